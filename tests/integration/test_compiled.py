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
    if _extension(warren.SHARED_LIBRARY) is None:
        pytest.skip("no compiled build (no C compiler or mypyc?)")
    names = _compiled_module_names()
    for name in names:
        extension = _extension(name)
        source = SRC.joinpath(*name.split(".")).with_suffix(".py")
        assert extension is not None, f"{name}: the build has no extension for it"
        assert extension.stat().st_mtime >= source.stat().st_mtime, f"{name}: stale build"
    # All of the build, or (stale, incomplete) none of it: here all.
    for name in names:
        module = importlib.import_module(name)
        assert module.__file__ == str(_extension(name)), name
    assert warren.compiled_modules() == sorted(names)


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


def _fake_build(root: Path) -> tuple[Path, str]:
    """A package like a compiled warren: a shared library, two modules with extensions."""
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    pkg = root / "pkg"
    (pkg / "sub").mkdir(parents=True)
    for init in (pkg / "__init__.py", pkg / "sub" / "__init__.py"):
        init.write_text("")
    (root / f"{warren.SHARED_LIBRARY}{suffix}").write_bytes(b"not really an extension")
    (pkg / "plain.py").write_text("X = 1\n")
    for module in (pkg / "a", pkg / "sub" / "b"):
        module.with_suffix(".py").write_text("X = 1\n")
        extension = module.with_name(module.name + suffix)
        extension.write_bytes(b"not really an extension")
        os.utime(module.with_suffix(".py"), (1_000_000_000, 1_000_000_000))
    return pkg, suffix


def test_stale_or_incomplete_build_is_skipped_as_a_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """One .py newer than its extension, or no shared library: every module from its .py."""
    monkeypatch.setattr(warren, "PURE_PYTHON", False)
    monkeypatch.setattr(warren, "_SOURCE_CHECKOUT", True)
    find = warren._SourceFirstFinder.find_spec

    def imported_from(pkg: Path) -> dict[str, str | None]:
        monkeypatch.setattr(warren, "_use_sources_cache", {})
        found = {}
        for name, directory in (("a", pkg), ("sub.b", pkg / "sub"), ("plain", pkg)):
            spec = find(f"warren.{name}", [str(directory)])
            found[name] = None if spec is None else spec.origin
        return found

    caplog.set_level(logging.WARNING, logger="warren")
    fresh, suffix = _fake_build(tmp_path / "fresh")
    # Fresh: the finder steps aside, so the normal machinery loads the extensions.
    assert imported_from(fresh) == {"a": None, "sub.b": None, "plain": None}
    assert not caplog.records

    stale, _ = _fake_build(tmp_path / "stale")
    os.utime(stale / "sub" / "b.py", (2_000_000_000, 2_000_000_000))
    everything = {"a": str(stale / "a.py"), "sub.b": str(stale / "sub" / "b.py"), "plain": None}
    assert imported_from(stale) == everything
    for _ in range(3):  # decided once per process: warned once
        assert find("warren.a", [str(stale)]) is not None
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "b.py is newer than its compiled module" in warnings[0]

    incomplete, _ = _fake_build(tmp_path / "incomplete")
    (incomplete.parent / f"{warren.SHARED_LIBRARY}{suffix}").unlink()
    assert imported_from(incomplete)["a"] == str(incomplete / "a.py")
    assert "_warren_compiled__mypyc is missing" in caplog.records[-1].getMessage()

    # Not a warren module, or a top-level one: never the finder's business.
    assert find("other.a", [str(stale)]) is None
    assert find("warren", None) is None
    # WARREN_PURE_PYTHON: the .py even when the build is fresh.
    monkeypatch.setattr(warren, "PURE_PYTHON", True)
    assert imported_from(fresh)["a"] == str(fresh / "a.py")


def test_an_edit_to_any_c_source_makes_the_native_build_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A hand-written extension is built from several files (setup.py's NATIVE):
    the module's .c, its other <name>_*.c and its .h all count."""
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    sources = [tmp_path / n for n in ("_fake.c", "_fake.h", "_fake_part.c")]
    for source in sources:
        source.write_text("")
        os.utime(source, (1_000_000_000, 1_000_000_000))
    (tmp_path / f"_fake{suffix}").write_bytes(b"not really an extension")
    (tmp_path / "_other.c").write_text("")  # another extension's source: not this one's
    monkeypatch.setattr(warren, "PURE_PYTHON", False)
    monkeypatch.setattr(warren, "_SOURCE_CHECKOUT", True)
    monkeypatch.setattr(warren, "_PACKAGE_DIR", str(tmp_path))
    caplog.set_level(logging.WARNING, logger="warren")

    def stale_file() -> str | None:
        monkeypatch.setattr(warren, "_stale_native_warned", set())
        caplog.clear()
        assert warren.native_module("_fake") is None  # no such module either way
        messages = [r.getMessage() for r in caplog.records]
        return messages[0].split("(")[1].split(" is newer")[0] if messages else None

    assert stale_file() is None
    for source in sources:
        os.utime(source, (2_000_000_000, 2_000_000_000))
        assert stale_file() == source.name
        os.utime(source, (1_000_000_000, 1_000_000_000))
