"""The Prometheus text format (0.0.4), written straight from tuples.

prometheus-client's families build a Sample object per value: 1.2 s for the
200,000 samples of /metrics/per-object under 10,000 queues on the reference
machine, where these few lines, which reuse each queue's label text for all
of its families, take about a tenth of that (docs/benchmarks.md). Tests parse
the output with prometheus-client's parser, and a real Prometheus scrapes it
(tests/test_prometheus_server.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

__all__ = ["CONTENT_TYPE", "Text", "labels"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _escape(value: str) -> str:
    if "\\" in value or '"' in value or "\n" in value:
        value = value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return value


def labels(**pairs: str) -> str:
    """``name="value",...`` in the order given, values escaped."""
    return ",".join(f'{k}="{_escape(v)}"' for k, v in pairs.items())


def _number(value: float) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


class Text:
    """An exposition being written: families in order, each with its samples."""

    def __init__(self) -> None:
        self._parts: list[str] = []

    def family(
        self, name: str, mtype: str, help_text: str, samples: Iterable[tuple[str, float]]
    ) -> None:
        """``samples``: (label text or "", value)."""
        help_text = help_text.replace("\\", "\\\\").replace("\n", "\\n")
        out = self._parts
        out.append(f"# TYPE {name} {mtype}\n# HELP {name} {help_text}\n")
        for label_text, value in samples:
            if label_text:
                out.append(f"{name}{{{label_text}}} {_number(value)}\n")
            else:
                out.append(f"{name} {_number(value)}\n")

    def bytes(self) -> bytes:
        return "".join(self._parts).encode("utf-8")
