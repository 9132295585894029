"""Scenarios: quorum queues (x-queue-type: quorum).

RabbitMQ's quorum queues take publishes through Raft, asynchronously: the
scenarios publish with confirms before they read, and poll (briefly) for a
dead-lettered copy, which RabbitMQ moves after the reject's reply.
"""

from __future__ import annotations

import decimal
import time
from typing import Any

import pika
import pika.exceptions

from .common import Observation, scenario
from .pika_helpers import attempt, connection, get_one, sync

Q = "compat-qq"
DLQ = "compat-qq-dlq"
QUORUM = {"x-queue-type": "quorum"}


def _declare(host: str, port: int, arguments: dict[str, Any], **flags: Any) -> Observation:
    flags.setdefault("durable", True)
    with connection(host, port) as conn:
        ch = conn.channel()
        return attempt(lambda: ch.queue_declare(Q, arguments={**QUORUM, **arguments}, **flags))


def _redeclare(host: str, port: int, first: dict[str, Any], second: dict[str, Any]) -> Observation:
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare(Q, durable=True, arguments=first)
        return attempt(lambda: ch.queue_declare(Q, durable=True, arguments=second))


def _wait_get(ch: Any, queue: str, seconds: float = 3.0) -> dict[str, Any] | None:
    deadline = time.monotonic() + seconds
    while True:
        got = get_one(ch, queue, auto_ack=True)
        if got is not None or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


@scenario(queues=[Q])
def s_quorum_declare_auto_delete(host: str, port: int) -> Observation:
    """A durable, auto-delete quorum queue."""
    return _declare(host, port, {}, auto_delete=True)


@scenario()
def s_quorum_declare_server_named(host: str, port: int) -> Observation:
    """A quorum queue with an empty (server-chosen) name."""
    with connection(host, port) as conn:
        ch = conn.channel()
        return attempt(lambda: ch.queue_declare("", durable=True, arguments=QUORUM))


@scenario(queues=[Q])
def s_quorum_declare_max_priority(host: str, port: int) -> Observation:
    """x-max-priority on a quorum queue."""
    return _declare(host, port, {"x-max-priority": 5})


@scenario(queues=[Q])
def s_quorum_declare_queue_mode(host: str, port: int) -> Observation:
    """x-queue-mode=lazy on a quorum queue."""
    return _declare(host, port, {"x-queue-mode": "lazy"})


@scenario(queues=[Q])
def s_quorum_declare_master_locator(host: str, port: int) -> Observation:
    """x-queue-master-locator on a quorum queue."""
    return _declare(host, port, {"x-queue-master-locator": "min-masters"})


@scenario(queues=[Q])
def s_quorum_declare_bad_dead_letter_strategy(host: str, port: int) -> Observation:
    """x-dead-letter-strategy that is neither at-most-once nor at-least-once."""
    return _declare(host, port, {"x-dead-letter-strategy": "sometimes"})


@scenario(queues=[Q])
def s_quorum_declare_initial_group_size_zero(host: str, port: int) -> Observation:
    """x-quorum-initial-group-size=0."""
    return _declare(host, port, {"x-quorum-initial-group-size": 0})


@scenario(queues=[Q])
def s_quorum_declare_initial_group_size_negative(host: str, port: int) -> Observation:
    """x-quorum-initial-group-size=-1."""
    return _declare(host, port, {"x-quorum-initial-group-size": -1})


@scenario(queues=[Q])
def s_quorum_declare_initial_group_size_string(host: str, port: int) -> Observation:
    """x-quorum-initial-group-size as a string."""
    return _declare(host, port, {"x-quorum-initial-group-size": "3"})


@scenario(queues=[Q])
def s_quorum_declare_initial_group_size_decimal(host: str, port: int) -> Observation:
    """x-quorum-initial-group-size as a decimal."""
    return _declare(host, port, {"x-quorum-initial-group-size": decimal.Decimal("2.5")})


@scenario(queues=[Q])
def s_quorum_declare_initial_group_size_bool(host: str, port: int) -> Observation:
    """x-quorum-initial-group-size as a boolean."""
    return _declare(host, port, {"x-quorum-initial-group-size": True})


@scenario(queues=[Q])
def s_quorum_declare_initial_group_size_above_cluster(host: str, port: int) -> Observation:
    """x-quorum-initial-group-size larger than the cluster: taken (members: all nodes)."""
    return _declare(host, port, {"x-quorum-initial-group-size": 7})


@scenario(queues=[Q])
def s_quorum_declare_target_group_size_zero(host: str, port: int) -> Observation:
    """x-quorum-target-group-size=0: not a declaration argument RabbitMQ checks."""
    return _declare(host, port, {"x-quorum-target-group-size": 0})


@scenario(queues=[Q])
def s_quorum_declare_target_group_size_string(host: str, port: int) -> Observation:
    """x-quorum-target-group-size as a string."""
    return _declare(host, port, {"x-quorum-target-group-size": "five"})


@scenario(queues=[Q])
def s_classic_declare_initial_group_size(host: str, port: int) -> Observation:
    """x-quorum-initial-group-size on a classic queue."""
    with connection(host, port) as conn:
        ch = conn.channel()
        return attempt(
            lambda: ch.queue_declare(Q, durable=True, arguments={"x-quorum-initial-group-size": 3})
        )


@scenario(queues=[Q])
def s_classic_declare_target_group_size(host: str, port: int) -> Observation:
    """x-quorum-target-group-size on a classic queue."""
    with connection(host, port) as conn:
        ch = conn.channel()
        return attempt(
            lambda: ch.queue_declare(Q, durable=True, arguments={"x-quorum-target-group-size": 3})
        )


@scenario(queues=[Q])
def s_quorum_declare_non_durable_bad_length(host: str, port: int) -> Observation:
    """Non-durable with a negative x-max-length: the argument is reported first."""
    return _declare(host, port, {"x-max-length": -1}, durable=False)


@scenario(queues=[Q])
def s_quorum_declare_quorum_arguments(host: str, port: int) -> Observation:
    """Every quorum-only argument, declared twice alike."""
    arguments = {
        "x-quorum-initial-group-size": 3,
        "x-quorum-target-group-size": 5,
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
        "x-dead-letter-exchange": "",
        "x-delivery-limit": 4,
        "x-max-in-memory-length": 10,
        "x-queue-leader-locator": "balanced",
    }
    _declare(host, port, arguments)
    return _declare(host, port, arguments)


@scenario(queues=[Q])
def s_quorum_declare_reject_publish_dlx(host: str, port: int) -> Observation:
    """x-overflow=reject-publish-dlx (RabbitMQ: a warning, drop-head)."""
    return _declare(host, port, {"x-overflow": "reject-publish-dlx"})


@scenario(queues=[Q])
def s_quorum_redeclare_without_type(host: str, port: int) -> Observation:
    """A quorum queue redeclared without x-queue-type."""
    return _redeclare(host, port, QUORUM, {})


@scenario(queues=[Q])
def s_quorum_redeclare_as_classic(host: str, port: int) -> Observation:
    """A quorum queue redeclared with x-queue-type=classic."""
    return _redeclare(host, port, QUORUM, {"x-queue-type": "classic"})


@scenario(queues=[Q])
def s_quorum_redeclare_other_delivery_limit(host: str, port: int) -> Observation:
    """x-delivery-limit 3, redeclared with 4."""
    return _redeclare(
        host, port, {**QUORUM, "x-delivery-limit": 3}, {**QUORUM, "x-delivery-limit": 4}
    )


@scenario(queues=[Q])
def s_quorum_redeclare_other_target_group_size(host: str, port: int) -> Observation:
    """x-quorum-target-group-size is not compared on redeclaration."""
    return _redeclare(host, port, {**QUORUM, "x-quorum-target-group-size": 3}, QUORUM)


@scenario(queues=[Q])
def s_classic_redeclare_as_quorum(host: str, port: int) -> Observation:
    """A classic durable queue redeclared with x-queue-type=quorum."""
    return _redeclare(host, port, {}, QUORUM)


def _delete_with(host: str, port: int, **flags: bool) -> Observation:
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare(Q, durable=True, arguments=QUORUM)
        return attempt(lambda: conn.channel().queue_delete(Q, **flags))


@scenario(queues=[Q])
def s_quorum_delete_if_unused(host: str, port: int) -> Observation:
    """queue.delete if-unused on a quorum queue."""
    return _delete_with(host, port, if_unused=True)


@scenario(queues=[Q])
def s_quorum_delete_if_empty(host: str, port: int) -> Observation:
    """queue.delete if-empty on a quorum queue."""
    return _delete_with(host, port, if_empty=True)


@scenario(queues=[Q])
def s_quorum_consume_global_qos(host: str, port: int) -> Observation:
    """basic.consume on a channel with basic.qos(prefetch_count=5, global=true)."""
    with connection(host, port) as conn:
        conn.channel().queue_declare(Q, durable=True, arguments=QUORUM)
        ch = conn.channel()
        ch.basic_qos(prefetch_count=5, global_qos=True)
        return attempt(lambda: ch.basic_consume(Q, lambda *a: None, consumer_tag="compat-ctag"))


@scenario(queues=[Q])
def s_quorum_consume_global_qos_zero(host: str, port: int) -> Observation:
    """basic.consume on a channel with basic.qos(prefetch_count=0, global=true): fine."""
    with connection(host, port) as conn:
        conn.channel().queue_declare(Q, durable=True, arguments=QUORUM)
        ch = conn.channel()
        ch.basic_qos(prefetch_count=0, global_qos=True)
        return attempt(lambda: ch.basic_consume(Q, lambda *a: None, consumer_tag="compat-ctag"))


@scenario(queues=[Q])
def s_quorum_consume_stream_offset(host: str, port: int) -> Observation:
    """basic.consume on a quorum queue with x-stream-offset."""
    with connection(host, port) as conn:
        conn.channel().queue_declare(Q, durable=True, arguments=QUORUM)
        ch = conn.channel()
        return attempt(
            lambda: ch.basic_consume(Q, lambda *a: None, arguments={"x-stream-offset": "first"})
        )


@scenario(queues=[Q])
def s_quorum_reject_publish_overshoot(host: str, port: int) -> Observation:
    """x-max-length=1, reject-publish: the confirms of three publishes and the count."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare(
            Q, durable=True, arguments={**QUORUM, "x-max-length": 1, "x-overflow": "reject-publish"}
        )
        ch.confirm_delivery()
        outcomes = []
        for i in range(3):
            try:
                ch.basic_publish("", Q, b"m%d" % i)
                outcomes.append("ack")
            except pika.exceptions.NackError:
                outcomes.append("nack")
        return {
            "confirms": outcomes,
            "message_count": ch.queue_declare(Q, passive=True).method.message_count,
        }


@scenario(queues=[Q, DLQ])
def s_quorum_drop_head_dead_letters(host: str, port: int) -> Observation:
    """x-max-length=1 (drop-head) with a dead-letter queue: what is kept, what moves."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare(DLQ, durable=True)
        ch.queue_declare(
            Q,
            durable=True,
            arguments={
                **QUORUM,
                "x-max-length": 1,
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": DLQ,
            },
        )
        ch.confirm_delivery()
        for i in range(3):
            ch.basic_publish("", Q, b"m%d" % i)
        kept = get_one(ch, Q, auto_ack=True)
        dead = [_wait_get(ch, DLQ) for _ in range(2)]
        return {
            "kept": kept and kept["body"],
            "dead": [
                d and (d["body"], d["properties"]["headers"]["x-death"][0]["reason"]) for d in dead
            ],
        }


@scenario(queues=[Q])
def s_quorum_transient_message(host: str, port: int) -> Observation:
    """A transient message in a quorum queue: confirmed and read back as sent."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare(Q, durable=True, arguments=QUORUM)
        ch.confirm_delivery()
        ch.basic_publish("", Q, b"t", pika.BasicProperties(delivery_mode=1))
        got = get_one(ch, Q, auto_ack=True)
        return {"get": got}


@scenario(queues=[Q])
def s_quorum_message_expired(host: str, port: int) -> Observation:
    """expiration=0 and x-message-ttl: neither message is left to get."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare(Q, durable=True, arguments={**QUORUM, "x-message-ttl": 60000})
        ch.confirm_delivery()
        ch.basic_publish("", Q, b"e", pika.BasicProperties(expiration="0"))
        ch.basic_publish("", Q, b"kept")
        sync(ch)
        return {"get": get_one(ch, Q, auto_ack=True), "then": get_one(ch, Q, auto_ack=True)}


@scenario(queues=[Q, DLQ])
def s_quorum_delivery_limit(host: str, port: int) -> Observation:
    """x-delivery-limit=2: the x-delivery-count of each delivery while nacked with
    requeue, then where the message went and why."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare(DLQ, durable=True)
        ch.queue_declare(
            Q,
            durable=True,
            arguments={
                **QUORUM,
                "x-delivery-limit": 2,
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": DLQ,
            },
        )
        ch.confirm_delivery()
        ch.basic_publish("", Q, b"poison", pika.BasicProperties(headers={"h": "v"}))
        counts = []
        for _ in range(5):
            got = get_one(ch, Q)
            if got is None:
                break
            headers = got["properties"].get("headers", {})
            counts.append([got["redelivered"], headers.get("x-delivery-count")])
            ch.basic_nack(got["delivery_tag"], requeue=True)
        dead = _wait_get(ch, DLQ)
        headers = dead["properties"]["headers"] if dead else {}
        return {
            "deliveries": counts,
            "dead_lettered": dead and dead["body"],
            "reason": headers.get("x-first-death-reason"),
            "count_header_kept": "x-delivery-count" in headers,
            "app_header": headers.get("h"),
        }


@scenario(queues=[Q])
def s_quorum_priorities(host: str, port: int) -> Observation:
    """Priorities none, 9, 2, 7 published in that order: the order of gets."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare(Q, durable=True, arguments=QUORUM)
        ch.confirm_delivery()
        for body, priority in (("none", None), ("p9", 9), ("p2", 2), ("p7", 7)):
            ch.basic_publish("", Q, body.encode(), pika.BasicProperties(priority=priority))
        order = []
        for _ in range(4):
            got = get_one(ch, Q, auto_ack=True)
            order.append(got and got["body"])
        return {"order": order}
