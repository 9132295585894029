"""Human output of ``warren ctl``: aligned tables and key/value blocks.

``--json`` bypasses all of this and prints the API's JSON as it came.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, TextIO

__all__ = ["Column", "cell", "field", "render_pairs", "render_table"]

#: A column: its header and how to get its value from one API object.
Getter = Callable[[dict[str, Any]], Any]


class Column:
    def __init__(self, header: str, get: str | Getter) -> None:
        self.header = header
        self.get: Getter = _getter(get) if isinstance(get, str) else get


def _getter(dotted: str) -> Getter:
    def get(obj: dict[str, Any]) -> Any:
        return field(obj, dotted)

    return get


def field(obj: Any, dotted: str) -> Any:
    """``obj["a"]["b"]`` for ``"a.b"``; None when any step is missing."""
    for key in dotted.split("."):
        if not isinstance(obj, dict) or key not in obj:
            return None
        obj = obj[key]
    return obj


def cell(value: Any) -> str:
    """One value as table text: lists joined by commas, objects as compact JSON."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list):
        if all(isinstance(v, str | int | float) and not isinstance(v, bool) for v in value):
            return ",".join(str(v) for v in value)
        return json.dumps(value, separators=(",", ":"), sort_keys=True)
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"), sort_keys=True) if value else ""
    text = str(value)
    # A table row is one line: control characters would break the alignment.
    return text.replace("\r", "\\r").replace("\n", "\\n").replace("\t", "\\t")


def _numeric(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def render_table(
    rows: Sequence[dict[str, Any]],
    columns: Sequence[Column],
    out: TextIO,
    headers: bool = True,
) -> None:
    """Columns separated by two spaces, numbers right-aligned, a header line first."""
    raw = [[c.get(r) for c in columns] for r in rows]
    text = [[cell(v) for v in row] for row in raw]
    widths = [len(c.header) if headers else 0 for c in columns]
    for row in text:
        for i, t in enumerate(row):
            widths[i] = max(widths[i], len(t))
    right = [
        bool(raw) and all(_numeric(row[i]) or row[i] is None for row in raw)
        for i in range(len(columns))
    ]

    def line(cells: Sequence[str]) -> str:
        parts = [
            c.rjust(widths[i]) if right[i] else c.ljust(widths[i]) for i, c in enumerate(cells)
        ]
        return "  ".join(parts).rstrip()

    if headers:
        out.write(line([c.header for c in columns]) + "\n")
    for row in text:
        out.write(line(row) + "\n")


def render_pairs(pairs: Sequence[tuple[str, Any]], out: TextIO) -> None:
    """``key  value`` lines with the keys aligned (a single object, e.g. ``status``)."""
    width = max((len(k) for k, _ in pairs), default=0)
    for key, value in pairs:
        out.write(f"{key.ljust(width)}  {cell(value)}".rstrip() + "\n")
