"""A stream protocol publish the broker confirmed survives kill -9, and its
publisher reference still deduplicates after the restart: a real `warren`
process is killed while rstream publishes with a reference, every confirmed
record is read back after a restart on the same data dir, and sending every
record again with its publishing id stores none of the confirmed ones twice
(an unconfirmed one stored before the kill may be: see the test)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path

import pytest
from procs import Process, start_warren_stream
from rstream import (
    AMQPMessage,
    ConfirmationStatus,
    Consumer,
    ConsumerOffsetSpecification,
    MessageContext,
    OffsetType,
    Producer,
    amqp_decoder,
)
from rstream.recovery import BackOffRecoveryStrategy

pytestmark = pytest.mark.timeout(120)

HOST = "127.0.0.1"
TOTAL = 3000
KILL_AFTER = 500
BATCH = 50


def stop(proc: Process) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def producer(port: int) -> Producer:
    return Producer(
        HOST,
        port,
        username="guest",
        password="guest",
        recovery_strategy=BackOffRecoveryStrategy(enable=False),
    )


def message(i: int) -> AMQPMessage:
    msg = AMQPMessage(body=b"m%d" % i)
    msg.publishing_id = i + 1  # rstream sends a set id as it is
    return msg


async def publish_until_killed(port: int, proc: Process) -> set[int]:
    """Publishing ids confirmed before the kill."""
    confirmed: set[int] = set()
    killed = asyncio.Event()

    def on_confirm(status: ConfirmationStatus) -> None:
        if killed.is_set() or not status.is_confirmed:
            return
        confirmed.add(status.message_id)
        if len(confirmed) >= KILL_AFTER:
            killed.set()
            os.kill(proc.pid, signal.SIGKILL)

    p = producer(port)
    await p.start()
    await p.create_stream("k9")
    with contextlib.suppress(Exception):
        for start in range(0, TOTAL, BATCH):
            if killed.is_set():
                break
            batch = [message(i) for i in range(start, start + BATCH)]
            await p.send_batch("k9", batch, publisher_name="app", on_publish_confirm=on_confirm)
            await asyncio.sleep(0.001)
        await asyncio.wait_for(killed.wait(), 30)
    with contextlib.suppress(BaseException):
        await asyncio.wait_for(p.close(), 5)
    return confirmed


async def read_all(port: int, expect: int) -> list[int]:
    got: list[int] = []
    done = asyncio.Event()

    async def on_message(msg: AMQPMessage, ctx: MessageContext) -> None:
        got.append(int(msg.body[1:]))
        if len(got) >= expect:
            done.set()

    async with Consumer(HOST, port, username="guest", password="guest") as consumer:
        await consumer.subscribe(
            "k9",
            on_message,
            decoder=amqp_decoder,
            offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST),
        )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), 20)
    return got


async def resend_all(port: int) -> int:
    """Every record again with its publishing id; the stored sequence after."""
    async with producer(port) as p:
        for start in range(0, TOTAL, BATCH):
            await p.send_batch(
                "k9", [message(i) for i in range(start, start + BATCH)], publisher_name="app"
            )
        await p.send_wait("k9", message(TOTAL), publisher_name="app")
        client = await p.default_client
        return await client.query_publisher_sequence("k9", "app")


def test_confirmed_publishes_survive_kill_9_and_stay_deduplicated(tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc, port = start_warren_stream(data)
    try:
        confirmed = asyncio.run(publish_until_killed(port, proc))
        proc.wait(10)
        assert proc.returncode == -signal.SIGKILL
        assert TOTAL > len(confirmed) >= KILL_AFTER  # killed mid-stream
        stop(proc)
        proc, port = start_warren_stream(data)
        # rstream calls back a PublishConfirm's ids in set order: the confirmed
        # are not always a prefix of the ids, so read up to the highest.
        recovered = asyncio.run(read_all(port, max(confirmed)))
        assert {i + 1 for i in recovered} >= confirmed
        assert recovered == list(range(len(recovered)))  # in order, no duplicates
        assert asyncio.run(resend_all(port)) == TOTAL + 1
        everything = asyncio.run(read_all(port, TOTAL + 1))
        kept = len(recovered)
        assert everything[:kept] == recovered
        # The resend is stored from just after the sequence the reference had
        # kept: never a confirmed record again, and, as each chunk record
        # carries its publisher's last id (as RabbitMQ's chunks do), never one
        # that reached the file either, confirmed or not.
        resumed = everything[kept]
        assert resumed >= max(confirmed)  # ids are 1-based, records 0-based
        assert resumed == kept
        assert everything[kept:] == list(range(resumed, resumed + TOTAL + 1 - kept))
    finally:
        stop(proc)
