"""Optional compiled build: mypyc compiles Warren's hot modules when it can,
and a small C extension (warren._fastpath) takes the hot path's byte work.

Metadata, dependencies and entry points live in pyproject.toml; this file only
adds the extension modules. The .py files stay the only source: mypyc compiles
them as they are, using their type annotations (the code is mypy-clean), and
Warren runs unchanged from them when nothing was compiled. A build that cannot
compile (no C compiler, mypyc missing or failing, or WARREN_PURE_PYTHON=1 set
at build time) warns and still installs, as pure Python.

mypyc puts the compiled code of all the modules in one top-level extension
module, _warren_compiled__mypyc*.so (next to the warren package), plus a small
shim extension per module next to its .py (warren/amqp/connection*.so, ...)
that loads it. The modules are compiled
together and call each other directly, so they are used all together or not at
all: see warren/__init__.py for how an edited .py (newer than the build) makes
Warren import every module from its .py until `make build` recompiles.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# The per-message path, from frame to queue to delivery, and the message store.
# With these compiled `warren perf throughput` (1 publisher, 1 consumer, CPython
# 3.11, medians of 4 alternated runs) delivers 1.24x the pure-Python rate
# without acks, 1.41x with manual acks, 1.18x with publisher confirms.
# (Cython, tried first, gained nothing: untyped, it cannot beat the 3.11
# interpreter's specialized attribute access; mypyc uses the annotations.)
#
# Never compile modules that recurse over client-built structures, such as
# core/vhost_dead_letters.py (a quorum queue's at-least-once dead-lettering hands
# its copy to the next queue, which can dead-letter it at once, and so on along
# a chain of such queues): calls between compiled functions
# skip the interpreter's recursion limit, so a deep enough nesting overflows the
# C stack and kills the broker where Python raises RecursionError (which becomes
# a protocol error). core/table.py qualifies: its decoding and validation keep an
# explicit stack, and its encoding (core/table_encode.py) stops at MAX_DEPTH
# levels; core/table_edit.py only walks a table's top level.
COMPILED_MODULES = [
    # AMQP 1.0's wire layer: its decoding recurses, up to amqp1/formats.py's
    # MAX_DEPTH levels only, as does its encoding.
    "warren.amqp1.codec",
    "warren.amqp1.encoding",
    "warren.amqp1.formats",
    "warren.amqp1.frames",
    "warren.amqp1.performatives",
    # Its consumer subclasses core/consumer.py's compiled Consumer, which an
    # interpreted class cannot.
    "warren.amqp1.outgoing",
    # Every transfer passes through these (a read's publish run, its session's
    # windows and dispositions).
    "warren.amqp1.incoming",
    "warren.amqp1.session",
    "warren.amqp.channel",
    "warren.amqp.confirms",
    "warren.amqp.connection",
    "warren.amqp.consumer",
    "warren.amqp.declarations",
    "warren.amqp.frame_loop",
    "warren.amqp.frames",
    "warren.amqp.handshake",
    "warren.amqp.publish_checks",
    "warren.amqp.publishing",
    "warren.amqp.replica",
    "warren.amqp.settlement",
    "warren.core.channel_counts",
    "warren.core.clock",
    "warren.core.consumer",
    "warren.core.deliveries",
    "warren.core.message",
    "warren.core.properties",
    "warren.core.queue",
    "warren.core.queue_delivery",
    "warren.core.queue_expires",
    "warren.core.queue_features",
    "warren.core.queue_settings",
    "warren.core.queue_settle",
    "warren.core.quorum_queue",
    "warren.core.stats",
    "warren.core.stats_history",
    "warren.core.stream",
    "warren.core.stream_delivery",
    "warren.core.stream_queue",
    "warren.core.table",
    "warren.core.table_edit",
    "warren.core.table_encode",
    "warren.core.unsettled",
    "warren.core.vhost_routing",
    # The stream protocol's subscription is a core Consumer (compiled): so is
    # the module that defines it.
    "warren.stream_protocol.delivering",
    # The HTTP bridge's consumer subclasses the compiled Consumer.
    "warren.http.bridge_consumer",
    # So does a CoAP observation's.
    "warren.coap.consumer",
    "warren.mqtt.codec",
    "warren.mqtt.connection",
    "warren.mqtt.delivery",
    "warren.mqtt.mapping",
    "warren.mqtt.publishing",
    "warren.mqtt.subscriptions",
    "warren.mqtt.sync_acks",
    "warren.core.session",
    "warren.store.ack_files",
    "warren.store.disk_budget",
    "warren.store.records",
    "warren.store.requeued",
    "warren.store.segment_alloc",
    "warren.store.segment_cursor",
    "warren.store.segment_damage",
    "warren.store.segment_faults",
    "warren.store.segment_files",
    "warren.store.segment_format",
    "warren.store.segment_log",
    "warren.store.segment_losses",
    "warren.store.segment_parts",
    "warren.store.segment_reader",
    "warren.store.segment_reads",
    "warren.store.segment_recovery",
    "warren.store.segment_scan",
    "warren.store.segment_settle",
    "warren.store.segment_spares",
    "warren.store.segment_store",
    "warren.store.stream_cursor",
    "warren.store.stream_records",
    "warren.store.stream_replica",
    "warren.store.stream_segment",
    "warren.store.stream_store",
    "warren.store.stream_tracking",
    "warren.store.sync_files",
    "warren.store.transient_counts",
]

# The shared extension module: GROUP + "__mypyc" (mypyc's suffix), a fixed name
# rather than mypyc's default hash of the module list. It must be top-level:
# mypyc derives the compiled modules' __file__ from its location.
GROUP = "_warren_compiled"

# Python's own CFLAGS carry -g: debug info multiplies the compile time of the
# generated C and nobody debugs it at C level.
EXTRA_COMPILE_ARGS = ["-g0"] if os.name == "posix" else []


# Hand-written C for the byte work of the hot path (src/warren/_fastpath.c and
# the _fastpath_*.c it is split into, sharing _fastpath.h): scanning a socket
# read for runs of alike publishes, their delivery frames and store records.
# Its Python twin (warren/amqp/publish_run.py) is the reference and the
# fallback; the C is used when it was built (see warren.native_module). Built
# with the mypyc modules, all or nothing.
# src/warren/_syncworker.c is the group commit's sync thread without the GIL
# (store/sync.py runs a ThreadPoolExecutor without it).
# Entries: (module, its C sources, the headers they include: a header's change
# rebuilds it too). The Makefile lists the same files for its build rule.
NATIVE = [
    (
        "warren._fastpath",
        [
            "src/warren/_fastpath.c",
            "src/warren/_fastpath_scan.c",
            "src/warren/_fastpath_run.c",
            "src/warren/_fastpath_deliver.c",
            "src/warren/_fastpath_records.c",
            "src/warren/_fastpath_spark.c",
            "src/warren/_fastpath_stream.c",
            "src/warren/_fastpath_chunks.c",
        ],
        ["src/warren/_fastpath.h"],
    ),
    ("warren._syncworker", ["src/warren/_syncworker.c"], []),
]


def _native() -> list[Extension]:
    return [
        Extension(name, sources, depends=headers, extra_compile_args=["-O3", *EXTRA_COMPILE_ARGS])
        for name, sources, headers in NATIVE
    ]


def _source(module: str) -> str:
    return os.path.join("src", *module.split(".")) + ".py"


def _mypycify() -> list[Extension]:
    from mypyc.build import mypycify

    # multi_file: one C file per module (and mypyc's runtime as C files of its
    # own) instead of one 40 MB file, still in one extension. gcc spends half
    # the CPU on ~80 files that it spent on the one (74 s against 135 s at
    # -O3 here: its cost grows faster than a file's size), and they compile in
    # parallel (_compile_in_parallel).
    extensions: list[Extension] = mypycify(
        [_source(name) for name in COMPILED_MODULES],
        opt_level="3",
        debug_level="0",
        multi_file=True,
        group_name=GROUP,
        target_dir=os.path.join("build", "mypyc"),
    )
    for ext in extensions:
        ext.extra_compile_args = [*ext.extra_compile_args, *EXTRA_COMPILE_ARGS]
    return extensions


def _compile_in_parallel(compiler: Any, jobs: int) -> None:
    """Make ``compiler`` compile an extension's C files on ``jobs`` threads,
    the biggest first.

    setuptools runs extensions in parallel (build_ext -j) but compiles the
    files of one extension one after another, and mypyc's shared extension
    holds nearly all the C. One limit covers every extension, so build_ext's
    own threads and these never run more than ``jobs`` compilers at once.
    Unix compilers only (they implement ``_compile``; MSVC's ``compile`` is its
    own loop): others compile as before.
    """
    if jobs < 2 or compiler.compiler_type != "unix":
        return
    slots = threading.BoundedSemaphore(jobs)
    compile_one: Callable[..., None] = compiler._compile

    def limited(*args: Any) -> None:
        with slots:
            compile_one(*args)

    def compile_all(
        sources: list[str],
        output_dir: str | None = None,
        macros: Any = None,
        include_dirs: Any = None,
        debug: bool = False,
        extra_preargs: list[str] | None = None,
        extra_postargs: list[str] | None = None,
        depends: list[str] | None = None,
    ) -> list[str]:
        macros, objects, extra_postargs, pp_opts, build = compiler._setup_compile(
            output_dir, macros, include_dirs, sources, depends, extra_postargs
        )
        cc_args = compiler._get_cc_args(pp_opts, debug, extra_preargs)
        order = sorted(build, key=lambda obj: -os.path.getsize(build[obj][0]))
        with ThreadPoolExecutor(jobs) as pool:
            futures = [
                pool.submit(limited, obj, *build[obj], cc_args, extra_postargs, pp_opts)
                for obj in order
            ]
            for future in futures:
                future.result()
        return objects  # all of them, in the given order, as CCompiler.compile

    compiler.compile = compile_all  # CCompiler.compile's signature


class OptionalBuildExt(build_ext):
    """build_ext that turns every failure into a warning and a pure-Python install."""

    def finalize_options(self) -> None:
        self._skipped = ""
        if os.environ.get("WARREN_PURE_PYTHON", "") not in ("", "0"):
            self._skipped = "WARREN_PURE_PYTHON is set"
        else:
            try:
                # Type-checks the modules and writes their C under build/mypyc
                # (a file only when its content changes). Before setuptools
                # finalizes the extension list, which it prepares for building.
                self.distribution.ext_modules = _mypycify() + _native()
            except (Exception, SystemExit) as exc:  # mypyc reports errors by exiting
                self._skipped = f"mypyc: {type(exc).__name__}: {exc}"
        super().finalize_options()
        if self.parallel is None:
            self.parallel = os.cpu_count() or 1  # one C compiler per core

    def run(self) -> None:
        if self._skipped:
            self._skip(self._skipped)
            return
        inplace = self.inplace  # setuptools clears it while building
        try:
            super().run()
        except Exception as exc:  # no compiler, ...: never fail the install
            self.inplace = inplace
            self._remove_outputs()
            self._skip(f"{type(exc).__name__}: {exc}")
            return
        if self.inplace:
            # An unchanged C file is not recompiled, and the in-place copy keeps
            # the old build's mtime: stamp the build as no older than the
            # sources it was just checked against (warren/__init__.py compares).
            for path in self._inplace_outputs():
                if os.path.exists(path):
                    os.utime(path)

    def build_extensions(self) -> None:
        jobs = (os.cpu_count() or 1) if self.parallel is True else int(self.parallel or 1)
        _compile_in_parallel(self.compiler, jobs)
        super().build_extensions()

    def build_extension(self, ext: Extension) -> None:
        # Every module needs the shared library and the library needs every
        # module: one failure fails the whole compiled build (run() catches it).
        super().build_extension(ext)

    def get_outputs(self) -> list[str]:
        # Only what exists: a wheel must not list modules that were not built.
        return [path for path in super().get_outputs() if os.path.exists(path)]

    def _inplace_outputs(self) -> list[str]:
        build_py = self.get_finalized_command("build_py")
        return [self._get_inplace_equivalent(build_py, ext)[0] for ext in self.extensions]

    def _remove_outputs(self) -> None:
        # Half a build is unusable: leave none of it where Python would import it.
        if self.inplace:
            for path in self._inplace_outputs():
                if os.path.exists(path):
                    os.remove(path)

    def _skip(self, reason: str) -> None:
        self.extensions = []
        self._warn(f"not compiling Warren's hot modules ({reason}); installing pure Python")

    @staticmethod
    def _warn(text: str) -> None:
        print(f"warning: {text}", file=sys.stderr)


setup(
    # Placeholders, so that setuptools runs build_ext (and builds a platform
    # wheel); OptionalBuildExt replaces them with mypyc's extensions.
    ext_modules=[Extension(name, [_source(name)]) for name in COMPILED_MODULES] + _native(),
    cmdclass={"build_ext": OptionalBuildExt},
)
