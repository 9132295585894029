"""At-least-once dead-lettering of quorum queues, as RabbitMQ's: a message that
leaves the queue (rejected, expired, over its delivery limit) and whose
dead-letter copy no target took is held apart (RabbitMQ's "discards":
``messages_dlx`` in the management API), never delivered again, counted
against the length limits, and handed on once a target takes it. RabbitMQ
3.10 answers the same: an expired message is gone from ``messages_ready`` and
from basic.get, shown in ``messages_dlx``, and reaches the target queue bound
later at its worker's next try.

In memory (issue 29): a tests/harness broker on a ManualClock (the held
copies' retry timer fires when a test moves it), pika's calls over MemoryAMQP
(harness.channel, frames by pamqp; pika over a socket before), and the
management API's answers from its own aiohttp application, in memory too
(harness.management); a restart is a new Harness on the same data dir.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness import Channel, Connection, Harness, harness_fixture
from harness.channel import Nacked, Properties, uniq

from warren.core.clock import ManualClock
from warren.core.quorum_queue import HELD_RETRY_MS

STRICT = {"x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"}


def declare(ch: Channel, q: str, **arguments: Any) -> None:
    """A quorum queue dead-lettering at least once to amq.direct with key ``q``-dl,
    to which no queue is bound yet."""
    ch.queue_declare(
        q,
        durable=True,
        arguments={
            "x-queue-type": "quorum",
            "x-dead-letter-exchange": "amq.direct",
            "x-dead-letter-routing-key": f"{q}-dl",
            **STRICT,
            **arguments,
        },
    )


def ready(ch: Channel, q: str) -> int:
    return int(ch.queue_declare(q, passive=True).method.message_count)


def api_queue(broker: Harness, q: str) -> dict[str, Any]:
    """GET /api/queues/%2F/``q``: the management API's answer."""
    info: dict[str, Any] = broker.http().get(f"queues/%2F/{q}")
    return info


# This module's broker runs on a ManualClock: the held copies' retry timer
# fires when a test moves it.
broker = harness_fixture(manual_clock=True)


def connect(broker: Harness) -> Connection:
    return broker.amqp_connection()


def retry(broker: Harness, q: str) -> None:
    """Time for the held copies' next try (HELD_RETRY_MS), and the try."""
    assert broker.advance(HELD_RETRY_MS) >= 1


def bind_target(ch: Channel, q: str) -> str:
    target = f"{q}-dl"
    ch.queue_declare(target, durable=True)
    ch.queue_bind(target, "amq.direct", target)
    return target


def test_an_expired_message_is_held_not_delivered_then_handed_on(broker: Harness) -> None:
    conn = connect(broker)
    ch = conn.channel()
    q = uniq("alo")
    declare(ch, q, **{"x-message-ttl": 0})
    ch.basic_publish("", q, b"late", Properties(headers={"app": 1}))
    ch.barrier()
    # Expired: never delivered again, whoever asks, and not ready.
    assert ch.basic_get(q)[0] is None
    assert ready(ch, q) == 0
    info = api_queue(broker, q)
    assert (info["messages_dlx"], info["messages_ready"], info["messages"]) == (1, 0, 1)
    retry(broker, q)  # still nowhere to go: kept
    assert api_queue(broker, q)["messages_dlx"] == 1
    target = bind_target(ch, q)
    retry(broker, q)
    method, props, body = ch.basic_get(target, auto_ack=True)
    assert body == b"late"
    assert props.headers["app"] == 1
    assert props.headers["x-death"][0]["reason"] == "expired"
    assert props.headers["x-death"][0]["queue"] == q
    info = api_queue(broker, q)
    assert (info["messages_dlx"], info["messages"]) == (0, 0)
    conn.close()


def test_expiry_in_the_queue_and_at_a_consumer_are_held(broker: Harness) -> None:
    """A message's own expiration, met by the expiry timer or by a delivery pass."""
    conn = connect(broker)
    ch = conn.channel()
    q = uniq("alo")
    declare(ch, q, **{"x-message-ttl": 60_000})
    ch.basic_publish("", q, b"own", Properties(expiration="1"))
    ch.basic_publish("", q, b"kept")
    ch.barrier()
    broker.advance(1)
    assert api_queue(broker, q)["messages_dlx"] == 1
    assert [ch.basic_get(q, auto_ack=True)[2] for _ in range(2)] == [b"kept", None]
    conn.close()


def test_a_rejected_or_poison_message_is_held_too(broker: Harness) -> None:
    conn = connect(broker)
    ch = conn.channel()
    q = uniq("alo")
    declare(ch, q, **{"x-delivery-limit": 0})
    ch.basic_publish("", q, b"rejected")
    ch.basic_publish("", q, b"poison")
    method, _props, _body = ch.basic_get(q)
    ch.basic_reject(method.delivery_tag, requeue=False)
    method, _props, _body = ch.basic_get(q)
    ch.basic_nack(method.delivery_tag, requeue=True)  # one return over a limit of 0
    ch.barrier()
    assert ch.basic_get(q)[0] is None
    assert api_queue(broker, q)["messages_dlx"] == 2
    target = bind_target(ch, q)
    retry(broker, q)
    reasons = []
    for _ in range(2):
        _method, props, body = ch.basic_get(target, auto_ack=True)
        reasons.append((body, props.headers["x-death"][0]["reason"]))
    assert reasons == [(b"rejected", "rejected"), (b"poison", "delivery_limit")]
    conn.close()


def test_held_copies_count_against_the_length_limit(broker: Harness) -> None:
    """As rabbit_fifo: held copies and ready messages together, over the limit."""
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    q = uniq("alo")
    declare(ch, q, **{"x-max-length": 1, "x-message-ttl": 0})
    outcomes = []
    for i in range(3):
        try:
            ch.basic_publish("", q, b"%d" % i)
            outcomes.append("ack")
        except Nacked:
            outcomes.append("nack")
    # 0 and 1 expire into the held copies; with two held, 2 is one over the limit.
    assert outcomes == ["ack", "ack", "nack"]
    assert api_queue(broker, q)["messages_dlx"] == 2
    conn.close()


def test_a_policy_change_tries_them_at_once(broker: Harness) -> None:
    """As RabbitMQ's worker looks its targets up again when the policy changes."""
    conn = connect(broker)
    ch = conn.channel()
    q = uniq("alo")
    declare(ch, q, **{"x-message-ttl": 0})
    ch.basic_publish("", q, b"m")
    ch.barrier()
    target = bind_target(ch, q)
    broker.call(
        lambda: broker.broker.vhosts["/"].set_policy(
            "alo-expires", f"^{q}$", {"expires": 600_000}, apply_to="queues"
        )
    )
    broker.settle()  # no time passes: the policy change's own try
    assert ready(ch, target) == 1
    assert api_queue(broker, q)["messages_dlx"] == 0
    conn.close()


def test_without_at_least_once_nothing_is_held(broker: Harness) -> None:
    """At-most-once, and at-least-once without reject-publish (which falls back
    to it, as RabbitMQ's rule): the message is dropped."""
    conn = connect(broker)
    ch = conn.channel()
    loose, fallback = uniq("amo"), uniq("fb")
    declare(ch, loose, **{"x-dead-letter-strategy": "at-most-once"})
    declare(ch, fallback, **{"x-overflow": "drop-head"})
    for q in (loose, fallback):
        ch.basic_publish("", q, b"m")
        method, _props, _body = ch.basic_get(q)
        ch.basic_reject(method.delivery_tag, requeue=False)
    ch.barrier()
    for q in (loose, fallback):
        info = api_queue(broker, q)
        assert (info["messages_dlx"], info["messages"]) == (0, 0)
    conn.close()


def test_held_copies_survive_a_restart_and_go_on_at_start(tmp_path: Path) -> None:
    q = uniq("alo")
    # ManualClocks: no retry timer fires, so only the start tries the copies.
    with Harness(tmp_path / "data", clock=ManualClock()) as b:
        conn = connect(b)
        ch = conn.channel()
        declare(ch, q, **{"x-message-ttl": 0})
        ch.basic_publish("", q, b"m", Properties(delivery_mode=1))
        ch.barrier()
        target = bind_target(ch, q)  # bound, but the next try is seconds away
        conn.close()
    with Harness(tmp_path / "data", clock=ManualClock()) as b:
        conn = connect(b)
        ch = conn.channel()
        b.settle()
        assert ready(ch, target) == 1  # tried as the queue starts
        assert ch.basic_get(target, auto_ack=True)[2] == b"m"
        assert ready(ch, q) == 0
        conn.close()
