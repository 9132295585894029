"""The stream protocol's delivery alone (issue 31): a stream filled with N
messages, then drained by one consumer from ``first``, on two Warren builds
up at once, the drains alternating between them (a loaded machine hits both
alike).

    .venv/bin/python bench/stream_drain.py --before-src ../main/src            # 20M of 16 B, 4 rounds
    .venv/bin/python bench/stream_drain.py --before-src ../main/src --count 5000000 --size 1024

Each build (``--before-src`` DIR and this checkout's src/, compiled when
``make build`` has been run there) is a fresh Warren (stream_compare.py's
WarrenStream). ``warren perf stream`` (this checkout's) fills the stream
with one producer (confirms, window 10,000, 100 per Publish, as
stream_compare.py), then each round drains it with one consumer from
``first`` with 10 chunks of credit, one more per chunk: what a consumer pays
per chunk shows here, the publisher's cost does not. Reported per drain:
msg/s, records per chunk, and the broker's and the consumer's CPU over the
drain (for the whole stream: per message is that over the count).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import amqp_brokers as brokers  # noqa: E402
import stream_compare as sc  # noqa: E402

_DRAIN_SECONDS = 8


def fill(broker: sc.WarrenStream, count: int, size: int) -> dict[str, Any]:
    sc.fresh_stream(broker.stream_port)
    args = ["stream", "--uri", sc.uri(broker.stream_port), "--stream", sc.STREAM]
    args += ["-x", "1", "-y", "0", "-C", str(count), "-s", str(size)]
    args += ["-b", "100", "-c", "10000", "--keep"]
    return sc.perf_json(args, 600)


def drain(broker: sc.WarrenStream, size: int) -> dict[str, Any]:
    args = ["stream", "--uri", sc.uri(broker.stream_port), "--stream", sc.STREAM]
    args += ["-x", "0", "-y", "1", "--offset", "first", "-q", "10"]
    args += ["-z", str(_DRAIN_SECONDS), "-s", str(size), "--keep"]
    cpu0 = sc.cpu_seconds(broker.pid)
    s = sc.perf_json(args, _DRAIN_SECONDS)
    return {
        "consumed": s["consumed"],
        "rate": s["consume_rate"],
        "records_per_chunk": s["records_per_chunk"],
        "broker_cpu_s": round(sc.cpu_seconds(broker.pid) - cpu0, 2),
        "consumer_cpu_s": round(s["client_cpu"]["consumers"][0] * _DRAIN_SECONDS, 2),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before-src", required=True, metavar="DIR", help="the other build's src/")
    ap.add_argument("--count", type=int, default=20_000_000)
    ap.add_argument("--size", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args(argv)
    builds: dict[str, sc.WarrenStream] = {}
    results: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    try:
        for name, src in (("before", args.before_src), ("after", str(ROOT / "src"))):
            brokers.set_warren_src(src)
            builds[name] = sc.WarrenStream()
            builds[name].start()
            filled = fill(builds[name], args.count, args.size)
            print(json.dumps({"fill": name, "rate": filled["publish_rate"]}), flush=True)
        for r in range(args.rounds):
            for name in ("before", "after") if r % 2 == 0 else ("after", "before"):
                got = drain(builds[name], args.size)
                results[name].append(got)
                print(json.dumps({"round": r, "build": name, **got}), flush=True)
    finally:
        for b in builds.values():
            b.stop()
    for name, runs in results.items():
        rates = [r["rate"] for r in runs]
        print(
            f"{name}: median {statistics.median(rates):,.0f} msg/s over {len(runs)} drains, "
            f"{runs[0]['records_per_chunk']:,.1f} records per chunk"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
