"""The delivery acknowledgement timeout: broker-wide consumer_timeout and the
queue's x-consumer-timeout close a channel that holds a delivery too long (406)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from conftest import BrokerThread
from pika.exceptions import ChannelClosedByBroker
from pikahelp import connect, uniq, wait_until


def _closed_by_timeout(conn: Any, ch: Any, within: float) -> ChannelClosedByBroker:
    closed: list[Any] = []
    ch._impl.add_on_close_callback(lambda c, reason: closed.append(reason))
    wait_until(conn, lambda: bool(closed), timeout=within)
    reason = closed[0]
    assert isinstance(reason, ChannelClosedByBroker)
    return reason


def test_x_consumer_timeout_closes_the_channel(broker: BrokerThread) -> None:
    conn = connect(broker)
    ch = conn.channel()
    q = uniq()
    ch.queue_declare(q, arguments={"x-consumer-timeout": 500})
    ch.basic_publish("", q, b"slow")
    got: list[bytes] = []
    ch.basic_consume(q, lambda c, m, p, body: got.append(body))
    start = time.monotonic()
    reason = _closed_by_timeout(conn, ch, within=5)
    assert time.monotonic() - start >= 0.5
    assert got == [b"slow"]
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


def test_acked_in_time_keeps_the_channel(broker: BrokerThread) -> None:
    conn = connect(broker)
    ch = conn.channel()
    q = uniq()
    ch.queue_declare(q, arguments={"x-consumer-timeout": 1500})
    got: list[Any] = []
    ch.basic_consume(q, lambda c, m, p, body: (got.append(body), c.basic_ack(m.delivery_tag)))
    for i in range(5):
        ch.basic_publish("", q, str(i).encode())
    deadline = time.monotonic() + 2.5
    while time.monotonic() < deadline:  # well past the timeout: all acked, still open
        conn.process_data_events(time_limit=0.1)
    assert len(got) == 5 and ch.is_open
    conn.close()


def test_broker_wide_consumer_timeout(broker_factory: Any) -> None:
    b = broker_factory(consumer_timeout=400)
    conn = connect(b)
    ch = conn.channel()
    q = uniq()
    ch.queue_declare(q)
    ch.basic_publish("", q, b"m")
    method, _, _ = ch.basic_get(q)  # basic.get deliveries count too, as in RabbitMQ
    assert method is not None
    reason = _closed_by_timeout(conn, ch, within=5)
    assert "Timeout value used: 400 ms" in reason.reply_text
    conn.close()


def test_zero_disables_the_timeout(broker_factory: Any) -> None:
    b = broker_factory(consumer_timeout=0)
    conn = connect(b)
    ch = conn.channel()
    q = uniq()
    ch.queue_declare(q)
    ch.basic_publish("", q, b"m")
    method, _, _ = ch.basic_get(q)
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.1)
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
