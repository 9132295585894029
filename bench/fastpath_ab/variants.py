"""The variants of publish_to_deliver that are built (build.sh), by name."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.environ.get("FASTPATH_BUILD", os.path.join(HERE, "build"))

Kernel = Callable[[bytes, int, int, bytes, int, int], "tuple[int, int, bytes]"]


def _pure(name: str) -> Kernel:
    """The module's source, run by the interpreter (not the build's copy)."""
    spec = importlib.util.spec_from_file_location(name + "_pure", os.path.join(HERE, name + ".py"))
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.publish_to_deliver  # type: ignore[no-any-return]


def load(require_all: bool = False) -> dict[str, Kernel]:
    kernels = {"python": _pure("fastpath_py"), "python_idx": _pure("fastpath_py_idx")}
    if BUILD not in sys.path:
        sys.path.insert(0, BUILD)
    for name, module in [("mypyc", "fastpath_mypyc"), ("mypyc_idx", "fastpath_mypyc_idx"), ("c", "fastpath_c"), ("cython", "fastpath_cy"),
                         ("rust", "fastpath_rs")]:
        try:
            mod = importlib.import_module(module)
        except ImportError:
            if require_all:
                raise
            print(f"{name}: not built ({module} not in {BUILD}), skipped", file=sys.stderr)
            continue
        if name.startswith("mypyc"):
            assert mod.__file__ and mod.__file__.endswith(".so"), mod.__file__
        kernels[name] = mod.publish_to_deliver
    return kernels
