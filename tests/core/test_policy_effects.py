"""What policies do to queues, through real clients: limits, TTL and
dead-lettering set by policy apply at once to existing queues, the lower of
policy and operator policy wins, and the effect survives a restart."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pika
import pytest
from conftest import BrokerThread
from pika.exceptions import NackError
from pikahelp import connect, drain, ready_count, uniq

from warren.core.clock import ManualClock


def test_max_length_policy_trims_an_existing_queue_at_once(broker: BrokerThread) -> None:
    conn = connect(broker)
    ch = conn.channel()
    q = uniq("pol")
    ch.queue_declare(q)
    for i in range(5):
        ch.basic_publish("", q, str(i).encode())
    broker.call(lambda: broker.broker.set_policy("/", "len", f"^{q}$", {"max-length": 2}))
    assert ready_count(ch, q) == 2
    ch.basic_publish("", q, b"5")
    assert drain(ch, q) == [b"4", b"5"]
    broker.call(lambda: broker.broker.clear_policy("/", "len"))
    for i in range(4):
        ch.basic_publish("", q, str(i).encode())
    assert ready_count(ch, q) == 4
    conn.close()


def test_overflow_and_dead_lettering_by_policy(broker: BrokerThread) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    q, dlq = uniq("pol"), uniq("dlq")
    ch.queue_declare(dlq)
    ch.queue_declare(q)
    broker.call(
        lambda: broker.broker.set_policy(
            "/",
            "full",
            f"^{q}$",
            {
                "max-length": 1,
                "overflow": "reject-publish-dlx",
                "dead-letter-exchange": "",
                "dead-letter-routing-key": dlq,
            },
            apply_to="queues",
        )
    )
    ch.basic_publish("", q, b"in")
    with pytest.raises(NackError):
        ch.basic_publish("", q, b"out")
    method, props, body = ch.basic_get(dlq, auto_ack=True)
    assert body == b"out" and props.headers["x-death"][0]["reason"] == "maxlen"
    conn.close()


def test_message_ttl_policy_expires_what_is_already_queued(
    broker_factory: Callable[..., BrokerThread],
) -> None:
    b = broker_factory(clock=ManualClock())
    conn = connect(b)
    ch = conn.channel()
    q = uniq("pol")
    ch.queue_declare(q)
    ch.basic_publish("", q, b"old")
    assert ready_count(ch, q) == 1
    b.advance(150)
    b.call(lambda: b.broker.set_policy("/", "ttl", f"^{q}$", {"message-ttl": 100}))
    assert ready_count(ch, q) == 0
    conn.close()


def test_operator_policy_lower_value_wins(broker: BrokerThread) -> None:
    conn = connect(broker)
    ch = conn.channel()
    q = uniq("pol")
    b = broker.broker
    broker.call(lambda: b.set_policy("/", "user", f"^{q}$", {"max-length": 5}))
    broker.call(lambda: b.set_operator_policy("/", "ops", f"^{q}$", {"max-length": 2}))
    ch.queue_declare(q)
    for i in range(6):
        ch.basic_publish("", q, str(i).encode())
    assert drain(ch, q) == [b"4", b"5"]
    broker.call(lambda: b.clear_operator_policy("/", "ops"))
    for i in range(6):
        ch.basic_publish("", q, str(i).encode())
    assert ready_count(ch, q) == 5
    conn.close()


def test_queue_argument_below_policy_wins(broker: BrokerThread) -> None:
    conn = connect(broker)
    ch = conn.channel()
    q = uniq("pol")
    broker.call(lambda: broker.broker.set_policy("/", "big", f"^{q}$", {"max-length": 10}))
    ch.queue_declare(q, arguments={"x-max-length": 1})
    for i in range(3):
        ch.basic_publish("", q, str(i).encode())
    assert drain(ch, q) == [b"2"]
    conn.close()


def test_delivery_limit_by_policy(broker: BrokerThread) -> None:
    conn = connect(broker)
    ch = conn.channel()
    q = uniq("pol")
    ch.queue_declare(q)
    broker.call(lambda: broker.broker.set_policy("/", "dl", f"^{q}$", {"delivery-limit": 0}))
    ch.basic_publish("", q, b"m")
    method, _, _ = ch.basic_get(q)
    ch.basic_nack(method.delivery_tag, requeue=True)
    assert ready_count(ch, q) == 0
    conn.close()


def test_policy_effect_survives_a_restart(broker_factory: Any) -> None:
    b = broker_factory()
    q = uniq("pol")
    b.call(lambda: b.broker.set_policy("/", "len", f"^{q}$", {"max-length": 1}))
    conn = connect(b)
    ch = conn.channel()
    ch.queue_declare(q, durable=True)
    conn.close()
    b.stop()
    b = broker_factory()
    conn = connect(b)
    ch = conn.channel()
    persistent = pika.BasicProperties(delivery_mode=2)
    for i in range(3):
        ch.basic_publish("", q, str(i).encode(), persistent)
    assert drain(ch, q) == [b"2"]
    conn.close()
