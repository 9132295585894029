"""x-delivery-limit: redeliveries are counted in x-delivery-count, and a message
returned more often than the limit is dead-lettered (reason delivery_limit).

In memory (issue 29): a tests/harness broker, pika's calls over MemoryAMQP
(harness.channel, frames by pamqp; pika over a socket before).
"""

from __future__ import annotations

from typing import Any

from harness import Connection, Harness, harness_fixture
from harness.channel import uniq

broker = harness_fixture()


def connect(broker: Harness) -> Connection:
    return broker.amqp_connection()


def test_delivery_count_header_and_limit(broker: Harness) -> None:
    conn = connect(broker)
    ch = conn.channel()
    q, dlq = uniq(), uniq("dlq")
    ch.queue_declare(dlq)
    ch.queue_declare(
        q,
        arguments={
            "x-delivery-limit": 2,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": dlq,
        },
    )
    ch.basic_publish("", q, b"m")
    seen: list[Any] = []
    for _ in range(3):
        method, props, body = ch.basic_get(q)
        assert body == b"m"
        seen.append((props.headers or {}).get("x-delivery-count"))
        ch.basic_nack(method.delivery_tag, requeue=True)
    assert seen == [None, 1, 2]
    method, _, _ = ch.basic_get(q)
    assert method is None  # the third return was one too many
    method, props, body = ch.basic_get(dlq, auto_ack=True)
    assert body == b"m"
    assert props.headers["x-death"][0]["reason"] == "delivery_limit"
    conn.close()


def test_channel_close_counts_as_a_delivery_attempt(broker: Harness) -> None:
    conn = connect(broker)
    q = uniq()
    setup = conn.channel()
    setup.queue_declare(q, arguments={"x-delivery-limit": 0})
    setup.basic_publish("", q, b"once")
    ch = conn.channel()
    method, _, _ = ch.basic_get(q)
    assert method is not None
    ch.close()  # returned unacked: over a limit of 0, so dropped (no DLX)
    assert setup.queue_declare(q, passive=True).method.message_count == 0
    conn.close()


def test_ack_after_redelivery_forgets_the_count(broker: Harness) -> None:
    conn = connect(broker)
    ch = conn.channel()
    q = uniq()
    ch.queue_declare(q, arguments={"x-delivery-limit": 5})
    ch.basic_publish("", q, b"a")
    method, _, _ = ch.basic_get(q)
    ch.basic_reject(method.delivery_tag, requeue=True)
    method, props, _ = ch.basic_get(q)
    assert props.headers == {"x-delivery-count": 1}
    ch.basic_ack(method.delivery_tag)
    ch.basic_publish("", q, b"b")
    method, props, body = ch.basic_get(q, auto_ack=True)
    assert body == b"b" and not props.headers
    conn.close()
