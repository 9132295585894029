"""python-qpid-proton over real sockets against the embedded broker: the attach
options RabbitMQ 4 refuses or takes (rcv-settle-mode second, link recovery's
durable terminus) and RabbitMQ 3.x's v1 addresses (an exchange source's
queue, ``/queue/Q`` declaring its queue). The wire details: test_amqp1_attach.py."""

from __future__ import annotations

from typing import Any

import pytest

proton = pytest.importorskip("proton")
from proton import Link, Message, Terminus  # noqa: E402
from proton.reactor import AtMostOnce, LinkOption  # noqa: E402
from proton.utils import BlockingConnection, LinkDetached, SendException  # noqa: E402

pytestmark = [pytest.mark.timeout(60)]


def connect(broker: Any) -> BlockingConnection:
    return BlockingConnection(
        f"amqp://127.0.0.1:{broker.port}",
        user="guest",
        password="guest",
        allowed_mechs="PLAIN",
        allow_insecure_mechs=True,
        virtual_host="vhost:/",
        timeout=10,
    )


def queue_names(broker: Any) -> set[str]:
    return broker.call(lambda: set(broker.broker.vhosts["/"].queues))


class _RcvSecond(LinkOption):
    def apply(self, link: Any) -> None:
        link.rcv_settle_mode = Link.RCV_SECOND


class _Durable(LinkOption):
    """The terminus a client that means to resume its link asks for."""

    def apply(self, link: Any) -> None:
        terminus = link.target if link.is_sender else link.source
        terminus.durability = Terminus.DELIVERIES
        terminus.expiry_policy = Terminus.EXPIRE_NEVER


def test_rcv_settle_mode_second_is_refused_unless_presettled(broker) -> None:
    """RabbitMQ 4 refuses second with amqp:not-implemented on a link whose
    sender does not settle first, either way; with pre-settled transfers
    the links work."""
    conn = connect(broker)
    try:
        conn.create_sender("/queue/second").send(Message(body="one"))
        with pytest.raises(LinkDetached) as info:
            conn.create_receiver("/queues/second", options=_RcvSecond())
        assert "amqp:not-implemented" in str(info.value)
        with pytest.raises(LinkDetached) as info:
            conn.create_sender("/queues/second", options=_RcvSecond())
        assert "amqp:not-implemented" in str(info.value)
        sender = conn.create_sender("/queues/second", options=[AtMostOnce(), _RcvSecond()])
        assert sender.link.remote_rcv_settle_mode == Link.RCV_FIRST
        sender.send(Message(body="two"))
        receiver = conn.create_receiver(
            "/queues/second", credit=2, options=[AtMostOnce(), _RcvSecond()]
        )
        assert receiver.link.remote_rcv_settle_mode == Link.RCV_SECOND
        assert [receiver.receive(timeout=10).body for _ in range(2)] == ["one", "two"]
    finally:
        conn.close()
    assert broker.call(lambda: broker.broker.vhosts["/"].queues["second"].message_count) == 0


def test_a_durable_terminus_is_attached_as_asked(broker) -> None:
    """RabbitMQ 4 keeps no terminus state, and says so by what it refuses (an
    attach with unsettled state), not by the terminus: durability and
    expiry-policy come back as asked."""
    conn = connect(broker)
    try:
        sender = conn.create_sender("/queue/kept", options=_Durable())
        sender.send(Message(body="x"))
        receiver = conn.create_receiver("/queue/kept", options=_Durable())
        source = receiver.link.remote_source
        assert (source.durability, source.expiry_policy) == (
            Terminus.DELIVERIES,
            Terminus.EXPIRE_NEVER,
        )
        assert receiver.receive(timeout=10).body == "x"
        receiver.accept()
    finally:
        conn.close()
    # The v1 /queue/Q declared it durable, as the terminus is.
    assert broker.call(lambda: broker.broker.vhosts["/"].queues["kept"].durable)


def test_v1_exchange_and_topic_sources(broker) -> None:
    """RabbitMQ 3.x's plugin's subscriptions: a receiver on ``/topic/key`` or
    ``/exchange/X/key`` consumes a queue bound with the key; a v1 target
    without a key routes by each message's subject."""
    before = queue_names(broker)
    conn = connect(broker)
    try:
        news = conn.create_receiver("/topic/news.*", credit=10)
        direct = conn.create_receiver("/exchange/amq.direct/orders", credit=10)
        assert len(queue_names(broker) - before) == 2
        conn.create_sender("/topic/news.today").send(Message(body="headline"))
        by_subject = conn.create_sender("/exchange/amq.direct")
        by_subject.send(Message(body="order 1", subject="orders"))
        with pytest.raises(SendException):  # released: no queue is bound with "other"
            by_subject.send(Message(body="nobody's", subject="other"))
        assert news.receive(timeout=10).body == "headline"
        news.accept()
        assert direct.receive(timeout=10).body == "order 1"
        direct.accept()
        news.close()
        direct.close()
        assert queue_names(broker) == before  # each link's queue went with it
    finally:
        conn.close()


def test_v1_queue_declares_and_amq_queue_does_not(broker) -> None:
    conn = connect(broker)
    try:
        with pytest.raises(LinkDetached) as info:
            conn.create_receiver("/amq/queue/absent")
        assert "amqp:not-found" in str(info.value)
        conn.create_sender("/queue/fresh").send(Message(body="declared"))
        receiver = conn.create_receiver("/amq/queue/fresh")
        assert receiver.receive(timeout=10).body == "declared"
        receiver.accept()
    finally:
        conn.close()
    names = queue_names(broker)
    assert "fresh" in names and "absent" not in names
    # No terminus durability asked: a transient queue, as RabbitMQ declares it.
    assert not broker.call(lambda: broker.broker.vhosts["/"].queues["fresh"].durable)
