"""At-least-once dead-lettering of quorum queues, as RabbitMQ's: a message that
leaves the queue (rejected, expired, over its delivery limit) and whose
dead-letter copy no target took is held apart (RabbitMQ's "discards":
``messages_dlx`` in the management API), never delivered again, counted
against the length limits, and handed on once a target takes it. RabbitMQ
3.10 answers the same: an expired message is gone from ``messages_ready`` and
from basic.get, shown in ``messages_dlx``, and reaches the target queue bound
later at its worker's next try."""

from __future__ import annotations

import base64
import json
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from conftest import BrokerThread, start_broker
from pika.adapters.blocking_connection import BlockingChannel
from pikahelp import barrier, connect, uniq, wait_until

from warren.core.clock import ManualClock
from warren.core.quorum_queue import HELD_RETRY_MS

STRICT = {"x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"}


def declare(ch: BlockingChannel, q: str, **arguments: Any) -> None:
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


def ready(ch: BlockingChannel, q: str) -> int:
    return int(ch.queue_declare(q, passive=True).method.message_count)


def api_queue(broker: BrokerThread, q: str) -> dict[str, Any]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{broker.http_port}/api/queues/%2F/{q}",
        headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()},
    )
    with urllib.request.urlopen(request) as response:
        info: dict[str, Any] = json.load(response)
    return info


@pytest.fixture
def broker(broker_factory: Callable[..., BrokerThread]) -> BrokerThread:
    """This module's broker runs on a ManualClock: the held copies' retry timer
    fires when a test moves it."""
    return broker_factory(clock=ManualClock())


def retry(broker: BrokerThread, q: str) -> None:
    """Time for the held copies' next try (HELD_RETRY_MS), and the try."""
    assert broker.advance(HELD_RETRY_MS) >= 1


def bind_target(ch: BlockingChannel, q: str) -> str:
    target = f"{q}-dl"
    ch.queue_declare(target, durable=True)
    ch.queue_bind(target, "amq.direct", target)
    return target


def test_an_expired_message_is_held_not_delivered_then_handed_on(broker: BrokerThread) -> None:
    conn = connect(broker)
    ch = conn.channel()
    q = uniq("alo")
    declare(ch, q, **{"x-message-ttl": 0})
    ch.basic_publish("", q, b"late", pika.BasicProperties(headers={"app": 1}))
    barrier(ch)
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


def test_expiry_in_the_queue_and_at_a_consumer_are_held(broker: BrokerThread) -> None:
    """A message's own expiration, met by the expiry timer or by a delivery pass."""
    conn = connect(broker)
    ch = conn.channel()
    q = uniq("alo")
    declare(ch, q, **{"x-message-ttl": 60_000})
    ch.basic_publish("", q, b"own", pika.BasicProperties(expiration="1"))
    ch.basic_publish("", q, b"kept")
    barrier(ch)
    broker.advance(1)
    assert api_queue(broker, q)["messages_dlx"] == 1
    assert [ch.basic_get(q, auto_ack=True)[2] for _ in range(2)] == [b"kept", None]
    conn.close()


def test_a_rejected_or_poison_message_is_held_too(broker: BrokerThread) -> None:
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
    barrier(ch)
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


def test_held_copies_count_against_the_length_limit(broker: BrokerThread) -> None:
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
        except pika.exceptions.NackError:
            outcomes.append("nack")
    # 0 and 1 expire into the held copies; with two held, 2 is one over the limit.
    assert outcomes == ["ack", "ack", "nack"]
    assert api_queue(broker, q)["messages_dlx"] == 2
    conn.close()


def test_a_policy_change_tries_them_at_once(broker: BrokerThread) -> None:
    """As RabbitMQ's worker looks its targets up again when the policy changes."""
    conn = connect(broker)
    ch = conn.channel()
    q = uniq("alo")
    declare(ch, q, **{"x-message-ttl": 0})
    ch.basic_publish("", q, b"m")
    barrier(ch)
    target = bind_target(ch, q)
    broker.call(
        lambda: broker.broker.vhosts["/"].set_policy(
            "alo-expires", f"^{q}$", {"expires": 600_000}, apply_to="queues"
        )
    )
    wait_until(conn, lambda: ready(ch, target) == 1)
    assert api_queue(broker, q)["messages_dlx"] == 0
    conn.close()


def test_without_at_least_once_nothing_is_held(broker: BrokerThread) -> None:
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
    barrier(ch)
    for q in (loose, fallback):
        info = api_queue(broker, q)
        assert (info["messages_dlx"], info["messages"]) == (0, 0)
    conn.close()


@pytest.fixture
def restartable(tmp_path: Path) -> Iterator[Callable[[], BrokerThread]]:
    current: list[BrokerThread] = []

    def start() -> BrokerThread:
        if current:
            current.pop().stop()
        current.append(start_broker(tmp_path / "data"))
        return current[-1]

    yield start
    for b in current:
        b.stop()


def test_held_copies_survive_a_restart_and_go_on_at_start(
    restartable: Callable[[], BrokerThread],
) -> None:
    b = restartable()
    conn = connect(b)
    ch = conn.channel()
    q = uniq("alo")
    declare(ch, q, **{"x-message-ttl": 0})
    ch.basic_publish("", q, b"m", pika.BasicProperties(delivery_mode=1))
    barrier(ch)
    target = bind_target(ch, q)  # bound, but the next try is seconds away
    conn.close()
    b = restartable()
    conn = connect(b)
    ch = conn.channel()
    wait_until(conn, lambda: ready(ch, target) == 1)  # tried as the queue starts
    assert ch.basic_get(target, auto_ack=True)[2] == b"m"
    assert ready(ch, q) == 0
    conn.close()
