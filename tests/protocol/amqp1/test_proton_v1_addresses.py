"""RabbitMQ 3.x's "v1" addresses (its rabbitmq_amqp1_0 plugin's, README
"Routing and Addressing") with python-qpid-proton, against Warren and
against RabbitMQ 3.10's plugin, the reference for them (tests/amqp1_peers.py):
RabbitMQ 4.0 took them on, deprecated, and newer 4.x refuse them by default.
What Warren alone does with them (permissions, the exchange source's queue
going with the link): test_proton_links.py.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from amqp1_peers import Peer

proton = pytest.importorskip("proton")
from proton import Delivery, Message  # noqa: E402

pytestmark = [pytest.mark.timeout(60)]


def _receive(peer: Peer, address: str, count: int) -> list[Any]:
    """``count`` bodies from ``address``, accepted, on a connection of their
    own: 3.10 answers a link's detach without closing it, and proton would
    wait for the close."""
    conn = peer.connect()
    try:
        receiver = conn.create_receiver(address, name=str(uuid.uuid4()))
        bodies = []
        for _ in range(count):
            bodies.append(receiver.receive(timeout=10).body)
            receiver.accept()
        return bodies
    finally:
        conn.close()


def test_v1_targets(peer: Peer) -> None:
    """Each target form routes as the plugin's README says; every unsettled
    transfer is accepted."""
    # Not durable: 3.10 declares /queue/Q's queue again, durable only when the
    # target terminus is (proton's is not), and an inequivalent one ends the session.
    peer.declare("v1q", durable=False)
    peer.bind("v1q", "amq.direct", "k1")
    peer.bind("v1q", "amq.topic", "t.*")
    sends: list[tuple[str | None, str | None]] = [
        ("/amq/queue/v1q", None),
        ("/queue/v1q", None),
        ("v1q", None),  # no leading slash: a queue
        ("/exchange/amq.direct/k1", None),
        ("/exchange/amq.direct", "k1"),  # no key: the message's subject
        ("/topic/t.x", None),  # amq.topic
        ("/queue", "v1q"),  # the default exchange, keyed by the subject
    ]
    conn = peer.connect()
    try:
        for i, (address, subject) in enumerate(sends):
            sender = conn.create_sender(address, name=f"s{i}")
            delivery = sender.send(Message(body=f"{i} {address}", subject=subject))
            assert delivery.remote_state == Delivery.ACCEPTED, address
    finally:
        conn.close()
    bodies = _receive(peer, "/amq/queue/v1q", len(sends))
    assert bodies == [f"{i} {address}" for i, (address, _) in enumerate(sends)]
    peer.check_depth("v1q", 0, 0)


def test_v1_queue_sources(peer: Peer) -> None:
    peer.declare("v1src", durable=False)
    sources = ["/amq/queue/v1src", "/queue/v1src", "v1src"]
    conn = peer.connect()
    try:
        sender = conn.create_sender("/amq/queue/v1src")
        for source in sources:
            sender.send(Message(body=source))
    finally:
        conn.close()
    assert [_receive(peer, source, 1)[0] for source in sources] == sources
    peer.check_depth("v1src", 0, 0)


def test_v1_queue_target_declares_its_queue(peer: Peer) -> None:
    """/queue/Q and a bare Q declare a missing queue (not durable unless the
    terminus is)."""
    for name in ("v1new", "v1bare"):
        peer.delete(name)
    conn = peer.connect()
    try:
        for address in ("/queue/v1new", "v1bare"):
            sender = conn.create_sender(address)
            assert sender.send(Message(body=address)).remote_state == Delivery.ACCEPTED
    finally:
        conn.close()
    assert peer.exists("v1new") and peer.exists("v1bare")
    peer.check_depth("v1new", 1, 0)


def test_v1_exchange_sources(peer: Peer) -> None:
    """A source on an exchange (/exchange/X/RK, /topic/RK) consumes from a new
    queue bound to it (3.10's outlives the link, Warren's goes with it)."""
    conn = peer.connect()
    try:
        direct = conn.create_receiver("/exchange/amq.direct/xsrc", name="direct")
        topic = conn.create_receiver("/topic/xsrc.*", name="topic")
        conn.create_sender("/exchange/amq.direct/xsrc").send(Message(body="direct"))
        conn.create_sender("/topic/xsrc.a", name="t").send(Message(body="topic"))
        assert direct.receive(timeout=10).body == "direct"
        direct.accept()
        assert topic.receive(timeout=10).body == "topic"
        topic.accept()
    finally:
        conn.close()
