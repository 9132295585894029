"""kombu (py-amqp transport) against a real Warren broker over TCP."""

from __future__ import annotations

import bz2
import contextlib
import datetime
import decimal
import json
import time
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import amqp.exceptions
import pytest
from kombu import Connection, Consumer, Exchange, Producer, Queue
from kombu.message import Message

from warren.core.clock import ManualClock


@pytest.fixture
def conn(broker: Any) -> Iterator[Connection]:
    # Publisher confirms make every publish synchronous, so counts read right after
    # publishing are exact (RabbitMQ too would otherwise answer before enqueueing).
    with Connection(
        broker.url, connect_timeout=5, transport_options={"confirm_publish": True}
    ) as c:
        c.connect()
        yield c


def drain_until(conn: Connection, done: Any, timeout: float = 5) -> None:
    """drain_events until ``done()`` holds; each wait is bounded by ``timeout``."""
    while not done():
        conn.drain_events(timeout=timeout)


class Received:
    def __init__(self) -> None:
        self.items: list[tuple[Any, Message]] = []

    def __call__(self, body: Any, message: Message) -> None:
        self.items.append((body, message))

    def bodies(self) -> list[Any]:
        return [b for b, _ in self.items]


# -- SimpleQueue ---------------------------------------------------------------------


def test_simple_queue_json_round_trip(conn: Connection) -> None:
    with conn.SimpleQueue("simple-json", serializer="json") as q:
        payloads = [{"n": i, "text": "héllo", "list": [1, 2.5, None, True]} for i in range(5)]
        for p in payloads:
            q.put(p)
        assert q.qsize() == 5
        got = []
        for _ in payloads:
            msg = q.get(timeout=5)
            assert msg.content_type == "application/json"
            assert msg.delivery_info["routing_key"] == "simple-json"
            got.append(msg.payload)
            msg.ack()
        assert got == payloads
        assert q.qsize() == 0
        with pytest.raises(q.Empty):
            q.get_nowait()


def test_simple_queue_pickle_round_trip(conn: Connection) -> None:
    value = {
        "when": datetime.datetime(2024, 5, 17, 12, 30, tzinfo=datetime.UTC),
        "money": decimal.Decimal("12.34"),
        "raw": b"\x00\xff" * 10,
        "tuple": (1, "two", frozenset({3})),
    }
    with conn.SimpleQueue("simple-pickle", serializer="pickle", accept=["pickle"]) as q:
        q.put(value)
        msg = q.get(timeout=5)
        assert msg.content_type == "application/x-python-serialize"
        assert msg.payload == value
        msg.ack()
        assert q.qsize() == 0


@pytest.mark.parametrize(
    ("compression", "content_encoding", "decompress"),
    [
        ("zlib", "application/x-gzip", zlib.decompress),
        ("bzip2", "application/x-bz2", bz2.decompress),
    ],
)
def test_simple_queue_compression(
    conn: Connection, compression: str, content_encoding: str, decompress: Any
) -> None:
    payload = {"blob": "abc" * 20_000}  # 60 kB of text, compresses well
    with conn.SimpleQueue(f"simple-{compression}", serializer="json") as q:
        q.put(payload, compression=compression)
        q.put(payload, compression=compression)
        # What the broker holds is the compressed body, byte for byte.
        raw = conn.default_channel.basic_get(f"simple-{compression}", no_ack=True)
        assert raw is not None
        assert len(raw.body) < 5_000
        assert json.loads(decompress(raw.body)) == payload
        assert raw.properties["application_headers"]["compression"] == content_encoding

        msg = q.get(timeout=5)
        assert msg.headers["compression"] == content_encoding
        assert msg.payload == payload  # kombu decompressed it
        msg.ack()


def test_simple_queue_large_message_spans_frames(conn: Connection) -> None:
    big = "x" * (1_000_000)  # larger than frame_max: split into many body frames
    with conn.SimpleQueue("simple-big") as q:
        q.put({"big": big})
        msg = q.get(timeout=5)
        assert msg.payload == {"big": big}
        msg.ack()


def test_simple_queue_unacked_message_comes_back(broker: Any) -> None:
    with Connection(broker.url) as c1:
        q = c1.SimpleQueue("simple-requeue")
        q.put("first")
        msg = q.get(timeout=5)
        assert msg.payload == "first"
        # No ack: closing the connection returns the message to the queue.
    with Connection(broker.url) as c2:
        q = c2.SimpleQueue("simple-requeue")
        msg = q.get(timeout=5)
        assert msg.payload == "first"
        assert msg.delivery_info["redelivered"] is True
        msg.ack()
        q.close()


# -- Producer / Consumer with declarations ------------------------------------------------


def test_producer_declares_and_routes_direct_topic_fanout(conn: Connection) -> None:
    direct = Exchange("k.direct", type="direct", durable=False)
    topic = Exchange("k.topic", type="topic", durable=False)
    fanout = Exchange("k.fanout", type="fanout", durable=False)
    q_direct = Queue("k.q.direct", direct, routing_key="invoice", durable=False)
    q_topic = Queue("k.q.topic", topic, routing_key="eu.*.orders", durable=False)
    q_fan1 = Queue("k.q.fan1", fanout, durable=False)
    q_fan2 = Queue("k.q.fan2", fanout, durable=False)

    producer = Producer(conn.default_channel, serializer="json")
    producer.publish(
        {"kind": "invoice"}, exchange=direct, routing_key="invoice", declare=[q_direct]
    )
    producer.publish({"kind": "other"}, exchange=direct, routing_key="other")
    producer.publish({"kind": "fr"}, exchange=topic, routing_key="eu.fr.orders", declare=[q_topic])
    producer.publish({"kind": "us"}, exchange=topic, routing_key="us.ny.orders")
    producer.publish({"kind": "fan"}, exchange=fanout, routing_key="x", declare=[q_fan1, q_fan2])

    got: dict[str, list[Any]] = {}

    def on_message(body: Any, message: Message) -> None:
        got.setdefault(message.delivery_info["consumer_tag"], []).append(body)
        message.ack()

    queues = [q_direct, q_topic, q_fan1, q_fan2]
    with Consumer(conn, queues=queues, callbacks=[on_message], accept=["json"]) as consumer:
        tags = {q.name: consumer._active_tags[q.name] for q in queues}
        # declare= bound both fanout queues before publishing: each got one copy.
        drain_until(conn, lambda: sum(len(v) for v in got.values()) == 4)

    assert got[tags["k.q.direct"]] == [{"kind": "invoice"}]
    assert got[tags["k.q.topic"]] == [{"kind": "fr"}]
    assert got[tags["k.q.fan1"]] == [{"kind": "fan"}]
    assert got[tags["k.q.fan2"]] == [{"kind": "fan"}]
    # Nothing else is waiting anywhere.
    for q in queues:
        assert q(conn.default_channel).queue_declare(passive=True).message_count == 0


def test_message_properties_survive(conn: Connection) -> None:
    queue = Queue("k.props", Exchange("k.props.ex", type="direct"), routing_key="p")
    producer = conn.Producer()
    producer.publish(
        "payload",
        exchange=queue.exchange,
        routing_key="p",
        declare=[queue],
        serializer="json",
        headers={"x-trace": "abc", "n": 7},
        correlation_id="corr-1",
        reply_to="replies",
        priority=3,
        expiration=60,  # seconds; kombu sends milliseconds
        message_id="mid-1",
        delivery_mode=2,
    )
    rec = Received()
    with Consumer(conn, queues=[queue], callbacks=[rec], accept=["json"]):
        drain_until(conn, lambda: rec.items)
    body, msg = rec.items[0]
    assert body == "payload"
    assert msg.headers == {"x-trace": "abc", "n": 7}
    props = msg.properties
    assert props["correlation_id"] == "corr-1"
    assert props["reply_to"] == "replies"
    assert props["priority"] == 3
    assert props["expiration"] == "60000"
    assert props["message_id"] == "mid-1"
    assert props["delivery_mode"] == 2
    assert msg.delivery_info["exchange"] == "k.props.ex"
    assert msg.delivery_info["routing_key"] == "p"
    msg.ack()


def test_consumer_ack_reject_requeue(conn: Connection) -> None:
    queue = Queue("k.settle", Exchange("k.settle.ex", type="direct"), routing_key="s")
    producer = conn.Producer(serializer="json")
    for body in ("requeue-me", "reject-me", "ack-me"):
        producer.publish(body, exchange=queue.exchange, routing_key="s", declare=[queue])

    seen: list[tuple[str, bool]] = []

    def on_message(body: str, message: Message) -> None:
        redelivered = message.delivery_info["redelivered"]
        seen.append((body, redelivered))
        if body == "requeue-me" and not redelivered:
            message.requeue()
        elif body == "reject-me":
            message.reject()
        else:
            message.ack()
        assert message.acknowledged

    with Consumer(conn, queues=[queue], callbacks=[on_message], accept=["json"], prefetch_count=1):
        drain_until(conn, lambda: len(seen) == 4)

    # With prefetch 1 the requeued message comes straight back, before the others.
    assert seen == [
        ("requeue-me", False),
        ("requeue-me", True),
        ("reject-me", False),
        ("ack-me", False),
    ]
    assert queue(conn.default_channel).queue_declare(passive=True).message_count == 0


def test_reject_with_requeue_true(conn: Connection) -> None:
    with conn.SimpleQueue("k.reject-requeue") as q:
        q.put("again")
        msg = q.get(timeout=5)
        assert not msg.delivery_info["redelivered"]
        msg.reject(requeue=True)
        msg2 = q.get(timeout=5)
        assert msg2.payload == "again"
        assert msg2.delivery_info["redelivered"] is True
        msg2.ack()


def test_consumer_cancel_stops_delivery(conn: Connection) -> None:
    queue = Queue("k.cancel", Exchange("k.cancel.ex", type="fanout"))
    producer = conn.Producer(serializer="json")
    rec = Received()
    consumer = Consumer(conn, queues=[queue], callbacks=[rec], accept=["json"], no_ack=True)
    consumer.consume()
    producer.publish(1, exchange=queue.exchange, declare=[queue])
    drain_until(conn, lambda: rec.items)
    consumer.cancel()
    producer.publish(2, exchange=queue.exchange)
    # The second message stays in the queue for the next reader.
    assert queue(conn.default_channel).queue_declare(passive=True).message_count == 1
    assert rec.bodies() == [1]


# -- purge, passive declare --------------------------------------------------------------


def test_queue_purge(conn: Connection) -> None:
    queue = Queue("k.purge", Exchange("k.purge.ex", type="direct"), routing_key="p")
    bound = queue(conn.default_channel)
    bound.declare()
    producer = conn.Producer()
    for i in range(7):
        producer.publish({"i": i}, exchange=queue.exchange, routing_key="p")
    assert bound.queue_declare(passive=True).message_count == 7
    assert bound.purge() == 7
    assert bound.queue_declare(passive=True).message_count == 0
    assert bound.purge() == 0
    assert bound.get() is None


def test_passive_declare_of_missing_queue_raises_not_found(conn: Connection) -> None:
    channel = conn.channel()
    with pytest.raises(amqp.exceptions.NotFound) as info:
        channel.queue_declare(queue="k.does-not-exist", passive=True)
    assert info.value.reply_code == 404
    assert "no queue 'k.does-not-exist' in vhost '/'" in info.value.reply_text
    # The channel was closed by the broker; the connection stays usable.
    assert conn.connected
    with pytest.raises(amqp.exceptions.NotFound):
        Queue("k.does-not-exist", channel=conn.channel()).queue_declare(passive=True)
    with pytest.raises(amqp.exceptions.NotFound):
        conn.channel().exchange_declare("k.no-exchange", "direct", passive=True)
    q = conn.SimpleQueue("k.after-error")
    q.put("ok")
    assert q.get(timeout=5).payload == "ok"
    q.close()


def test_redeclare_with_different_arguments_is_precondition_failed(conn: Connection) -> None:
    Queue("k.durable", durable=True)(conn.default_channel).declare()
    with pytest.raises(amqp.exceptions.PreconditionFailed) as info:
        Queue("k.durable", durable=False)(conn.channel()).declare()
    assert "inequivalent arg 'durable'" in info.value.reply_text


# -- heartbeats ---------------------------------------------------------------------------


def test_heartbeats_keep_idle_connection_alive(broker_factory: Callable[..., Any]) -> None:
    """3.5 s of the broker's ManualClock with nothing but heartbeats both ways:
    py-amqp reads the broker's, and its own (send_heartbeat, what heartbeat_check
    sends once an interval of wall time has passed, here when the test moves the
    broker's clock) keep the broker from closing the connection."""
    broker = broker_factory(clock=ManualClock())
    with Connection(broker.url, heartbeat=1) as c:
        c.connect()
        raw = c.connection
        assert raw.heartbeat == 1  # negotiated down from the server's proposal
        received_before = raw.bytes_recv
        for _ in range(7):  # idle for well over two heartbeat intervals
            broker.advance(500)
            raw.send_heartbeat()
        # The broker's heartbeats (at least one per interval), read one frame at a
        # time as they come (py-amqp's bytes_recv counts frames read).
        deadline = time.monotonic() + 10
        while raw.bytes_recv < received_before + 3:
            assert time.monotonic() < deadline, raw.bytes_recv - received_before
            with contextlib.suppress(TimeoutError):
                raw.blocking_read(timeout=0.05)
        assert broker.call(lambda: len(broker.broker.connections)) == 1
        with c.SimpleQueue("k.hb") as q:
            q.put("alive")
            assert q.get(timeout=5).payload == "alive"


def test_broker_drops_client_that_stops_heartbeating(
    broker_factory: Callable[..., Any],
) -> None:
    broker = broker_factory(clock=ManualClock())
    c = Connection(broker.url, heartbeat=1)
    c.connect()
    try:
        assert broker.call(lambda: len(broker.broker.connections)) == 1
        # Never a heartbeat from the client: the broker checks what it read
        # once per interval of its clock and, as RabbitMQ, closes the socket at
        # the second check in a row with nothing read (3 s after the open; the
        # first check still sees the handshake), which the blocked read notices.
        broker.advance(2999)
        assert broker.call(lambda: len(broker.broker.connections)) == 1
        broker.advance(1)
        with pytest.raises((ConnectionError, OSError, amqp.exceptions.ConnectionError)) as raised:
            c.drain_events(timeout=10)
        # A read timeout is an OSError too: it would mean the socket stayed open.
        assert not isinstance(raised.value, TimeoutError), raised.value
        assert broker.call(lambda: len(broker.broker.connections)) == 0
    finally:
        c.release()
