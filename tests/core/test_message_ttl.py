"""Message TTL: x-message-ttl and the per-message expiration property.

An expired message is never delivered (also after a requeue), a short-lived
message behind a long-lived head still expires on time, expired messages are
dead-lettered with reason ``expired``, and deadlines survive a restart. Time is
the broker's ManualClock (core/clock.py): each test moves it to just before a
deadline and then onto it, so none waits for time to pass.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pika
from conftest import BrokerThread
from pikahelp import connect, ready_count, uniq, wait_until

from warren.core.clock import ManualClock

Factory = Callable[..., BrokerThread]


def _dl_pair(ch: Any, **args: Any) -> tuple[str, str]:
    q, dlq = uniq(), uniq("dlq")
    ch.queue_declare(dlq)
    ch.queue_declare(
        q, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq, **args}
    )
    return q, dlq


def test_queue_ttl_expires_and_dead_letters(broker_factory: Factory) -> None:
    b = broker_factory(clock=ManualClock())
    conn = connect(b)
    ch = conn.channel()
    q, dlq = _dl_pair(ch, **{"x-message-ttl": 200})
    ch.basic_publish("", q, b"a")
    ch.basic_publish("", q, b"b")
    assert ready_count(ch, q) == 2  # also: both publishes are in
    b.advance(199)
    assert (ready_count(ch, q), ready_count(ch, dlq)) == (2, 0)
    b.advance(1)
    assert (ready_count(ch, q), ready_count(ch, dlq)) == (0, 2)
    method, props, body = ch.basic_get(dlq, auto_ack=True)
    assert body == b"a"
    death = props.headers["x-death"][0]
    assert death["reason"] == "expired" and death["queue"] == q
    assert "original-expiration" not in death
    conn.close()


def test_per_message_expiration(broker_factory: Factory) -> None:
    b = broker_factory(clock=ManualClock())
    conn = connect(b)
    ch = conn.channel()
    q, dlq = _dl_pair(ch)
    ch.basic_publish("", q, b"short", pika.BasicProperties(expiration="150"))
    ch.basic_publish("", q, b"forever")
    assert ready_count(ch, q) == 2
    b.advance(149)
    assert ready_count(ch, dlq) == 0
    b.advance(1)
    assert ready_count(ch, dlq) == 1
    method, props, body = ch.basic_get(dlq, auto_ack=True)
    assert body == b"short"
    assert props.expiration is None
    assert props.headers["x-death"][0]["original-expiration"] == "150"
    method, _, body = ch.basic_get(q, auto_ack=True)
    assert body == b"forever"
    conn.close()


def test_short_ttl_behind_a_long_head_expires_on_time(broker_factory: Factory) -> None:
    b = broker_factory(clock=ManualClock())
    conn = connect(b)
    ch = conn.channel()
    q, dlq = _dl_pair(ch, **{"x-message-ttl": 60_000})
    ch.basic_publish("", q, b"long")
    ch.basic_publish("", q, b"short", pika.BasicProperties(expiration="200"))
    ch.basic_publish("", q, b"long too")
    assert ready_count(ch, q) == 3
    b.advance(200)
    assert (ready_count(ch, q), ready_count(ch, dlq)) == (2, 1)
    assert [ch.basic_get(q, auto_ack=True)[2] for _ in range(2)] == [b"long", b"long too"]
    assert ch.basic_get(dlq, auto_ack=True)[2] == b"short"
    conn.close()


def test_a_message_expired_while_unacked_is_not_redelivered(broker_factory: Factory) -> None:
    b = broker_factory(clock=ManualClock())
    conn = connect(b)
    ch = conn.channel()
    q, dlq = _dl_pair(ch, **{"x-message-ttl": 200})
    ch.basic_publish("", q, b"m")
    method, _, _ = ch.basic_get(q)
    assert method is not None
    b.advance(400)  # held past its TTL: an unacked message does not expire
    assert ready_count(ch, dlq) == 0
    ch.basic_nack(method.delivery_tag, requeue=True)
    assert ch.basic_get(q)[0] is None
    assert ch.basic_get(dlq, auto_ack=True)[2] == b"m"
    conn.close()


def test_expired_messages_are_skipped_by_consumers(broker_factory: Factory) -> None:
    """Messages that expired while a consumer was away are never delivered to it."""
    b = broker_factory(clock=ManualClock())
    conn = connect(b)
    ch = conn.channel()
    q = uniq()
    ch.queue_declare(q, arguments={"x-message-ttl": 100})
    ch.basic_publish("", q, b"stale")
    assert ready_count(ch, q) == 1
    b.advance(300)
    got: list[bytes] = []
    ch.basic_consume(q, lambda c, m, p, body: got.append(body), auto_ack=True)
    ch.basic_publish("", q, b"fresh")
    wait_until(conn, lambda: got == [b"fresh"])
    conn.close()


def test_ttl_zero_reaches_a_waiting_consumer_only(broker: BrokerThread) -> None:
    conn = connect(broker)
    ch = conn.channel()
    q = uniq()
    ch.queue_declare(q, arguments={"x-message-ttl": 0})
    ch.basic_publish("", q, b"nobody waiting")
    assert ready_count(ch, q) == 0
    got: list[bytes] = []
    ch.basic_consume(q, lambda c, m, p, body: got.append(body), auto_ack=True)
    ch.basic_publish("", q, b"live")
    wait_until(conn, lambda: got == [b"live"])
    conn.close()


def test_deadlines_survive_a_restart(broker_factory: Factory) -> None:
    """TTL counts from publication, not from the restart; per-message expirations
    behind a long-lived head are found again after the restart. One ManualClock
    serves both runs and moves while the broker is down too."""
    clock = ManualClock()
    b = broker_factory(clock=clock)
    conn = connect(b)
    ch = conn.channel()
    q, dlq = uniq(), uniq("dlq")
    ch.queue_declare(dlq, durable=True)
    ch.queue_declare(
        q,
        durable=True,
        arguments={
            "x-message-ttl": 3000,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": dlq,
        },
    )
    persistent = pika.BasicProperties(delivery_mode=2)
    ch.basic_publish("", q, b"queue-ttl", persistent)
    ch.basic_publish(
        "", q, b"own-ttl", pika.BasicProperties(delivery_mode=2, expiration="1500")
    )
    assert ready_count(ch, q) == 2
    conn.close()
    b.stop()
    clock.advance(500)  # down for half a second
    b = broker_factory(clock=clock)
    conn = connect(b)
    ch = conn.channel()
    assert ready_count(ch, q) == 2
    b.advance(999)  # 1.499 s after the publish
    assert ready_count(ch, dlq) == 0
    b.advance(1)  # 1.5 s: not 1.5 s after the restart, nor after the head's 3 s
    assert ready_count(ch, dlq) == 1
    b.advance(1499)
    assert ready_count(ch, dlq) == 1
    b.advance(1)  # 3 s
    assert ready_count(ch, dlq) == 2
    assert [ch.basic_get(dlq, auto_ack=True)[2] for _ in range(2)] == [b"own-ttl", b"queue-ttl"]
    conn.close()
