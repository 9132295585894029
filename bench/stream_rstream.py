"""A stream protocol load generator that shares no code with Warren: rstream
(the Python stream client, asyncio), for bench/stream_compare.py.

One producer and one consumer, each in a process of its own (multiprocessing,
'spawn'):

* the consumer subscribes from ``next`` with rstream's default initial credit
  (10 chunks; rstream grants one more per chunk) and counts its callbacks;
* the producer publishes one pre-encoded AMQP 1.0 message (rstream's
  ``AMQPMessage`` encoded once, then sent as bytes: the same bytes on the wire
  without re-encoding per message) with ``send_batch`` in batches of ``batch``,
  keeping at most ``window`` unconfirmed (rstream's confirm callback).

Both stop ``seconds`` after the consumer subscribed and the producer started;
the counts and each process's CPU share (of its wall time) come back over a
queue.

    .venv/bin/python bench/stream_rstream.py --port 5552 --stream s --seconds 5 --size 16
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
from rstream import (
    AMQPMessage,
    ConfirmationStatus,
    Consumer,
    ConsumerOffsetSpecification,
    MessageContext,
    OffsetType,
    Producer,
)

USER = {"username": "guest", "password": "guest"}


async def _produce(
    host: str, port: int, stream: str, size: int, seconds: float, batch: int, window: int
) -> dict[str, Any]:
    body = bytes(AMQPMessage(body=b"\x00" * size))
    messages = [body] * batch
    confirmed = 0
    errors = 0
    room = asyncio.Event()

    def on_confirm(status: ConfirmationStatus) -> None:
        nonlocal confirmed, errors
        confirmed += 1
        if not status.is_confirmed:
            errors += 1
        room.set()

    async with Producer(host, port, **USER) as producer:  # type: ignore[arg-type]
        sent = 0
        cpu0 = time.process_time()
        t0 = time.monotonic()
        deadline = t0 + seconds
        while time.monotonic() < deadline:
            if sent - confirmed >= window:
                room.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(room.wait(), 1)
                continue
            await producer.send_batch(stream, messages, on_publish_confirm=on_confirm)  # type: ignore[arg-type]
            sent += batch
        elapsed = time.monotonic() - t0
        cpu = time.process_time() - cpu0
        end = time.monotonic() + 10
        while confirmed < sent and time.monotonic() < end:
            await asyncio.sleep(0.05)
    return {"sent": sent, "confirmed": confirmed, "errors": errors, "cpu": cpu / elapsed}


async def _consume(host: str, port: int, stream: str, seconds: float, ready: Any) -> dict[str, Any]:
    count = 0

    async def on_message(_msg: Any, _context: MessageContext) -> None:
        nonlocal count
        count += 1

    async with Consumer(host, port, **USER) as consumer:  # type: ignore[arg-type]
        await consumer.subscribe(
            stream,
            on_message,
            offset_specification=ConsumerOffsetSpecification(OffsetType.NEXT, None),
        )
        ready.set()
        cpu0 = time.process_time()
        t0 = time.monotonic()
        await asyncio.sleep(seconds + 0.5)  # the producer's last batch still arrives
        result = {"received": count, "cpu": (time.process_time() - cpu0) / (time.monotonic() - t0)}
    return result


def run(
    host: str,
    port: int,
    stream: str,
    seconds: float,
    size: int,
    batch: int = 100,
    window: int = 10_000,
) -> dict[str, Any]:
    """One timed run, producer and consumer together, on an existing stream; rates in
    msg/s and CPU shares."""
    pub, con = run_pair(
        "rstream",
        _consume,
        (host, port, stream, seconds),
        _produce,
        (host, port, stream, size, seconds, batch, window),
        seconds,
    )
    return rates(pub, con, seconds, errors=pub["errors"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=5552)
    ap.add_argument("--stream", default="perf-rstream", help="an existing stream")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--size", type=int, default=16)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--window", type=int, default=10_000)
    args = ap.parse_args(argv)
    result = run(
        args.host, args.port, args.stream, args.seconds, args.size, args.batch, args.window
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
