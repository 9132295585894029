"""The sdist and wheel as `python -m build` makes them, installed into a fresh
virtualenv that then runs the README's quick start against its own `warren`.

The wheel is built from the sdist (python -m build's way), so a file the build
needs but the sdist lacks fails here. It is built pure Python
(WARREN_PURE_PYTHON=1, which setup.py honours at build time): compiling takes
minutes on 2 cores; the compiled build itself is what make test's compiled
pass runs. The sdist still has to carry everything the compiled build needs,
which is checked file by file.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from packaging_help import (
    ROOT,
    checkout_copy,
    clean_env,
    quick_start_python,
    require_namespaces,
    run_isolated,
    wheelhouse,
)

pytestmark = pytest.mark.timeout(400)

NAME = "warren_broker-0.1.0"


def _setup_lists() -> tuple[list[str], list[str]]:
    """setup.py's COMPILED_MODULES and NATIVE's C sources and headers, read from its AST."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    found: dict[str, object] = {}
    for node in tree.body:
        if not isinstance(node, ast.Assign):
            continue
        target = node.targets[0]
        if isinstance(target, ast.Name) and target.id in ("COMPILED_MODULES", "NATIVE"):
            found[target.id] = ast.literal_eval(node.value)
    modules = found["COMPILED_MODULES"]
    native = found["NATIVE"]
    assert isinstance(modules, list) and isinstance(native, list)
    c_files = [f for _, sources, headers in native for f in (*sources, *headers)]
    return [m.replace(".", "/") + ".py" for m in modules], c_files


def _build(tmp_path: Path) -> tuple[Path, Path]:
    source = checkout_copy(tmp_path / "source")
    dist = tmp_path / "dist"
    done = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(source)],
        capture_output=True, text=True, timeout=300,
        env=clean_env(WARREN_PURE_PYTHON="1"),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    # The build itself warns of nothing but the skipped compile (no deprecations).
    warnings = [
        line
        for line in (done.stdout + done.stderr).splitlines()
        if "warning" in line.lower()
        and "not compiling Warren's hot modules" not in line
        and "byte-compiling is disabled" not in line
    ]
    assert warnings == []
    (sdist,) = dist.glob("*.tar.gz")
    (wheel,) = dist.glob("*.whl")
    return sdist, wheel


def _check_sdist(sdist: Path) -> None:
    assert sdist.name == f"{NAME}.tar.gz"
    with tarfile.open(sdist) as tar:
        names = {n.removeprefix(f"{NAME}/") for n in tar.getnames()}
    modules, c_files = _setup_lists()
    needed = {"setup.py", "pyproject.toml", "README.md", "LICENSE", "PKG-INFO"}
    needed |= {f"src/warren/{m.removeprefix('warren/')}" for m in modules}
    needed |= set(c_files)  # src/warren/_fastpath*.c, .h, _syncworker.c
    needed |= {"src/warren/http/static/index.html", "src/pyspark_warren/__init__.py"}
    assert needed - names == set()
    junk = [
        n
        for n in names
        if n.startswith(("tests/", "data/", ".venv/", "build/", "docs/"))
        or n.endswith((".so", ".pyc"))
        or "__pycache__" in n
    ]
    assert junk == []


def _check_wheel(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as whl:
        names = set(whl.namelist())
        entry_points = whl.read(f"{NAME}.dist-info/entry_points.txt").decode()
        metadata = whl.read(f"{NAME}.dist-info/METADATA").decode()
    assert {"warren/__init__.py", "warren/http/static/index.html",
            "pyspark_warren/__init__.py", f"{NAME}.dist-info/licenses/LICENSE"} <= names  # fmt: skip
    assert not [n for n in names if n.endswith((".c", ".h")) or n.startswith("tests/")]
    assert "warren = warren.cli:main" in entry_points
    assert "warrenctl = warren.ctl.main:main" in entry_points
    assert "[pytest11]\nwarren = warren.pytest_plugin" in entry_points
    assert "Name: warren-broker\n" in metadata
    assert "License-Expression: MIT\n" in metadata
    # pip install 'warren-broker[spark]': the extra's requirements.
    assert "Provides-Extra: spark\n" in metadata
    assert 'Requires-Dist: pyspark>=4.2; extra == "spark"\n' in metadata
    assert 'Requires-Dist: pyarrow>=15; extra == "spark"\n' in metadata


def test_the_built_wheel_installs_into_a_fresh_venv_and_runs_the_quick_start(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    require_namespaces()
    sdist, wheel = _build(tmp_path)
    _check_sdist(sdist)
    _check_wheel(wheel)

    wheels = wheelhouse(tmp_path_factory, "pika")
    venv = tmp_path / "venv"
    env = clean_env(PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheels), PIP_NO_CACHE_DIR="1")
    # A venv without a pip of its own (ensurepip is some 2.5 s of CPU), installed
    # into by this environment's pip (`pip --python`); nothing byte-compiled
    # ahead (the quick start's imports compile what they use).
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, env=env)
    python = venv / "bin" / "python"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-compile",
         str(wheel), "pika"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert install.returncode == 0, install.stdout + install.stderr

    # Imported from the venv, not from this checkout (run from elsewhere, no PYTHONPATH).
    where = subprocess.run(
        [str(python), "-c", "import warren; print(warren.__file__); print(warren.build_description())"],
        capture_output=True, text=True, env=env, cwd=tmp_path, check=True,
    ).stdout.split("\n")  # fmt: skip
    site = Path(where[0]).resolve()
    assert site.is_relative_to(venv.resolve()), where
    assert not site.is_relative_to(ROOT)
    assert where[1] == "pure Python"

    # The README's client against a broker started from the venv's console
    # script, on the quick start's ports (in a private network namespace).
    bin_dir = venv / "bin"
    script = tmp_path / "quickstart.sh"
    script.write_text(
        f"{bin_dir}/warren --data-dir {tmp_path}/data &\n"
        f"{bin_dir}/warren ctl await-startup\n"
        f"{python} - <<'EOF'\n{quick_start_python()}EOF\n"
    )
    out = run_isolated(script, tmp_path, env, timeout=120)
    got = [line for line in out.splitlines() if line.startswith("(<Basic.GetOk(")]
    assert len(got) == 1 and got[0].endswith("b'hi')"), out
    assert f"data dir {tmp_path}/data" in out  # the venv's warren, on that data dir
    assert os.path.isdir(tmp_path / "data")
