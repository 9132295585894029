"""Prometheus scrapes under many queues: how long they take, and what clients feel.

    .venv/bin/python bench/metrics_scrape.py --queues 10000

Starts ``python -m warren`` on a scratch data dir, declares N queues (a few
messages in every tenth) over AMQP, then keeps one publisher with confirms
busy (one message in flight, each confirm timed) while it scrapes
``/metrics``, ``/metrics/per-object`` and ``/metrics/detailed`` on the
[prometheus] listener. Prints each endpoint's scrape time (median and worst
of --scrapes) and size, and the publisher's confirm round-trip (median, 99th
percentile, worst) without scrapes and while scraping back to back: a scrape
is read from the broker in slices (warren/metrics/snapshot.py), so the worst
round-trip should stay far below the scrape time.
"""

from __future__ import annotations

import argparse
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

ENDPOINTS = (
    "/metrics",
    "/metrics/per-object",
    "/metrics/detailed?family=queue_coarse_metrics&family=queue_metrics",
)


def confirm_times(port: int, stop: threading.Event, out: list[float]) -> None:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("bench-latency")
    while not stop.is_set():
        start = time.perf_counter()
        ch.basic_publish("", "bench-latency", b"x")
        out.append(time.perf_counter() - start)
        if len(out) % 1000 == 0:
            ch.queue_purge("bench-latency")
    conn.close()


def summary(times: list[float]) -> str:
    ordered = sorted(times)
    p99 = ordered[int(len(ordered) * 0.99)]
    return (
        f"{len(times)} confirms: median {statistics.median(ordered) * 1000:.2f} ms, "
        f"p99 {p99 * 1000:.2f} ms, worst {ordered[-1] * 1000:.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queues", type=int, default=10_000)
    parser.add_argument("--scrapes", type=int, default=5)
    args = parser.parse_args()
    amqp, prom = free_port(), free_port()
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.Popen(
            [sys.executable, "-m", "warren", "-D", f"{tmp}/data", "--amqp-port", str(amqp),
             "--http-port", "-1", "--mqtt-port", "-1", "--prometheus-port", str(prom),
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
            quiet: list[float] = []
            stop = threading.Event()
            t = threading.Thread(target=confirm_times, args=(amqp, stop, quiet))
            t.start()
            time.sleep(3)
            stop.set()
            t.join()
            print("publisher, no scrapes:     ", summary(quiet[100:]))
            busy: list[float] = []
            stop = threading.Event()
            t = threading.Thread(target=confirm_times, args=(amqp, stop, busy))
            t.start()
            for path in ENDPOINTS:
                times, size = [], 0
                for _ in range(args.scrapes):
                    start = time.perf_counter()
                    size = len(urllib.request.urlopen(base + path, timeout=60).read())
                    times.append(time.perf_counter() - start)
                print(
                    f"{path[:40]:<42} median {statistics.median(times) * 1000:.0f} ms, "
                    f"worst {max(times) * 1000:.0f} ms, {size / 1e6:.1f} MB"
                )
            stop.set()
            t.join()
            print("publisher, while scraping: ", summary(busy[100:]))
        finally:
            proc.terminate()
            proc.wait(30)


if __name__ == "__main__":
    main()
