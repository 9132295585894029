"""Broker RAM while stream protocol consumers read a long stream end to end
(issue 31: "consumers reading a 10M-message stream without the broker's RSS
growing"). bench/stream_memory.py does the same over AMQP 0-9-1.

    .venv/bin/python bench/stream_protocol_memory.py --count 10000000 --consumers 2

It starts `python -m warren` on a scratch data dir with only the stream
listener, publishes N 16-byte messages with `warren perf stream` (1,000 to a
Publish: chunk records), then starts the consumers, each an rstream Consumer
in a process of its own, subscribed from ``first`` and counting its
callbacks until it has N. The broker's RssAnon is sampled every 0.5 s
meanwhile (mapped segment pages are page cache, not counted). Printed: RssAnon
empty, after publishing, its peak while the consumers read, and the rates.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def rss_anon_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    return 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def consume(port: int, stream: str, count: int, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    from rstream import Consumer, ConsumerOffsetSpecification, OffsetType

    async def main() -> None:
        n = 0
        done = asyncio.Event()

        async def on(_msg: object, _ctx: object) -> None:
            nonlocal n
            n += 1
            if n >= count:
                done.set()

        start = time.monotonic()
        async with Consumer("127.0.0.1", port=port, username="guest", password="guest") as c:
            spec = ConsumerOffsetSpecification(OffsetType.FIRST)
            await c.subscribe(stream, on, offset_specification=spec, initial_credit=50)
            await asyncio.wait_for(done.wait(), 1800)
        out.put((n, time.monotonic() - start))

    asyncio.run(main())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=10_000_000)
    ap.add_argument("--consumers", type=int, default=1)
    args = ap.parse_args()
    data = Path(tempfile.mkdtemp(prefix="warren-stream-memory-"))
    port = free_port()
    broker = subprocess.Popen(
        [sys.executable, "-m", "warren", "--data-dir", str(data), "--no-sync"]
        + ["--amqp-port", "0", "--mqtt-port", "-1", "--http-port", "-1"]
        + ["--prometheus-port", "-1", "--stream-port", str(port)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        empty = rss_anon_kb(broker.pid)
        uri = f"rabbitmq-stream://guest:guest@127.0.0.1:{port}/%2F"
        perf = [sys.executable, "-m", "warren", "perf", "stream"]
        t = time.monotonic()
        subprocess.run(
            [*perf, "--uri", uri, "--stream", "big", "-y", "0", "-s", "16", "-b", "1000"]
            + ["-C", str(args.count), "--keep", "-z", "1800"],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        published_s = time.monotonic() - t
        after_publish = rss_anon_kb(broker.pid)
        peak = [after_publish]
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(0.5):
                peak[0] = max(peak[0], rss_anon_kb(broker.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        ctx = multiprocessing.get_context("spawn")
        out: multiprocessing.Queue = ctx.Queue()  # type: ignore[type-arg]
        procs = [
            ctx.Process(target=consume, args=(port, "big", args.count, out))
            for _ in range(args.consumers)
        ]
        for p in procs:
            p.start()
        results = [out.get(timeout=1900) for _ in procs]
        for p in procs:
            p.join()
        stop.set()
        sampler.join()
        print(f"stream protocol, {args.count:,} messages of 16 B, {args.consumers} consumer(s)")
        print(f"  published in {published_s:.1f} s ({args.count / published_s:,.0f} msg/s)")
        for n, seconds in results:
            print(f"  a consumer read {n:,} in {seconds:.1f} s ({n / seconds:,.0f} msg/s)")
        print(f"  broker RssAnon: empty {empty:,} kB, after publishing {after_publish:,} kB,")
        print(
            f"  peak while reading {peak[0]:,} kB ({(peak[0] - empty) * 1024 / args.count:.3f} B per message)"
        )
    finally:
        broker.terminate()
        broker.wait(30)
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    main()
