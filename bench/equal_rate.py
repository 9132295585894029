"""Latency with publisher confirms at the same fixed rate for every broker.

At full speed a latency percentile mostly measures how much a broker lets
queue up (the faster broker moves many times the messages); at one fixed rate
that all brokers sustain it measures the broker. `compare.py --only latency`
runs these cases against each broker (`warren perf throughput -r RATE`) and
this module renders the section of docs/benchmarks.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

KEY = "latency"
TITLE = "## Latency at an equal rate (publisher confirms)"


@dataclass(frozen=True)
class RateCase:
    key: str
    title: str
    args: tuple[str, ...]


CASES: tuple[RateCase, ...] = (
    RateCase("20k", "20,000 msg/s, confirms", ("-x", "1", "-y", "1", "-c", "1000", "-r", "20000")),
    RateCase(
        "100k", "100,000 msg/s, confirms", ("-x", "1", "-y", "1", "-c", "1000", "-r", "100000")
    ),
    RateCase(
        "persistent20k",
        "20,000 msg/s, persistent to a durable queue, confirms, ack every 100 "
        "(`-p --durable -a 100 -q 1000`)",
        ("-x", "1", "-y", "1", "-c", "1000", "-r", "20000", "-p", "--durable", "-a", "100", "-q", "1000"),
    ),
)


def _p(run: Any, key: str) -> str:
    """A latency percentile of a perf_runs.Run, in ms, or n/a."""
    result = getattr(run, "result", None)
    if not result or not result.get("latency_ms"):
        return "n/a"
    return f"{float(result['latency_ms'][key]):.3f}"


def _rate(run: Any) -> str:
    result = getattr(run, "result", None)
    if not result:
        return "n/a"
    return f"{float(result['consume_rate']):,.0f}"


def render(
    w: Callable[[str], None],
    runs: Mapping[str, Mapping[str, Any]],
    names: list[str],
    seconds: float,
) -> None:
    """The section: one row per case, p50 / p99 per broker (and the rate reached)."""
    if not runs:
        return
    w(TITLE)
    w("")
    w(
        "At full speed the latency columns of the throughput scenarios mostly measure "
        "how much each broker lets queue up. Here every broker gets the same fixed "
        f"publish rate (`warren perf throughput ... -r RATE -z {seconds:g} --json`, "
        "`--only latency`), a rate each of them sustains, so the percentiles measure "
        "the broker's own delay. Latency is from the publisher's send to the "
        "consumer's receipt; with persistent messages Warren confirms only after the "
        "group fsync (LavinMQ 1.0.1 does not fsync)."
    )
    w("")
    w("| Rate, scenario | " + " | ".join(f"{n} p50 / p99 ms" for n in names) + " |")
    w("|---|" + "---:|" * len(names))
    for case in CASES:
        row = runs.get(case.key) or {}
        cells = [f"{_p(row.get(n), 'p50')} / {_p(row.get(n), 'p99')}" for n in names]
        w(f"| {case.title} | " + " | ".join(cells) + " |")
    w("")
    w("Messages per second actually consumed in those runs:")
    w("")
    w("| Rate, scenario | " + " | ".join(names) + " |")
    w("|---|" + "---:|" * len(names))
    for case in CASES:
        row = runs.get(case.key) or {}
        w(f"| {case.title} | " + " | ".join(_rate(row.get(n)) for n in names) + " |")
    w("")
    for case in CASES:
        for name, run in (runs.get(case.key) or {}).items():
            if getattr(run, "error", None):
                w(f"- {name}, {case.title}: {run.error}")
    w("")
