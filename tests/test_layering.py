"""The package layering docs/architecture.md promises, checked on the source.

core/ and store/ import no protocol package (a protocol package calls the core,
never the other way), and a protocol package never imports another one. Read
from the source with ast, so a lazy import inside a function counts too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "warren"
#: Packages that speak a protocol to the outside world.
PROTOCOL_PACKAGES = ("amqp",)


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, absolute names, wherever the import sits."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _files(package: str) -> list[Path]:
    return sorted((SRC / package).glob("*.py"))


@pytest.mark.parametrize("package", ["core", "store"])
def test_core_and_store_import_no_protocol_package(package: str) -> None:
    offenders = {
        f"{path.relative_to(SRC)}: {name}"
        for path in _files(package)
        for name in imported_modules(path)
        if any(name.startswith(f"warren.{p}") for p in PROTOCOL_PACKAGES)
    }
    assert not offenders


@pytest.mark.parametrize("package", PROTOCOL_PACKAGES)
def test_a_protocol_package_imports_no_other(package: str) -> None:
    others = [p for p in PROTOCOL_PACKAGES if p != package]
    offenders = {
        f"{path.relative_to(SRC)}: {name}"
        for path in _files(package)
        for name in imported_modules(path)
        if any(name.startswith(f"warren.{p}") for p in others)
    }
    assert not offenders


def test_the_check_sees_imports() -> None:
    names = imported_modules(SRC / "amqp" / "channel.py")
    assert "warren.core.properties" in names


def test_nothing_outside_the_spark_package_imports_it() -> None:
    """warren.spark (the PySpark data source) is a client of the broker, never a part."""
    offenders = {
        f"{path.relative_to(SRC)}: {name}"
        for path in sorted(SRC.rglob("*.py"))
        if "spark" not in path.relative_to(SRC).parts
        for name in imported_modules(path)
        if name == "warren.spark" or name.startswith("warren.spark.")
    }
    assert not offenders
