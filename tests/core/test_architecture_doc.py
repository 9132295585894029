"""docs/architecture.md's module list names every module (the guide: the
document matches the code).

Each module under src/warren/ must appear, by file name, in the "The modules"
section under its package's heading line. perf/, ctl/ and spark/ are described
there as packages, a paragraph each, not module by module.
"""

from __future__ import annotations

import re

from paths import REPO
from paths import SRC as SRC_ROOT

SRC = SRC_ROOT / "warren"
DOC = REPO / "docs" / "architecture.md"
#: Packages the document describes as a whole.
AS_A_WHOLE = ("perf", "ctl", "spark")


def _modules_section() -> str:
    text = DOC.read_text(encoding="utf-8")
    start = text.index("## The modules")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def _package_blocks(section: str) -> dict[str, str]:
    """The text under each top-level package line (``  core/ ...``), '' for the top."""
    blocks: dict[str, list[str]] = {"": []}
    current = ""
    for line in section.splitlines():
        m = re.match(r"^  ([a-z_0-9]+)/\s", line)
        if m:
            current = m.group(1)
            blocks.setdefault(current, [])
        elif re.match(r"^  [a-z_0-9]+\.(py|c)\b", line):
            current = ""
        blocks[current].append(line)
    return {k: "\n".join(v) for k, v in blocks.items()}


def test_every_module_is_in_the_module_list() -> None:
    blocks = _package_blocks(_modules_section())
    missing = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC)
        if rel.name in ("__init__.py", "__main__.py") or "__pycache__" in rel.parts:
            continue
        package = rel.parts[0] if len(rel.parts) > 1 else ""
        if package in AS_A_WHOLE:
            continue
        if not re.search(rf"(?<![a-z_0-9]){re.escape(rel.stem)}\.py", blocks.get(package, "")):
            missing.append(str(rel))
    assert not missing, f"docs/architecture.md's module list misses: {missing}"
