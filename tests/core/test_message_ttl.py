"""Message TTL: x-message-ttl and the per-message expiration property.

An expired message is never delivered (also after a requeue), a short-lived
message behind a long-lived head still expires on time, expired messages are
dead-lettered with reason ``expired``, and deadlines survive a restart. Time is
the broker's ManualClock (core/clock.py): each test moves it to just before a
deadline and then onto it, so none waits for time to pass.

In memory (issue 29): a tests/harness broker and MemoryAMQP connections whose
frames pamqp decodes (pika over a socket before); a restart is a new Harness
on the same data dir and the same clock.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from harness import Harness, MemoryAMQP, harness_fixture
from pamqp import commands
from rawamqp import publish_frames

from warren.core.clock import ManualClock

broker = harness_fixture(manual_clock=True)


def uniq(prefix: str = "q") -> str:
    return f"test-{prefix}-{uuid.uuid4().hex[:10]}"


def declare(c: MemoryAMQP, queue: str, durable: bool = False, **arguments: Any) -> None:
    c.send_method(
        1, commands.Queue.Declare(queue=queue, durable=durable, arguments=arguments or None)
    )
    c.expect_method(commands.Queue.DeclareOk)


def publish(c: MemoryAMQP, queue: str, body: bytes, **properties: Any) -> None:
    props = commands.Basic.Properties(**properties) if properties else None
    c.send(publish_frames(1, body, queue, properties=props))


def _dl_pair(c: MemoryAMQP, **args: Any) -> tuple[str, str]:
    q, dlq = uniq(), uniq("dlq")
    declare(c, dlq)
    declare(c, q, **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq, **args})
    return q, dlq


def consume_no_ack(c: MemoryAMQP, queue: str) -> None:
    c.send_method(1, commands.Basic.Consume(queue=queue, no_ack=True))
    c.expect_method(commands.Basic.ConsumeOk)


def only_delivery(c: MemoryAMQP) -> bytes:
    """The next delivery's body, with nothing else delivered before a round trip."""
    c.expect_method(commands.Basic.Deliver)
    body = c.expect_content()[1]
    c.send_method(1, commands.Exchange.Declare(exchange="amq.direct", passive=True))
    c.expect_method(commands.Exchange.DeclareOk)
    return body


def test_queue_ttl_expires_and_dead_letters(broker: Harness) -> None:
    c = broker.amqp_client()
    q, dlq = _dl_pair(c, **{"x-message-ttl": 200})
    publish(c, q, b"a")
    publish(c, q, b"b")
    assert c.ready_count(q) == 2  # also: both publishes are in
    broker.advance(199)
    assert (c.ready_count(q), c.ready_count(dlq)) == (2, 0)
    broker.advance(1)
    assert (c.ready_count(q), c.ready_count(dlq)) == (0, 2)
    _, props, body = c.basic_get(dlq)
    assert props is not None
    assert body == b"a"
    death = props.headers["x-death"][0]
    assert death["reason"] == "expired" and death["queue"] == q
    assert "original-expiration" not in death
    c.close()


def test_per_message_expiration(broker: Harness) -> None:
    c = broker.amqp_client()
    q, dlq = _dl_pair(c)
    publish(c, q, b"short", expiration="150")
    publish(c, q, b"forever")
    assert c.ready_count(q) == 2
    broker.advance(149)
    assert c.ready_count(dlq) == 0
    broker.advance(1)
    assert c.ready_count(dlq) == 1
    _, props, body = c.basic_get(dlq)
    assert props is not None
    assert body == b"short"
    assert props.expiration is None
    assert props.headers["x-death"][0]["original-expiration"] == "150"
    _, _, body = c.basic_get(q)
    assert body == b"forever"
    c.close()


def test_short_ttl_behind_a_long_head_expires_on_time(broker: Harness) -> None:
    c = broker.amqp_client()
    q, dlq = _dl_pair(c, **{"x-message-ttl": 60_000})
    publish(c, q, b"long")
    publish(c, q, b"short", expiration="200")
    publish(c, q, b"long too")
    assert c.ready_count(q) == 3
    broker.advance(200)
    assert (c.ready_count(q), c.ready_count(dlq)) == (2, 1)
    assert [c.basic_get(q)[2] for _ in range(2)] == [b"long", b"long too"]
    assert c.basic_get(dlq)[2] == b"short"
    c.close()


def test_a_message_expired_while_unacked_is_not_redelivered(broker: Harness) -> None:
    c = broker.amqp_client()
    q, dlq = _dl_pair(c, **{"x-message-ttl": 200})
    publish(c, q, b"m")
    method, _, _ = c.basic_get(q, no_ack=False)
    assert method is not None
    broker.advance(400)  # held past its TTL: an unacked message does not expire
    assert c.ready_count(dlq) == 0
    c.send_method(1, commands.Basic.Nack(delivery_tag=method.delivery_tag, requeue=True))
    assert c.basic_get(q, no_ack=False)[0] is None
    assert c.basic_get(dlq)[2] == b"m"
    c.close()


def test_expired_messages_are_skipped_by_consumers(broker: Harness) -> None:
    """Messages that expired while a consumer was away are never delivered to it."""
    c = broker.amqp_client()
    q = uniq()
    declare(c, q, **{"x-message-ttl": 100})
    publish(c, q, b"stale")
    assert c.ready_count(q) == 1
    broker.advance(300)
    consume_no_ack(c, q)
    publish(c, q, b"fresh")
    assert only_delivery(c) == b"fresh"
    c.close()


def test_ttl_zero_reaches_a_waiting_consumer_only(broker: Harness) -> None:
    c = broker.amqp_client()
    q = uniq()
    declare(c, q, **{"x-message-ttl": 0})
    publish(c, q, b"nobody waiting")
    assert c.ready_count(q) == 0
    consume_no_ack(c, q)
    publish(c, q, b"live")
    assert only_delivery(c) == b"live"
    c.close()


def test_deadlines_survive_a_restart(tmp_path: Path) -> None:
    """TTL counts from publication, not from the restart; per-message expirations
    behind a long-lived head are found again after the restart. One ManualClock
    serves both runs and moves while the broker is down too."""
    clock = ManualClock()
    q, dlq = uniq(), uniq("dlq")
    with Harness(tmp_path / "data", clock=clock) as b:
        c = b.amqp_client()
        declare(c, dlq, durable=True)
        declare(
            c,
            q,
            durable=True,
            **{
                "x-message-ttl": 3000,
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": dlq,
            },
        )
        publish(c, q, b"queue-ttl", delivery_mode=2)
        publish(c, q, b"own-ttl", delivery_mode=2, expiration="1500")
        assert c.ready_count(q) == 2
        c.close()
    clock.advance(500)  # down for half a second
    with Harness(tmp_path / "data", clock=clock) as b:
        c = b.amqp_client()
        assert c.ready_count(q) == 2
        b.advance(999)  # 1.499 s after the publish
        assert c.ready_count(dlq) == 0
        b.advance(1)  # 1.5 s: not 1.5 s after the restart, nor after the head's 3 s
        assert c.ready_count(dlq) == 1
        b.advance(1499)
        assert c.ready_count(dlq) == 1
        b.advance(1)  # 3 s
        assert c.ready_count(dlq) == 2
        assert [c.basic_get(dlq)[2] for _ in range(2)] == [b"own-ttl", b"queue-ttl"]
        c.close()
