"""Stream protocol consumers on a cluster's follower (stream_protocol/replica.py):
the leader's Metadata names the in-sync follower's read service
(``[clustering] stream_protocol_read_port``) as each stream's replica, and
rstream's Consumer, which reads from a replica when Metadata lists one,
gets every message the leader stored from the follower. A publisher
declared on the read service is refused."""

from __future__ import annotations

import asyncio
import base64
import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from etcd_proc import EtcdProcess, free_port
from nodes import Node
from rstream import (
    AMQPMessage,
    Consumer,
    ConsumerOffsetSpecification,
    MessageContext,
    OffsetType,
    Producer,
    amqp_decoder,
)
from rstream.client import Client
from rstream.exceptions import StreamNotAvailable


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
