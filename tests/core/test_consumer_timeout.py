"""The delivery acknowledgement timeout: broker-wide consumer_timeout and the
queue's x-consumer-timeout close a channel that holds a delivery too long (406).

The broker checks once a second of its clock (amqp/ack_timeout.py): a delivery
is first seen by the check after it, and its channel closed by the first check
at least the timeout after that one. The tests give the broker a ManualClock,
deliver with the clock standing still at a check, and move it to the closing
check (nothing before it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from conftest import BrokerThread
from pika.exceptions import ChannelClosedByBroker
from pikahelp import barrier, connect, uniq, wait_until

from warren.core.clock import ManualClock

Factory = Callable[..., BrokerThread]


def _closed_by_timeout(conn: Any, ch: Any) -> ChannelClosedByBroker:
    closed: list[Any] = []
    ch._impl.add_on_close_callback(lambda c, reason: closed.append(reason))
    wait_until(conn, lambda: bool(closed))
    reason = closed[0]
    assert isinstance(reason, ChannelClosedByBroker)
    return reason


def test_x_consumer_timeout_closes_the_channel(broker_factory: Factory) -> None:
    b = broker_factory(clock=ManualClock())
    conn = connect(b)
    ch = conn.channel()
    q = uniq()
    ch.queue_declare(q, arguments={"x-consumer-timeout": 500})
    ch.basic_publish("", q, b"slow")
    got: list[bytes] = []
    ch.basic_consume(q, lambda c, m, p, body: got.append(body))
    wait_until(conn, lambda: got == [b"slow"])
    b.advance(1999)  # seen by the check at 1 s, not yet 500 ms old at the next
    barrier(ch)  # still open
    b.advance(1)
    reason = _closed_by_timeout(conn, ch)
    assert reason.reply_code == 406
    assert reason.reply_text == (
        "PRECONDITION_FAILED - delivery acknowledgement on channel 1 timed out. "
        "Timeout value used: 500 ms. This timeout value can be configured, see "
        "consumers doc guide to learn more"
    )
    # The message went back to the queue for someone else.
    other = conn.channel()
    method, _, body = other.basic_get(q, auto_ack=True)
    assert body == b"slow" and method.redelivered
    conn.close()


def test_acked_in_time_keeps_the_channel(broker_factory: Factory) -> None:
    b = broker_factory(clock=ManualClock())
    conn = connect(b)
    ch = conn.channel()
    q = uniq()
    ch.queue_declare(q, arguments={"x-consumer-timeout": 1500})
    got: list[Any] = []
    ch.basic_consume(q, lambda c, m, p, body: (got.append(body), c.basic_ack(m.delivery_tag)))
    for i in range(5):
        ch.basic_publish("", q, str(i).encode())
    wait_until(conn, lambda: len(got) == 5)
    barrier(ch)  # the acks are in
    b.advance(5000)  # well past the timeout: all acked, still open
    barrier(ch)
    assert ch.is_open
    conn.close()


def test_broker_wide_consumer_timeout(broker_factory: Factory) -> None:
    b = broker_factory(consumer_timeout=400, clock=ManualClock())
    conn = connect(b)
    ch = conn.channel()
    q = uniq()
    ch.queue_declare(q)
    ch.basic_publish("", q, b"m")
    method, _, _ = ch.basic_get(q)  # basic.get deliveries count too, as in RabbitMQ
    assert method is not None
    b.advance(1999)
    barrier(ch)
    b.advance(1)
    reason = _closed_by_timeout(conn, ch)
    assert "Timeout value used: 400 ms" in reason.reply_text
    conn.close()


def test_zero_disables_the_timeout(broker_factory: Factory) -> None:
    # No heartbeats either: an hour without them would close the connection.
    b = broker_factory(consumer_timeout=0, heartbeat=0, clock=ManualClock())
    conn = connect(b)
    ch = conn.channel()
    q = uniq()
    ch.queue_declare(q)
    ch.basic_publish("", q, b"m")
    method, _, _ = ch.basic_get(q)
    b.advance(3_600_000)  # an hour, past the default timeout (30 min)
    barrier(ch)
    assert ch.is_open
    ch.basic_ack(method.delivery_tag)
    conn.close()


def test_invalid_x_consumer_timeout_is_refused(broker: BrokerThread) -> None:
    conn = connect(broker)
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as info:
        ch.queue_declare(uniq(), arguments={"x-consumer-timeout": 0})
    assert info.value.reply_code == 406
    conn.close()
