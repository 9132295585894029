"""Memory and time of the rates and lengths history under 10,000 queues.

Each queue has what the broker samples for it: a MessageStats (its message_stats)
and a GaugeStats of 3 (its lengths), each with a History under RabbitMQ's basic
retention policy (605 s every 5 s, then an hour every 60 s). The sampler runs on
its own clock, 5 s a round, long enough for every tier to fill (an hour and
605 s: 841 rounds), in two scenarios:

- ``busy``: every queue's counters and lengths move in every round (publish,
  deliver, ack and redeliver by a few dozen, the lengths up and down): the
  worst case, one record per round per object;
- ``idle``: nothing moves (most queues of a real broker): one record each.

Printed: the bytes the histories hold at the end (every object reachable from
the queues' History objects, each counted once: sys.getsizeof over
gc.get_referents), per queue and for all of them; the process's resident memory
growth; and the time of one sampling round. The same script run on an older
tree (PYTHONPATH=<its src>) measures its History the same way. Run:

    PYTHONPATH=src python bench/stats_history.py [--queues 10000] [--json out.json]

Numbers: docs/benchmarks.md ("The rates history under 10,000 queues").
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import re
import sys
import time
from pathlib import Path
from typing import Any

from warren.core.stats import GaugeStats, MessageStats

STEP = 5.0
ROUNDS = int((3600 + 605) / STEP) + 1  # every tier of the basic policy full
T0 = 1_794_999_600.0


def _objects(queues: int) -> list[tuple[MessageStats, GaugeStats]]:
    return [(MessageStats(), GaugeStats(3)) for _ in range(queues)]


def _move(objects: list[tuple[MessageStats, GaugeStats]], rng: random.Random) -> None:
    """One round of traffic on every queue: counters only, as the hot path counts."""
    for stats, lengths in objects:
        n = rng.randint(1, 60)
        stats.publish += n
        stats.deliver += n
        stats.ack += rng.randint(0, n)
        stats.redeliver += rng.randint(0, 2)
        ready = rng.randint(0, 500)
        unacked = rng.randint(0, 50)
        lengths.values = (ready + unacked, ready, unacked)


def _round(objects: list[tuple[MessageStats, GaugeStats]], t: float) -> None:
    for stats, lengths in objects:
        stats.sample(STEP, t)
        lengths.sample(STEP, t)


def deep_size(roots: list[Any]) -> int:
    """Bytes of every object reachable from ``roots``, each counted once (classes,
    modules and functions excluded: they are shared, not history)."""
    seen: set[int] = set()
    total = 0
    stack = list(roots)
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, type | type(sys) | type(deep_size)):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        stack.extend(gc.get_referents(obj))
    return total


def rss_kb() -> int:
    text = Path("/proc/self/status").read_text()
    found = re.search(r"VmRSS:\s+(\d+) kB", text)
    return int(found.group(1)) if found else 0


def records(history: Any) -> int:
    """Records (or entries, in older trees) a history keeps."""
    if hasattr(history, "records"):
        return len(history.records())
    return len(history.entries)


def run(queues: int, scenario: str) -> dict[str, Any]:
    rng = random.Random(1)
    objects = _objects(queues)
    gc.collect()
    rss_before = rss_kb()
    timings = []
    for i in range(ROUNDS):
        if scenario == "busy":
            _move(objects, rng)
        start = time.perf_counter()
        _round(objects, T0 + i * STEP)
        timings.append(time.perf_counter() - start)
    gc.collect()
    held = deep_size([h for s, g in objects for h in (s.history, g.history)])
    timings.sort()
    return {
        "queues": queues,
        "scenario": scenario,
        "rounds": ROUNDS,
        "history_bytes": held,
        "bytes_per_queue": round(held / queues),
        "records_per_queue": round(
            sum(records(s.history) + records(g.history) for s, g in objects) / queues, 1
        ),
        "rss_growth_mb": round((rss_kb() - rss_before) / 1024, 1),
        "round_ms_median": round(timings[len(timings) // 2] * 1000, 1),
        "round_ms_p99": round(timings[len(timings) * 99 // 100] * 1000, 1),
        "round_ms_max": round(timings[-1] * 1000, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queues", type=int, default=10_000)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    results = []
    for scenario in ("idle", "busy"):
        result = run(args.queues, scenario)
        print(json.dumps(result), flush=True)
        results.append(result)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
