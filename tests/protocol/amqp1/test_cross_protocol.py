"""Messages across protocols over real sockets, as RabbitMQ 4 maps them
(amqp1/mapping.py, docs/amqp1.md "Message mapping"; MQTT: docs/mqtt.md):
published over AMQP 1.0 (Qpid Proton) and consumed over AMQP 0-9-1 (pika)
and MQTT (paho), and the other way round. 1.0 to 1.0 runs against RabbitMQ
3.10's plugin too (tests/amqp1_peers.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pika
import pytest
from amqp1_peers import Peer
from mqttclient import V5, V311, Client, props

proton = pytest.importorskip("proton")
from proton import Message, symbol  # noqa: E402
from proton.utils import BlockingConnection  # noqa: E402

pytestmark = [pytest.mark.timeout(60)]


@pytest.fixture
def amqp1(broker) -> Iterator[Any]:
    conn = BlockingConnection(
        f"amqp://127.0.0.1:{broker.port}",
        user="guest",
        password="guest",
        allowed_mechs="PLAIN",
        allow_insecure_mechs=True,
        virtual_host="vhost:/",
        timeout=10,
    )
    yield conn
    conn.close()


@pytest.fixture
def channel(broker) -> Iterator[Any]:
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    yield conn.channel()
    conn.close()


def mqtt(broker: Any, protocol: int = V5) -> Client:
    client = Client(broker.mqtt_port, protocol=protocol, username="guest", password="guest")
    client.connect()
    return client


def data(body: bytes, **fields: Any) -> Message:
    """A message with ``body`` as one data section (proton's inferred bytes)."""
    message = Message(body=body, **fields)
    message.inferred = True
    return message


def receive(conn: Any, queue: str) -> Message:
    receiver = conn.create_receiver(f"/queues/{queue}", name=str(uuid.uuid4()))
    message = receiver.receive(timeout=10)
    receiver.accept()
    return message


# -- AMQP 1.0 -> 0-9-1 and MQTT ------------------------------------------------------------


def test_amqp1_to_amqp091(amqp1, channel) -> None:
    channel.queue_declare("to091", durable=True)
    sender = amqp1.create_sender("/queues/to091")
    sender.send(
        data(
            b'{"n": 1}',
            id="msg-1",
            correlation_id="corr-1",
            content_type="application/json",
            content_encoding="identity",
            reply_to="/queues/reply%20here",
            durable=True,
            priority=7,
            ttl=60,
            group_id="app",
            creation_time=1_700_000_000,
            # No float: pika 1.4 reads doubles and floats as ints (data.py).
            properties={"s": "text", "n": 7, "t": True, "b": b"\x00\xff"},
            annotations={symbol("x-trace"): "t-1"},
        )
    )
    ids = uuid.UUID("12345678-1234-5678-1234-567812345678")
    sender.send(data(b"uuid ids", id=ids, correlation_id=42, durable=False))
    method, props_, body = channel.basic_get("to091", auto_ack=True)
    assert body == b'{"n": 1}'
    assert (props_.message_id, props_.correlation_id) == ("msg-1", "corr-1")
    assert (props_.content_type, props_.content_encoding) == ("application/json", "identity")
    assert props_.reply_to == "reply here"  # /queues/Q, percent-decoded
    assert (props_.delivery_mode, props_.priority, props_.expiration) == (2, 7, "60000")
    assert props_.app_id == "app"
    assert props_.timestamp == 1_700_000_000
    # Annotations x-* before application properties.
    assert props_.headers == {"x-trace": "t-1", "s": "text", "n": 7, "t": True, "b": b"\x00\xff"}
    assert method.routing_key == "to091" and method.exchange == ""
    _, props_, body = channel.basic_get("to091", auto_ack=True)
    assert body == b"uuid ids"
    assert props_.message_id == f"urn:uuid:{ids}"
    assert props_.correlation_id == "42"  # a ulong as decimal text
    assert props_.delivery_mode is None  # proton sends no header: durable absent


def test_amqp1_to_mqtt(broker, amqp1) -> None:
    v5, v311 = mqtt(broker), mqtt(broker, V311)
    try:
        v5.subscribe("sensors/+", qos=1)
        v311.subscribe("sensors/#", qos=1)
        sender = amqp1.create_sender("/exchanges/amq.topic/sensors.temp")
        sender.send(
            data(
                b"21.5",
                content_type="text/plain",
                correlation_id="corr-7",
                reply_to="/queues/answers",
                durable=True,
                properties={"unit": "C"},
            )
        )
        got = v5.next()
        assert (got.topic, got.payload, got.qos) == ("sensors/temp", b"21.5", 1)
        p = got.properties
        assert p.ContentType == "text/plain"
        assert p.CorrelationData == b"corr-7"
        assert p.ResponseTopic == "answers"
        assert ("unit", "C") in p.UserProperty
        old = v311.next()
        assert (old.topic, old.payload, old.qos) == ("sensors/temp", b"21.5", 1)
        # Not persistent: QoS 0.
        amqp1.create_sender("/exchanges/amq.topic/sensors.wind", name="wind").send(
            data(b"3", durable=False)
        )
        assert (v5.next().topic, v311.next().qos) == ("sensors/wind", 0)
    finally:
        v5.close()
        v311.close()


# -- AMQP 0-9-1 and MQTT -> AMQP 1.0 -------------------------------------------------------


def test_amqp091_to_amqp1(amqp1, channel) -> None:
    channel.queue_declare("to10", durable=True)
    ids = uuid.UUID("87654321-4321-8765-4321-876543218765")
    channel.basic_publish(
        "",
        "to10",
        b"from 0-9-1",
        pika.BasicProperties(
            content_type="text/plain",
            content_encoding="utf-8",
            message_id=f"urn:uuid:{ids}",
            correlation_id="c-2",
            reply_to="replies",
            delivery_mode=2,
            priority=3,
            expiration="5000",
            timestamp=1_700_000_000,
            app_id="billing",
            type="invoice",
            headers={"h": "v", "n": 5, "x-custom": "a"},
        ),
    )
    msg = receive(amqp1, "to10")
    assert msg.body == b"from 0-9-1"
    assert (msg.content_type, msg.content_encoding) == ("text/plain", "utf-8")
    assert (msg.id, msg.correlation_id) == (ids, "c-2")  # urn:uuid: as a uuid
    assert msg.reply_to == "/queues/replies"
    assert (msg.durable, msg.priority, msg.ttl) == (True, 3, 5.0)
    assert msg.creation_time == 1_700_000_000
    assert msg.group_id == "billing"
    assert msg.properties == {"h": "v", "n": 5}
    annotations = msg.annotations
    assert annotations["x-basic-type"] == "invoice"
    assert annotations["x-custom"] == "a"
    assert (annotations["x-exchange"], annotations["x-routing-key"]) == ("", "to10")


def test_mqtt_to_amqp1(broker, amqp1, channel) -> None:
    channel.queue_declare("telemetry", durable=True)
    channel.queue_bind("telemetry", "amq.topic", "devices.*.temp")
    client = mqtt(broker)
    try:
        client.publish(
            "devices/d1/temp",
            b"22.0",
            qos=1,
            properties=props(
                ContentType="text/plain",
                CorrelationData=b"req-3",
                ResponseTopic="devices/d1/answers",
                UserProperty=[("unit", "C")],
            ),
        )
        client.publish("devices/d2/temp", b"19.0", qos=0)
    finally:
        client.close()
    msg = receive(amqp1, "telemetry")
    assert msg.body == b"22.0"
    assert msg.content_type == "text/plain"
    assert msg.correlation_id == "req-3"
    assert msg.reply_to == "/queues/devices.d1.answers"
    assert msg.durable is True
    assert msg.properties == {"unit": "C"}
    annotations = msg.annotations
    assert (annotations["x-exchange"], annotations["x-routing-key"]) == (
        "amq.topic",
        "devices.d1.temp",
    )
    assert annotations["x-mqtt-publish-qos"] == 1
    second = receive(amqp1, "telemetry")
    assert (second.body, second.durable, second.annotations["x-mqtt-publish-qos"]) == (
        b"19.0",
        False,
        0,
    )


def test_amqp1_to_amqp1_keeps_the_mapped_fields(peer: Peer) -> None:
    """Through the core's 0-9-1 format: what the tables convert both ways.
    RabbitMQ 3.10's plugin is the reference too: the sections a 1.0 consumer
    gets back are those a 1.0 publisher sent (its README, "Message payloads").
    The other scenarios here follow RabbitMQ 4's mapping (its docs,
    https://www.rabbitmq.com/docs/conversions, rewritten in 3.13): 3.10's
    plugin gave 0-9-1 consumers none of a 1.0 message's application
    properties and 1.0 consumers none of 0-9-1's headers (README, note 8)."""
    peer.declare("same")
    conn = peer.connect()
    try:
        _keeps_the_mapped_fields(peer, conn)
    finally:
        conn.close()


def _keeps_the_mapped_fields(peer: Peer, amqp1: Any) -> None:
    amqp1.create_sender(peer.queue("same")).send(
        Message(
            body={"k": [1, 2]},
            id="m-9",
            correlation_id="c-9",
            content_type="application/x-map",
            reply_to="/queues/back",
            durable=True,
            priority=2,
            ttl=30,
            group_id="g",
            properties={"p": "v"},
        )
    )
    receiver = amqp1.create_receiver(peer.queue("same"))
    msg = receiver.receive(timeout=10)
    receiver.accept()
    assert msg.body == {"k": [1, 2]}  # an amqp-value, kept as sections
    assert (msg.id, msg.correlation_id, msg.content_type) == ("m-9", "c-9", "application/x-map")
    assert (msg.reply_to, msg.group_id, msg.properties) == ("/queues/back", "g", {"p": "v"})
    assert (msg.durable, msg.priority, msg.ttl) == (True, 2, 30.0)
