"""The Prometheus text format (0.0.4), written straight from tuples and columns.

prometheus-client's families build a Sample object per value: 1.2 s for the
200,000 samples of /metrics/per-object under 10,000 queues on the reference
machine. Here a family of one sample per queue is joined in C from each
queue's label text (kept between scrapes, :class:`LabelCache`) and its value
(no Python code per sample), and the text is taken in chunks
(:meth:`Text.take`) that the endpoint sends as they are made, giving the
loop back in between (http/prometheus.py; docs/benchmarks.md). Tests parse
the output with prometheus-client's parser, and a real Prometheus scrapes it
(tests/http/test_prometheus_server.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from operator import add

__all__ = ["CONTENT_TYPE", "LabelCache", "Text", "labels"]

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


class LabelCache:
    """Each queue's ``{vhost="...",queue="..."} `` text, made once and kept while
    the queue is there: a scrape of 10,000 queues does not escape and format
    10,000 label sets again. A scrape asks for its queues in slices
    (:meth:`queues`), then :meth:`done` forgets the queues it did not ask for.
    Keyed by vhost, then by name: no key object per queue, which the garbage
    collector would track (10,000 more on every scrape set off collections)."""

    def __init__(self) -> None:
        self._texts: dict[str, dict[str, str]] = {}
        self._seen: dict[str, dict[str, str]] = {}

    def queues(self, vhosts: Sequence[str], names: Sequence[str]) -> list[str]:
        """The texts of these queues."""
        out: list[str] = []
        vhost = None
        old: dict[str, str] = {}
        seen: dict[str, str] = {}
        for v, name in zip(vhosts, names, strict=True):
            if v != vhost:
                vhost = v
                old = self._texts.get(v, {})
                seen = self._seen.setdefault(v, {})
            text = old.get(name)
            if text is None:
                text = "{" + labels(vhost=v, queue=name) + "} "
            seen[name] = text
            out.append(text)
        return out

    def done(self) -> None:
        """The scrape asked for all its queues: keep only theirs."""
        self._texts, self._seen = self._seen, {}


class Text:
    """An exposition being written: families in order, each with its samples,
    taken in chunks as it goes (:meth:`take`) or whole (:meth:`bytes`)."""

    def __init__(self) -> None:
        self._parts: list[str] = []

    @property
    def pending(self) -> int:
        """Roughly how many samples were written since the last take."""
        return len(self._parts)

    def family(
        self, name: str, mtype: str, help_text: str, samples: Iterable[tuple[str, float]]
    ) -> None:
        """``samples``: (label text or "", value)."""
        self.head(name, mtype, help_text)
        self._parts.extend(
            f"{name}{{{lt}}} {v if type(v) is int else _number(v)}\n"
            if lt
            else f"{name} {v if type(v) is int else _number(v)}\n"
            for lt, v in samples
        )

    def series(self, name: str, prefixes: Sequence[str], values: Sequence[float | None]) -> None:
        """Samples of one family (its head written before), one per object:
        ``prefixes`` are the objects' ``{labels} `` texts (LabelCache),
        ``values`` ints, finite floats or None (no sample). Joined in C: no
        Python code, no object the garbage collector tracks, per sample."""
        if not prefixes:
            return
        if None in values:
            kept = [(p, v) for p, v in zip(prefixes, values, strict=True) if v is not None]
            if not kept:
                return
            prefixes = [p for p, _ in kept]
            values = [v for _, v in kept]
        texts = list(map(str, values))  # ints and finite floats read as _number writes them
        if texts.count(texts[0]) == len(texts):  # one value for all (zeros, mostly)
            tail = texts[0] + "\n"
            self._parts.append(name + (tail + name).join(prefixes) + tail)
            return
        self._parts.append(name + ("\n" + name).join(map(add, prefixes, texts)) + "\n")

    def head(self, name: str, mtype: str, help_text: str) -> None:
        help_text = help_text.replace("\\", "\\\\").replace("\n", "\\n")
        self._parts.append(f"# TYPE {name} {mtype}\n# HELP {name} {help_text}\n")

    def take(self) -> str:
        """What was written since the last take."""
        text = "".join(self._parts)
        self._parts = []
        return text

    def bytes(self) -> bytes:
        return self.take().encode("utf-8")
