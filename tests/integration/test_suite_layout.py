"""The suite's own layout (docs/testing.md, "Where Warren's own tests live"):
test modules sit in a subsystem's directory, their base names are unique
(pytest imports them by base name), none imports another directory's
test module, and each directory is in a pass of make test (tests/passes.py)."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

from passes import GROUPS
from paths import TESTS

# Packages (with __init__.py) are imported by their dotted name: their base
# names may repeat those elsewhere.
PACKAGES = {"spark", "ui", "compat", "harness"}


def _modules() -> list[Path]:
    return sorted(
        p
        for p in TESTS.rglob("test_*.py")
        if p.relative_to(TESTS).parts[0] not in PACKAGES
    )


def test_no_test_module_sits_at_the_top() -> None:
    assert sorted(p.name for p in TESTS.glob("test_*.py")) == []


def test_test_module_names_are_unique() -> None:
    names = Counter(p.name for p in _modules())
    assert [n for n, k in names.items() if k > 1] == []


def test_no_test_module_imports_another_directorys_test_module() -> None:
    where = {p.stem: p.parent for p in _modules()}
    crossing = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                name = node.module
            elif isinstance(node, ast.Import):
                name = node.names[0].name
            else:
                continue
            if name.startswith("test_") and where.get(name) != path.parent:
                crossing.append(f"{path.relative_to(TESTS)} imports {name}")
    assert crossing == []


def test_every_group_is_in_a_pass_of_make_test() -> None:
    groups = {p.relative_to(TESTS).parts[0] for p in TESTS.rglob("test_*.py")}
    assert groups == {g for g in GROUPS if "/" not in g}
    assert [g for g in GROUPS if not (TESTS / g).is_dir()] == []
