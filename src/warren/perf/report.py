"""Rates, latency percentiles, broker memory and the printed/JSON reports of the perf tools.

Latencies are kept in a log-linear histogram (64 buckets per power of two of
microseconds, so any reported value is within about 1.6 % of the true one):
bounded in size however long a run lasts, cheap to fill in a consumer's hot
loop (see :func:`bucket`) and cheap to merge across consumer processes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from typing import Any, TextIO

__all__ = [
    "SUB_BITS",
    "bucket",
    "bucket_value_us",
    "format_count",
    "format_rate",
    "merge_histograms",
    "merge_into",
    "percentiles_ms",
    "pid_note",
    "print_json",
    "print_result",
    "print_rss_change",
    "read_rss",
    "rss_line",
]

#: Histogram resolution: values below 2**SUB_BITS microseconds are exact; above,
#: each power of two is split into 2**(SUB_BITS-1) buckets.
SUB_BITS = 7


def bucket(us: int) -> int:
    """Histogram key of a latency in microseconds (the consumers inline this)."""
    if us < 0:
        return 0
    b = us.bit_length()
    if b <= SUB_BITS:
        return us
    shift = b - SUB_BITS
    return (shift << SUB_BITS) | (us >> shift)


def bucket_value_us(key: int) -> float:
    """The midpoint, in microseconds, of the values that map to ``key``."""
    shift = key >> SUB_BITS
    if shift == 0:
        return float(key)
    # For shift > 0 the mantissa keeps its top bit, so key & mask is in [2**(SUB_BITS-1), 2**SUB_BITS).
    mantissa = key & ((1 << SUB_BITS) - 1)
    low = mantissa << shift
    return low + ((1 << shift) - 1) / 2


def merge_histograms(histograms: Iterable[Mapping[int, int]]) -> dict[int, int]:
    merged: dict[int, int] = {}
    for hist in histograms:
        merge_into(merged, hist)
    return merged


def merge_into(target: dict[int, int], source: Mapping[int, int]) -> None:
    """Add the counts of histogram ``source`` to ``target``."""
    for key, count in source.items():
        target[key] = target.get(key, 0) + count


def percentiles_ms(
    hist: Mapping[int, int], points: Iterable[float] = (50, 95, 99)
) -> dict[str, float] | None:
    """``{"p50": ms, ...}`` (plus min, max, mean and samples) from a histogram; None if empty."""
    total = sum(hist.values())
    if not total:
        return None
    keys = sorted(hist)
    out: dict[str, float] = {}
    for p in points:
        rank = max(1, -(-total * p // 100))  # ceil(total * p / 100), at least the first sample
        seen = 0
        for key in keys:
            seen += hist[key]
            if seen >= rank:
                out[f"p{p:g}"] = round(bucket_value_us(key) / 1000, 3)
                break
    out["min"] = round(bucket_value_us(keys[0]) / 1000, 3)
    out["max"] = round(bucket_value_us(keys[-1]) / 1000, 3)
    out["mean"] = round(sum(bucket_value_us(k) * n for k, n in hist.items()) / total / 1000, 3)
    out["samples"] = total
    return out


def format_rate(rate: float) -> str:
    return f"{rate:,.0f}"


def format_count(n: int) -> str:
    return f"{n:,}"


def read_rss(pid: int) -> dict[str, int] | None:
    """VmRSS, RssAnon, RssFile and VmHWM of a process in KiB (Linux /proc); None if unreadable."""
    fields = ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM")
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name in fields:
                    out[name] = int(rest.split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return out or None


def rss_line(label: str, rss: Mapping[str, int] | None) -> str:
    if rss is None:
        return f"{label}: unavailable"
    parts = [f"VmRSS {rss.get('VmRSS', 0) / 1024:,.1f} MiB"]
    if "RssAnon" in rss:
        parts.append(f"RssAnon {rss['RssAnon'] / 1024:,.1f} MiB")
    return f"{label}: " + ", ".join(parts)


def print_rss_change(
    out: TextIO,
    pid: int,
    before: Mapping[str, int] | None,
    after: Mapping[str, int] | None,
    n: int,
    what: str,
    *,
    with_them: str = "with them open",
    digits: int = 2,
) -> None:
    """The broker's memory before and after, and the difference per one of ``n`` ``what``s."""
    print(rss_line(f"broker pid {pid} before", before), file=out)
    print(rss_line(f"broker pid {pid} {with_them}", after), file=out)
    if before and after and n:
        delta = after.get("VmRSS", 0) - before.get("VmRSS", 0)
        print(
            f"  delta VmRSS {delta / 1024:+,.1f} MiB, {delta / n:,.{digits}f} KiB per {what}",
            file=out,
        )


def print_result(
    result: Any, as_json: bool, out: TextIO, last: str | None, note: str | None
) -> None:
    """The result as JSON, or its ``last`` line and the ``note`` (see :func:`pid_note`)."""
    if as_json:
        print_json(result)
        return
    if last is not None:
        print(last, file=out)
    if note:
        print(note, file=out)


def pid_note(pid: int | None) -> str | None:
    """A line explaining why no broker memory is reported, or None when it can be."""
    if pid is None:
        return "note: pass --pid <broker pid> to report the broker's memory (VmRSS, RssAnon)"
    if not os.path.exists(f"/proc/{pid}/status"):
        return f"note: /proc/{pid}/status is not readable: no broker memory figures"
    return None


def print_json(obj: Any) -> None:
    print(json.dumps(obj, sort_keys=False), flush=True)
