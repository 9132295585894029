"""Builds one variant's extension into the current directory (build.sh runs it):
FASTPATH_VARIANT=mypyc|mypyc_idx|c|cython python setup_variants.py build_ext --inplace"""

from __future__ import annotations

import os

from setuptools import Extension, setup

HERE = os.path.dirname(os.path.abspath(__file__))
variant = os.environ["FASTPATH_VARIANT"]
flags = ["-O3", "-g0"]

if variant == "mypyc":
    from mypyc.build import mypycify

    # The copy build.sh made of fastpath_py.py, under the compiled module's name.
    ext_modules = mypycify(["fastpath_mypyc.py"], opt_level="3", debug_level="0")
elif variant == "mypyc_idx":
    from mypyc.build import mypycify

    ext_modules = mypycify(["fastpath_mypyc_idx.py"], opt_level="3", debug_level="0")
elif variant == "c":
    ext_modules = [
        Extension("fastpath_c", [os.path.relpath(os.path.join(HERE, "fastpath_c.c"))], extra_compile_args=flags)
    ]
elif variant == "cython":
    from Cython.Build import cythonize

    ext_modules = cythonize(
        [Extension("fastpath_cy", ["fastpath_cy.pyx"], extra_compile_args=flags)],
        language_level=3,
        quiet=True,
    )
else:
    raise SystemExit(f"unknown variant {variant}")

if variant.startswith("mypyc"):
    for ext in ext_modules:
        ext.extra_compile_args = [*ext.extra_compile_args, "-g0"]

setup(name=f"fastpath_{variant}", version="0", py_modules=[], ext_modules=ext_modules)
