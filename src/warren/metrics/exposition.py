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
from collections.abc import Iterable, Sequence

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
        self._head(name, mtype, help_text)
        self._parts.extend(
            f"{name}{{{lt}}} {v if type(v) is int else _number(v)}\n"
            if lt
            else f"{name} {v if type(v) is int else _number(v)}\n"
            for lt, v in samples
        )

    def series(
        self,
        name: str,
        mtype: str,
        help_text: str,
        label_texts: Sequence[str],
        values: Sequence[float | None],
    ) -> None:
        """One sample per object, from parallel sequences (None: no sample): no
        tuple per sample, so 200,000 samples do not wake the garbage collector."""
        self._head(name, mtype, help_text)
        self._parts.extend(
            [
                f"{name}{{{lt}}} {v if type(v) is int else _number(v)}\n"
                for lt, v in zip(label_texts, values, strict=True)
                if v is not None
            ]
        )

    def _head(self, name: str, mtype: str, help_text: str) -> None:
        help_text = help_text.replace("\\", "\\\\").replace("\n", "\\n")
        self._parts.append(f"# TYPE {name} {mtype}\n# HELP {name} {help_text}\n")

    def bytes(self) -> bytes:
        return "".join(self._parts).encode("utf-8")
