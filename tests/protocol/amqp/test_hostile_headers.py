"""A confirmed message is never lost, and one client's bad message never hurts another.

Regression tests for what a hostile or careless publisher could do before
properties were validated at publish: deeply nested headers that broke
dead-lettering (541 and a lost message), expiry that stopped for good after one
such message, another client's connection closed for an overflow it did not
cause, and an unknown field type that was confirmed and then cut off every
consumer of the queue.

The containment tests at the end stand in for data written before validation
existed: a record whose properties cannot be parsed is put into a queue through
the queue itself (as an older Warren stored it), and the queue must keep it,
say so once, and go on with its other work.

In memory (issue 29): every client is a tests/harness MemoryAMQP whose frames
pamqp decodes (pika was the client before, raw sockets where pika cannot send
or read the bytes); the expiry tests run on a ManualClock moved past the TTL
instead of polling the queues on the wall clock; a restart is a new Harness
on the same data dir. That pika, aio-pika and py-amqp read headers at the
depth limit needs those clients, so that test stays on a socket:
tests/protocol/amqp/test_deep_headers_clients.py.
"""

from __future__ import annotations

import logging
import struct
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from harness import Harness, MemoryAMQP, harness_fixture
from pamqp import commands
from rawamqp import FRAME_BODY, FRAME_HEADER, AMQPFrames, method_frame, publish_frames, raw_frame

from warren.core.message import Message
from warren.core.table import MAX_DEPTH

broker = harness_fixture()
clocked = harness_fixture(manual_clock=True)

# -- helpers --------------------------------------------------------------------------


def nested(levels: int) -> dict[str, Any]:
    """Headers whose tables nest ``levels`` deep, the headers table being level 1."""
    value: dict[str, Any] = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


def depth(value: Any) -> int:
    """How deep tables nest in ``value`` (a dict is one level), iteratively."""
    levels = 0
    while isinstance(value, dict):
        levels += 1
        value = value.get("a")
    return levels


def _table(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


#: Headers {k: <field type 'Z'>} plus delivery-mode 2: what RabbitMQ cannot parse.
UNKNOWN_TAG_PROPERTIES = struct.pack(">H", 0x3000) + _table(b"\x01kZ\x00") + b"\x02"


def uniq(prefix: str = "q") -> str:
    return f"test-{prefix}-{uuid.uuid4().hex[:10]}"


def client(b: Harness, confirm: bool = False) -> MemoryAMQP:
    """A connection with channel 1 open (in confirm mode if asked)."""
    c = b.amqp_client()
    if confirm:
        c.send_method(1, commands.Confirm.Select())
        c.expect_method(commands.Confirm.SelectOk)
    return c


def declare(c: AMQPFrames, queue: str, durable: bool = False, **arguments: Any) -> None:
    c.send_method(
        1, commands.Queue.Declare(queue=queue, durable=durable, arguments=arguments or None)
    )
    c.expect_method(commands.Queue.DeclareOk)


def publish(
    c: AMQPFrames,
    exchange: str,
    routing_key: str,
    body: bytes,
    properties: commands.Basic.Properties | None = None,
) -> None:
    """basic.publish in confirm mode: its basic.ack must come next."""
    c.send(publish_frames(1, body, routing_key, exchange, properties))
    c.expect_method(commands.Basic.Ack, channel=1)


def raw_publish(
    client: AMQPFrames, routing_key: str, properties: bytes, data: bytes, exchange: str = ""
) -> None:
    """basic.publish with a content header whose property list is given as bytes."""
    client.send(
        method_frame(1, commands.Basic.Publish(exchange=exchange, routing_key=routing_key))
        + raw_frame(FRAME_HEADER, 1, struct.pack(">HHQ", 60, 0, len(data)) + properties)
        + raw_frame(FRAME_BODY, 1, data)
    )


def dlx_queue(c: AMQPFrames, **arguments: Any) -> tuple[str, str]:
    """A queue dead-lettering (through the default exchange) into a second queue."""
    src, dlq = uniq("src"), uniq("dlq")
    declare(c, dlq, durable=True)
    args = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq, **arguments}
    declare(c, src, durable=True, **args)
    return src, dlq


def persistent(headers: dict[str, Any] | None = None) -> commands.Basic.Properties:
    return commands.Basic.Properties(headers=headers, delivery_mode=2)


# -- refused at publish, never confirmed ------------------------------------------------


def test_headers_nested_deeper_than_the_limit_are_refused_unconfirmed(broker: Harness) -> None:
    c = client(broker, confirm=True)
    q = uniq()
    declare(c, q)
    c.send(publish_frames(1, b"deep", q, properties=persistent(nested(MAX_DEPTH + 1))))
    # The channel's close, with no basic.ack before it.
    code, text, _, _ = c.expect_channel_close(1)
    assert code == 406
    assert text == (
        f"PRECONDITION_FAILED - invalid message: headers nested deeper than {MAX_DEPTH} levels"
    )
    c.open_channel(2)
    assert c.ready_count(q, channel=2) == 0
    c.close()


def test_unknown_field_type_is_refused_and_consumers_keep_working(broker: Harness) -> None:
    """RabbitMQ refuses it too (541); before, Warren confirmed it and every consumer
    of the queue then failed to decode it."""
    consumer = client(broker)
    q = uniq()
    declare(consumer, q)
    consumer.send_method(1, commands.Basic.Consume(queue=q, no_ack=True))
    consumer.expect_method(commands.Basic.ConsumeOk)

    with client(broker, confirm=True) as bad:
        raw_publish(bad, q, UNKNOWN_TAG_PROPERTIES, b"poison")
        code, text, class_id, method_id = bad.expect_close()
    assert (code, class_id, method_id) == (501, 60, 40)
    assert text == (
        "FRAME_ERROR - cannot decode the message's properties: "
        "in header 'k': unknown field type 'Z'"
    )

    publisher = client(broker)
    publisher.send(
        publish_frames(1, b"fine", q, properties=commands.Basic.Properties(headers={"k": 1}))
    )
    # The first delivery is the good message (pamqp decodes it), and the consumer
    # is still served.
    consumer.expect_method(commands.Basic.Deliver)
    assert consumer.expect_content()[1] == b"fine"
    assert consumer.ready_count(q) == 0
    publisher.close()
    consumer.close()


# -- accepted at the limit ----------------------------------------------------------------


def test_headers_at_the_depth_limit_survive_a_restart(tmp_path: Path) -> None:
    with Harness(tmp_path / "data") as b:
        c = client(b, confirm=True)
        q = uniq()
        declare(c, q, durable=True)
        publish(c, "", q, b"kept", persistent(nested(MAX_DEPTH)))
        c.close()
    with Harness(tmp_path / "data") as restarted:
        c = client(restarted)
        _, props, body = c.basic_get(q)
        assert props is not None
        assert body == b"kept" and depth(props.headers) == MAX_DEPTH
        c.close()


def test_expiry_dead_letters_deep_headers_and_goes_on_expiring(clocked: Harness) -> None:
    """Before, the expiry timer raised on this message: it was lost, and messages
    behind it stayed queued long after their TTL."""
    c = client(clocked, confirm=True)
    src, dlq = dlx_queue(c, **{"x-message-ttl": 100})
    publish(c, "", src, b"deep", persistent(nested(MAX_DEPTH)))
    for i in range(3):
        publish(c, "", src, f"plain-{i}".encode(), persistent())
    clocked.advance(100)
    clocked.settle()
    assert c.ready_count(dlq) == 4
    assert c.ready_count(src) == 0
    bodies = []
    for _ in range(4):
        _, props, body = c.basic_get(dlq)
        assert props is not None
        assert props.headers["x-death"][0]["reason"] == "expired"
        bodies.append(body)
    assert bodies == [b"deep", b"plain-0", b"plain-1", b"plain-2"]
    c.close()


def test_another_clients_overflow_never_closes_its_connection(broker: Harness) -> None:
    """x-max-length 1: B's publish pushes A's deep-header message out; before, B's
    connection was closed with 541 and A's message lost."""
    a = client(broker, confirm=True)
    src, dlq = dlx_queue(a, **{"x-max-length": 1})
    publish(a, "", src, b"from-a", commands.Basic.Properties(headers=nested(MAX_DEPTH)))
    b = client(broker, confirm=True)
    publish(b, "", src, b"from-b")  # confirmed: basic.ack, not a close
    _, props, body = b.basic_get(dlq)  # and B's connection still answers
    assert props is not None
    assert body == b"from-a"
    assert props.headers["x-death"][0]["reason"] == "maxlen"
    assert depth(props.headers["a"]) == MAX_DEPTH - 1
    _, _, body = b.basic_get(src)
    assert body == b"from-b"
    a.close()
    b.close()


# -- containment: a message that cannot be dead-lettered stays ----------------------------


def _store_unreadable(broker: Harness, queue: str, data: bytes) -> None:
    """Put a message whose properties cannot be parsed into ``queue`` the way an
    older Warren, which did not validate them, stored it."""

    def store() -> None:
        q = broker.broker.vhosts["/"].queues[queue]
        now = broker.broker.clock.now_ms()
        q.publish(Message("", queue, UNKNOWN_TAG_PROPERTIES, data, now))

    broker.call(store)


def _ready_properties(broker: Harness, queue: str) -> list[bytes]:
    """The raw properties of the queue's ready messages, in order (from its store)."""

    def scan() -> list[bytes]:
        q = broker.broker.vhosts["/"].queues[queue]
        return [props for _, _, props in q.store.scan_ready()]

    return broker.call(scan)


def _raw_frame(client: AMQPFrames) -> tuple[int, bytes]:
    """The next frame's type and payload, undecoded (pamqp cannot parse these)."""
    deadline = time.monotonic() + 5
    while len(client.buf) < 7 or len(client.buf) < 8 + struct.unpack_from(">I", client.buf, 3)[0]:
        assert client._recv(deadline), "server closed the socket"
    size = struct.unpack_from(">I", client.buf, 3)[0]
    frame_type, payload = client.buf[0], client.buf[7 : 7 + size]
    client.buf = client.buf[8 + size :]
    return frame_type, payload


def _raw_content(client: AMQPFrames) -> tuple[bytes, bytes]:
    """A content header's payload and the body that follows it, undecoded."""
    frame_type, header_payload = _raw_frame(client)
    assert frame_type == FRAME_HEADER
    (size,) = struct.unpack_from(">Q", header_payload, 4)
    body = b""
    while len(body) < size:
        frame_type, part = _raw_frame(client)
        assert frame_type == FRAME_BODY
        body += part
    return header_payload, body


def _failures_logged(caplog: pytest.LogCaptureFixture, queue: str) -> int:
    return sum(
        1
        for r in caplog.records
        if r.name == "warren.queue"
        and "cannot dead-letter" in r.getMessage()
        and queue in r.getMessage()
    )


def test_expiry_keeps_an_unreadable_message_and_expires_the_rest(
    clocked: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    c = client(clocked)
    src, dlq = dlx_queue(c, **{"x-message-ttl": 100})
    _store_unreadable(clocked, src, b"legacy")
    for i in range(3):
        c.send(publish_frames(1, f"plain-{i}".encode(), src))
    clocked.advance(100)
    clocked.settle()
    assert c.ready_count(dlq) == 3
    assert [c.basic_get(dlq)[2] for _ in range(3)] == [b"plain-0", b"plain-1", b"plain-2"]
    # The unreadable one is still there, no longer expiring, logged once.
    c.send(publish_frames(1, b"later", src))
    clocked.advance(100)
    clocked.settle()
    assert c.ready_count(dlq) == 1
    assert _ready_properties(clocked, src) == [UNKNOWN_TAG_PROPERTIES]
    assert _failures_logged(caplog, src) == 1
    c.close()


def test_overflow_of_an_unreadable_message_keeps_it_and_the_limit(
    broker: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    c = client(broker, confirm=True)
    src, dlq = dlx_queue(c, **{"x-max-length": 1})
    _store_unreadable(broker, src, b"legacy")
    publish(c, "", src, b"new")  # confirmed: no 541 for this innocent publisher
    # The queue holds its one message: the unreadable one stayed, the newer one went.
    assert _ready_properties(broker, src) == [UNKNOWN_TAG_PROPERTIES]
    _, props, body = c.basic_get(dlq)  # the channel and the connection still answer
    assert props is not None
    assert body == b"new" and props.headers["x-death"][0]["reason"] == "maxlen"
    assert _failures_logged(caplog, src) == 1
    c.close()


def test_rejecting_an_unreadable_message_requeues_it(
    broker: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    c = client(broker)
    src, dlq = dlx_queue(c)
    _store_unreadable(broker, src, b"legacy")
    with client(broker) as raw:
        raw.send_method(1, commands.Basic.Get(queue=src))
        ok = raw.expect_method(commands.Basic.GetOk, channel=1)
        header_payload, body = _raw_content(raw)
        assert header_payload[12:] == UNKNOWN_TAG_PROPERTIES and body == b"legacy"
        raw.send_method(1, commands.Basic.Reject(delivery_tag=ok.delivery_tag, requeue=False))
        raw.send_method(1, commands.Basic.Qos())  # a round trip: the reject is handled
        raw.expect_method(commands.Basic.QosOk, channel=1)
    assert c.ready_count(src) == 1 and c.ready_count(dlq) == 0
    assert _ready_properties(broker, src) == [UNKNOWN_TAG_PROPERTIES]
    assert _failures_logged(caplog, src) == 1
    c.close()


def test_redelivering_an_unreadable_message_under_a_delivery_limit(broker: Harness) -> None:
    """x-delivery-count cannot be added to properties that cannot be parsed: the
    message is delivered without it instead of failing the client that asked."""
    c = client(broker)
    q = uniq()
    declare(c, q, durable=True, **{"x-delivery-limit": 5})
    _store_unreadable(broker, q, b"legacy")
    with client(broker) as raw:
        for attempt in range(2):
            raw.send_method(1, commands.Basic.Get(queue=q))
            ok = raw.expect_method(commands.Basic.GetOk, channel=1)
            assert ok.redelivered == (attempt == 1)
            header_payload, body = _raw_content(raw)
            assert header_payload[12:] == UNKNOWN_TAG_PROPERTIES and body == b"legacy"
            raw.send_method(1, commands.Basic.Reject(delivery_tag=ok.delivery_tag, requeue=True))
        raw.send_method(1, commands.Basic.Qos())
        raw.expect_method(commands.Basic.QosOk, channel=1)
    assert c.ready_count(q) == 1
    c.close()
