"""AMQP 1.0 over real sockets: Qpid Proton's BlockingConnection against the
embedded broker's AMQP port (handed over by its protocol header), and the
mapping's promises seen from AMQP 0-9-1 (pika) both ways."""

from __future__ import annotations

import contextlib

import pika
import pytest

proton = pytest.importorskip("proton")
from proton.utils import BlockingConnection  # noqa: E402

pytestmark = [pytest.mark.timeout(60)]


def connect(broker, user: str = "guest", password: str = "guest", vhost: str = "/"):
    return BlockingConnection(
        f"amqp://127.0.0.1:{broker.port}",
        user=user,
        password=password,
        allowed_mechs="PLAIN",
        allow_insecure_mechs=True,
        virtual_host=f"vhost:{vhost}",
        timeout=10,
    )


def declare(broker, name: str, **arguments) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        conn.channel().queue_declare(name, durable=True, arguments=arguments or None)
    finally:
        conn.close()


def test_send_and_receive_a_queue(broker) -> None:
    declare(broker, "q")
    conn = connect(broker)
    try:
        sender = conn.create_sender("/queues/q")
        sender.send(proton.Message(body="over a socket", durable=True))
        receiver = conn.create_receiver("/queues/q")
        msg = receiver.receive(timeout=10)
        receiver.accept()
        assert msg.body == "over a socket"
    finally:
        conn.close()


def test_amqp1_to_amqp091_and_back(broker) -> None:
    declare(broker, "to091")
    declare(broker, "to10")
    conn = connect(broker)
    channel_conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        sender = conn.create_sender("/queues/to091")
        message = proton.Message(
            body=b"binary",
            content_type="text/plain",
            correlation_id="c-1",
            properties={"k": "v"},
            durable=True,
        )
        message.inferred = True  # bytes as a data section, not an amqp-value
        sender.send(message)
        ch = channel_conn.channel()
        method, props, body = ch.basic_get("to091", auto_ack=True)
        assert body == b"binary"
        assert props.content_type == "text/plain"
        assert props.correlation_id == "c-1"
        assert props.headers == {"k": "v"}
        assert props.delivery_mode == 2
        ch.basic_publish(
            "",
            "to10",
            b"from 0-9-1",
            pika.BasicProperties(message_id="m-1", headers={"h": 5}, delivery_mode=2),
        )
        receiver = conn.create_receiver("/queues/to10")
        msg = receiver.receive(timeout=10)
        receiver.accept()
        assert msg.body == b"from 0-9-1"
        assert msg.id == "m-1"
        assert msg.properties == {"h": 5}
        assert msg.durable
    finally:
        channel_conn.close()
        conn.close()


def test_errors_never_affect_another_connection(broker) -> None:
    declare(broker, "shared")
    good = connect(broker)
    try:
        sender = good.create_sender("/queues/shared")
        with pytest.raises(proton.utils.LinkDetached) as info:
            good.create_receiver("/queues/missing")
        assert "amqp:not-found" in str(info.value)
        with pytest.raises(proton.ConnectionException):
            connect(broker, password="wrong")
        sender.send(proton.Message(body="still here"))
        receiver = good.create_receiver("/queues/shared")
        assert receiver.receive(timeout=10).body == "still here"
        receiver.accept()
    finally:
        good.close()


def test_a_silent_client_is_closed_on_the_brokers_clock(broker_factory) -> None:
    """Nothing from the client for [amqp] heartbeat seconds on the broker's
    clock: the close says amqp:resource-limit-exceeded, as RabbitMQ 4's."""
    from warren.core.clock import ManualClock

    b = broker_factory(clock=ManualClock(), heartbeat=60)
    conn = connect(b)
    try:
        b.advance(60_001)
        with pytest.raises(proton.ConnectionException) as info:
            conn.create_sender("/exchanges/amq.topic/x")
        assert "amqp:resource-limit-exceeded" in str(info.value)
    finally:
        with contextlib.suppress(Exception):
            conn.close()


def test_a_broker_shutting_down_closes_its_clients_first(broker) -> None:
    """The stop tells each AMQP 1.0 client (amqp:connection:forced) and waits
    until its connection is gone (the listener's OpenClients)."""
    conn = connect(broker)
    try:
        broker.stop()
        listener = broker.broker.listener("amqp1")
        assert listener is not None and len(listener.protocols) == 0
        with pytest.raises(proton.ConnectionException) as info:
            conn.wait(lambda: False, timeout=5)
        assert "amqp:connection:forced" in str(info.value)
    finally:
        with contextlib.suppress(Exception):
            conn.close()
