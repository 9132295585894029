"""Optional compiled build: Cython compiles Warren's hot modules when it can.

Metadata, dependencies and entry points live in pyproject.toml; this file only
adds the extension modules. The .py files stay the only source: Cython
compiles them as they are ("pure Python mode"), and Warren runs unchanged from
them when nothing was compiled. A build that cannot compile (no C compiler,
Cython missing or failing, or WARREN_PURE_PYTHON=1 set at build time) warns and
still installs, as pure Python.

`pip install -e .` builds the extensions in place, next to their .py files
(src/warren/.../*.so); `make build` rebuilds them after an edit. See
warren/__init__.py for how a .so older than its .py is ignored at import.
"""

from __future__ import annotations

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# Only modules that measurably gain. On CPython 3.11+ an untyped Cython module is
# not automatically faster: the interpreter's specialized attribute loads and
# method calls beat Cython's generic ones, so attribute-heavy class code
# (channel.py, consumer.py, queue.py, segment_store.py, records.py) ran 1-6% MORE
# instructions per message compiled (valgrind, one module at a time, publishes
# and acks fed to a connection), and compiling all 15 candidate modules made the
# broker 4-8% slower. These three run fewer instructions: the frame loop
# (connection.feed), the method codecs (spec.py), the property codecs.
#
# Never compile modules that recurse over client-built structures, such as
# core/table.py (nested field tables) or core/vhost.py (exchange-to-exchange
# chains): calls between compiled functions skip the interpreter's recursion
# limit, so a deep enough nesting overflows the C stack and kills the broker
# where Python raises RecursionError (which becomes a protocol error).
COMPILED_MODULES = [
    "warren.amqp.connection",
    "warren.amqp.spec",
    "warren.core.properties",
]

# Python semantics first: annotations are documentation, not C types (with
# annotation_typing, `x: float` would turn an int argument into a C double and
# `x: dict` would refuse a dict subclass). Explicit typing would go through
# cython.locals() in the source; none is used (C ints for connection.feed's
# offsets saved ~1.4% of instructions: not worth a runtime `cython` import).
COMPILER_DIRECTIVES = {
    "language_level": 3,
    "annotation_typing": False,
    "binding": True,
}


# Python's own CFLAGS carry -g: debug info triples the compile time of the big
# generated files (spec.c is ~5 MB of C) and nobody debugs them at C level.
EXTRA_COMPILE_ARGS = ["-g0"] if os.name == "posix" else []


def _source(module: str) -> str:
    return os.path.join("src", *module.split(".")) + ".py"


class OptionalBuildExt(build_ext):
    """build_ext that turns every failure into a warning and a pure-Python module."""

    def finalize_options(self) -> None:
        super().finalize_options()
        self._failed: set[str] = set()
        self._skipped = ""
        if self.parallel is None:
            self.parallel = os.cpu_count() or 1  # one C compiler per core
        if os.environ.get("WARREN_PURE_PYTHON", "") not in ("", "0"):
            self._skipped = "WARREN_PURE_PYTHON is set"
            return
        try:
            from Cython.Build import cythonize

            # .py -> .c under build/cython; the .c is regenerated only when its
            # .py is newer, and the .so relinked only when its .c is.
            generated = cythonize(
                [Extension(ext.name, ext.sources) for ext in self.extensions],
                compiler_directives=COMPILER_DIRECTIVES,
                build_dir=os.path.join("build", "cython"),
                nthreads=self.parallel,
                quiet=True,
            )
            sources = {ext.name: ext.sources for ext in generated}
            for ext in self.extensions:
                ext.sources = sources[ext.name]
        except Exception as exc:  # no Cython, or it cannot compile a module
            self._skipped = f"{type(exc).__name__}: {exc}"

    def run(self) -> None:
        if self._skipped:
            self._skip(self._skipped)
            return
        try:
            super().run()
        except Exception as exc:  # no compiler, ...: never fail the install
            self._skip(f"{type(exc).__name__}: {exc}")

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            self._failed.add(ext.name)
            self._warn(
                f"could not compile {ext.name} ({type(exc).__name__}: {exc}); "
                "it runs as pure Python"
            )

    def copy_extensions_to_source(self) -> None:
        # In-place (editable) builds copy each built module next to its .py; skip
        # the ones that failed, which have nothing to copy.
        built = self.extensions
        self.extensions = [ext for ext in built if ext.name not in self._failed]
        try:
            super().copy_extensions_to_source()
        finally:
            self.extensions = built

    def get_outputs(self) -> list[str]:
        # Only what exists: a wheel must not list modules that failed to build.
        return [path for path in super().get_outputs() if os.path.exists(path)]

    def _skip(self, reason: str) -> None:
        self.extensions = []
        self._warn(f"not compiling Warren's hot modules ({reason}); installing pure Python")

    @staticmethod
    def _warn(text: str) -> None:
        print(f"warning: {text}", file=sys.stderr)


setup(
    ext_modules=[
        Extension(name, [_source(name)], extra_compile_args=EXTRA_COMPILE_ARGS)
        for name in COMPILED_MODULES
    ],
    cmdclass={"build_ext": OptionalBuildExt},
)
