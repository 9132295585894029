"""A confirmed message is never lost, and one client's bad message never hurts another.

Regression tests for what a hostile or careless publisher could do before
properties were validated at publish: deeply nested headers that broke
dead-lettering (541 and a lost message), expiry that stopped for good after one
such message, another client's connection closed for an overflow it did not
cause, and an unknown field type that was confirmed and then cut off every pika
consumer of the queue. Real clients and raw sockets against an embedded broker.

The containment tests at the end stand in for data written before validation
existed: a record whose properties cannot be parsed is put into a queue through
the queue itself (as an older Warren stored it), and the queue must keep it,
say so once, and go on with its other work.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aio_pika
import amqp
import pika
import pika.exceptions
import pytest
from conftest import BrokerThread, start_broker
from pamqp import commands
from pikahelp import connect, ready_count, uniq, wait_until
from rawamqp import FRAME_BODY, FRAME_HEADER, RawAMQP, method_frame, raw_frame

from warren.core.message import Message
from warren.core.table import MAX_DEPTH

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


def raw_publish(
    client: RawAMQP, routing_key: str, properties: bytes, data: bytes, exchange: str = ""
) -> None:
    """basic.publish with a content header whose property list is given as bytes."""
    client.send(
        method_frame(1, commands.Basic.Publish(exchange=exchange, routing_key=routing_key))
        + raw_frame(FRAME_HEADER, 1, struct.pack(">HHQ", 60, 0, len(data)) + properties)
        + raw_frame(FRAME_BODY, 1, data)
    )


def dlx_queue(ch: Any, **arguments: Any) -> tuple[str, str]:
    """A queue dead-lettering (through the default exchange) into a second queue."""
    src, dlq = uniq("src"), uniq("dlq")
    ch.queue_declare(dlq, durable=True)
    args = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq, **arguments}
    ch.queue_declare(src, durable=True, arguments=args)
    return src, dlq


def wait_for_count(conn: Any, ch: Any, queue: str, count: int, timeout: float = 5.0) -> None:
    wait_until(conn, lambda: ready_count(ch, queue) == count, timeout)


@pytest.fixture
def broker_dir(tmp_path: Path) -> Iterator[tuple[BrokerThread, Path]]:
    """A broker and its data directory, for tests that restart it (stop() twice is fine)."""
    data = tmp_path / "data"
    b = start_broker(data)
    try:
        yield b, data
    finally:
        b.stop()


# -- refused at publish, never confirmed ------------------------------------------------


def test_headers_nested_deeper_than_the_limit_are_refused_unconfirmed(
    broker: BrokerThread,
) -> None:
    conn = connect(broker)
    ch = conn.channel()
    q = uniq()
    ch.queue_declare(q)
    ch.confirm_delivery()
    props = pika.BasicProperties(headers=nested(MAX_DEPTH + 1), delivery_mode=2)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
        ch.basic_publish("", q, b"deep", props)
    assert caught.value.reply_code == 406
    assert caught.value.reply_text == (
        f"PRECONDITION_FAILED - invalid message: headers nested deeper than {MAX_DEPTH} levels"
    )
    ch = conn.channel()
    assert ready_count(ch, q) == 0
    conn.close()


def test_unknown_field_type_is_refused_and_consumers_keep_working(broker: BrokerThread) -> None:
    """RabbitMQ refuses it too (541); before, Warren confirmed it and every pika
    consumer of the queue then failed to decode it."""
    consumer_conn = connect(broker)
    ch = consumer_conn.channel()
    q = uniq()
    ch.queue_declare(q)
    got: list[bytes] = []
    ch.basic_consume(q, lambda c, m, p, b: got.append(b), auto_ack=True)

    with RawAMQP(broker.port) as bad:
        bad.handshake()
        bad.open_channel(1)
        bad.send_method(1, commands.Confirm.Select())
        bad.expect_method(commands.Confirm.SelectOk)
        raw_publish(bad, q, UNKNOWN_TAG_PROPERTIES, b"poison")
        code, text, class_id, method_id = bad.expect_close()
    assert (code, class_id, method_id) == (501, 60, 40)
    assert text == (
        "FRAME_ERROR - cannot decode the message's properties: "
        "in header 'k': unknown field type 'Z'"
    )

    publisher = connect(broker)
    publisher.channel().basic_publish("", q, b"fine", pika.BasicProperties(headers={"k": 1}))
    wait_until([consumer_conn, publisher], lambda: got == [b"fine"])
    assert consumer_conn.is_open
    publisher.close()
    consumer_conn.close()


# -- accepted at the limit: every path can handle it ------------------------------------


def test_headers_at_the_depth_limit_survive_routing_dead_lettering_and_every_client(
    broker: BrokerThread,
) -> None:
    """Nesting at the limit goes through the headers exchange and CC routing, is
    rejected into a dead-letter queue, and pika, aio-pika and py-amqp read it back."""
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    src, dlq = dlx_queue(ch)
    other = uniq("cc")
    ch.queue_declare(other, durable=True)
    hx = uniq("hx")
    ch.exchange_declare(hx, "headers")
    ch.queue_bind(src, hx, arguments={"x-match": "all", "route": "yes"})
    ch.exchange_declare(dx := uniq("dx"), "direct")
    ch.queue_bind(src, dx, "to-src")
    ch.queue_bind(other, dx, "to-other")
    headers = {"route": "yes", "deep": nested(MAX_DEPTH - 1)}
    props = pika.BasicProperties(headers=headers, delivery_mode=2, message_id="m1")
    ch.basic_publish(hx, "", b"by-headers", props)  # confirmed, or this raises
    cc_props = pika.BasicProperties(headers={**headers, "CC": ["to-other"]}, delivery_mode=2)
    ch.basic_publish(dx, "to-src", b"by-cc", cc_props)
    assert ready_count(ch, src) == 2 and ready_count(ch, other) == 1

    for _ in range(2):
        method, _, _ = ch.basic_get(src)
        assert method is not None
        ch.basic_reject(method.delivery_tag, requeue=False)
    wait_for_count(conn, ch, dlq, 2)

    method, got, body = ch.basic_get(dlq, auto_ack=True)  # pika
    assert body == b"by-headers"
    assert depth(got.headers["deep"]) == MAX_DEPTH - 1
    assert got.headers["x-death"][0]["reason"] == "rejected"
    assert got.headers["x-first-death-queue"] == src

    async def aio_get() -> Any:  # aio-pika (pamqp)
        c = await aio_pika.connect(broker.url)
        try:
            channel = await c.channel()
            queue = await channel.get_queue(dlq, ensure=False)
            return await queue.get(no_ack=True)
        finally:
            await c.close()

    message = asyncio.run(aio_get())
    assert message.body == b"by-cc"
    assert depth(message.headers["deep"]) == MAX_DEPTH - 1
    # A dead-letter routing key replaces the CC header; x-death keeps the keys.
    assert "CC" not in message.headers
    assert message.headers["x-death"][0]["routing-keys"] == ["to-src", "to-other"]

    with amqp.Connection(f"127.0.0.1:{broker.port}") as pyamqp:  # py-amqp
        pych = pyamqp.channel()
        msg = pych.basic_get(other, no_ack=True)
        assert msg is not None and msg.body == b"by-cc"
        assert depth(msg.headers["deep"]) == MAX_DEPTH - 1
    conn.close()


def test_headers_at_the_depth_limit_survive_a_restart(
    broker_dir: tuple[BrokerThread, Path],
) -> None:
    broker, data = broker_dir
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    q = uniq()
    ch.queue_declare(q, durable=True)
    ch.basic_publish(
        "", q, b"kept", pika.BasicProperties(headers=nested(MAX_DEPTH), delivery_mode=2)
    )
    conn.close()
    broker.stop()
    restarted = start_broker(data)
    try:
        conn = connect(restarted)
        method, props, body = conn.channel().basic_get(q, auto_ack=True)
        assert body == b"kept" and depth(props.headers) == MAX_DEPTH
        conn.close()
    finally:
        restarted.stop()


def test_expiry_dead_letters_deep_headers_and_goes_on_expiring(broker: BrokerThread) -> None:
    """Before, the expiry timer raised on this message: it was lost, and messages
    behind it stayed queued long after their TTL."""
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    src, dlq = dlx_queue(ch, **{"x-message-ttl": 100})
    deep = pika.BasicProperties(headers=nested(MAX_DEPTH), delivery_mode=2)
    ch.basic_publish("", src, b"deep", deep)
    for i in range(3):
        ch.basic_publish("", src, f"plain-{i}".encode(), pika.BasicProperties(delivery_mode=2))
    wait_for_count(conn, ch, dlq, 4)
    assert ready_count(ch, src) == 0
    bodies = []
    for _ in range(4):
        _, props, body = ch.basic_get(dlq, auto_ack=True)
        assert props.headers["x-death"][0]["reason"] == "expired"
        bodies.append(body)
    assert bodies == [b"deep", b"plain-0", b"plain-1", b"plain-2"]
    conn.close()


def test_another_clients_overflow_never_closes_its_connection(broker: BrokerThread) -> None:
    """x-max-length 1: B's publish pushes A's deep-header message out; before, B's
    connection was closed with 541 and A's message lost."""
    a = connect(broker)
    ach = a.channel()
    ach.confirm_delivery()
    src, dlq = dlx_queue(ach, **{"x-max-length": 1})
    ach.basic_publish("", src, b"from-a", pika.BasicProperties(headers=nested(MAX_DEPTH)))
    b = connect(broker)
    bch = b.channel()
    bch.confirm_delivery()
    bch.basic_publish("", src, b"from-b")  # confirmed, or this raises
    assert b.is_open and bch.is_open
    _, props, body = bch.basic_get(dlq, auto_ack=True)
    assert body == b"from-a"
    assert props.headers["x-death"][0]["reason"] == "maxlen"
    assert depth(props.headers["a"]) == MAX_DEPTH - 1
    _, _, body = bch.basic_get(src, auto_ack=True)
    assert body == b"from-b"
    a.close()
    b.close()


# -- containment: a message that cannot be dead-lettered stays ----------------------------


def _store_unreadable(broker: BrokerThread, queue: str, data: bytes) -> None:
    """Put a message whose properties cannot be parsed into ``queue`` the way an
    older Warren, which did not validate them, stored it."""

    def store() -> None:
        q = broker.broker.vhosts["/"].queues[queue]
        q.publish(Message("", queue, UNKNOWN_TAG_PROPERTIES, data))

    broker.call(store)


def _ready_properties(broker: BrokerThread, queue: str) -> list[bytes]:
    """The raw properties of the queue's ready messages, in order (from its store)."""

    def scan() -> list[bytes]:
        q = broker.broker.vhosts["/"].queues[queue]
        return [props for _, _, props in q.store.scan_ready()]

    return broker.call(scan)


def _raw_frame(client: RawAMQP) -> tuple[int, bytes]:
    """The next frame's type and payload, undecoded (pamqp cannot parse these)."""
    deadline = time.monotonic() + 5
    while len(client.buf) < 7 or len(client.buf) < 8 + struct.unpack_from(">I", client.buf, 3)[0]:
        assert client._recv(deadline), "server closed the socket"
    size = struct.unpack_from(">I", client.buf, 3)[0]
    frame_type, payload = client.buf[0], client.buf[7 : 7 + size]
    client.buf = client.buf[8 + size :]
    return frame_type, payload


def _raw_content(client: RawAMQP) -> tuple[bytes, bytes]:
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
    broker: BrokerThread, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    conn = connect(broker)
    ch = conn.channel()
    src, dlq = dlx_queue(ch, **{"x-message-ttl": 100})
    _store_unreadable(broker, src, b"legacy")
    for i in range(3):
        ch.basic_publish("", src, f"plain-{i}".encode())
    wait_for_count(conn, ch, dlq, 3)
    assert [ch.basic_get(dlq, auto_ack=True)[2] for _ in range(3)] == [
        b"plain-0",
        b"plain-1",
        b"plain-2",
    ]
    # The unreadable one is still there, no longer expiring, logged once.
    ch.basic_publish("", src, b"later")
    wait_for_count(conn, ch, dlq, 1)
    assert _ready_properties(broker, src) == [UNKNOWN_TAG_PROPERTIES]
    assert _failures_logged(caplog, src) == 1
    conn.close()


def test_overflow_of_an_unreadable_message_keeps_it_and_the_limit(
    broker: BrokerThread, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    src, dlq = dlx_queue(ch, **{"x-max-length": 1})
    _store_unreadable(broker, src, b"legacy")
    ch.basic_publish("", src, b"new")  # confirmed: no 541 for this innocent publisher
    assert conn.is_open and ch.is_open
    # The queue holds its one message: the unreadable one stayed, the newer one went.
    assert _ready_properties(broker, src) == [UNKNOWN_TAG_PROPERTIES]
    _, props, body = ch.basic_get(dlq, auto_ack=True)
    assert body == b"new" and props.headers["x-death"][0]["reason"] == "maxlen"
    assert _failures_logged(caplog, src) == 1
    conn.close()


def test_rejecting_an_unreadable_message_requeues_it(
    broker: BrokerThread, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    conn = connect(broker)
    ch = conn.channel()
    src, dlq = dlx_queue(ch)
    _store_unreadable(broker, src, b"legacy")
    with RawAMQP(broker.port) as client:
        client.handshake()
        client.open_channel(1)
        client.send_method(1, commands.Basic.Get(queue=src))
        ok = client.expect_method(commands.Basic.GetOk, channel=1)
        header_payload, body = _raw_content(client)
        assert header_payload[12:] == UNKNOWN_TAG_PROPERTIES and body == b"legacy"
        client.send_method(1, commands.Basic.Reject(delivery_tag=ok.delivery_tag, requeue=False))
        client.send_method(1, commands.Basic.Qos())  # a round trip: the reject is handled
        client.expect_method(commands.Basic.QosOk, channel=1)
    assert ready_count(ch, src) == 1 and ready_count(ch, dlq) == 0
    assert _ready_properties(broker, src) == [UNKNOWN_TAG_PROPERTIES]
    assert _failures_logged(caplog, src) == 1
    conn.close()


def test_redelivering_an_unreadable_message_under_a_delivery_limit(broker: BrokerThread) -> None:
    """x-delivery-count cannot be added to properties that cannot be parsed: the
    message is delivered without it instead of failing the client that asked."""
    conn = connect(broker)
    ch = conn.channel()
    q = uniq()
    ch.queue_declare(q, durable=True, arguments={"x-delivery-limit": 5})
    _store_unreadable(broker, q, b"legacy")
    with RawAMQP(broker.port) as client:
        client.handshake()
        client.open_channel(1)
        for attempt in range(2):
            client.send_method(1, commands.Basic.Get(queue=q))
            ok = client.expect_method(commands.Basic.GetOk, channel=1)
            assert ok.redelivered == (attempt == 1)
            header_payload, body = _raw_content(client)
            assert header_payload[12:] == UNKNOWN_TAG_PROPERTIES and body == b"legacy"
            client.send_method(1, commands.Basic.Reject(delivery_tag=ok.delivery_tag, requeue=True))
        client.send_method(1, commands.Basic.Qos())
        client.expect_method(commands.Basic.QosOk, channel=1)
    assert ready_count(ch, q) == 1
    conn.close()
