"""Quorum queues (x-queue-type: quorum): RabbitMQ 4.x's rules and behaviour on
Warren's durable queues, as a client sees them. RabbitMQ 3.10's answers to the
same declarations are in tests/compat (the quorum_* scenarios).

In memory (issue 29): a tests/harness broker, pika's calls over MemoryAMQP
(harness.channel, frames by pamqp; pika before); a restart is a new Harness on
the same data dir; the management API through ``harness.http()``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from harness import Channel, Harness, channel_error, connection_error, harness_fixture
from harness.channel import Nacked, uniq
from pamqp import commands

Q = {"x-queue-type": "quorum"}

broker = harness_fixture()


def connect(broker: Harness) -> Any:
    return broker.amqp_connection()


def quorum(ch: Channel, name: str, **arguments: Any) -> None:
    ch.queue_declare(name, durable=True, arguments={**Q, **arguments})


def returns(ch: Channel, queue: str, times: int) -> list[Any]:
    """Get and nack (requeue) the queue's head ``times`` times: the x-delivery-count
    each delivery carried (None: none), stopping when the queue is empty."""
    seen = []
    for _ in range(times):
        method, props, _body = ch.basic_get(queue)
        if method is None:
            break
        seen.append((props.headers or {}).get("x-delivery-count"))
        ch.basic_nack(method.delivery_tag, requeue=True)
    return seen


def count(ch: Channel, queue: str) -> int:
    return int(ch.queue_declare(queue, passive=True).method.message_count)


# -- declaration -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "arguments", "text"),
    [
        ({"durable": False}, {}, "invalid property 'non-durable' for queue '{q}' in vhost '/'"),
        (
            {"durable": True, "exclusive": True},
            {},
            "invalid property 'exclusive-owner' for queue '{q}' in vhost '/'",
        ),
        (
            {"durable": True, "auto_delete": True},
            {},
            "invalid property 'auto-delete' for queue '{q}' in vhost '/'",
        ),
        (
            {"durable": True},
            {"x-max-priority": 5},
            "invalid arg 'x-max-priority' for queue '{q}' in vhost '/' of queue type "
            "rabbit_quorum_queue",
        ),
        (
            {"durable": True},
            {"x-queue-mode": "lazy"},
            "invalid arg 'x-queue-mode' for queue '{q}' in vhost '/' of queue type "
            "rabbit_quorum_queue",
        ),
        (
            {"durable": True},
            {"x-dead-letter-strategy": "sometimes"},
            "invalid arg 'x-dead-letter-strategy' for queue '{q}' in vhost '/': "
            "invalid_dlx_strategy",
        ),
        (
            {"durable": True},
            {"x-quorum-initial-group-size": 0},
            "invalid arg 'x-quorum-initial-group-size' for queue '{q}' in vhost '/': "
            "{{value_zero,0}}",
        ),
    ],
)
def test_refused_declarations_have_rabbitmqs_texts(
    broker: Harness, flags: dict[str, Any], arguments: dict[str, Any], text: str
) -> None:
    conn = connect(broker)
    q = uniq()
    reply = channel_error(
        406, conn.channel().queue_declare, q, arguments={**Q, **arguments}, **flags
    )
    assert reply == "PRECONDITION_FAILED - " + text.format(q=q)
    assert channel_error(404, conn.channel().queue_declare, q, passive=True)
    conn.close()


def test_server_named_quorum_queues_are_refused(broker: Harness) -> None:
    conn = connect(broker)
    reply = channel_error(406, conn.channel().queue_declare, "", durable=True, arguments=Q)
    assert reply == (
        "PRECONDITION_FAILED - Cannot declare a server-named queue for type rabbit_quorum_queue"
    )
    conn.close()


def test_quorum_only_arguments_are_accepted(broker: Harness) -> None:
    conn = connect(broker)
    ch = conn.channel()
    q = uniq()
    arguments = {
        "x-quorum-initial-group-size": 3,
        "x-quorum-target-group-size": 5,
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
        "x-max-in-memory-length": 10,
        "x-queue-leader-locator": "balanced",
        "x-delivery-limit": 3,
    }
    quorum(ch, q, **arguments)
    quorum(ch, q, **arguments)  # the same again: fine
    conn.close()


def test_redeclaring_with_another_type_or_limit_is_refused(broker: Harness) -> None:
    conn = connect(broker)
    q = uniq()
    quorum(conn.channel(), q, **{"x-delivery-limit": 3})
    prefix = f"PRECONDITION_FAILED - inequivalent arg '{{}}' for queue '{q}' in vhost '/': "
    assert (
        channel_error(
            406,
            conn.channel().queue_declare,
            q,
            durable=True,
            arguments={**Q, "x-delivery-limit": 4},
        )
        == prefix.format("x-delivery-limit") + "received '4' but current is '3'"
    )
    assert channel_error(
        406, conn.channel().queue_declare, q, durable=True, arguments={"x-delivery-limit": 3}
    ) == prefix.format("x-queue-type") + (
        "received none but current is the value 'quorum' of type 'longstr'"
    )
    classic = uniq()
    conn.channel().queue_declare(classic, durable=True)
    assert channel_error(406, conn.channel().queue_declare, classic, durable=True, arguments=Q) == (
        f"PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue '{classic}' in "
        "vhost '/': received the value 'quorum' of type 'longstr' but current is none"
    )
    conn.close()


def test_delete_if_unused_or_if_empty_is_not_implemented(broker: Harness) -> None:
    conn = connect(broker)
    q = uniq()
    quorum(conn.channel(), q)
    for flag in ("if_unused", "if_empty"):
        reply = connection_error(540, conn.channel().queue_delete, q, **{flag: True})
        assert reply == (
            f"NOT_IMPLEMENTED - cannot delete queue '{q}' in vhost '/'. queue.delete "
            f"operations with {flag.replace('_', '-')} flag set are not supported by "
            "quorum queues"
        )
        conn = connect(broker)
    assert conn.channel().queue_delete(q).method.message_count == 0
    conn.close()


# -- poison messages ---------------------------------------------------------------------


def test_default_delivery_limit_is_twenty_then_dead_lettered(broker: Harness) -> None:
    conn = connect(broker)
    ch = conn.channel()
    q, dlq = uniq(), uniq("dlq")
    ch.queue_declare(dlq)
    quorum(ch, q, **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
    ch.basic_publish("", q, b"poison", commands.Basic.Properties(headers={"app": 1}))
    # 4.x: no header on the first delivery, then the returns so far.
    assert returns(ch, q, 30) == [None, *range(1, 21)]
    assert count(ch, q) == 0
    method, props, body = ch.basic_get(dlq, auto_ack=True)
    assert body == b"poison"
    headers = props.headers
    assert headers["app"] == 1
    assert "x-delivery-count" not in headers  # as RabbitMQ's dead-letter copy
    assert headers["x-death"][0]["reason"] == "delivery_limit"
    assert headers["x-death"][0]["queue"] == q
    conn.close()


def test_header_and_limit_count_every_return(broker: Harness) -> None:
    """RabbitMQ 4.0-4.2 over AMQP 0-9-1 (x-delivery-count is the acquired count) and
    3.10: a channel closed with the message unacked counts as a nack does, in the
    header and towards the limit."""
    conn = connect(broker)
    q = uniq()
    quorum(conn.channel(), q, **{"x-delivery-limit": 3})
    conn.channel().basic_publish("", q, b"m")
    seen = []
    for explicit in (False, True, False, True):
        ch = conn.channel()
        method, props, _body = ch.basic_get(q)
        assert method is not None
        seen.append((props.headers or {}).get("x-delivery-count"))
        if explicit:
            ch.basic_nack(method.delivery_tag, requeue=True)
            ch.barrier()
        ch.close()  # returns what is still unacked
    # Returns so far: none, close, nack, close; the fourth return (a nack) is
    # one over the limit of 3.
    assert seen == [None, 1, 2, 3]
    assert count(conn.channel(), q) == 0
    conn.close()


def test_counts_survive_a_policy_change(broker: Harness) -> None:
    """A queue with only a delivery limit takes the plain path until a message
    comes back; a policy applied after that keeps the counts in force."""
    conn = connect(broker)
    ch = conn.channel()
    q = uniq()
    quorum(ch, q, **{"x-delivery-limit": 2})
    for body in (b"a", b"b"):
        ch.basic_publish("", q, body)
    assert returns(ch, q, 1) == [None]
    broker.call(lambda: _set_policy(broker, "qq-expires", f"^{q}$", {"expires": 600_000}))
    assert returns(ch, q, 2) == [1, 2]  # "a" again: its third return is one too many
    method, props, body = ch.basic_get(q, auto_ack=True)
    assert (body, props.headers) == (b"b", None)
    conn.close()


def test_poison_message_without_dead_letter_exchange_is_dropped(broker: Harness) -> None:
    conn = connect(broker)
    ch = conn.channel()
    q = uniq()
    quorum(ch, q, **{"x-delivery-limit": 1})
    ch.basic_publish("", q, b"m")
    assert returns(ch, q, 5) == [None, 1]
    assert count(ch, q) == 0
    conn.close()


def test_negative_delivery_limit_means_no_limit(broker: Harness) -> None:
    conn = connect(broker)
    ch = conn.channel()
    q = uniq()
    quorum(ch, q, **{"x-delivery-limit": -1})
    ch.basic_publish("", q, b"m")
    assert len(returns(ch, q, 25)) == 25
    assert count(ch, q) == 1
    conn.close()


def test_delivery_limit_policy_and_4x_merge(broker: Harness) -> None:
    """RabbitMQ 4.x: the lower of policy and argument wins, unless one is negative
    (no limit): then the higher, so -1 lifts only the default."""
    conn = connect(broker)
    ch = conn.channel()
    low, kept, unlimited = uniq("low"), uniq("kept"), uniq("unl")
    quorum(ch, low, **{"x-delivery-limit": 5})
    quorum(ch, kept, **{"x-delivery-limit": 3})
    quorum(ch, unlimited)
    broker.call(lambda: _set_policy(broker, "qq-low", f"^{low}$", {"delivery-limit": 2}))
    for name, q in (("qq-kept", kept), ("qq-unl", unlimited)):
        broker.call(
            lambda name=name, q=q: _set_policy(broker, name, f"^{q}$", {"delivery-limit": -1})
        )
    for q in (low, kept, unlimited):
        ch.basic_publish("", q, b"m")
    assert returns(ch, low, 10) == [None, 1, 2]
    assert returns(ch, kept, 10) == [None, 1, 2, 3]
    assert len(returns(ch, unlimited, 25)) == 25
    conn.close()


def _set_policy(broker: Harness, name: str, pattern: str, definition: dict[str, Any]) -> None:
    broker.broker.vhosts["/"].set_policy(name, pattern, definition, apply_to="queues")


# -- limits, TTL, priorities -------------------------------------------------------------


def test_reject_publish_takes_one_more_as_rabbit_fifo(broker: Harness) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    q = uniq()
    quorum(ch, q, **{"x-max-length": 1, "x-overflow": "reject-publish"})
    outcomes = []
    for i in range(3):
        try:
            ch.basic_publish("", q, b"%d" % i)
            outcomes.append("ack")
        except Nacked:
            outcomes.append("nack")
    assert outcomes == ["ack", "ack", "nack"]  # RabbitMQ 3.10's answer too
    assert count(ch, q) == 2
    conn.close()


def test_reject_publish_dlx_falls_back_to_drop_head(broker: Harness) -> None:
    conn = connect(broker)
    ch = conn.channel()
    q, dlq = uniq(), uniq("dlq")
    ch.queue_declare(dlq)
    quorum(
        ch,
        q,
        **{
            "x-max-length": 1,
            "x-overflow": "reject-publish-dlx",
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": dlq,
        },
    )
    ch.confirm_delivery()
    for i in range(3):
        ch.basic_publish("", q, b"%d" % i)  # all confirmed: the head is dropped instead
    assert count(ch, q) == 1
    assert [ch.basic_get(dlq, auto_ack=True)[2] for _ in range(2)] == [b"0", b"1"]
    conn.close()


def test_message_ttl_and_per_message_expiration(broker: Harness) -> None:
    conn = connect(broker)
    ch = conn.channel()
    q = uniq()
    quorum(ch, q, **{"x-message-ttl": 0})
    ch.basic_publish("", q, b"gone")
    own = uniq()
    quorum(ch, own)
    ch.basic_publish("", own, b"gone", commands.Basic.Properties(expiration="0"))
    ch.basic_publish("", own, b"kept")
    assert (count(ch, q), count(ch, own)) == (0, 1)
    conn.close()


def test_two_priorities_served_two_high_for_one_normal(broker: Harness) -> None:
    conn = connect(broker)
    ch = conn.channel()
    q = uniq()
    quorum(ch, q)
    for body, priority in [
        ("n1", None),
        ("n2", 4),
        ("n3", 0),
        ("h1", 5),
        ("h2", 9),
        ("h3", 200),
        ("h4", 6),
    ]:
        ch.basic_publish("", q, body.encode(), commands.Basic.Properties(priority=priority))
    order = [ch.basic_get(q, auto_ack=True)[2].decode() for _ in range(7)]
    assert order == ["h1", "h2", "n1", "h3", "h4", "n2", "n3"]
    conn.close()


# -- consumers ---------------------------------------------------------------------------


def test_global_qos_consumer_is_refused_per_consumer_qos_is_not(broker: Harness) -> None:
    conn = connect(broker)
    q = uniq()
    quorum(conn.channel(), q)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=10)  # per consumer: fine
    ch.basic_consume(q, lambda *a: None)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=10, global_qos=True)
    reply = connection_error(540, ch.basic_consume, q, lambda *a: None)
    assert reply == f"NOT_IMPLEMENTED - queue '{q}' in vhost '/' does not support global qos"


def test_single_active_consumer_and_consumer_priorities(broker: Harness) -> None:
    conn = connect(broker)
    ch = conn.channel()
    sac, prio = uniq("sac"), uniq("prio")
    quorum(ch, sac, **{"x-single-active-consumer": True})
    quorum(ch, prio)
    got: dict[str, list[bytes]] = {}

    def on(tag: str) -> Callable[..., None]:
        return lambda _ch, _m, _p, body: got.setdefault(tag, []).append(body)

    ch.basic_consume(sac, on("first"), auto_ack=True)
    ch.basic_consume(sac, on("second"), auto_ack=True)
    ch.basic_consume(prio, on("low"), auto_ack=True, arguments={"x-priority": 1})
    ch.basic_consume(prio, on("high"), auto_ack=True, arguments={"x-priority": 10})
    for i in range(4):
        ch.basic_publish("", sac, b"%d" % i)
        ch.basic_publish("", prio, b"%d" % i)
    while sum(map(len, got.values())) < 8:
        conn.read_one()  # each delivery to its consumer's callback
    assert got == {"first": [b"0", b"1", b"2", b"3"], "high": [b"0", b"1", b"2", b"3"]}
    conn.close()


# -- durability and management -----------------------------------------------------------


def test_transient_messages_survive_a_restart(tmp_path: Path) -> None:
    """A quorum queue keeps every message whatever its delivery-mode."""
    q = uniq()
    with Harness(tmp_path / "data") as b:
        conn = connect(b)
        ch = conn.channel()
        ch.confirm_delivery()
        quorum(ch, q, **{"x-delivery-limit": 7})
        ch.basic_publish("", q, b"transient", commands.Basic.Properties(delivery_mode=1))
        ch.basic_publish("", q, b"high", commands.Basic.Properties(delivery_mode=1, priority=9))
        conn.close()
    with Harness(tmp_path / "data") as b:
        conn = connect(b)
        ch = conn.channel()
        assert [ch.basic_get(q, auto_ack=True)[2] for _ in range(2)] == [b"high", b"transient"]
        # Still a quorum queue with its own arguments (7 went out as pamqp's 'byte',
        # which RabbitMQ names and Warren's definitions log keeps).
        assert channel_error(406, ch.queue_declare, q, durable=True, arguments=Q).endswith(
            "received none but current is the value '7' of type 'byte'"
        )
        conn.close()


def _api(broker: Harness, method: str, path: str) -> tuple[int, Any]:
    reply = broker.http().request(method, f"/api/{path}")
    return reply.status, reply.json() if reply.body else None


def test_management_api_delete_if_unused_has_rabbitmqs_answer(broker: Harness) -> None:
    conn = connect(broker)
    q = uniq()
    quorum(conn.channel(), q)
    conn.close()
    for flag in ("if-unused", "if-empty"):
        assert _api(broker, "DELETE", f"queues/%2F/{q}?{flag}=true") == (
            400,
            {
                "error": "bad_request",
                "reason": f"cannot delete queue '{q}' in vhost '/'. queue.delete operations "
                f"with {flag} flag set are not supported by quorum queues",
            },
        )
    assert _api(broker, "DELETE", f"queues/%2F/{q}") == (204, None)


def test_management_api_shows_type_leader_members_online(broker: Harness) -> None:
    conn = connect(broker)
    q = uniq()
    quorum(conn.channel(), q)
    conn.close()
    info = broker.http().get(f"/api/queues/%2F/{q}")
    node = info["node"]
    assert info["type"] == "quorum"
    assert (info["leader"], info["members"], info["online"]) == (node, [node], [node])
    assert info["arguments"] == {"x-queue-type": "quorum"}
    assert (info["durable"], info["exclusive"], info["auto_delete"]) == (True, False, False)


def test_definitions_export_and_import_keep_the_type(tmp_path: Path) -> None:
    with Harness(tmp_path / "one") as first:
        conn = connect(first)
        quorum(conn.channel(), "orders", **{"x-delivery-limit": 4})
        conn.close()
        exported = first.call(lambda: first.broker.export_definitions())
    (entry,) = [q for q in exported["queues"] if q["name"] == "orders"]
    assert entry["type"] == "quorum"
    assert entry["arguments"] == {"x-queue-type": "quorum", "x-delivery-limit": 4}
    # RabbitMQ's exports may carry the type without the argument: both are read.
    entry = {**entry, "arguments": {"x-delivery-limit": 4}}
    with Harness(tmp_path / "two") as second:
        second.call(lambda: second.broker.import_definitions({"queues": [entry]}))
        queue = second.broker.vhosts["/"].queues["orders"]
        assert queue.queue_type == "quorum"
        assert queue.arguments == {"x-queue-type": "quorum", "x-delivery-limit": 4}
