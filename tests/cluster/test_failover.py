"""Three real nodes and a real etcd: one is elected and serves, the others
replicate; kill -9 the leader and a follower takes over with every confirmed
message; clients reach the leader through any node."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from etcd_proc import EtcdProcess
from nodes import Node, wait_any

PERSISTENT = pika.BasicProperties(delivery_mode=2)


@pytest.fixture
def nodes(etcd: EtcdProcess, tmp_path: Path) -> Iterator[list[Node]]:
    started = [Node(tmp_path, f"n{i}", etcd.url) for i in range(3)]
    try:
        yield started
    finally:
        for node in started:
            node.stop()


def _channel(
    port: int,
) -> tuple[pika.BlockingConnection, pika.adapters.blocking_connection.BlockingChannel]:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    return conn, conn.channel()


def test_kill_9_of_the_leader_loses_no_confirmed_message(nodes: list[Node]) -> None:
    first = nodes[0].start()
    first.wait_for("elected leader")
    first.wait_for(r"listening on AMQP")
    for node in nodes[1:]:
        node.start()
    for node in nodes[1:]:
        node.wait_for("synced with the leader")
    first.wait_for(r"in-sync replicas: .*,")  # at least one follower in the ISR

    conn, ch = _channel(first.amqp_port)
    ch.queue_declare("orders", durable=True)
    ch.confirm_delivery()
    for i in range(300):
        ch.basic_publish("", "orders", b"order-%d" % i, PERSISTENT)
    for _ in range(100):
        method, _props, _body = ch.basic_get("orders")
        assert method is not None
        ch.basic_ack(method.delivery_tag)
    conn.close()

    # A client on a follower's port reaches the leader.
    conn, ch = _channel(nodes[1].amqp_port)
    assert ch.queue_declare("orders", passive=True).method.message_count == 200
    conn.close()

    followers = nodes[1:]
    first.kill()
    new_leader = wait_any(followers, "elected leader", timeout=30)
    new_leader.wait_for(r"listening on AMQP")
    conn, ch = _channel(new_leader.amqp_port)
    count = ch.queue_declare("orders", passive=True).method.message_count
    # Every confirmed message is there; acks are at-least-once (a late one may be back).
    assert 200 <= count <= 300
    bodies = set()
    while True:
        method, _props, body = ch.basic_get("orders", auto_ack=True)
        if method is None:
            break
        bodies.add(body)
    assert {b"order-%d" % i for i in range(100, 300)} <= bodies
    conn.close()

    # The old leader comes back on its stale directory and follows.
    first.start()
    first.wait_for("following leader")
    first.wait_for("synced with the leader")
