"""Sub-entry batches (issue 31) survive kill -9: a real `warren` process is
killed while rstream publishes gzip batches with a publisher reference; after
a restart on the same data dir every confirmed batch is read back by rstream
with one offset per record, in order, and the reference's sequence is the
last stored batch's publishing id (one per batch; rstream numbers a batch
with the last of as many ids as it has records)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path

import pytest
from procs import start_warren_stream
from rstream import (
    ConfirmationStatus,
    Consumer,
    ConsumerOffsetSpecification,
    MessageContext,
    OffsetType,
    RawMessage,
)
from rstream.compression import CompressionType
from test_stream_kill9 import HOST, producer, stop

pytestmark = pytest.mark.timeout(120)

PER_BATCH = 10
BATCHES = 120
KILL_AFTER = 20


def batch(n: int) -> list[RawMessage]:
    """Batch ``n``: records "b<n>-<k>", message n * PER_BATCH + k of the stream."""
    return [RawMessage(b"b%d-%d" % (n, k)) for k in range(PER_BATCH)]


async def publish_until_killed(port: int, pid: int) -> set[int]:
    """Publishing ids (one per batch: PER_BATCH * (n + 1)) confirmed before the kill."""
    confirmed: set[int] = set()
    killed = asyncio.Event()

    def on_confirm(status: ConfirmationStatus) -> None:
        if killed.is_set() or not status.is_confirmed:
            return
        confirmed.add(status.message_id)
        if len(confirmed) >= KILL_AFTER:
            killed.set()
            os.kill(pid, signal.SIGKILL)

    p = producer(port)
    await p.start()
    await p.create_stream("k9b")
    with contextlib.suppress(Exception):
        for n in range(BATCHES):
            if killed.is_set():
                break
            await p.send_sub_entry(
                "k9b",
                batch(n),
                compression_type=CompressionType.Gzip,
                publisher_name="app",
                on_publish_confirm=on_confirm,
            )
            await asyncio.sleep(0.002)
        await asyncio.wait_for(killed.wait(), 30)
    with contextlib.suppress(BaseException):
        await asyncio.wait_for(p.close(), 5)
    return confirmed


async def read_all(port: int, expect: int) -> list[tuple[int, bytes]]:
    got: list[tuple[int, bytes]] = []
    done = asyncio.Event()

    async def on_message(msg: bytes, ctx: MessageContext) -> None:
        got.append((ctx.offset, bytes(msg)))
        if len(got) >= expect:
            done.set()

    async with Consumer(HOST, port, username="guest", password="guest") as consumer:
        await consumer.subscribe(
            "k9b",
            on_message,
            offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST),
        )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), 20)
    return got


async def sequence(port: int) -> int:
    async with producer(port) as p:
        client = await p.default_client
        return await client.query_publisher_sequence("k9b", "app")


def test_confirmed_batches_survive_kill_9(tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc, port = start_warren_stream(data)
    try:
        confirmed = asyncio.run(publish_until_killed(port, proc.pid))
        proc.wait(10)
        assert proc.returncode == -signal.SIGKILL
        assert BATCHES > len(confirmed) >= KILL_AFTER
        stop(proc)
        proc, port = start_warren_stream(data)
        seq = asyncio.run(sequence(port))
        assert seq >= max(confirmed) and seq % PER_BATCH == 0
        stored = seq // PER_BATCH  # batches, each kept whole
        got = asyncio.run(read_all(port, stored * PER_BATCH))
        assert got == [
            (n * PER_BATCH + k, b"b%d-%d" % (n, k)) for n in range(stored) for k in range(PER_BATCH)
        ]
    finally:
        stop(proc)
