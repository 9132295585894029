"""Stream protocol consumers on a cluster's follower (stream_protocol/replica.py):
the leader's Metadata names the in-sync follower's read service
(``[clustering] stream_protocol_read_port``) as each stream's replica, and
rstream's Consumer, which reads from a replica when Metadata lists one,
gets every message the leader stored from the follower. A publisher
declared on the read service is refused. Single active consumers (rstream's
Consumer and SuperStreamConsumer) and StoreOffset go through the follower to
the leader's groups and tracking (stream_protocol/replica_forward.py)."""

from __future__ import annotations

import asyncio
import base64
import json
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pika
import pytest
from etcd_proc import EtcdProcess, free_port
from nodes import Node
from rstream import (
    AMQPMessage,
    Consumer,
    ConsumerOffsetSpecification,
    EventContext,
    MessageContext,
    OffsetSpecification,
    OffsetType,
    Producer,
    SuperStreamConsumer,
    amqp_decoder,
)
from rstream.client import Client
from rstream.exceptions import OffsetNotFound, StreamNotAvailable


@pytest.fixture
def nodes(etcd: EtcdProcess, tmp_path: Path) -> Iterator[list[Node]]:
    started = []
    for i in range(2):
        stream_port, read_port = free_port(), free_port()
        settings = {
            "stream": {"port": str(stream_port)},
            "clustering": {"stream_protocol_read_port": str(read_port)},
        }
        node = Node(tmp_path, f"n{i}", etcd.url, http=True, settings=settings)
        node.stream_port = stream_port  # type: ignore[attr-defined]
        node.read_port = read_port  # type: ignore[attr-defined]
        started.append(node)
    try:
        yield started
    finally:
        for node in started:
            node.stop()


async def replicas_named(port: int, stream: str, timeout: float = 60) -> list[tuple[str, int]]:
    """The replicas the leader's Metadata names for ``stream``, once it names
    any (the follower joins the in-sync replicas after its first sync)."""
    client = Client("127.0.0.1", port, frame_max=1 << 20, heartbeat=60)
    await client.start()
    await client.authenticate("/", "guest", "guest")
    try:
        deadline = time.monotonic() + timeout
        while True:
            _leader, replicas = await client.query_leader_and_replicas(stream)
            if replicas or time.monotonic() > deadline:
                return [(r.host, r.port) for r in replicas]
            await asyncio.sleep(0.1)
    finally:
        await client.close()


def test_a_consumer_reads_from_the_follower_and_a_publisher_is_refused_there(
    nodes: list[Node],
) -> None:
    leader, follower = nodes
    leader.start().wait_for("elected leader")
    leader.wait_for("listening on stream")
    follower.start().wait_for("stream protocol reads served on")
    follower.wait_for("synced with the leader")
    leader_port: int = leader.stream_port  # type: ignore[attr-defined]
    read_port: int = follower.read_port  # type: ignore[attr-defined]
    bodies = [b"m%d" % i for i in range(250)]

    async def run() -> None:
        async with Producer("127.0.0.1", leader_port, username="guest", password="guest") as p:
            await p.create_stream("replicated")
            for body in bodies[:200]:
                await p.send_wait("replicated", AMQPMessage(body=body))
            # One Publish of 50: one chunk record, sent by the follower as stored.
            await p.send_batch("replicated", [AMQPMessage(body=body) for body in bodies[200:]])
        assert await replicas_named(leader_port, "replicated") == [("127.0.0.1", read_port)]

        got: list[bytes] = []
        done = asyncio.Event()

        async def on_message(msg: AMQPMessage, context: MessageContext) -> None:
            got.append(bytes(msg.body))  # type: ignore[arg-type]
            if len(got) == len(bodies):
                done.set()

        consumer = Consumer("127.0.0.1", leader_port, username="guest", password="guest")
        await consumer.start()
        try:
            await consumer.subscribe(
                "replicated",
                on_message,
                decoder=amqp_decoder,
                offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST),
            )
            # rstream connected for the stream where Metadata sent it: the follower.
            reader = consumer._clients["replicated"]
            assert (reader.host, reader.port) == ("127.0.0.1", read_port)
            await asyncio.wait_for(done.wait(), 60)
        finally:
            await consumer.close()
        assert got == bodies

        client = Client("127.0.0.1", read_port, frame_max=1 << 20, heartbeat=60)
        await client.start()
        try:
            await client.authenticate("/", "guest", "guest")
            with pytest.raises(StreamNotAvailable):
                await client.declare_publisher("replicated", "p", 1)
        finally:
            await client.close()

    asyncio.run(run())
    # /api/cluster (through either node's HTTP port: the leader's API) lists it.
    auth = "Basic " + base64.b64encode(b"guest:guest").decode()
    url = f"http://127.0.0.1:{follower.http_port}/api/cluster"
    request = urllib.request.Request(url, headers={"Authorization": auth})
    with urllib.request.urlopen(request, timeout=10) as resp:
        [listed] = json.load(resp)["followers"]
    assert listed["stream_protocol_reads"] == f"127.0.0.1:{read_port}"
    follower.wait_for("DeclarePublisher refused: a cluster follower serves stream reads only")


async def until(check: Callable[[], Awaitable[bool]], timeout: float = 60) -> None:
    """Wait (for a condition, polled) until ``check()`` holds."""
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, "the condition did not come about"
        await asyncio.sleep(0.05)


async def stored(port: int, stream: str, reference: str) -> int | None:
    """QueryOffset on the node at ``port``: the offset stored, None for none."""
    client = Client("127.0.0.1", port, frame_max=1 << 20, heartbeat=60)
    await client.start()
    try:
        await client.authenticate("/", "guest", "guest")
        return await client.query_offset(stream, reference)
    except OffsetNotFound:
        return None
    finally:
        await client.close()


class GroupMember:
    """An rstream Consumer (or SuperStreamConsumer) of a single active consumer
    group: what it got by stream, and the ConsumerUpdates it heard. An
    activated one resumes after the offset stored under the group's name
    (the leader's, through rstream's locator connection)."""

    def __init__(self, consumer: Consumer | SuperStreamConsumer) -> None:
        self.consumer = consumer
        self.got: dict[str, list[tuple[int, bytes]]] = {}
        self.updates: list[tuple[str, bool]] = []

    async def on_message(self, msg: AMQPMessage, ctx: MessageContext) -> None:
        self.got.setdefault(ctx.stream, []).append((ctx.offset, bytes(msg.body)))  # type: ignore[arg-type]

    async def on_update(self, active: bool, ctx: EventContext) -> OffsetSpecification:
        self.updates.append((ctx.stream, active))
        if not active:
            return OffsetSpecification(OffsetType.NEXT, 0)
        try:
            offset = await ctx.consumer.query_offset(ctx.stream, GROUP)
        except OffsetNotFound:
            return OffsetSpecification(OffsetType.FIRST, 0)
        return OffsetSpecification(OffsetType.OFFSET, offset + 1)

    def count(self) -> int:
        return sum(len(v) for v in self.got.values())


GROUP = "app"
SAC = {"single-active-consumer": "true", "name": GROUP}


def test_single_active_consumers_on_the_follower_hand_over_through_the_leader(
    nodes: list[Node],
) -> None:
    leader, follower = nodes
    leader.start().wait_for("elected leader")
    leader.wait_for("listening on stream")
    follower.start().wait_for("stream protocol reads served on")
    follower.wait_for("synced with the leader")
    leader_port: int = leader.stream_port  # type: ignore[attr-defined]
    read_port: int = follower.read_port  # type: ignore[attr-defined]

    async def run() -> None:
        async with Producer("127.0.0.1", leader_port, username="guest", password="guest") as p:
            await p.create_stream("sac")
            for i in range(10):
                await p.send_wait("sac", AMQPMessage(body=b"m%d" % i))
            assert await replicas_named(leader_port, "sac") == [("127.0.0.1", read_port)]
            a, b = (
                GroupMember(Consumer("127.0.0.1", leader_port, username="guest", password="guest"))
                for _ in range(2)
            )
            for member in (a, b):
                assert isinstance(member.consumer, Consumer)
                await member.consumer.start()
                await member.consumer.subscribe(
                    "sac",
                    member.on_message,
                    decoder=amqp_decoder,
                    properties=SAC,
                    consumer_update_listener=member.on_update,
                )
                reader = member.consumer._clients["sac"]
                assert (reader.host, reader.port) == ("127.0.0.1", read_port)

            async def a_has_all() -> bool:
                return a.count() == 10

            await until(a_has_all)
            assert a.updates == [("sac", True)] and b.updates == [] and b.got == {}
            # a stores its offset through the follower: the leader keeps it.
            client = Client("127.0.0.1", read_port, frame_max=1 << 20, heartbeat=60)
            await client.start()
            await client.authenticate("/", "guest", "guest")
            await client.store_offset("sac", GROUP, a.got["sac"][-1][0])
            await client.close()

            async def kept() -> bool:
                return await stored(leader_port, "sac", GROUP) == 9

            await until(kept)
            # a goes: b is activated on the follower, resumes after a's offset.
            await a.consumer.close()
            for i in range(10, 13):
                await p.send_wait("sac", AMQPMessage(body=b"m%d" % i))

            async def b_has_the_rest() -> bool:
                return b.count() == 3

            await until(b_has_the_rest)
            assert b.updates == [("sac", True)]
            assert [body for _, body in b.got["sac"]] == [b"m10", b"m11", b"m12"]
            await b.consumer.close()

    asyncio.run(run())


def test_super_stream_consumers_on_the_follower_share_partitions(nodes: list[Node]) -> None:
    leader, follower = nodes
    leader.start().wait_for("elected leader")
    leader.wait_for("listening on stream")
    follower.start().wait_for("stream protocol reads served on")
    follower.wait_for("synced with the leader")
    leader_port: int = leader.stream_port  # type: ignore[attr-defined]
    read_port: int = follower.read_port  # type: ignore[attr-defined]
    partitions = [f"orders-{i}" for i in range(3)]

    def publish(round_: str) -> None:
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", leader.amqp_port))
        try:
            ch = conn.channel()
            ch.exchange_declare(
                "orders", "direct", durable=True, arguments={"x-super-stream": True}
            )
            for i, stream in enumerate(partitions):
                ch.queue_declare(stream, durable=True, arguments={"x-queue-type": "stream"})
                ch.queue_bind(stream, "orders", str(i), arguments={"x-stream-partition-order": i})
            for i in range(len(partitions)):
                ch.basic_publish("orders", str(i), f"{round_}-{i}".encode())
        finally:
            conn.close()

    publish("r1")

    async def run() -> None:
        assert await replicas_named(leader_port, partitions[0]) == [("127.0.0.1", read_port)]
        members = [
            GroupMember(
                SuperStreamConsumer(
                    "127.0.0.1",
                    leader_port,
                    username="guest",
                    password="guest",
                    super_stream="orders",
                )
            )
            for _ in range(2)
        ]
        a, b = members
        for member in members:
            await member.consumer.start()
            await member.consumer.subscribe(
                member.on_message,
                decoder=amqp_decoder,
                properties={**SAC, "super-stream": "orders"},
                consumer_update_listener=member.on_update,
            )
            if member is a:  # alone in the group: active on every partition

                async def a_has_all() -> bool:
                    return a.count() == 3

                await until(a_has_all)

        async def shared() -> bool:
            return (PARTITION_1, True) in b.updates and (PARTITION_1, False) in a.updates

        await until(shared)
        # Partition 1 (1 % 2) is b's; a keeps 0 and 2, all read on the follower.
        consumer = b.consumer._consumer  # type: ignore[union-attr]
        assert consumer is not None
        reader = consumer._clients[PARTITION_1]
        assert (reader.host, reader.port) == ("127.0.0.1", read_port)
        publish("r2")

        async def spread() -> bool:
            return a.count() == 5 and b.count() == 2

        await until(spread)
        assert {s: [x for _, x in v] for s, v in sorted(a.got.items())} == {
            partitions[0]: [b"r1-0", b"r2-0"],
            partitions[1]: [b"r1-1"],
            partitions[2]: [b"r1-2", b"r2-2"],
        }
        # No offset stored under the group's name: b started at the first.
        assert [x for _, x in b.got[PARTITION_1]] == [b"r1-1", b"r2-1"]
        # a goes: b takes partitions 0 and 2.
        await a.consumer.close()

        async def taken() -> bool:
            return sorted(u for u in b.updates if u[1]) == [
                (partitions[0], True),
                (PARTITION_1, True),
                (partitions[2], True),
            ]

        await until(taken)
        await b.consumer.close()

    asyncio.run(run())


PARTITION_1 = "orders-1"


def test_offsets_stored_through_the_follower_outlive_a_leader_restart(
    nodes: list[Node],
) -> None:
    first, second = nodes
    first.start().wait_for("elected leader")
    first.wait_for("listening on stream")
    second.start().wait_for("stream protocol reads served on")
    second.wait_for("synced with the leader")
    first_port: int = first.stream_port  # type: ignore[attr-defined]
    read_port: int = second.read_port  # type: ignore[attr-defined]

    async def store() -> None:
        async with Producer("127.0.0.1", first_port, username="guest", password="guest") as p:
            await p.create_stream("tracked")
            for i in range(5):
                await p.send_wait("tracked", AMQPMessage(body=b"m%d" % i))
        client = Client("127.0.0.1", read_port, frame_max=1 << 20, heartbeat=60)
        await client.start()
        await client.authenticate("/", "guest", "guest")
        await client.store_offset("tracked", "reader", 3)
        await client.close()

        async def replicated() -> bool:  # written by the leader, back on the follower
            return await stored(read_port, "tracked", "reader") == 3

        await until(replicated)

    asyncio.run(store())
    # The leader restarts: the other node leads, the first follows it.
    first.stop()
    second.wait_for("elected leader")
    second.wait_for("listening on stream")
    first.start().wait_for("stream protocol reads served on")
    first.wait_for("synced with the leader")
    second_port: int = second.stream_port  # type: ignore[attr-defined]
    first_read_port: int = first.read_port  # type: ignore[attr-defined]

    async def read_back() -> None:
        assert await stored(second_port, "tracked", "reader") == 3
        assert await stored(first_read_port, "tracked", "reader") == 3

    asyncio.run(read_back())
