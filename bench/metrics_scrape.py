"""Prometheus scrapes under many queues: how long they take, and what clients feel.

    .venv/bin/python bench/metrics_scrape.py --queues 10000

Starts Warren (``python -m warren``'s code, with a loop monitor added) on a
scratch data dir, declares N queues (a few messages in every tenth) over
AMQP, then keeps one publisher with confirms busy (one message in flight,
each confirm round trip timed) while it scrapes ``/metrics``,
``/metrics/per-object`` and ``/metrics/detailed`` on the [prometheus]
listener in turn, with as long a pause after each scrape as the scrape
took. Prints each endpoint's scrape time (median and worst of --scrapes)
and size, the publisher's round trips that overlapped its scrapes (median,
99th percentile, worst), and the loop's stalls during them: the monitor
wakes every millisecond and records how late it woke (wall time) and how
much CPU the broker process used meanwhile (its threads, not other
processes), so a stall of the broker itself (the loop busy, or waiting for
the GIL) shows apart from another process taking the core. The same figures
between scrapes are the baseline: on a shared machine the wall-clock worst
cases carry other processes' noise either way.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import pika

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from free_ports import free_port  # noqa: E402

#: Runs Warren's CLI with a task that records the loop's late wake-ups
#: (monotonic time, how late, process CPU since the previous wake-up), and
#: what holds the loop besides scrapes: the garbage collector's full
#: collections and the broker's rate sampler (every 5 s, every queue): their
#: (start, duration), written as JSON to argv[1] when the broker stops.
MONITORED = """
import asyncio, gc, json, sys, time
from warren import broker, cli

out, late, full, sampled = sys.argv[1], [], [], []
started = [0.0]
sample_stats = broker.Broker.sample_stats

def timed_sample(self, now_s):
    start = time.monotonic()
    try:
        return sample_stats(self, now_s)
    finally:
        sampled.append((start, time.monotonic() - start))

broker.Broker.sample_stats = timed_sample

def collected(phase, info):
    if info["generation"] == 2:
        if phase == "start":
            started[0] = time.monotonic()
        else:
            full.append((started[0], time.monotonic() - started[0]))

gc.callbacks.append(collected)

async def monitor():
    last, cpu = time.monotonic(), time.process_time()
    while True:
        await asyncio.sleep(0.001)
        now, now_cpu = time.monotonic(), time.process_time()
        if now - last > 0.002:
            late.append((now, now - last - 0.001, now_cpu - cpu))
        last, cpu = now, now_cpu

serve = cli._serve

async def monitored(config):
    task = asyncio.ensure_future(monitor())
    try:
        return await serve(config)
    finally:
        task.cancel()
        with open(out, "w") as f:
            json.dump({"late": late, "full_collections": full, "sampled": sampled}, f)

cli._serve = monitored
sys.exit(cli.main(sys.argv[2:]))
"""

ENDPOINTS = (
    "/metrics",
    "/metrics/per-object",
    "/metrics/detailed?family=queue_coarse_metrics&family=queue_metrics",
)


def confirm_times(port: int, stop: threading.Event, out: list[tuple[float, float]]) -> None:
    """(start, duration) of each publish's confirm round trip until ``stop``."""
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("bench-latency")
    while not stop.is_set():
        start = time.perf_counter()
        ch.basic_publish("", "bench-latency", b"x")
        out.append((start, time.perf_counter() - start))
        if len(out) % 1000 == 0:
            ch.queue_purge("bench-latency")
    conn.close()


def summary(times: list[float]) -> str:
    if not times:
        return "no round trips"
    ordered = sorted(times)
    p99 = ordered[int(len(ordered) * 0.99)]
    return (
        f"{len(times):5} round trips: median {statistics.median(ordered) * 1000:.2f} ms, "
        f"p99 {p99 * 1000:.1f} ms, worst {ordered[-1] * 1000:.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queues", type=int, default=10_000)
    parser.add_argument("--scrapes", type=int, default=10)
    args = parser.parse_args()
    amqp, prom = free_port(), free_port()
    with tempfile.TemporaryDirectory() as tmp:
        stalls_file = Path(tmp) / "stalls.json"
        proc = subprocess.Popen(
            [sys.executable, "-c", MONITORED, str(stalls_file),
             "-D", f"{tmp}/data", "--amqp-port", str(amqp),
             "--http-port", "-1", "--mqtt-port", "-1", "--stream-port", "-1", "--prometheus-port", str(prom),
             "--log-level", "warning"],
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp))
                    break
                except pika.exceptions.AMQPConnectionError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            ch = conn.channel()
            for i in range(args.queues):
                ch.queue_declare(f"q{i}")
                if i % 10 == 0:
                    for _ in range(3):
                        ch.basic_publish("", f"q{i}", b"m" * 100)
            conn.close()
            print(f"{args.queues} queues declared")
            base = f"http://127.0.0.1:{prom}"
            trips: list[tuple[float, float]] = []
            stop = threading.Event()
            t = threading.Thread(target=confirm_times, args=(amqp, stop, trips))
            t.start()
            time.sleep(1)
            scrapes: dict[str, list[tuple[float, float]]] = {path: [] for path in ENDPOINTS}
            pauses: list[tuple[float, float]] = []
            sizes: dict[str, int] = {}
            # time.monotonic: the broker's monitor uses the same clock.
            offset = time.monotonic() - time.perf_counter()
            for _ in range(args.scrapes):
                for path in ENDPOINTS:
                    start = time.perf_counter()
                    sizes[path] = len(urllib.request.urlopen(base + path, timeout=60).read())
                    end = time.perf_counter()
                    scrapes[path].append((start, end))
                    time.sleep(end - start)
                    pauses.append((end, time.perf_counter()))
            stop.set()
            t.join()
        finally:
            proc.terminate()
            proc.wait(30)
        record = json.loads(stalls_file.read_text()) if stalls_file.exists() else {}
    stalls = record.get("late", [])
    collections = record.get("full_collections", [])
    sampled = record.get("sampled", [])

    def overlapping(spans: list[tuple[float, float]]) -> list[float]:
        return [d for s, d in trips if any(a < s + d and s < b for a, b in spans)]

    def within(when: float, spans: list[tuple[float, float]]) -> bool:
        return any(a + offset <= when <= b + offset for a, b in spans)

    def loop(spans: list[tuple[float, float]]) -> str:
        """The loop's worst late wake-up within the spans (wall, and the
        process's CPU meanwhile), full collections and the rate sampler aside,
        and those."""
        gcs = [(s, d) for s, d in collections if within(s, spans)]
        samplers = [d for s, d in sampled if within(s, spans)]
        inside = [
            (late, cpu)
            for when, late, cpu in stalls
            if within(when, spans)
            and not any(
                s <= when and when - late - 0.001 <= s + d for s, d in collections + sampled
            )
        ]
        text = "loop late by at most " + (
            f"{max(late for late, _ in inside) * 1000:.1f} ms (wall), "
            f"{max(cpu for _, cpu in inside) * 1000:.1f} ms (CPU)"
            if inside
            else "1 ms"
        )
        if gcs:
            text += f"; {len(gcs)} full collections, longest {max(d for _, d in gcs) * 1000:.0f} ms"
        if samplers:
            text += f"; rate sampler {len(samplers)}x, longest {max(samplers) * 1000:.0f} ms"
        return text

    print("between scrapes:", summary(overlapping(pauses)))
    print("    ", loop(pauses))
    for path in ENDPOINTS:
        took = [b - a for a, b in scrapes[path]]
        print(
            f"{path[:40]:<42} scrape median {statistics.median(took) * 1000:.0f} ms, "
            f"worst {max(took) * 1000:.0f} ms, {sizes[path] / 1e6:.1f} MB"
        )
        print("    during its scrapes:", summary(overlapping(scrapes[path])))
        print("    ", loop(scrapes[path]))


if __name__ == "__main__":
    main()
