"""Times each built variant of publish_to_deliver (build.sh first).

    python bench/fastpath_ab/measure.py [--runs 7] [--seconds 0.15] [--json FILE]

Inputs: reads of one message (the per-call cost) and of 64 KiB and 1 MiB
(whole messages only) of publishes with 16-byte and 4 KiB bodies, as a publisher sends them (exchange "", a 15-byte
routing key, delivery-mode property); frame_max 131072. Each run calls a
variant on one input for about --seconds and gives ns per message; the runs
rotate the variants' order, and the table shows the median of the runs and
the spread (min..max) as a percentage of the median."""

from __future__ import annotations

import argparse
import json
import statistics
import struct
import sys
import time

from variants import load

FRAME_MAX = 131072


def frame(ftype: int, channel: int, payload: bytes) -> bytes:
    return struct.pack(">BHI", ftype, channel, len(payload)) + payload + b"\xce"


def message(body_size: int, channel: int = 1) -> bytes:
    rk = b"perf-queue-0001"
    return (
        frame(1, channel, struct.pack(">HHH", 60, 40, 0) + b"\x00" + bytes([len(rk)]) + rk + b"\x00")
        + frame(2, channel, struct.pack(">HHQ", 60, 0, body_size) + b"\x10\x00\x02")
        + frame(3, channel, bytes(range(256)) * (body_size // 256) + b"x" * (body_size % 256))
    )


def read_of(body_size: int, read_size: int) -> tuple[bytes, int]:
    one = message(body_size)
    count = read_size // len(one)
    return one * count, count


CASES = {
    "16 B body, 1 message per read": (16, len(message(16))),
    "16 B bodies, 64 KiB read": (16, 64 * 1024),
    "4 KiB bodies, 64 KiB read": (4096, 64 * 1024),
    "16 B bodies, 1 MiB read": (16, 1024 * 1024),
    "4 KiB bodies, 1 MiB read": (4096, 1024 * 1024),
}


def time_one(kernel, data: bytes, count: int, seconds: float) -> float:  # type: ignore[no-untyped-def]
    ctag = b"\x1famq.ctag-0123456789abcdefghijk"[:32]
    calls = 1
    while True:
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            kernel(data, 0, 1, ctag, 1, FRAME_MAX)
        elapsed = time.perf_counter_ns() - t0
        if elapsed >= seconds * 1e9:
            return elapsed / calls / count
        calls = max(calls * 2, int(calls * seconds * 1e9 / max(elapsed, 1) * 1.1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=0.15)
    parser.add_argument("--json")
    args = parser.parse_args()
    kernels = load()
    names = list(kernels)
    results: dict[str, dict[str, list[float]]] = {}
    for case, (body, read) in CASES.items():
        data, count = read_of(body, read)
        expected = kernels["python"](data, 0, 1, b"\x03tag", 1, FRAME_MAX)
        assert expected[:2] == (len(data), count)
        for name, kernel in kernels.items():  # the same answer, and warmed up
            assert kernel(data, 0, 1, b"\x03tag", 1, FRAME_MAX) == expected, name
        runs: dict[str, list[float]] = {name: [] for name in names}
        for run in range(args.runs):
            order = names[run % len(names):] + names[: run % len(names)]
            for name in order:
                runs[name].append(time_one(kernels[name], data, count, args.seconds))
        results[case] = runs
        print(f"\n{case}: {count} messages of {len(data) // count} bytes per call", flush=True)
        base_py = statistics.median(runs["python"])
        base_mypyc = statistics.median(runs["mypyc"]) if "mypyc" in runs else float("nan")
        print(f"  {'variant':8} {'ns/msg':>9} {'spread':>14} {'vs python':>10} {'vs mypyc':>9}")
        for name in names:
            med = statistics.median(runs[name])
            lo, hi = min(runs[name]), max(runs[name])
            print(f"  {name:8} {med:9.1f} {100 * (lo - med) / med:+6.1f}..{100 * (hi - med) / med:+5.1f}% "
                  f"{base_py / med:9.1f}x {base_mypyc / med:8.1f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": args.runs, "seconds": args.seconds, "python": sys.version, "results": results}, f,
                      indent=1)


if __name__ == "__main__":
    main()
