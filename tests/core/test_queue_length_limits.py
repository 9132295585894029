"""x-max-length, x-max-length-bytes and x-overflow (drop-head, reject-publish,
reject-publish-dlx), with confirms and dead-lettering as RabbitMQ does them.

In memory (issue 29): a tests/harness broker, pika's calls over MemoryAMQP
(harness.channel, frames by pamqp; pika over a socket before); the restart is
a new Harness on the same data dir.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from harness import Connection, Harness, harness_fixture
from harness.channel import Nacked, Properties, drain, uniq

broker = harness_fixture()


def connect(broker: Harness) -> Connection:
    return broker.amqp_connection()


def test_drop_head_keeps_the_newest(broker: Harness) -> None:
    conn = connect(broker)
    ch = conn.channel()
    q = uniq()
    ch.queue_declare(q, arguments={"x-max-length": 3})
    for i in range(6):
        ch.basic_publish("", q, str(i).encode())
    assert drain(ch, q) == [b"3", b"4", b"5"]
    conn.close()


def test_max_length_bytes_counts_bodies(broker: Harness) -> None:
    conn = connect(broker)
    ch = conn.channel()
    q = uniq()
    ch.queue_declare(q, arguments={"x-max-length-bytes": 10})
    for body in (b"aaaa", b"bbbb", b"cccc"):  # 12 bytes: the oldest goes
        ch.basic_publish("", q, body)
    assert drain(ch, q) == [b"bbbb", b"cccc"]
    conn.close()


def test_drop_head_dead_letters_with_reason_maxlen(broker: Harness) -> None:
    conn = connect(broker)
    ch = conn.channel()
    q, dlq = uniq(), uniq("dlq")
    ch.queue_declare(dlq)
    ch.queue_declare(
        q,
        arguments={
            "x-max-length": 1,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": dlq,
        },
    )
    ch.basic_publish("", q, b"old")
    ch.basic_publish("", q, b"new")
    method, props, body = ch.basic_get(dlq, auto_ack=True)
    assert body == b"old"
    assert props.headers["x-death"][0]["reason"] == "maxlen"
    assert drain(ch, q) == [b"new"]
    conn.close()


def test_unacked_messages_do_not_count(broker: Harness) -> None:
    conn = connect(broker)
    ch = conn.channel()
    q = uniq()
    ch.queue_declare(q, arguments={"x-max-length": 1})
    ch.basic_publish("", q, b"a")
    held, _, _ = ch.basic_get(q)
    ch.basic_publish("", q, b"b")
    assert ch.queue_declare(q, passive=True).method.message_count == 1
    ch.basic_ack(held.delivery_tag)
    assert drain(ch, q) == [b"b"]
    conn.close()


def test_reject_publish_nacks_the_publisher(broker: Harness) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    q = uniq()
    ch.queue_declare(q, arguments={"x-max-length": 2, "x-overflow": "reject-publish"})
    ch.basic_publish("", q, b"1")
    ch.basic_publish("", q, b"2")
    with pytest.raises(Nacked):
        ch.basic_publish("", q, b"3")
    assert drain(ch, q) == [b"1", b"2"]
    ch.basic_publish("", q, b"4")  # room again: acked
    assert drain(ch, q) == [b"4"]
    conn.close()


def test_reject_publish_is_not_a_return(broker: Harness) -> None:
    """Routed but refused: no basic.return for a mandatory publish, a nack only."""
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    q = uniq()
    ch.queue_declare(q, arguments={"x-max-length": 0, "x-overflow": "reject-publish"})
    with pytest.raises(Nacked):
        ch.basic_publish("", q, b"x", mandatory=True)
    conn.pump()  # all the broker has written by now: no basic.return among it
    assert ch.returned == []
    conn.close()


def test_reject_publish_dlx_dead_letters_the_refused_message(broker: Harness) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    q, dlq = uniq(), uniq("dlq")
    ch.queue_declare(dlq)
    ch.queue_declare(
        q,
        arguments={
            "x-max-length": 1,
            "x-overflow": "reject-publish-dlx",
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": dlq,
        },
    )
    ch.basic_publish("", q, b"kept")
    with pytest.raises(Nacked):
        ch.basic_publish("", q, b"refused")
    method, props, body = ch.basic_get(dlq, auto_ack=True)
    assert body == b"refused"
    assert props.headers["x-death"][0]["reason"] == "maxlen"
    assert drain(ch, q) == [b"kept"]
    conn.close()


def test_reject_publish_on_one_of_two_queues_nacks(broker: Harness) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    ex, full, roomy = uniq("ex"), uniq("full"), uniq("roomy")
    ch.exchange_declare(ex, "fanout")
    ch.queue_declare(full, arguments={"x-max-length": 0, "x-overflow": "reject-publish"})
    ch.queue_declare(roomy)
    ch.queue_bind(full, ex)
    ch.queue_bind(roomy, ex)
    with pytest.raises(Nacked):
        ch.basic_publish(ex, "", b"m")
    assert drain(ch, roomy) == [b"m"]
    conn.close()


def test_a_waiting_consumer_still_gets_messages_at_max_length_zero(
    broker: Harness,
) -> None:
    """drop-head with max-length 0: a message a consumer can take at once is
    delivered, anything that would wait is dropped."""
    conn = connect(broker)
    ch = conn.channel()
    q = uniq()
    ch.queue_declare(q, arguments={"x-max-length": 0})
    got: list[bytes] = []
    ch.basic_consume(q, lambda c, m, p, b: got.append(b), auto_ack=True)
    ch.basic_publish("", q, b"live")
    conn.pump()
    assert got == [b"live"]
    conn.close()


def test_length_limit_applies_to_persistent_messages_after_restart(tmp_path: Path) -> None:
    q = uniq()
    with Harness(tmp_path / "data") as b:
        conn = connect(b)
        ch = conn.channel()
        ch.queue_declare(q, durable=True, arguments={"x-max-length": 2})
        for i in range(4):
            ch.basic_publish("", q, str(i).encode(), Properties(delivery_mode=2))
        conn.close()
    with Harness(tmp_path / "data") as b:
        conn = connect(b)
        ch = conn.channel()
        ch.basic_publish("", q, b"4", Properties(delivery_mode=2))
        assert drain(ch, q) == [b"3", b"4"]
        conn.close()
