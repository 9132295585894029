"""Message deduplication: the cache (dedup.py) on its own, then exchanges and
queues as a client sees them.

Exchanges deduplicate LavinMQ's way (``x-message-deduplication: true`` on any
type) or as the rabbitmq-message-deduplication plugin's ``x-message-deduplication``
exchange type. A duplicate is dropped as unroutable in both: a mandatory one
comes back with basic.return, and its publisher confirm is an ack.

The exchange and queue tests run in memory (issue 29): a tests/harness broker,
pika's calls over MemoryAMQP (harness.channel, frames by pamqp); a restart is a
new Harness on the same data dir, a delay runs on its ManualClock.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from harness import Harness, Session, channel_error, harness_fixture
from harness.channel import Unroutable
from pamqp import commands

from warren.core.dedup import DEFAULT_CACHE_SIZE, DEFAULT_HEADER, Deduplicator
from warren.core.errors import PreconditionFailed
from warren.core.message import Message
from warren.core.properties import BasicProperties


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def message(headers: dict[str, Any] | None) -> Message:
    return Message("x", "rk", BasicProperties(headers=headers).encode(), b"body")


# -- the cache ------------------------------------------------------------------------


def test_from_arguments_enabled_only_by_a_true_flag() -> None:
    assert Deduplicator.from_arguments(None) is None
    assert Deduplicator.from_arguments({}) is None
    assert Deduplicator.from_arguments({"x-cache-size": 5}) is None
    assert Deduplicator.from_arguments({"x-message-deduplication": False}) is None
    d = Deduplicator.from_arguments({"x-message-deduplication": True})
    assert d is not None
    assert (d.size, d.ttl, d.header) == (DEFAULT_CACHE_SIZE, None, DEFAULT_HEADER)
    d = Deduplicator.from_arguments(
        {
            "x-message-deduplication": True,
            "x-cache-size": 10,
            "x-cache-ttl": "2000",  # the plugin takes numeric strings
            "x-deduplication-header": "msg-id",
        }
    )
    assert d is not None
    assert (d.size, d.ttl, d.header) == (10, 2000, "msg-id")


@pytest.mark.parametrize(
    ("arguments", "text"),
    [
        (
            {"x-message-deduplication": "yes"},
            "invalid arg 'x-message-deduplication' for exchange 'e': expected a boolean, "
            "got longstr 'yes'",
        ),
        (
            {"x-message-deduplication": True, "x-cache-size": 0},
            "invalid arg 'x-cache-size' for exchange 'e': expected an integer greater than 0, "
            "got signedint 0",
        ),
        (
            {"x-message-deduplication": True, "x-cache-size": "many"},
            "invalid arg 'x-cache-size' for exchange 'e': expected an integer greater than 0, "
            "got longstr 'many'",
        ),
        (
            {"x-message-deduplication": True, "x-cache-ttl": -5},
            "invalid arg 'x-cache-ttl' for exchange 'e': expected an integer greater than 0 "
            "(milliseconds), got signedint -5",
        ),
        (
            {"x-message-deduplication": True, "x-deduplication-header": 7},
            "invalid arg 'x-deduplication-header' for exchange 'e': expected a non-empty "
            "string, got signedint 7",
        ),
    ],
)
def test_from_arguments_refuses_bad_types(arguments: dict[str, Any], text: str) -> None:
    with pytest.raises(PreconditionFailed) as info:
        Deduplicator.from_arguments(arguments, "exchange 'e'")
    assert info.value.code == 406
    assert info.value.text == text


def test_a_seen_key_is_a_duplicate() -> None:
    d = Deduplicator(size=10)
    assert not d.seen(message({DEFAULT_HEADER: "a"}))
    assert d.seen(message({DEFAULT_HEADER: "a"}))
    assert not d.seen(message({DEFAULT_HEADER: "b"}))
    # Without the key header a message is never a duplicate.
    assert not d.seen(message(None))
    assert not d.seen(message({}))
    assert not d.seen(message({"other": "a"}))
    assert not d.seen(message({DEFAULT_HEADER: None}))
    assert len(d) == 2


def test_keys_of_any_type() -> None:
    d = Deduplicator(size=10)
    for value in (1, True, "1", b"1x", 1.5, {"t": [1, 2]}, [1, "a"]):
        assert not d.seen(message({DEFAULT_HEADER: value})), value
        assert d.seen(message({DEFAULT_HEADER: value})), value


def test_the_header_name_is_configurable() -> None:
    d = Deduplicator(header="msg-id")
    assert not d.seen(message({"msg-id": 1, DEFAULT_HEADER: "x"}))
    assert d.seen(message({"msg-id": 1, DEFAULT_HEADER: "y"}))


def test_size_evicts_the_least_recently_seen() -> None:
    d = Deduplicator(size=3)
    for key in "abc":
        assert not d.check(key)
    assert d.check("a")  # a is now the most recently seen; b the least
    assert not d.check("d")  # evicts b
    assert len(d) == 3
    assert d.check("a") and d.check("c") and d.check("d")
    assert not d.check("b")  # forgotten, so new again (and evicts the oldest, a)
    assert not d.check("a")


def test_ttl_expiry_with_an_injected_clock() -> None:
    clock = Clock()
    d = Deduplicator(size=10, ttl=1000, clock=clock)
    assert not d.check("k")
    clock.now += 999
    assert d.check("k")  # a duplicate does not extend the key's life
    clock.now += 1
    assert not d.check("k")  # expired: new again, remembered for another second
    clock.now += 500
    assert d.check("k")


def test_message_ttl_header_overrides_the_default() -> None:
    clock = Clock()
    d = Deduplicator(size=10, ttl=None, clock=clock)
    assert not d.seen(message({DEFAULT_HEADER: "k", "x-cache-ttl": 100}))
    clock.now += 99
    assert d.seen(message({DEFAULT_HEADER: "k"}))
    clock.now += 1
    assert not d.seen(message({DEFAULT_HEADER: "k"}))  # and now kept for ever
    clock.now += 10**9
    assert d.seen(message({DEFAULT_HEADER: "k"}))
    # A TTL header that is not an integer is ignored.
    assert not d.seen(message({DEFAULT_HEADER: "j", "x-cache-ttl": "soon"}))
    clock.now += 10**9
    assert d.seen(message({DEFAULT_HEADER: "j"}))


def test_forget_and_clear() -> None:
    d = Deduplicator()
    d.check("a")
    d.check("b")
    d.forget("a")
    assert not d.check("a")
    d.clear()
    assert len(d) == 0


# -- exchanges, in memory -------------------------------------------------------------

broker = harness_fixture()
clocked = harness_fixture(manual_clock=True)


@pytest.fixture
def s(broker: Harness) -> Session:
    return Session(broker)


def keyed(key: Any, header: str = DEFAULT_HEADER, **headers: Any) -> commands.Basic.Properties:
    return commands.Basic.Properties(headers={header: key, **headers})


def count(s: Session, q: str) -> int:
    s.ch.barrier()
    return int(s.ch.queue_declare(q, passive=True).method.message_count)


def bodies(s: Session, q: str) -> list[bytes]:
    out = []
    while True:
        method, _, body = s.ch.basic_get(q, auto_ack=True)
        if method is None:
            return out
        out.append(body)


@pytest.mark.parametrize("exchange_type", ["direct", "fanout", "topic"])
def test_exchange_drops_duplicates(s: Session, exchange_type: str) -> None:
    ex = s.exchange(exchange_type, arguments={"x-message-deduplication": True})
    q = s.queue()
    s.ch.queue_bind(q, ex, "rk")
    for body, key in [(b"1", "a"), (b"2", "a"), (b"3", "b"), (b"4", "a"), (b"5", "b")]:
        s.ch.basic_publish(ex, "rk", body, keyed(key))
    s.ch.basic_publish(ex, "rk", b"6", commands.Basic.Properties())  # no key: never a duplicate
    s.ch.basic_publish(ex, "rk", b"7", commands.Basic.Properties())
    s.ch.barrier()
    assert bodies(s, q) == [b"1", b"3", b"6", b"7"]


def test_custom_header_cache_size_and_message_ttl(s: Session) -> None:
    ex = s.exchange(
        "fanout",
        arguments={
            "x-message-deduplication": True,
            "x-deduplication-header": "order-id",
            "x-cache-size": 2,
        },
    )
    q = s.queue()
    s.ch.queue_bind(q, ex)
    publish = s.ch.basic_publish
    publish(ex, "", b"1", keyed(1, "order-id"))
    publish(ex, "", b"dup", keyed(1, "order-id"))
    publish(ex, "", b"other-header", keyed(1))  # DEFAULT_HEADER is not the key here
    publish(ex, "", b"2", keyed(2, "order-id"))
    publish(ex, "", b"3", keyed(3, "order-id"))  # evicts 1 (size 2)
    publish(ex, "", b"1-again", keyed(1, "order-id"))
    # x-cache-ttl 0 on the message: its key is not remembered at all.
    publish(ex, "", b"4", keyed(4, "order-id", **{"x-cache-ttl": 0}))
    publish(ex, "", b"4-again", keyed(4, "order-id"))
    s.ch.barrier()
    assert bodies(s, q) == [b"1", b"other-header", b"2", b"3", b"1-again", b"4", b"4-again"]


def test_a_duplicate_is_unroutable_to_the_publisher(s: Session) -> None:
    ex = s.exchange("direct", arguments={"x-message-deduplication": True})
    q = s.queue()
    s.ch.queue_bind(q, ex, "rk")
    s.ch.confirm_delivery()
    s.ch.basic_publish(ex, "rk", b"first", keyed("k"), mandatory=True)
    with pytest.raises(Unroutable) as info:
        s.ch.basic_publish(ex, "rk", b"again", keyed("k"), mandatory=True)
    assert info.value.messages[0].method.reply_code == 312
    assert info.value.messages[0].method.reply_text == "NO_ROUTE"
    s.ch.basic_publish(ex, "rk", b"again", keyed("k"))  # not mandatory: just acked
    assert count(s, q) == 1


def test_bad_arguments_are_refused_on_declare(s: Session) -> None:
    reply = channel_error(
        406,
        s.ch.exchange_declare,
        "dedup-bad",
        "direct",
        arguments={"x-message-deduplication": True, "x-cache-size": "lots"},
    )
    assert reply == (
        "PRECONDITION_FAILED - invalid arg 'x-cache-size' for exchange 'dedup-bad' in "
        "vhost '/': expected an integer greater than 0, got longstr 'lots'"
    )
    s.reopen()
    channel_error(404, s.ch.exchange_declare, "dedup-bad", "direct", passive=True)


def test_deduplication_before_delay(clocked: Harness) -> None:
    """A delayed exchange deduplicates at publish, not at release: the held
    message's key makes the later ones duplicates, whatever their delays, and
    the held one is not taken for a duplicate of itself when it is released
    (on the broker's ManualClock, moved by the test)."""
    s = Session(clocked)
    ex = s.exchange(
        "x-delayed-message",
        arguments={"x-delayed-type": "direct", "x-message-deduplication": True},
    )
    q = s.queue()
    s.ch.queue_bind(q, ex, "rk")
    s.ch.basic_publish(ex, "rk", b"held", keyed("k", **{"x-delay": 50}))
    s.ch.basic_publish(ex, "rk", b"dup", keyed("k", **{"x-delay": 10}))
    s.ch.basic_publish(ex, "rk", b"dup-now", keyed("k"))
    assert count(s, q) == 0
    clocked.advance(49)  # past "dup"'s delay, 1 ms short of "held"'s
    assert count(s, q) == 0
    clocked.advance(1)
    assert count(s, q) == 1
    clocked.advance(60_000)
    assert bodies(s, q) == [b"held"]  # released once, not taken for a duplicate of itself


def test_plugin_exchange_type(s: Session) -> None:
    ex = s.exchange("x-message-deduplication", arguments={"x-cache-size": "5"})
    q1, q2 = s.queue(), s.queue()
    s.ch.queue_bind(q1, ex)
    s.ch.queue_bind(q2, ex, "ignored")  # routes like a fanout
    s.ch.basic_publish(ex, "any", b"1", keyed("a"))
    s.ch.basic_publish(ex, "any", b"2", keyed("a"))
    s.ch.basic_publish(ex, "any", b"3", keyed("b"))
    s.ch.barrier()
    assert bodies(s, q1) == [b"1", b"3"]
    assert bodies(s, q2) == [b"1", b"3"]


@pytest.mark.parametrize(
    ("arguments", "text"),
    [
        ({}, "Missing or invalid argument, 'x-cache-size' must be an integer greater than 0"),
        (
            {"x-cache-size": 0},
            "Missing or invalid argument, 'x-cache-size' must be an integer greater than 0",
        ),
        (
            {"x-cache-size": 5, "x-cache-ttl": "x"},
            "Invalid argument, 'x-cache-ttl' must be an integer greater than 0",
        ),
        (
            {"x-cache-size": 5, "x-cache-persistence": "cloud"},
            "Invalid argument, 'x-cache-persistence' must be either 'disk' or 'memory'",
        ),
    ],
)
def test_plugin_exchange_type_arguments(s: Session, arguments: dict[str, Any], text: str) -> None:
    reply = channel_error(
        406, s.ch.exchange_declare, "dedup-x", "x-message-deduplication", arguments=arguments
    )
    assert reply == f"PRECONDITION_FAILED - {text}"
    s.reopen()


def test_restart_keeps_deduplication_and_its_keys(tmp_path: Path) -> None:
    args = {"x-message-deduplication": True, "x-cache-ttl": 60_000}
    with Harness(tmp_path / "data") as b:
        ch = b.amqp_connection().channel()
        ch.exchange_declare("dedup-durable", "direct", durable=True, arguments=args)
        ch.queue_declare("dedup-q", durable=True)
        ch.queue_bind("dedup-q", "dedup-durable", "rk")
        persistent = commands.Basic.Properties(headers={DEFAULT_HEADER: "k"}, delivery_mode=2)
        ch.basic_publish("dedup-durable", "rk", b"1", persistent)
        ch.connection.close()

    with Harness(tmp_path / "data") as b:
        ch = b.amqp_connection().channel()
        ch.exchange_declare("dedup-durable", "direct", durable=True, arguments=args)
        # A durable exchange's cache is durable (LavinMQ's is in memory only): "k"
        # is still a duplicate (tests/store/test_dedup_durable.py: through kill -9 too).
        ch.basic_publish("dedup-durable", "rk", b"2", keyed("k"))
        ch.basic_publish("dedup-durable", "rk", b"3", keyed("k"))
        ch.barrier()
        assert ch.queue_declare("dedup-q", passive=True).method.message_count == 1
        ch.connection.close()


def test_plugin_type_as_a_delayed_type(s: Session) -> None:
    ex = s.exchange(
        "x-delayed-message",
        arguments={"x-delayed-type": "x-message-deduplication", "x-cache-size": 10},
    )
    q = s.queue()
    s.ch.queue_bind(q, ex)
    s.ch.basic_publish(ex, "", b"1", keyed("a"))
    s.ch.basic_publish(ex, "", b"2", keyed("a"))
    s.ch.barrier()
    assert bodies(s, q) == [b"1"]


# -- queues ---------------------------------------------------------------------------


def test_queue_drops_duplicates_but_routes_them(broker: Harness) -> None:
    """A queue with x-message-deduplication keeps the first of each key; the
    publisher sees the duplicate as routed (a confirm ack, no return)."""
    conn = broker.amqp_connection()
    ch = conn.channel()
    ch.confirm_delivery()
    q = f"dedup-q-{id(conn)}"
    ch.queue_declare(q, arguments={"x-message-deduplication": True, "x-cache-size": 10})
    for key, body in (("a", b"1"), ("b", b"2"), ("a", b"3"), (None, b"4"), (None, b"5")):
        headers = {DEFAULT_HEADER: key} if key is not None else None
        ch.basic_publish("", q, body, commands.Basic.Properties(headers=headers), mandatory=True)
    bodies = []
    while True:
        method, _, body = ch.basic_get(q, auto_ack=True)
        if method is None:
            break
        bodies.append(body)
    assert bodies == [b"1", b"2", b"4", b"5"]
    conn.close()


def test_queue_deduplication_arguments_are_validated(broker: Harness) -> None:
    conn = broker.amqp_connection()
    ch = conn.channel()
    text = channel_error(
        406,
        ch.queue_declare,
        "dedup-bad",
        arguments={"x-message-deduplication": True, "x-cache-size": "lots"},
    )
    assert "x-cache-size" in text
    conn.close()
