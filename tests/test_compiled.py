"""The optional compiled build: which file each hot module is imported from.

`make test` runs the suite twice, with the compiled modules and with
WARREN_PURE_PYTHON=1; these tests check that each run really is what it claims.
"""

from __future__ import annotations

import ast
import importlib
import importlib.machinery
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from procs import SRC

import warren

SETUP_PY = SRC.parent / "setup.py"


def _compiled_module_names() -> list[str]:
    """setup.py's COMPILED_MODULES, read without running setup.py."""
    tree = ast.parse(SETUP_PY.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "COMPILED_MODULES" for t in node.targets
        ):
            names = ast.literal_eval(node.value)
            assert names and all(name.startswith("warren.") for name in names)
            return list(names)
    raise AssertionError("no COMPILED_MODULES in setup.py")


def _extension(name: str) -> Path | None:
    base = SRC.joinpath(*name.split("."))
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = base.with_name(base.name + suffix)
        if path.exists():
            return path
    return None


def _env(**extra: str) -> dict[str, str]:
    """The environment tests/procs.py gives `python -m warren`: this one's, plus SRC."""
    return dict(os.environ, PYTHONPATH=str(SRC), **extra)


@pytest.mark.skipif(warren.PURE_PYTHON, reason="WARREN_PURE_PYTHON run: nothing compiled is used")
def test_built_extensions_are_the_modules_imported() -> None:
    built = {}
    for name in _compiled_module_names():
        extension = _extension(name)
        source = SRC.joinpath(*name.split(".")).with_suffix(".py")
        if extension is not None and extension.stat().st_mtime >= source.stat().st_mtime:
            built[name] = extension
    if not built:
        pytest.skip("no compiled modules built (no C compiler or Cython?)")
    for name, extension in built.items():
        module = importlib.import_module(name)
        assert module.__file__ == str(extension), name
    assert set(built) <= set(warren.compiled_modules())


def test_pure_python_mode_imports_every_module_from_its_py() -> None:
    code = (
        "import sys, warren, warren.broker, warren.amqp.server\n"
        "mods = [m for n, m in sys.modules.items() if n.startswith('warren.')]\n"
        "assert len(mods) > 20, len(mods)\n"
        "for m in mods:\n"
        "    f = getattr(m, '__file__', None)\n"
        "    assert f is None or f.endswith('.py'), f\n"
        "assert warren.compiled_modules() == [], warren.compiled_modules()\n"
        "print('pure ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        env=_env(WARREN_PURE_PYTHON="1"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "pure ok"


def test_warren_processes_inherit_the_mode() -> None:
    """`python -m warren`, as tests/procs.py starts it, runs in this run's mode."""
    result = subprocess.run(
        [sys.executable, "-m", "warren", "--version"],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"warren {warren.__version__} ({warren.build_description()})"
    if warren.PURE_PYTHON:
        assert "pure Python, WARREN_PURE_PYTHON=1" in result.stdout


def test_stale_extension_is_skipped_with_one_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An extension older than its .py is ignored (the .py imported), once warned about."""
    monkeypatch.setattr(warren, "PURE_PYTHON", False)
    monkeypatch.setattr(warren, "_SOURCE_CHECKOUT", True)
    monkeypatch.setattr(warren, "_stale_warned", False)
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    for name in ("fresh", "stale", "stale2"):
        (tmp_path / f"{name}.py").write_text("X = 1\n")
        (tmp_path / f"{name}{suffix}").write_bytes(b"not really an extension")
    os.utime(tmp_path / f"fresh{suffix}", (2_000_000_000, 2_000_000_000))
    os.utime(tmp_path / "stale.py", (2_000_000_000, 2_000_000_000))
    os.utime(tmp_path / "stale2.py", (2_000_000_000, 2_000_000_000))
    find = warren._SourceFirstFinder.find_spec
    with caplog.at_level(logging.WARNING, logger="warren"):
        # Fresh: the finder steps aside, so the normal machinery loads the extension.
        assert find("warren.fresh", [str(tmp_path)]) is None
        for name in ("stale", "stale2"):
            spec = find(f"warren.{name}", [str(tmp_path)])
            assert spec is not None and spec.origin == str(tmp_path / f"{name}.py")
        # Not a warren module, or a top-level one: never the finder's business.
        assert find("other.stale", [str(tmp_path)]) is None
        assert find("warren", None) is None
    warnings = [r for r in caplog.records if "newer than its compiled module" in r.getMessage()]
    assert len(warnings) == 1
    assert "stale.py" in warnings[0].getMessage()
    # WARREN_PURE_PYTHON: the .py even when the extension is fresh.
    monkeypatch.setattr(warren, "PURE_PYTHON", True)
    spec = find("warren.fresh", [str(tmp_path)])
    assert spec is not None and spec.origin == str(tmp_path / "fresh.py")
