"""Quorum queues in a cluster of three real nodes and a real etcd: every durable
queue is replicated and a confirm waits for the in-sync followers, so a quorum
queue's confirmed messages (transient ones too: a quorum queue keeps every
message) are all on the follower that takes over when the leader is killed
with SIGKILL; the management API names the leader and members."""

from __future__ import annotations

import base64
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from etcd_proc import EtcdProcess
from nodes import Node, marks, open_channel, start_cluster, wait_any

QUORUM = {"x-queue-type": "quorum", "x-delivery-limit": 5}


@pytest.fixture
def nodes(etcd: EtcdProcess, tmp_path: Path) -> Iterator[list[Node]]:
    started = [Node(tmp_path, f"n{i}", etcd.url, http=True) for i in range(3)]
    try:
        yield started
    finally:
        for node in started:
            node.stop()


def queue_json(node: Node, name: str) -> dict[str, Any]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{node.http_port}/api/queues/%2F/{name}",
        headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        info: dict[str, Any] = json.load(response)
        return info


def test_confirmed_quorum_messages_survive_kill_9_of_the_leader(nodes: list[Node]) -> None:
    leader = start_cluster(nodes)
    conn, ch = open_channel(leader.address)
    ch.queue_declare("orders", durable=True, arguments=QUORUM)
    ch.confirm_delivery()
    for i in range(200):
        mode = 1 if i % 2 else 2  # half of them transient: kept all the same
        ch.basic_publish("", "orders", b"order-%d" % i, pika.BasicProperties(delivery_mode=mode))
    for _ in range(50):
        method, _props, _body = ch.basic_get("orders")
        assert method is not None
        ch.basic_ack(method.delivery_tag)
    conn.close()

    info = queue_json(leader, "orders")
    ids = sorted(n.node_id for n in nodes)
    assert info["type"] == "quorum"
    assert info["leader"] == leader.node_id
    assert info["members"] == ids  # RabbitMQ's default group size, 3
    assert sorted(info["online"]) == ids
    # min(x-quorum-initial-group-size, cluster size) members, the leader among them.
    conn, ch = open_channel(leader.address)
    for name, size in (("pair", 2), ("single", 1), ("wide", 7)):
        ch.queue_declare(name, durable=True, arguments={**QUORUM, "x-quorum-initial-group-size": size})
        info = queue_json(leader, name)
        assert len(info["members"]) == min(size, 3)
        assert leader.node_id in info["members"]
        assert sorted(info["online"]) == info["members"]
    conn.close()

    followers = [n for n in nodes if n is not leader]
    before = marks(followers)
    leader.kill()
    new_leader = wait_any(followers, "elected leader", timeout=30, since=before)
    new_leader.wait_for(r"listening on AMQP")
    conn, ch = open_channel(new_leader.address)
    # Still a quorum queue with its arguments: a classic redeclaration is refused.
    with pytest.raises(pika.exceptions.ChannelClosedByBroker, match="x-queue-type"):
        conn.channel().queue_declare("orders", durable=True)
    bodies = set()
    while True:
        method, props, body = ch.basic_get("orders", auto_ack=True)
        if method is None:
            break
        bodies.add(body)
    conn.close()
    # Every confirmed message is there (an ack may come back: at least once).
    assert {b"order-%d" % i for i in range(50, 200)} <= bodies
    assert bodies <= {b"order-%d" % i for i in range(200)}
    info = queue_json(new_leader, "orders")
    assert info["type"] == "quorum"
    assert info["leader"] == new_leader.node_id


def test_delivery_counts_survive_a_failover(nodes: list[Node]) -> None:
    """The counts are in the queue's directory, which the followers copy: the
    new leader goes on counting where the old one stopped, and dead-letters the
    poison message at the limit (QUORUM's 5)."""
    leader = start_cluster(nodes)
    conn, ch = open_channel(leader.address)
    ch.queue_declare("poison-dlq", durable=True)
    ch.queue_declare(
        "jobs",
        durable=True,
        arguments={
            **QUORUM,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": "poison-dlq",
        },
    )
    ch.confirm_delivery()
    ch.basic_publish("", "jobs", b"poison")
    seen = []
    for _ in range(3):
        method, props, _body = ch.basic_get("jobs")
        seen.append((props.headers or {}).get("x-delivery-count"))
        ch.basic_nack(method.delivery_tag, requeue=True)
    assert seen == [None, 1, 2]
    # A confirm waits until the in-sync followers have everything before it
    # (replication is one ordered stream), the counts included.
    ch.basic_publish("", "poison-dlq", b"barrier", pika.BasicProperties(delivery_mode=2))
    conn.close()

    followers = [n for n in nodes if n is not leader]
    before = marks(followers)
    leader.kill()
    new_leader = wait_any(followers, "elected leader", timeout=30, since=before)
    new_leader.wait_for(r"listening on AMQP")
    conn, ch = open_channel(new_leader.address)
    seen = []
    for _ in range(3):
        method, props, _body = ch.basic_get("jobs")
        seen.append((props.headers or {}).get("x-delivery-count"))
        ch.basic_nack(method.delivery_tag, requeue=True)
    assert seen == [3, 4, 5]
    assert ch.queue_declare("jobs", passive=True).method.message_count == 0
    bodies = [ch.basic_get("poison-dlq", auto_ack=True)[2] for _ in range(2)]
    assert sorted(bodies) == [b"barrier", b"poison"]
    conn.close()
