"""What policies do to queues, as a client sees it: limits, TTL and
dead-lettering set by policy apply at once to existing queues, the lower of
policy and operator policy wins, and the effect survives a restart.

In memory (issue 29): a tests/harness broker, pika's calls over MemoryAMQP
(harness.channel, frames by pamqp; pika over a socket before); a restart is a
new Harness on the same data dir, the TTL test runs on its ManualClock.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from harness import Connection, Harness, harness_fixture
from harness.channel import Nacked, drain, ready_count, uniq
from pamqp import commands

broker = harness_fixture()
clocked = harness_fixture(manual_clock=True)


def connect(broker: Harness) -> Connection:
    return broker.amqp_connection()


def test_max_length_policy_trims_an_existing_queue_at_once(broker: Harness) -> None:
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


def test_overflow_and_dead_lettering_by_policy(broker: Harness) -> None:
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
    with pytest.raises(Nacked):
        ch.basic_publish("", q, b"out")
    method, props, body = ch.basic_get(dlq, auto_ack=True)
    assert body == b"out" and props.headers["x-death"][0]["reason"] == "maxlen"
    conn.close()


def test_message_ttl_policy_expires_what_is_already_queued(clocked: Harness) -> None:
    b = clocked
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


def test_operator_policy_lower_value_wins(broker: Harness) -> None:
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


def test_queue_argument_below_policy_wins(broker: Harness) -> None:
    conn = connect(broker)
    ch = conn.channel()
    q = uniq("pol")
    broker.call(lambda: broker.broker.set_policy("/", "big", f"^{q}$", {"max-length": 10}))
    ch.queue_declare(q, arguments={"x-max-length": 1})
    for i in range(3):
        ch.basic_publish("", q, str(i).encode())
    assert drain(ch, q) == [b"2"]
    conn.close()


def test_delivery_limit_by_policy(broker: Harness) -> None:
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


def test_policy_effect_survives_a_restart(tmp_path: Path) -> None:
    q = uniq("pol")
    with Harness(tmp_path / "data") as b:
        b.call(lambda: b.broker.set_policy("/", "len", f"^{q}$", {"max-length": 1}))
        conn = connect(b)
        ch = conn.channel()
        ch.queue_declare(q, durable=True)
        conn.close()
    with Harness(tmp_path / "data") as b:
        conn = connect(b)
        ch = conn.channel()
        persistent = commands.Basic.Properties(delivery_mode=2)
        for i in range(3):
            ch.basic_publish("", q, str(i).encode(), persistent)
        assert drain(ch, q) == [b"2"]
        conn.close()
