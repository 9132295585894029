"""Warren: an AMQP 0-9-1 message broker in Python, wire-compatible with RabbitMQ."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import logging
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["Broker", "Config", "__version__", "build_description", "compiled_modules"]

if TYPE_CHECKING:
    from warren.broker import Broker
    from warren.config import Config


# -- compiled modules ---------------------------------------------------------------
# setup.py may compile some modules with Cython (pure Python mode: the .py files are
# the only source). In a source checkout the extension module (.so) sits next to its
# .py, and Python's import system prefers the extension however old it is: edit
# connection.py and the next run would silently use the old compiled one. The finder
# below, first on sys.meta_path, sends a warren.* import to the .py instead when
#   * WARREN_PURE_PYTHON is set (not "" or "0"): everything runs from .py, or
#   * the .py is newer than its extension module (a stale build; warns once).
# Otherwise it steps aside and the normal machinery loads the extension.
#
# The mtime rule applies to a source checkout only (src/warren next to
# pyproject.toml, where the extensions are built in place and the sources are
# edited): an installer unpacks a wheel's files in no particular order, so there
# their mtimes say nothing.

PURE_PYTHON = os.environ.get("WARREN_PURE_PYTHON", "") not in ("", "0")

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_SOURCE_CHECKOUT = os.path.exists(os.path.join(_PACKAGE_DIR, "..", "..", "pyproject.toml"))
_stale_warned = False


def _extension_path(directory: str, name: str) -> str | None:
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = os.path.join(directory, name + suffix)
        if os.path.exists(path):
            return path
    return None


def _use_source(source: str, extension: str) -> bool:
    """Whether to import ``source`` rather than its extension module."""
    if PURE_PYTHON:
        return True
    if not _SOURCE_CHECKOUT or os.path.getmtime(source) <= os.path.getmtime(extension):
        return False
    global _stale_warned
    if not _stale_warned:
        _stale_warned = True
        logging.getLogger("warren").warning(
            "%s is newer than its compiled module: using the .py (and any other "
            "stale module's); `make build` recompiles them",
            source,
        )
    return True


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
            extension = _extension_path(directory, name)
            if extension is not None and _use_source(source, extension):
                return importlib.util.spec_from_file_location(fullname, source)
            return None  # the normal machinery finds the same file (and its .so)
        return None


def _is_compiled(module_file: str) -> bool:
    return module_file.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))


def compiled_modules() -> list[str]:
    """The warren modules a compiled extension is (or will be) imported for.

    Decided as the import hook decides, without importing anything: modules
    already imported report what was actually loaded.
    """
    found = []
    for directory, _dirs, files in os.walk(_PACKAGE_DIR):
        package = os.path.relpath(directory, os.path.dirname(_PACKAGE_DIR)).replace(os.sep, ".")
        for file in files:
            if not file.endswith(".py"):
                continue
            fullname = f"{package}.{file[:-3]}"
            module = sys.modules.get(fullname)
            if module is not None:
                compiled = _is_compiled(getattr(module, "__file__", None) or "")
            else:
                extension = _extension_path(directory, file[:-3])
                source = os.path.join(directory, file)
                compiled = extension is not None and not _use_source(source, extension)
            if compiled:
                found.append(fullname)
    return sorted(found)


def build_description() -> str:
    """For --version and the startup log: "compiled: N modules" or "pure Python"."""
    count = len(compiled_modules())
    if count:
        return f"compiled: {count} modules"
    return "pure Python, WARREN_PURE_PYTHON=1" if PURE_PYTHON else "pure Python"


if not any(getattr(f, "__qualname__", "") == "_SourceFirstFinder" for f in sys.meta_path):
    sys.meta_path.insert(0, _SourceFirstFinder)  # its find_spec is a staticmethod


def __getattr__(name: str) -> Any:
    # Lazy, so `warren --help` does not import the whole broker.
    if name == "Broker":
        from warren.broker import Broker

        return Broker
    if name == "Config":
        from warren.config import Config

        return Config
    raise AttributeError(name)
