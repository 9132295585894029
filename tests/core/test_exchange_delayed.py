"""The x-delayed-message exchange (rabbitmq-delayed-message-exchange) as a
client sees it.

Time is the broker's ManualClock (core/clock.py): a test publishes, moves the
clock to just before a deadline (nothing routed yet) and onto it (routed,
synchronously in the timer), and reads the queues, so none waits for time to
pass. The declare errors are the plugin's
(rabbit_exchange_type_delayed_message:validate/1).

In memory (issue 29): a tests/harness broker, pika's calls over MemoryAMQP
(harness.channel, frames by pamqp; pika before); a restart is a new Harness
on the same data dir and the same clock.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from harness import Channel, Harness, Session, channel_error, harness_fixture
from harness.channel import Unroutable
from pamqp import commands

from warren.core.clock import ManualClock

DELAYED = "x-delayed-message"

#: This module's broker runs on a ManualClock.
broker = harness_fixture(manual_clock=True)


@pytest.fixture
def s(broker: Harness) -> Session:
    return Session(broker)


def delayed(s: Session, delayed_type: str = "direct", **kwargs: Any) -> str:
    arguments = {"x-delayed-type": delayed_type, **kwargs.pop("arguments", {})}
    return s.exchange(DELAYED, arguments=arguments, **kwargs)


def props(delay: Any = None, persistent: bool = False, **headers: Any) -> commands.Basic.Properties:
    if delay is not None:
        headers["x-delay"] = delay
    return commands.Basic.Properties(
        headers=headers or None, delivery_mode=2 if persistent else None
    )


def take(ch: Channel, queue: str) -> list[tuple[bytes, dict[str, Any]]]:
    """Every message ``queue`` holds now, in order: (body, headers)."""
    got = []
    while True:
        method, properties, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            return got
        got.append((body, properties.headers or {}))


def bodies(ch: Channel, queue: str) -> list[bytes]:
    return [body for body, _ in take(ch, queue)]


def advance(s: Session, ms: int) -> None:
    """What the session sent is in (a round trip), then the clock moves."""
    s.ch.barrier()
    s.broker.advance(ms)


def test_x_delayed_type_is_required(s: Session) -> None:
    missing = (
        "PRECONDITION_FAILED - Invalid argument, 'x-delayed-type' must be an existing exchange type"
    )
    assert channel_error(406, s.ch.exchange_declare, "dx", DELAYED) == missing
    s.reopen()
    bad_type = {"x-delayed-type": 5}
    assert channel_error(406, s.ch.exchange_declare, "dx", DELAYED, arguments=bad_type) == missing
    s.reopen()
    itself = {"x-delayed-type": DELAYED}
    assert channel_error(406, s.ch.exchange_declare, "dx", DELAYED, arguments=itself) == (
        "PRECONDITION_FAILED - Invalid argument, 'x-delayed-message' can't be used for "
        "'x-delayed-type'"
    )
    # An unknown type is RabbitMQ's own check (rabbit_exchange:check_type): 406
    # since 3.12.x (3.10 closed the connection with 503).
    s.reopen()
    unknown = {"x-delayed-type": "x-nope"}
    text = channel_error(406, s.ch.exchange_declare, "dx", DELAYED, arguments=unknown)
    assert text == "PRECONDITION_FAILED - unknown exchange type 'x-nope'"
    s.reopen()
    channel_error(404, s.ch.exchange_declare, "dx", DELAYED, passive=True)


@pytest.mark.parametrize("delay", [None, 0, -500, "soon", 2**32, True])
def test_without_a_positive_delay_a_message_routes_at_once(s: Session, delay: Any) -> None:
    ex = delayed(s)
    q = s.queue()
    s.ch.queue_bind(q, ex, "rk")
    s.ch.basic_publish(ex, "rk", b"now", props(delay))
    s.ch.barrier()
    method, properties, body = s.ch.basic_get(q, auto_ack=True)
    assert body == b"now"
    if delay is not None:
        assert properties.headers["x-delay"] == delay  # untouched


def test_messages_leave_by_deadline_not_publish_order(s: Session) -> None:
    ex = delayed(s)
    q = s.queue()
    s.ch.queue_bind(q, ex, "rk")
    s.ch.basic_publish(ex, "rk", b"late", props(700))
    s.ch.basic_publish(ex, "rk", b"soon", props(300))
    s.ch.basic_publish(ex, "rk", b"also-soon", props("300"))  # a numeric string counts
    s.ch.basic_publish(ex, "rk", b"now", props())
    s.ch.basic_publish(ex, "rk", b"mid", props(500))
    s.ch.barrier()
    assert bodies(s.ch, q) == [b"now"]
    advance(s, 299)
    assert bodies(s.ch, q) == []
    advance(s, 1)
    soon = take(s.ch, q)
    assert [body for body, _ in soon] == [b"soon", b"also-soon"]
    # Routed messages carry the negated delay, as the plugin sets it.
    assert [headers["x-delay"] for _, headers in soon] == [-300, -300]
    advance(s, 199)
    assert bodies(s.ch, q) == []
    advance(s, 1)
    assert take(s.ch, q) == [(b"mid", {"x-delay": -500})]
    advance(s, 200)
    assert bodies(s.ch, q) == [b"late"]


@pytest.mark.parametrize(
    ("value", "delay"),
    [(500, 500), ("500", 500), (b"500", 500), (500.9, 500), (2**32 - 1, 2**32 - 1)]
    + [(v, None) for v in (0, -1, 2**32, "x", True, None, [1], {"a": 1})],
)
def test_how_x_delay_is_read(value: Any, delay: int | None) -> None:
    # The plugin's rules, value by value (a unit test: the wire tests above send ints and strings).
    from warren.core.exchange_delayed import delay_of
    from warren.core.message import Message
    from warren.core.properties import BasicProperties

    raw = BasicProperties(headers={"x-delay": value}).encode()
    assert delay_of(Message("x", "", raw, b"")) == delay


def test_other_headers_keep_their_wire_types(s: Session) -> None:
    ex = delayed(s, "fanout")
    q = s.queue()
    s.ch.queue_bind(q, ex)
    headers = {"a": "text", "n": 7, "big": 2**40, "t": {"nested": [1, "x"]}, "no": None}
    s.ch.basic_publish(ex, "", b"m", props(100, **headers))
    advance(s, 100)
    assert take(s.ch, q) == [(b"m", {**headers, "x-delay": -100})]


def test_topic_delayed_type(s: Session) -> None:
    ex = delayed(s, "topic")
    q_all, q_eu = s.queue(), s.queue()
    s.ch.queue_bind(q_all, ex, "orders.#")
    s.ch.queue_bind(q_eu, ex, "orders.eu.*")
    s.ch.basic_publish(ex, "orders.eu.paris", b"eu", props(300))
    s.ch.basic_publish(ex, "orders.us.nyc", b"us", props(300))
    s.ch.basic_publish(ex, "other", b"none", props(300))
    advance(s, 299)
    assert bodies(s.ch, q_eu) == [] and bodies(s.ch, q_all) == []
    advance(s, 1)
    assert bodies(s.ch, q_eu) == [b"eu"]
    assert bodies(s.ch, q_all) == [b"eu", b"us"]


def test_headers_delayed_type(s: Session) -> None:
    ex = delayed(s, "headers")
    q = s.queue()
    s.ch.queue_bind(q, ex, arguments={"x-match": "all", "kind": "invoice"})
    # An invalid x-match is refused as a headers exchange refuses it.
    reply = channel_error(406, s.ch.queue_bind, q, ex, arguments={"x-match": "some"})
    assert reply.startswith("PRECONDITION_FAILED - Invalid x-match field value")
    s.reopen()
    s.ch.basic_publish(ex, "", b"invoice", props(250, kind="invoice"))
    s.ch.basic_publish(ex, "", b"receipt", props(250, kind="receipt"))
    advance(s, 249)
    assert bodies(s.ch, q) == []
    advance(s, 1)
    assert bodies(s.ch, q) == [b"invoice"]


def test_consistent_hash_delayed_type(s: Session) -> None:
    ex = delayed(s, "x-consistent-hash")
    q1, q2 = s.queue(), s.queue()
    s.ch.queue_bind(q1, ex, "1")
    s.ch.queue_bind(q2, ex, "1")
    for i in range(40):
        s.ch.basic_publish(ex, f"k{i}", b"m", props(100))
    advance(s, 100)
    assert sum(s.ch.queue_declare(q, passive=True).method.message_count for q in (q1, q2)) == 40


def test_confirm_once_held_and_synced(s: Session, broker: Harness) -> None:
    ex = delayed(s, durable=True)
    q = s.queue(durable=True)
    s.ch.queue_bind(q, ex, "rk")
    s.ch.confirm_delivery()
    syncer = broker.broker.syncer
    assert syncer is not None
    rounds = syncer.rounds
    # A persistent message held by a durable exchange: confirmed after an fdatasync.
    s.ch.basic_publish(ex, "rk", b"persistent", props(400, persistent=True))
    assert syncer.rounds == rounds + 1
    # A transient one is confirmed at once.
    s.ch.basic_publish(ex, "rk", b"transient", props(400))
    assert syncer.rounds == rounds + 1
    # Both confirmed while the clock stood still: held, not routed.
    assert s.ch.queue_declare(q, passive=True).method.message_count == 0
    advance(s, 399)
    assert s.ch.queue_declare(q, passive=True).method.message_count == 0
    advance(s, 1)
    assert bodies(s.ch, q) == [b"persistent", b"transient"]


def test_mandatory_delayed_message_is_not_returned(s: Session) -> None:
    ex = delayed(s)
    s.ch.confirm_delivery()
    s.ch.basic_publish(ex, "nowhere", b"held", props(100), mandatory=True)  # not Unroutable
    # Routed at once, an unroutable message is returned as usual.
    with pytest.raises(Unroutable):
        s.ch.basic_publish(ex, "nowhere", b"now", props(), mandatory=True)


def test_exchange_to_exchange_into_a_delayed_exchange(s: Session) -> None:
    front = s.exchange("fanout")
    ex = delayed(s)
    s.ch.exchange_bind(ex, front)
    q_now, q_later = s.queue(), s.queue()
    s.ch.queue_bind(q_now, front)
    s.ch.queue_bind(q_later, ex, "rk")
    s.ch.basic_publish(front, "rk", b"m", props(300))
    s.ch.barrier()
    assert s.ch.queue_declare(q_now, passive=True).method.message_count == 1
    assert s.ch.queue_declare(q_later, passive=True).method.message_count == 0
    advance(s, 300)
    assert bodies(s.ch, q_later) == [b"m"]
    _, properties, _ = s.ch.basic_get(q_now, auto_ack=True)
    assert properties.headers["x-delay"] == 300  # the immediate copy is untouched


def test_deleting_the_exchange_drops_held_messages(s: Session, broker: Harness) -> None:
    ex = delayed(s, durable=True)
    directory = broker.broker.layout.exchange_dir("/", ex)
    assert directory.is_dir()
    q = s.queue()
    s.ch.queue_bind(q, ex, "rk")
    s.ch.confirm_delivery()
    s.ch.basic_publish(ex, "rk", b"dropped", props(200, persistent=True))
    s.ch.exchange_delete(ex)
    assert not directory.exists()
    # Same name again: the old exchange's messages are gone with it.
    delayed(s, name=ex, durable=True)
    s.ch.queue_bind(q, ex, "rk")
    s.ch.basic_publish(ex, "rk", b"new", props(300))
    advance(s, 300)
    assert bodies(s.ch, q) == [b"new"]


def test_non_durable_exchange_holds_messages_too(s: Session) -> None:
    ex = delayed(s, "fanout", durable=False, auto_delete=False)
    q = s.queue()
    s.ch.queue_bind(q, ex)
    for i in range(20):
        s.ch.basic_publish(ex, "", str(i).encode(), props(200 + 10 * (19 - i)))
    advance(s, 199)
    assert bodies(s.ch, q) == []
    advance(s, 1)
    assert bodies(s.ch, q) == [b"19"]
    advance(s, 190)
    assert bodies(s.ch, q) == [str(i).encode() for i in reversed(range(19))]


def test_redeclare_checks_only_what_rabbitmq_checks(s: Session) -> None:
    ex = delayed(s, "topic")
    # The plugin delegates to rabbit_exchange: only alternate-exchange is compared.
    s.ch.exchange_declare(ex, DELAYED, arguments={"x-delayed-type": "direct"})
    reply = channel_error(406, s.ch.exchange_declare, ex, "topic")
    assert reply.startswith("PRECONDITION_FAILED - inequivalent arg 'type'")


def test_held_messages_survive_a_restart(tmp_path: Path) -> None:
    clock = ManualClock()
    data = tmp_path / "data"
    with Harness(data, clock=clock) as b:
        conn = b.amqp_connection()
        ch = conn.channel()
        ch.exchange_declare(
            "dx-durable", DELAYED, durable=True, arguments={"x-delayed-type": "direct"}
        )
        ch.queue_declare("dq", durable=True)
        ch.queue_bind("dq", "dx-durable", "rk")
        ch.confirm_delivery()
        ch.basic_publish("dx-durable", "rk", b"overdue", props(150, persistent=True))
        ch.basic_publish("dx-durable", "rk", b"later", props(2500, persistent=True))
        ch.basic_publish("dx-durable", "rk", b"sooner", props(1800, persistent=True))
        ch.basic_publish("dx-durable", "rk", b"transient", props(1800))  # lost, like in a queue
        conn.close()
        layout = b.broker.layout
    clock.advance(200)  # "overdue" passes its deadline while the broker is down

    # A directory no durable exchange owns is swept at start; the exchange's is not.
    stray = layout.exchange_dir("/", "gone")
    stray.mkdir(parents=True)
    with Harness(data, clock=clock) as b:
        assert not stray.exists()
        assert b.broker.layout.exchange_dir("/", "dx-durable").is_dir()
        conn = b.amqp_connection()
        ch = conn.channel()

        def count() -> int:
            return int(ch.queue_declare("dq", passive=True).method.message_count)

        # Routed right after the start, the clock standing still.
        b.settle()
        assert bodies(ch, "dq") == [b"overdue"]
        b.advance(1599)  # 1.799 s after the publish
        assert count() == 0
        b.advance(1)
        assert bodies(ch, "dq") == [b"sooner"]
        b.advance(700)
        assert take(ch, "dq") == [(b"later", {"x-delay": -2500})]
        b.advance(10_000)
        assert count() == 0  # nothing else was held
        conn.close()
    # Routed messages are gone from the exchange's store for good.
    with Harness(data, clock=clock) as b:
        ch = b.amqp_connection().channel()
        b.advance(10_000)
        assert ch.queue_declare("dq", passive=True).method.message_count == 0
        assert b.call(lambda: b.broker.vhosts["/"].exchanges["dx-durable"]._heap) == []


def test_set_header_edits_one_entry_in_place() -> None:
    import struct

    from warren.core.properties import decode_properties, set_header

    def table(*entries: bytes) -> bytes:
        body = b"".join(entries)
        return struct.pack(">I", len(body)) + body

    short = b"\x01ns" + struct.pack(">h", 7)  # a short: re-encoding would make it a long
    delay = b"\x07x-delayI" + struct.pack(">i", 500)
    octet = b"\x01zb\xff"
    flags = struct.pack(">H", 0x2000 | 0x1000)  # headers, delivery-mode
    raw = flags + table(short, delay, octet) + b"\x02"
    edited = set_header(raw, "x-delay", -500)
    assert (
        edited == flags + table(short, b"\x07x-delayI" + struct.pack(">i", -500), octet) + b"\x02"
    )
    # A missing entry is added at the end; missing headers become a table.
    added = set_header(flags + table(short) + b"\x02", "x-delay", -1)
    assert decode_properties(added).headers == {"n": 7, "x-delay": -1}
    assert decode_properties(set_header(b"\x10\x00\x02", "k", "v")).headers == {"k": "v"}
    assert decode_properties(set_header(b"\x10\x00\x02", "k", "v")).delivery_mode == 2


def test_segment_store_reads_any_record_back(tmp_path: Any) -> None:
    from warren.core.message import Message
    from warren.store.segment_store import SegmentStore

    store = SegmentStore(tmp_path / "held", segment_size=4096)
    seqs = [
        store.append_shifted(Message("x", f"k{i}", b"\x10\x00\x02", bytes(300) + str(i).encode()))
        for i in range(40)
    ]
    assert len({s >> 32 for s in seqs}) > 1  # several segments, the last one still buffered
    for i in (39, 0, 17, 38):
        msg = store.read(seqs[i])
        assert (msg.routing_key, msg.body[300:]) == (f"k{i}", str(i).encode())
    for seq in seqs[:20]:
        store.ack(seq)
    store.close()
    reopened = SegmentStore(tmp_path / "held", segment_size=4096)
    left = []
    while (item := reopened.shift()) is not None:
        left.append(item[1].routing_key)
        assert reopened.read(item[0]).routing_key == item[1].routing_key
    assert left == [f"k{i}" for i in range(20, 40)]
    with pytest.raises(KeyError):
        reopened.read(seqs[0])  # its segment was fully acked and deleted
    reopened.close()
