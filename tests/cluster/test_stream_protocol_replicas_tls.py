"""A cluster whose stream protocol is TLS only (``[stream] port = -1``, a
``tls_port``) with ``[clustering] tls``: a follower's read service serves
its rstream clients over TLS, and what it forwards to the leader (a single
active consumer's membership, StoreOffset: stream_protocol/replica_forward.py)
goes over a LeaderLink to the leader's stream TLS port, verified with the
cluster's CA (replication's client context), every certificate a trustme one."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest
from etcd_proc import EtcdProcess, free_port
from nodes import Node
from rstream import AMQPMessage, Consumer, Producer, amqp_decoder
from rstream.client import Client
from rstream.exceptions import OffsetNotFound
from test_stream_protocol_replicas import GROUP, SAC, GroupMember, until
from tlshelp import write_pki

HOST = "127.0.0.1"


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, str]:
    return write_pki(tmp_path / "pki")


@pytest.fixture
def nodes(etcd: EtcdProcess, tmp_path: Path, pki: dict[str, str]) -> Iterator[list[Node]]:
    started = []
    for i in range(2):
        tls_port, read_port = free_port(), free_port()
        settings = {
            "main": {
                "tls_cert": pki["server"],
                "tls_key": pki["server.key"],
                "tls_ca_cert": pki["ca"],
            },
            "stream": {"port": "-1", "tls_port": str(tls_port)},
            "clustering": {"tls": "true", "stream_protocol_read_port": str(read_port)},
        }
        node = Node(tmp_path, f"n{i}", etcd.url, settings=settings)
        node.tls_port = tls_port  # type: ignore[attr-defined]
        node.read_port = read_port  # type: ignore[attr-defined]
        started.append(node)
    try:
        yield started
    finally:
        for node in started:
            node.stop()


async def client(port: int, tls: ssl.SSLContext) -> Client:
    c = Client(HOST, port, ssl_context=tls, frame_max=1 << 20, heartbeat=60)
    await c.start()
    await c.authenticate("/", "guest", "guest")
    return c


def test_a_tls_only_cluster_forwards_from_the_follower_over_tls(
    nodes: list[Node], pki: dict[str, str]
) -> None:
    leader, follower = nodes
    leader.start().wait_for("elected leader")
    leader.wait_for("listening on stream")
    follower.start().wait_for("stream protocol reads served on")
    follower.wait_for("synced with the leader")
    tls_port: int = leader.tls_port  # type: ignore[attr-defined]
    read_port: int = follower.read_port  # type: ignore[attr-defined]
    tls = ssl.create_default_context(cafile=pki["ca"])

    async def run() -> None:
        async with Producer(
            HOST, tls_port, ssl_context=tls, username="guest", password="guest"
        ) as p:
            await p.create_stream("sac")
            for i in range(10):
                await p.send_wait("sac", AMQPMessage(body=b"m%d" % i))
        locator = await client(tls_port, tls)

        async def replicated() -> bool:  # the follower joined the in-sync replicas
            _leader, replicas = await locator.query_leader_and_replicas("sac")
            return [(r.host, r.port) for r in replicas] == [(HOST, read_port)]

        await until(replicated)
        # The follower's Metadata names the leader by its TLS port.
        reader = await client(read_port, tls)
        named, _ = await reader.query_leader_and_replicas("sac")
        assert (named.host, named.port) == (HOST, tls_port)
        member = GroupMember(
            Consumer(HOST, tls_port, ssl_context=tls, username="guest", password="guest")
        )
        assert isinstance(member.consumer, Consumer)
        await member.consumer.start()
        await member.consumer.subscribe(
            "sac",
            member.on_message,
            decoder=amqp_decoder,
            properties=SAC,
            consumer_update_listener=member.on_update,
        )
        consumer_client = member.consumer._clients["sac"]
        assert (consumer_client.host, consumer_client.port) == (HOST, read_port)

        async def has_all() -> bool:  # activated by the leader's group, over the link
            return member.count() == 10

        await until(has_all)
        assert member.updates == [("sac", True)]
        await reader.store_offset("sac", GROUP, 9)

        async def kept() -> bool:
            try:
                return await locator.query_offset("sac", GROUP) == 9
            except OffsetNotFound:
                return False

        await until(kept)
        await member.consumer.close()
        await reader.close()
        await locator.close()

    asyncio.run(run())
    assert not [line for line in follower.log if "link to the leader ended" in line]
