"""Dead-lettering as RabbitMQ does it: reasons, x-death, first/last death headers,
dead-letter routing keys, CC/BCC and cycle detection.

In memory (issue 29): a tests/harness broker, pika's calls over MemoryAMQP
(harness.channel, frames by pamqp; pika over a socket before); a restart is a
new Harness on the same data dir.
"""

from __future__ import annotations

import datetime
import logging
import sys
from pathlib import Path
from typing import Any

import pytest
from harness import Connection, Harness, harness_fixture
from harness.channel import uniq
from pamqp import commands

from warren.core.message import Message
from warren.core.properties import EMPTY_PROPERTIES
from warren.core.vhost import VHost

broker = harness_fixture()


def connect(broker: Harness) -> Connection:
    return broker.amqp_connection()


def _dlx_pair(ch: Any, **extra: Any) -> tuple[str, str]:
    """A source queue dead-lettering through the default exchange into a second queue."""
    src, dlq = uniq("src"), uniq("dlq")
    ch.queue_declare(dlq)
    args = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq, **extra}
    ch.queue_declare(src, arguments=args)
    return src, dlq


def _get(ch: Any, queue: str) -> tuple[Any, commands.Basic.Properties, bytes]:
    method, props, body = ch.basic_get(queue, auto_ack=True)
    assert method is not None, f"nothing in {queue}"
    return method, props, body


def test_rejected_message_carries_x_death(broker: Harness) -> None:
    conn = connect(broker)
    ch = conn.channel()
    src, dlq = _dlx_pair(ch)
    ch.basic_publish(
        "",
        src,
        b"m",
        commands.Basic.Properties(headers={"h": "v"}, expiration="60000", delivery_mode=2),
    )
    method, _, _ = ch.basic_get(src)
    ch.basic_reject(method.delivery_tag, requeue=False)
    method, props, body = _get(ch, dlq)
    assert body == b"m"
    assert method.routing_key == dlq and method.exchange == ""
    assert props.delivery_mode == 2
    assert props.expiration is None  # removed, kept as original-expiration
    headers = props.headers
    assert headers["h"] == "v"
    (death,) = headers["x-death"]
    assert death["count"] == 1
    assert death["reason"] == "rejected"
    assert death["queue"] == src
    assert death["exchange"] == ""
    assert death["routing-keys"] == [src]
    assert death["original-expiration"] == "60000"
    assert isinstance(death["time"], datetime.datetime)
    assert headers["x-first-death-reason"] == headers["x-last-death-reason"] == "rejected"
    assert headers["x-first-death-queue"] == headers["x-last-death-queue"] == src
    assert headers["x-first-death-exchange"] == headers["x-last-death-exchange"] == ""
    conn.close()


def test_nack_without_requeue_dead_letters_every_message(broker: Harness) -> None:
    conn = connect(broker)
    ch = conn.channel()
    src, dlq = _dlx_pair(ch)
    for i in range(3):
        ch.basic_publish("", src, str(i).encode())
    last = None
    for _ in range(3):
        last, _, _ = ch.basic_get(src)
    ch.basic_nack(last.delivery_tag, multiple=True, requeue=False)
    assert [_get(ch, dlq)[2] for _ in range(3)] == [b"0", b"1", b"2"]
    assert ch.queue_declare(src, passive=True).method.message_count == 0
    conn.close()


def test_without_a_dead_letter_routing_key_the_original_keys_are_used(
    broker: Harness,
) -> None:
    conn = connect(broker)
    ch = conn.channel()
    dlx, a, b = uniq("dlx"), uniq("a"), uniq("b")
    ch.exchange_declare(dlx, "direct")
    src = uniq("src")
    ch.queue_declare(src, arguments={"x-dead-letter-exchange": dlx})
    ch.queue_declare(a)
    ch.queue_declare(b)
    ch.queue_bind(a, dlx, src)  # the original routing key
    ch.queue_bind(b, dlx, "cc-key")  # a CC key
    ch.basic_publish("", src, b"m", commands.Basic.Properties(headers={"CC": ["cc-key"]}))
    method, _, _ = ch.basic_get(src)
    ch.basic_reject(method.delivery_tag, requeue=False)
    for q in (a, b):
        method, props, _ = _get(ch, q)
        assert method.exchange == dlx
        assert method.routing_key == src
        assert props.headers["x-death"][0]["routing-keys"] == [src, "cc-key"]
        assert props.headers["CC"] == ["cc-key"]
    conn.close()


def test_a_dead_letter_routing_key_replaces_the_keys_and_drops_cc(broker: Harness) -> None:
    conn = connect(broker)
    ch = conn.channel()
    src, dlq = _dlx_pair(ch)
    ch.basic_publish("", src, b"m", commands.Basic.Properties(headers={"CC": ["elsewhere"]}))
    method, _, _ = ch.basic_get(src)
    ch.basic_reject(method.delivery_tag, requeue=False)
    method, props, _ = _get(ch, dlq)
    assert method.routing_key == dlq
    assert "CC" not in props.headers
    assert props.headers["x-death"][0]["routing-keys"] == [src, "elsewhere"]
    conn.close()


def test_the_count_grows_for_the_same_queue_and_reason(broker: Harness) -> None:
    """Rejected around a loop twice: one x-death entry per (queue, reason), counted."""
    conn = connect(broker)
    ch = conn.channel()
    a, b = uniq("a"), uniq("b")
    ch.queue_declare(a, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": b})
    ch.queue_declare(b, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": a})
    ch.basic_publish("", a, b"m")
    route = [a, b, a, b, a]
    for q in route[:-1]:
        method, _, _ = ch.basic_get(q)
        assert method is not None, q
        ch.basic_reject(method.delivery_tag, requeue=False)
    method, props, _ = ch.basic_get(a, auto_ack=True)
    deaths = props.headers["x-death"]
    assert [(d["queue"], d["reason"], d["count"]) for d in deaths] == [
        (b, "rejected", 2),
        (a, "rejected", 2),
    ]
    assert props.headers["x-first-death-queue"] == a
    assert props.headers["x-last-death-queue"] == b
    conn.close()


def test_an_automatic_cycle_is_dropped(broker: Harness, caplog: pytest.LogCaptureFixture) -> None:
    """A queue whose expired messages dead-letter back into itself: RabbitMQ drops
    the message rather than circle for ever."""
    conn = connect(broker)
    ch = conn.channel()
    q = uniq("loop")
    ch.queue_declare(
        q,
        arguments={
            "x-message-ttl": 0,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": q,
        },
    )
    with caplog.at_level(logging.WARNING, logger="warren.vhost"):
        ch.basic_publish("", q, b"m")
        assert ch.queue_declare(q, passive=True).method.message_count == 0
    assert any("would cycle" in r.getMessage() for r in caplog.records)
    conn.close()


def test_a_rejection_on_the_loop_is_not_a_cycle(broker: Harness) -> None:
    conn = connect(broker)
    ch = conn.channel()
    q = uniq("self")
    ch.queue_declare(q, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": q})
    ch.basic_publish("", q, b"m")
    for expected in (1, 2, 3):
        method, props, _ = ch.basic_get(q)
        assert method is not None
        if expected > 1:
            assert props.headers["x-death"][0]["count"] == expected - 1
        ch.basic_reject(method.delivery_tag, requeue=False)
    conn.close()


def test_missing_dead_letter_exchange_drops_the_message(broker: Harness) -> None:
    conn = connect(broker)
    ch = conn.channel()
    q = uniq("q")
    ch.queue_declare(q, arguments={"x-dead-letter-exchange": uniq("nonexistent")})
    ch.basic_publish("", q, b"m")
    method, _, _ = ch.basic_get(q)
    ch.basic_reject(method.delivery_tag, requeue=False)
    assert ch.queue_declare(q, passive=True).method.message_count == 0
    conn.close()


def test_cc_and_bcc_route_to_more_queues_and_bcc_is_hidden(broker: Harness) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ex = uniq("ex")
    ch.exchange_declare(ex, "direct")
    qs = {k: uniq(k) for k in ("main", "cc", "bcc")}
    for key, q in qs.items():
        ch.queue_declare(q)
        ch.queue_bind(q, ex, key)
    ch.basic_publish(
        ex, "main", b"m", commands.Basic.Properties(headers={"CC": ["cc"], "BCC": ["bcc"], "x": 1})
    )
    for q in qs.values():
        method, props, body = _get(ch, q)
        assert body == b"m"
        assert method.routing_key == "main"  # delivered with the original key
        assert props.headers == {"CC": ["cc"], "x": 1}  # BCC stripped
    conn.close()


def test_cc_routes_each_queue_once(broker: Harness) -> None:
    conn = connect(broker)
    ch = conn.channel()
    q = uniq("q")
    ch.queue_declare(q)
    ch.basic_publish("", q, b"m", commands.Basic.Properties(headers={"CC": [q, q]}))
    assert ch.queue_declare(q, passive=True).method.message_count == 1
    conn.close()


def test_dead_lettered_persistent_message_survives_restart(tmp_path: Path) -> None:
    src, dlq = uniq("src"), uniq("dlq")
    with Harness(tmp_path / "data") as b:
        conn = connect(b)
        ch = conn.channel()
        ch.queue_declare(dlq, durable=True)
        ch.queue_declare(
            src,
            durable=True,
            arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq},
        )
        ch.basic_publish("", src, b"keep", commands.Basic.Properties(delivery_mode=2))
        method, _, _ = ch.basic_get(src)
        ch.basic_reject(method.delivery_tag, requeue=False)
        assert ch.queue_declare(dlq, passive=True).method.message_count == 1
        conn.close()
    with Harness(tmp_path / "data") as b:
        conn = connect(b)
        ch = conn.channel()
        method, props, body = _get(ch, dlq)
        assert body == b"keep"
        assert props.headers["x-death"][0]["reason"] == "rejected"
        assert ch.queue_declare(src, passive=True).method.message_count == 0
        conn.close()


def test_a_dead_letter_chain_longer_than_the_recursion_limit_is_followed_to_its_end(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Each queue of a chain holds nothing (x-max-length 0) and dead-letters to
    the next, so one publish goes from queue to queue. Longer than Python's
    recursion limit, the copy still reaches the last queue: the copies are
    handed over in a loop (core/vhost_dead_letters.py). A recursion stopped
    somewhere down the chain, where logging the RecursionError failed too, and
    the message was lost."""
    # A low recursion limit keeps the chain short (each copy's x-death grows by
    # one death per queue, so a chain's cost is quadratic): far longer than the
    # limit leaves room for, whatever the frames per step, compiled or not.
    limit = 400
    depth = 500
    vhost = VHost("/", lambda fn: None)
    for i in range(depth):
        vhost.declare_queue(
            f"q{i}",
            arguments={
                "x-max-length": 0,
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": f"q{i + 1}",
            },
        )
    last = vhost.declare_queue(f"q{depth}")
    msg = Message("", "q0", EMPTY_PROPERTIES, b"deep", 0)
    was = sys.getrecursionlimit()
    sys.setrecursionlimit(limit)
    try:
        with caplog.at_level(logging.WARNING):
            assert vhost.router.publish(vhost.default_exchange, msg) == 1
    finally:
        sys.setrecursionlimit(was)
    assert [q.name for q in vhost.queues.values() if q.message_count] == [last.name]
    item = last.pull_next(no_ack=True)
    assert item is not None and item[1].body == b"deep"
    deaths = item[1].headers["x-death"]
    assert len(deaths) == depth and deaths[0]["queue"] == f"q{depth - 1}"
    assert not caplog.records
    assert vhost.dead_letters.counts == {("rabbit_classic_queue", "at_most_once", "maxlen"): depth}
