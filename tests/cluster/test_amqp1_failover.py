"""AMQP 1.0 in a cluster of three real nodes and a real etcd: a message the
leader settled as accepted (the outcome comes after the group commit and the
in-sync followers' copy) is served by the node that takes over when the
leader is killed with SIGKILL, from a quorum queue and a durable classic
queue, to an AMQP 1.0 receiver and a 0-9-1 one. The /management node names
the cluster's leader and members, and works through a follower's port."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from etcd_proc import EtcdProcess
from nodes import Node, marks, open_channel, start_cluster, wait_any

proton = pytest.importorskip("proton")
from proton import Message  # noqa: E402
from proton.handlers import MessagingHandler  # noqa: E402
from proton.reactor import Container  # noqa: E402
from proton.utils import BlockingConnection  # noqa: E402

pytestmark = pytest.mark.timeout(180)

QUEUES = {"qq": {"x-queue-type": "quorum"}, "cq": {}}
#: Messages sent to each queue; the leader is killed once KILL_AFTER of each
#: are accepted, mid-stream, with more unsettled on the wire.
TOTAL = 1500
KILL_AFTER = 300


@pytest.fixture
def nodes(etcd: EtcdProcess, tmp_path: Path) -> Iterator[list[Node]]:
    # RabbitMQ's own 1.0 client (the management calls) wants RabbitMQ announced.
    settings = {"amqp1": {"announce_rabbitmq": "true"}}
    started = [Node(tmp_path, f"n{i}", etcd.url, settings=settings) for i in range(3)]
    try:
        yield started
    finally:
        for node in started:
            node.stop()


def connect_url(node: Node) -> str:
    return f"amqp://guest:guest@{node.host}:{node.amqp_port}"


class _Publisher(MessagingHandler):
    """Sends TOTAL durable messages unsettled to each queue and kills the
    leader once KILL_AFTER of each are accepted; what was accepted by then is
    in ``accepted``."""

    def __init__(self, leader: Node) -> None:
        super().__init__()
        self.leader = leader
        self.sent = dict.fromkeys(QUEUES, 0)
        self.ids: dict[Any, tuple[str, int]] = {}
        self.accepted: dict[str, set[int]] = {name: set() for name in QUEUES}
        self.killed = False

    def on_start(self, event: Any) -> None:
        conn = event.container.connect(
            connect_url(self.leader),
            allowed_mechs="PLAIN",
            allow_insecure_mechs=True,
            virtual_host="vhost:/",
            reconnect=False,
        )
        for name in QUEUES:
            event.container.create_sender(conn, f"/queues/{name}", name=name)

    def on_sendable(self, event: Any) -> None:
        name = event.sender.name
        while event.sender.credit and self.sent[name] < TOTAL and not self.killed:
            n = self.sent[name]
            message = Message(id=n, body=b"%s-%d" % (name.encode(), n), durable=True)
            message.inferred = True  # a data section: the 0-9-1 body as sent
            delivery = event.sender.send(message)
            self.ids[delivery.tag, name] = (name, n)
            self.sent[name] += 1

    def on_accepted(self, event: Any) -> None:
        if self.killed:
            return  # arrived after the kill: not counted, it may be in flight
        name, n = self.ids[event.delivery.tag, event.link.name]
        self.accepted[name].add(n)
        if all(len(got) >= KILL_AFTER for got in self.accepted.values()):
            self.killed = True
            assert self.leader.proc is not None
            os.kill(self.leader.proc.pid, signal.SIGKILL)

    def on_transport_error(self, event: Any) -> None:
        pass  # the kill: Container.run returns once the transport is gone


def numbers(bodies: list[bytes], name: str) -> list[int]:
    return [int(body.decode().removeprefix(f"{name}-")) for body in bodies]


def receive_amqp1(node: Node, name: str) -> list[bytes]:
    """Every message of queue ``name``, taken by an AMQP 1.0 receiver (accepted)."""
    conn = BlockingConnection(
        connect_url(node),
        allowed_mechs="PLAIN",
        allow_insecure_mechs=True,
        virtual_host="vhost:/",
        timeout=30,
    )
    try:
        receiver = conn.create_receiver(f"/queues/{name}", credit=100)
        bodies: list[bytes] = []
        while True:
            try:
                message = receiver.receive(timeout=3)
            except proton.Timeout:
                return bodies
            body = message.body
            assert message.durable and isinstance(body, (bytes, memoryview))
            bodies.append(bytes(body))
            receiver.accept()
    finally:
        conn.close()


def receive_amqp091(node: Node, name: str) -> list[bytes]:
    """Every message of queue ``name``, taken with basic.get."""
    conn, ch = open_channel(node.address)
    bodies: list[bytes] = []
    while True:
        method, props, body = ch.basic_get(name, auto_ack=True)
        if method is None:
            break
        assert props.delivery_mode == 2
        bodies.append(body)
    conn.close()
    return bodies


def test_accepted_messages_survive_kill_9_of_the_leader(nodes: list[Node]) -> None:
    leader = start_cluster(nodes)
    conn, ch = open_channel(leader.address)
    for name, arguments in QUEUES.items():
        ch.queue_declare(name, durable=True, arguments=arguments or None)
    conn.close()

    publisher = _Publisher(leader)
    Container(publisher).run()
    assert publisher.killed
    leader.proc.wait(10)  # type: ignore[union-attr]
    for name in QUEUES:
        assert len(publisher.accepted[name]) >= KILL_AFTER
    # Killed mid-stream: sent messages were still waiting for their outcome.
    assert sum(publisher.sent.values()) > sum(map(len, publisher.accepted.values()))

    followers = [n for n in nodes if n is not leader]
    before = marks(followers)
    new_leader = wait_any(followers, "elected leader", timeout=30, since=before)
    new_leader.wait_for(r"listening on AMQP")
    # The quorum queue to a 1.0 receiver, the classic one to a 0-9-1 consumer.
    got = {
        "qq": numbers(receive_amqp1(new_leader, "qq"), "qq"),
        "cq": numbers(receive_amqp091(new_leader, "cq"), "cq"),
    }
    for name, recovered in got.items():
        assert publisher.accepted[name] <= set(recovered), name
        assert recovered == sorted(set(recovered)), name  # in order, no duplicates
        assert set(recovered) <= set(range(publisher.sent[name])), name


def test_the_management_node_names_the_cluster(nodes: list[Node]) -> None:
    """RabbitMQ 4's leader and replicas of a queue, as the HTTP API reports a
    quorum queue's leader and members; a declare through a follower's port
    (relayed to the leader) works as a 0-9-1 one does."""
    client = pytest.importorskip("rabbitmq_amqp_python_client")
    leader = start_cluster(nodes)
    ids = sorted(n.node_id for n in nodes)
    follower = next(n for n in nodes if n is not leader)
    environment = client.Environment(f"amqp://guest:guest@{follower.host}:{follower.amqp_port}/")
    connection = environment.connection()
    connection.dial()
    try:
        management = connection.management()
        management.declare_queue(client.QuorumQueueSpecification(name="mq"))
        info = management.queue_info("mq")
        assert info.leader == leader.node_id
        assert sorted(info.members.elements) == ids
        management.declare_queue(
            client.QuorumQueueSpecification(name="mq-pair", quorum_initial_group_size=2)
        )
        info = management.queue_info("mq-pair")
        assert info.leader == leader.node_id
        assert len(info.members.elements) == 2 and leader.node_id in info.members.elements
        management.declare_queue(client.ClassicQueueSpecification(name="mc"))
        info = management.queue_info("mc")
        assert (info.leader, list(info.members.elements)) == (leader.node_id, [leader.node_id])
        management.close()
    finally:
        connection.close()
        environment.close()
    conn, ch = open_channel(leader.address)
    assert ch.queue_declare("mq", passive=True).method.message_count == 0
    conn.close()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker, match="x-queue-type"):
        conn, ch = open_channel(follower.address)
        try:
            ch.queue_declare("mq", durable=True)
        finally:
            conn.close()
