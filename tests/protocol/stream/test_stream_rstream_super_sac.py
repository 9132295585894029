"""rstream's SuperStreamConsumers in one single-active-consumer group over a
socket, on a super stream declared over AMQP 0-9-1 (pika): the partitions
are shared between the group's consumers, a partition changing hands is
handed over (the old consumer's listener hears it is inactive and stores its
offset, then the new one's hears it is active and resumes after it), and
when a consumer goes the others take its partitions."""

from __future__ import annotations

import asyncio
from typing import Any

import pika
import pytest
from rstream import (
    AMQPMessage,
    MessageContext,
    OffsetSpecification,
    OffsetType,
    Producer,
    SuperStreamConsumer,
    amqp_decoder,
    exceptions,
)
from streamhelp import HOST, port, stream_broker_fixture

from warren.pytest_plugin import WarrenBroker

pytestmark = [pytest.mark.timeout(120)]

SUPER = "rs-sac"
PARTITIONS = [f"{SUPER}-{i}" for i in range(3)]
GROUP = "app"

warren = stream_broker_fixture()


def declare_and_publish(warren: WarrenBroker, rounds: list[str]) -> None:
    """The super stream as RabbitMQ's Java client declares it (made once), and
    one message per partition for each of ``rounds``: ``<round>-<partition>``."""
    conn = pika.BlockingConnection(pika.ConnectionParameters(HOST, warren.amqp_port))
    try:
        ch = conn.channel()
        ch.exchange_declare(SUPER, "direct", durable=True, arguments={"x-super-stream": True})
        for i, stream in enumerate(PARTITIONS):
            ch.queue_declare(stream, durable=True, arguments={"x-queue-type": "stream"})
            ch.queue_bind(stream, SUPER, str(i), arguments={"x-stream-partition-order": i})
        for r in rounds:
            for i in range(len(PARTITIONS)):
                ch.basic_publish(SUPER, str(i), f"{r}-{i}".encode())
    finally:
        conn.close()


class Member:
    """One SuperStreamConsumer of the group: what it got by partition, and its
    ConsumerUpdate listener storing and reading offsets on the broker."""

    def __init__(self, warren: WarrenBroker, name: str, offsets: Any) -> None:
        self.name = name
        self.offsets = offsets
        self.got: dict[str, list[tuple[int, str]]] = {}
        self.updates: list[tuple[str, bool]] = []
        self.changed = asyncio.Event()
        self.consumer = SuperStreamConsumer(
            HOST, port(warren), username="guest", password="guest", super_stream=SUPER
        )

    async def on_message(self, msg: AMQPMessage, ctx: MessageContext) -> None:
        self.got.setdefault(ctx.stream, []).append((ctx.offset, bytes(msg.body).decode()))
        self.changed.set()

    async def on_update(self, active: bool, ctx: Any) -> OffsetSpecification:
        stream = ctx.stream
        self.updates.append((stream, active))
        self.changed.set()
        if not active:  # stepping down: where this one got to
            done = self.got.get(stream)
            if done:
                await self.offsets.store_offset(stream=stream, reference=GROUP, offset=done[-1][0])
            return OffsetSpecification(OffsetType.NEXT, 0)
        try:
            stored = await self.offsets.query_offset(stream=stream, reference=GROUP)
        except exceptions.OffsetNotFound:
            return OffsetSpecification(OffsetType.FIRST, 0)
        return OffsetSpecification(OffsetType.OFFSET, stored + 1)

    async def start(self) -> None:
        await self.consumer.start()
        await self.consumer.subscribe(
            self.on_message,
            decoder=amqp_decoder,
            properties={"single-active-consumer": "true", "name": GROUP, "super-stream": SUPER},
            consumer_update_listener=self.on_update,
        )

    def bodies(self) -> dict[str, list[str]]:
        return {s: [b for _, b in got] for s, got in sorted(self.got.items())}

    async def until(self, check: Any) -> None:
        """Wait (a condition, not time) until ``check()`` holds."""

        async def wait() -> None:
            while not check():
                self.changed.clear()
                await self.changed.wait()

        await asyncio.wait_for(wait(), 30)


def test_super_stream_consumers_share_and_hand_over_partitions(warren: WarrenBroker) -> None:
    declare_and_publish(warren, ["r1"])

    async def run() -> None:
        async with Producer(HOST, port(warren), username="guest", password="guest") as p:
            offsets = await p.default_client
            a = Member(warren, "a", offsets)
            b = Member(warren, "b", offsets)
            await a.start()
            # Alone in the group: active on every partition, from the first.
            await a.until(lambda: sum(len(v) for v in a.got.values()) == 3)
            assert sorted(a.updates) == [(s, True) for s in PARTITIONS]
            assert a.bodies() == {s: [f"r1-{i}"] for i, s in enumerate(PARTITIONS)}
            # A second member: partition 1 (1 % 2) is handed over to it.
            await b.start()
            await b.until(lambda: b.updates == [(PARTITIONS[1], True)])
            assert a.updates[3:] == [(PARTITIONS[1], False)]
            declare_and_publish(warren, ["r2"])
            await b.until(lambda: PARTITIONS[1] in b.got)
            await a.until(lambda: sum(len(v) for v in a.got.values()) == 5)
            assert b.bodies() == {PARTITIONS[1]: ["r2-1"]}  # resumed after a's offset
            assert a.bodies() == {
                PARTITIONS[0]: ["r1-0", "r2-0"],
                PARTITIONS[1]: ["r1-1"],
                PARTITIONS[2]: ["r1-2", "r2-2"],
            }
            # a stores where it is and goes: b takes partitions 0 and 2 from there.
            for s in (PARTITIONS[0], PARTITIONS[2]):
                await offsets.store_offset(stream=s, reference=GROUP, offset=a.got[s][-1][0])
            await a.consumer.close()
            await b.until(lambda: len(b.updates) == 3)
            assert sorted(b.updates[1:]) == [(PARTITIONS[0], True), (PARTITIONS[2], True)]
            declare_and_publish(warren, ["r3"])
            await b.until(lambda: sum(len(v) for v in b.got.values()) == 4)
            assert b.bodies() == {
                PARTITIONS[0]: ["r3-0"],
                PARTITIONS[1]: ["r2-1", "r3-1"],
                PARTITIONS[2]: ["r3-2"],
            }
            await b.consumer.close()

    asyncio.run(run())
