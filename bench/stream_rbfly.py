"""A second stream protocol load generator that shares no code with Warren:
rbfly (asyncio, its codec in Cython), for bench/stream_compare.py.

One producer and one consumer, each in a process of its own (multiprocessing,
'spawn'):

* the consumer iterates ``subscribe(stream, offset=Offset.FIRST)`` (on the
  fresh stream of the run: every message the producer publishes), with
  rbfly's own credit, and counts the messages (decoded as AMQP 1.0, as rbfly
  does by default);
* the producer is rbfly's ``PublisherBatchFast``: ``batch`` messages queued,
  then ``flush``, which sends them in as few Publish frames as fit and waits for
  their confirms (rbfly has one frame per publisher unconfirmed at a time).

Both stop ``seconds`` after the producer started; the counts and each process's
CPU share (of its wall time) come back over a queue.

    .venv/bin/python bench/stream_rbfly.py --port 5552 --stream s --seconds 5 --size 16
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from typing import Any

from client_pair import rates, run_pair  # bench/client_pair.py
from rbfly.streams import Offset, PublisherBatchFast, streams_client


def _uri(host: str, port: int) -> str:
    return f"rabbitmq-stream://guest:guest@{host}:{port}/"


async def _produce(
    host: str, port: int, stream: str, size: int, seconds: float, batch: int
) -> dict[str, Any]:
    client = streams_client(_uri(host, port))
    body = b"\x00" * size
    sent = 0
    try:
        async with client.publisher(stream, cls=PublisherBatchFast) as publisher:
            cpu0 = time.process_time()
            t0 = time.monotonic()
            deadline = t0 + seconds
            while time.monotonic() < deadline:
                for _ in range(batch):
                    publisher.batch(body)
                await publisher.flush()  # returns once confirmed
                sent += batch
            elapsed = time.monotonic() - t0
            cpu = time.process_time() - cpu0
    finally:
        await client.disconnect()
    return {"sent": sent, "confirmed": sent, "cpu": cpu / elapsed}


async def _consume(host: str, port: int, stream: str, seconds: float, ready: Any) -> dict[str, Any]:
    client = streams_client(_uri(host, port))
    count = 0

    async def read() -> None:
        nonlocal count
        async for _msg in client.subscribe(stream, offset=Offset.FIRST):
            count += 1

    task = asyncio.create_task(read())
    ready.set()
    cpu0 = time.process_time()
    t0 = time.monotonic()
    await asyncio.sleep(seconds + 0.5)  # the producer's last batch still arrives
    result = {"received": count, "cpu": (time.process_time() - cpu0) / (time.monotonic() - t0)}
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await client.disconnect()
    return result


def run(
    host: str, port: int, stream: str, seconds: float, size: int, batch: int = 10_000
) -> dict[str, Any]:
    """One timed run, producer and consumer together, on an existing (fresh) stream;
    rates in msg/s and CPU shares."""
    pub, con = run_pair(
        "rbfly",
        _consume,
        (host, port, stream, seconds),
        _produce,
        (host, port, stream, size, seconds, batch),
        seconds,
    )
    return rates(pub, con, seconds)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=5552)
    ap.add_argument("--stream", default="perf-rbfly", help="an existing, empty stream")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--size", type=int, default=16)
    ap.add_argument("--batch", type=int, default=10_000)
    args = ap.parse_args(argv)
    result = run(args.host, args.port, args.stream, args.seconds, args.size, args.batch)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
