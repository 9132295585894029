"""Warren: an AMQP 0-9-1 message broker in Python, wire-compatible with RabbitMQ."""

from __future__ import annotations

import functools
import glob
import importlib
import importlib.machinery
import importlib.util
import logging
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["Broker", "Config", "__version__", "build_description", "compiled_modules"]

if TYPE_CHECKING:
    from warren.app import Broker
    from warren.config import Config


# -- compiled modules ---------------------------------------------------------------
# setup.py may compile some modules with mypyc (the .py files are the only source).
# The build is one shared extension module, _warren_compiled__mypyc*.so next to the
# warren package, holding the compiled code of every module, plus a small extension module (.so) next to each
# compiled module's .py that loads it. Python's import system prefers that .so to the
# .py however old it is: edit connection.py and the next run would silently use the
# old compiled code. The compiled modules call each other directly, so they are used
# all together or not at all. The finder below, first on sys.meta_path, sends the
# import of every compiled warren.* module to its .py instead when
#   * WARREN_PURE_PYTHON is set (not "" or "0"), or
#   * the shared module is missing (an incomplete build), or
#   * any compiled module's .py is newer than its .so (a stale build; warns once).
# Otherwise it steps aside and the normal machinery loads the extensions.
#
# The mtime rule applies to a source checkout only (src/warren next to
# pyproject.toml, where the extensions are built in place and the sources are
# edited): an installer unpacks a wheel's files in no particular order, so there
# their mtimes say nothing.

PURE_PYTHON = os.environ.get("WARREN_PURE_PYTHON", "") not in ("", "0")

SHARED_LIBRARY = "_warren_compiled__mypyc"  # setup.py's GROUP + mypyc's suffix

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_SOURCE_CHECKOUT = os.path.exists(os.path.join(_PACKAGE_DIR, "..", "..", "pyproject.toml"))
_use_sources_cache: dict[str, bool] = {}


def _extension_path(directory: str, name: str) -> str | None:
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = os.path.join(directory, name + suffix)
        if os.path.exists(path):
            return path
    return None


def _compiled_sources(package_dir: str) -> list[tuple[str, str]]:
    """(.py, .so) of every module of package_dir that has an extension module."""
    found = []
    for directory, _dirs, files in os.walk(package_dir):
        for file in files:
            if file.endswith(".py"):
                extension = _extension_path(directory, file[:-3])
                if extension is not None:
                    found.append((os.path.join(directory, file), extension))
    return found


def _build_unusable(package_dir: str) -> str | None:
    """Why the compiled build of package_dir must not be used, or None."""
    if _extension_path(os.path.dirname(package_dir), SHARED_LIBRARY) is None:
        return f"{SHARED_LIBRARY} is missing"
    if _SOURCE_CHECKOUT:
        for source, extension in _compiled_sources(package_dir):
            if os.path.getmtime(source) > os.path.getmtime(extension):
                return f"{source} is newer than its compiled module"
    return None


def _use_sources(package_dir: str) -> bool:
    """Whether to import every module of package_dir from its .py (decided once)."""
    if PURE_PYTHON:
        return True
    decided = _use_sources_cache.get(package_dir)
    if decided is None:
        reason = _build_unusable(package_dir)
        decided = _use_sources_cache[package_dir] = reason is not None
        if reason is not None and _compiled_sources(package_dir):
            logging.getLogger("warren").warning(
                "not using the compiled modules (%s): every module runs from its .py; "
                "`make build` recompiles them",
                reason,
            )
    return decided


def _package_dir(directory: str) -> str:
    """The top warren package directory that holds ``directory``."""
    while os.path.exists(os.path.join(os.path.dirname(directory), "__init__.py")):
        directory = os.path.dirname(directory)
    return directory


class _SourceFirstFinder:
    """Meta path finder: a warren.* module from its .py when its .so must not be used."""

    @staticmethod
    def find_spec(
        fullname: str, path: Sequence[str] | None = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith("warren.") or not path:
            return None
        name = fullname.rpartition(".")[2]
        for directory in path:
            source = os.path.join(directory, name + ".py")
            if not os.path.exists(source):
                continue
            if _extension_path(directory, name) is not None and _use_sources(
                _package_dir(os.path.abspath(directory))
            ):
                return importlib.util.spec_from_file_location(fullname, source)
            return None  # the normal machinery finds the same file (and its .so)
        return None


def _is_compiled(module_file: str) -> bool:
    return module_file.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))


@functools.cache
def _own_compiled_sources() -> list[tuple[str, str]]:
    """_compiled_sources of warren itself, walked once per process: every broker
    start logs build_description(), and the walk (a stat per suffix per module)
    was most of an embedded broker's start (3 of 4 ms)."""
    return _compiled_sources(_PACKAGE_DIR)


def compiled_modules() -> list[str]:
    """The warren modules a compiled extension is (or will be) imported for.

    Decided as the import hook decides, without importing anything: modules
    already imported report what was actually loaded.
    """
    found = []
    use_sources = _use_sources(_PACKAGE_DIR)
    root = os.path.dirname(_PACKAGE_DIR)
    for source, _extension in _own_compiled_sources():
        fullname = os.path.relpath(source, root)[:-3].replace(os.sep, ".")
        module = sys.modules.get(fullname)
        if module is not None:
            compiled = _is_compiled(getattr(module, "__file__", None) or "")
        else:
            compiled = not use_sources
        if compiled:
            found.append(fullname)
    return sorted(found)


def native_module(name: str) -> ModuleType | None:
    """Warren's hand-written C extension ``warren.<name>`` (setup.py's NATIVE), or
    None: with WARREN_PURE_PYTHON, when it was not built, or, in a source
    checkout, when one of its sources (``<name>*.c``, ``<name>*.h``) is newer
    than the build (warned once, as for mypyc's)."""
    if PURE_PYTHON:
        return None
    path = _extension_path(_PACKAGE_DIR, name)
    if path is None:
        return None
    if _SOURCE_CHECKOUT:
        built = os.path.getmtime(path)
        newer = [
            source
            for source in sorted(glob.glob(os.path.join(_PACKAGE_DIR, name + "*.[ch]")))
            if os.path.getmtime(source) > built
        ]
        if newer:
            if name not in _stale_native_warned:
                _stale_native_warned.add(name)
                logging.getLogger("warren").warning(
                    "not using warren.%s (%s is newer than its build): `make build` rebuilds it",
                    name,
                    os.path.basename(newer[0]),
                )
            return None
    try:
        return importlib.import_module(f"warren.{name}")
    except ImportError:
        return None


_stale_native_warned: set[str] = set()


def build_description() -> str:
    """For --version and the startup log: "compiled: N modules" or "pure Python"."""
    count = len(compiled_modules())
    native = " + C fast path" if native_module("_fastpath") is not None else ""
    if count:
        return f"compiled: {count} modules{native}"
    if native:
        return "compiled: C fast path"
    return "pure Python, WARREN_PURE_PYTHON=1" if PURE_PYTHON else "pure Python"


if not any(getattr(f, "__qualname__", "") == "_SourceFirstFinder" for f in sys.meta_path):
    sys.meta_path.insert(0, _SourceFirstFinder)  # its find_spec is a staticmethod


def __getattr__(name: str) -> Any:
    # Lazy, so `warren --help` does not import the whole broker.
    if name == "Broker":
        from warren.app import Broker

        return Broker
    if name == "Config":
        from warren.config import Config

        return Config
    raise AttributeError(name)
