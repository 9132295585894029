"""The stream protocol in a cluster of two real nodes: a client on the
follower's stream port is passed through to the leader (cluster/proxy.py),
and Metadata names the leader's stream port, where rstream then connects."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from etcd_proc import EtcdProcess, free_port
from nodes import Node
from rstream import Producer


@pytest.fixture
def nodes(etcd: EtcdProcess, tmp_path: Path) -> Iterator[list[Node]]:
    ports = [free_port(), free_port()]
    started = [
        Node(tmp_path, f"n{i}", etcd.url, settings={"stream": {"port": str(ports[i])}})
        for i in range(2)
    ]
    for node, port in zip(started, ports, strict=True):
        node.stream_port = port  # type: ignore[attr-defined]
    try:
        yield started
    finally:
        for node in started:
            node.stop()


def test_a_stream_client_on_the_follower_reaches_the_leader(nodes: list[Node]) -> None:
    leader, follower = nodes
    leader.start().wait_for("elected leader")
    leader.wait_for("listening on stream")
    follower.start().wait_for("proxying stream clients")
    follower.wait_for("synced with the leader")

    async def run() -> None:
        port = follower.stream_port  # type: ignore[attr-defined]
        async with Producer("127.0.0.1", port, username="guest", password="guest") as p:
            await p.create_stream("clustered")
            client = await p.default_client
            broker, replicas = await client.query_leader_and_replicas("clustered")
            assert (broker.port, replicas) == (leader.stream_port, [])  # type: ignore[attr-defined]
            await p.delete_stream("clustered")

    asyncio.run(run())
