"""Scenarios: queues."""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from typing import Any

import pika
import pika.exceptions
import pika.spec

from .common import Observation, ScenarioFn, scenario
from .framing import after_handshake
from .pika_helpers import attempt, connection, get_all, get_one, method_dict, publish_bodies, sync
from .raw import raw_method, shortstr

# ======================================================================================
# Scenarios: queues
# ======================================================================================


@scenario()
def s_queue_declare_server_named(host: str, port: int) -> Observation:
    """queue.declare with an empty name: the generated name's shape and the counts."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ok = ch.queue_declare("", exclusive=True).method
        name = ok.queue
        return {
            "prefix": name[:8],
            "length": len(name),
            "charset_ok": bool(re.fullmatch(r"amq\.gen-[A-Za-z0-9_\-]+", name)),
            "message_count": ok.message_count,
            "consumer_count": ok.consumer_count,
        }


@scenario()
def s_queue_declare_server_named_not_exclusive(host: str, port: int) -> Observation:
    """A server-named, non-exclusive queue is reachable from a second connection."""
    with connection(host, port) as conn, connection(host, port) as other:
        ch = conn.channel()
        name = ch.queue_declare("").method.queue
        try:
            return attempt(lambda: other.channel().queue_declare(name, passive=True))
        finally:
            ch.queue_delete(name)


def _queue_redeclare(
    host: str,
    port: int,
    first: dict[str, Any],
    second: dict[str, Any],
    name: str = "compat-q-redeclare",
) -> Observation:
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare(name, **first)
        return attempt(lambda: ch.queue_declare(name, **second))


@scenario(queues=["compat-q-redeclare"])
def s_queue_redeclare_same(host: str, port: int) -> Observation:
    """Redeclare a queue with identical properties."""
    return _queue_redeclare(host, port, {"durable": True}, {"durable": True})


@scenario(queues=["compat-q-redeclare"])
def s_queue_redeclare_different_durable(host: str, port: int) -> Observation:
    """Declared non-durable, redeclared durable."""
    return _queue_redeclare(host, port, {"durable": False}, {"durable": True})


@scenario(queues=["compat-q-redeclare"])
def s_queue_redeclare_different_exclusive(host: str, port: int) -> Observation:
    """Declared non-exclusive, redeclared exclusive (same connection)."""
    return _queue_redeclare(host, port, {"exclusive": False}, {"exclusive": True})


@scenario(queues=["compat-q-redeclare"])
def s_queue_redeclare_exclusive_as_non_exclusive(host: str, port: int) -> Observation:
    """Declared exclusive, redeclared non-exclusive on the owning connection."""
    return _queue_redeclare(host, port, {"exclusive": True}, {"exclusive": False})


@scenario(queues=["compat-q-redeclare"])
def s_queue_redeclare_different_auto_delete(host: str, port: int) -> Observation:
    """Declared auto_delete=false, redeclared auto_delete=true."""
    return _queue_redeclare(host, port, {"auto_delete": False}, {"auto_delete": True})


@scenario(queues=["compat-q-redeclare"])
def s_queue_redeclare_different_max_length(host: str, port: int) -> Observation:
    """Declared x-max-length=10, redeclared x-max-length=20."""
    return _queue_redeclare(
        host, port, {"arguments": {"x-max-length": 10}}, {"arguments": {"x-max-length": 20}}
    )


@scenario(queues=["compat-q-redeclare"])
def s_queue_redeclare_missing_max_length(host: str, port: int) -> Observation:
    """Declared x-max-length=10, redeclared without arguments."""
    return _queue_redeclare(host, port, {"arguments": {"x-max-length": 10}}, {})


@scenario(queues=["compat-q-redeclare"])
def s_queue_redeclare_added_max_length(host: str, port: int) -> Observation:
    """Declared without arguments, redeclared with x-max-length=10."""
    return _queue_redeclare(host, port, {}, {"arguments": {"x-max-length": 10}})


@scenario(queues=["compat-q-redeclare"])
def s_queue_redeclare_max_length_other_int_type(host: str, port: int) -> Observation:
    """Declared x-max-length=10 (signed 32-bit), redeclared 10 as a 64-bit integer (raw)."""
    with connection(host, port) as conn:
        conn.channel().queue_declare("compat-q-redeclare", arguments={"x-max-length": 10})
    table = shortstr("x-max-length") + b"l" + struct.pack(">q", 10)
    args = (
        struct.pack(">H", 0)
        + shortstr("compat-q-redeclare")
        + b"\x00"
        + struct.pack(">I", len(table))
        + table
    )
    return after_handshake(host, port, raw_method(1, 50, 10, args))


@scenario(queues=["compat-q-redeclare"])
def s_queue_redeclare_different_unknown_argument(host: str, port: int) -> Observation:
    """Declared x-compat=1, redeclared x-compat=2 (argument the broker does not know)."""
    return _queue_redeclare(
        host, port, {"arguments": {"x-compat": 1}}, {"arguments": {"x-compat": 2}}
    )


@scenario(queues=["compat-q-redeclare"])
def s_queue_redeclare_passive_different_durable(host: str, port: int) -> Observation:
    """Declared non-durable; passive redeclare saying durable."""
    return _queue_redeclare(host, port, {"durable": False}, {"durable": True, "passive": True})


@scenario()
def s_queue_declare_amq_prefix(host: str, port: int) -> Observation:
    """Non-passive queue.declare of 'amq.compat'."""
    with connection(host, port) as conn:
        return attempt(lambda: conn.channel().queue_declare("amq.compat"))


@scenario()
def s_queue_declare_amq_prefix_passive(host: str, port: int) -> Observation:
    """Passive queue.declare of 'amq.compat' (does not exist)."""
    with connection(host, port) as conn:
        return attempt(lambda: conn.channel().queue_declare("amq.compat", passive=True))


@scenario()
def s_queue_declare_passive_missing(host: str, port: int) -> Observation:
    """Passive queue.declare of a missing queue."""
    with connection(host, port) as conn:
        return attempt(lambda: conn.channel().queue_declare("compat-q-missing", passive=True))


@scenario()
def s_queue_declare_passive_empty_name_fresh_channel(host: str, port: int) -> Observation:
    """Passive queue.declare with an empty name on a fresh channel."""
    with connection(host, port) as conn:
        return attempt(lambda: conn.channel().queue_declare("", passive=True))


@scenario(queues=["compat-q-counts"])
def s_queue_declare_counts(host: str, port: int) -> Observation:
    """message_count / consumer_count in declare-ok before and after a prefetch-1 consumer."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-counts")
        ch.confirm_delivery()
        publish_bodies(ch, "compat-q-counts", ["m1", "m2", "m3"])
        before = method_dict(ch.queue_declare("compat-q-counts"))
        consumer_ch = conn.channel()
        consumer_ch.basic_qos(prefetch_count=1)
        consumer_ch.basic_consume("compat-q-counts", lambda *_: None)
        after = method_dict(ch.queue_declare("compat-q-counts", passive=True))
        return {"before": before, "after_consumer": after}


def _exclusive_other(op: Callable[[Any], Any]) -> ScenarioFn:
    def run(host: str, port: int) -> Observation:
        with connection(host, port) as owner, connection(host, port) as other:
            owner.channel().queue_declare("compat-q-excl", exclusive=True)
            ch = other.channel()
            return attempt(lambda: op(ch))

    return run


_EXCLUSIVE_OPS: dict[str, Callable[[Any], Any]] = {
    "declare": lambda ch: ch.queue_declare("compat-q-excl", exclusive=True),
    "declare_non_exclusive": lambda ch: ch.queue_declare("compat-q-excl"),
    "declare_passive": lambda ch: ch.queue_declare("compat-q-excl", passive=True),
    "consume": lambda ch: ch.basic_consume("compat-q-excl", lambda *_: None),
    "delete": lambda ch: ch.queue_delete("compat-q-excl"),
    "bind": lambda ch: ch.queue_bind("compat-q-excl", "amq.fanout"),
    "unbind": lambda ch: ch.queue_unbind("compat-q-excl", "amq.fanout"),
    "purge": lambda ch: ch.queue_purge("compat-q-excl"),
    "get": lambda ch: get_one(ch, "compat-q-excl"),
    "publish": lambda ch: (
        ch.confirm_delivery(),
        ch.basic_publish("", "compat-q-excl", b"m"),
        "published",
    )[-1],
}

for _op_name, _op in _EXCLUSIVE_OPS.items():
    _fn = _exclusive_other(_op)
    _fn.__doc__ = f"Exclusive queue of another connection: {_op_name}."
    scenario(f"queue_exclusive_other_connection_{_op_name}", queues=["compat-q-excl"])(_fn)


@scenario(queues=["compat-q-excl"])
def s_queue_exclusive_same_connection_other_channel(host: str, port: int) -> Observation:
    """Exclusive queue used from another channel of the owning connection."""
    with connection(host, port) as conn:
        conn.channel().queue_declare("compat-q-excl", exclusive=True)
        ch = conn.channel()
        return {
            "declare_passive": attempt(lambda: ch.queue_declare("compat-q-excl", passive=True)),
            "get": attempt(lambda: get_one(ch, "compat-q-excl")),
        }


@scenario(queues=["compat-q-excl"])
def s_queue_exclusive_deleted_with_connection(host: str, port: int) -> Observation:
    """An exclusive queue is gone once its connection closed."""
    with connection(host, port) as owner:
        owner.channel().queue_declare("compat-q-excl", exclusive=True)
    with connection(host, port) as other:
        return attempt(lambda: other.channel().queue_declare("compat-q-excl", passive=True))


@scenario(queues=["compat-q-quorum"])
def s_queue_declare_quorum_durable(host: str, port: int) -> Observation:
    """queue.declare x-queue-type=quorum, durable."""
    with connection(host, port) as conn:
        ch = conn.channel()
        return attempt(
            lambda: ch.queue_declare(
                "compat-q-quorum", durable=True, arguments={"x-queue-type": "quorum"}
            )
        )


@scenario(queues=["compat-q-quorum"])
def s_queue_declare_quorum_non_durable(host: str, port: int) -> Observation:
    """queue.declare x-queue-type=quorum, non-durable."""
    with connection(host, port) as conn:
        ch = conn.channel()
        return attempt(
            lambda: ch.queue_declare("compat-q-quorum", arguments={"x-queue-type": "quorum"})
        )


@scenario(queues=["compat-q-quorum"])
def s_queue_declare_quorum_exclusive(host: str, port: int) -> Observation:
    """queue.declare x-queue-type=quorum, durable and exclusive."""
    with connection(host, port) as conn:
        ch = conn.channel()
        return attempt(
            lambda: ch.queue_declare(
                "compat-q-quorum",
                durable=True,
                exclusive=True,
                arguments={"x-queue-type": "quorum"},
            )
        )


@scenario(queues=["compat-q-qtype"])
def s_queue_declare_unknown_queue_type(host: str, port: int) -> Observation:
    """queue.declare x-queue-type='compat-bogus'."""
    with connection(host, port) as conn:
        ch = conn.channel()
        return attempt(
            lambda: ch.queue_declare("compat-q-qtype", arguments={"x-queue-type": "compat-bogus"})
        )


@scenario(queues=["compat-q-qtype"])
def s_queue_declare_classic_queue_type(host: str, port: int) -> Observation:
    """queue.declare x-queue-type='classic', then redeclare without the argument."""
    with connection(host, port) as conn:
        ch = conn.channel()
        first = attempt(
            lambda: ch.queue_declare("compat-q-qtype", arguments={"x-queue-type": "classic"})
        )
        second = attempt(lambda: ch.queue_declare("compat-q-qtype"))
        return {"declare": first, "redeclare_without_type": second}


@scenario(queues=["compat-q-badarg"])
def s_queue_declare_max_length_string(host: str, port: int) -> Observation:
    """queue.declare x-max-length='ten'."""
    with connection(host, port) as conn:
        return attempt(
            lambda: conn.channel().queue_declare(
                "compat-q-badarg", arguments={"x-max-length": "ten"}
            )
        )


@scenario(queues=["compat-q-badarg"])
def s_queue_declare_max_length_negative(host: str, port: int) -> Observation:
    """queue.declare x-max-length=-1."""
    with connection(host, port) as conn:
        return attempt(
            lambda: conn.channel().queue_declare("compat-q-badarg", arguments={"x-max-length": -1})
        )


@scenario(queues=["compat-q-badarg"])
def s_queue_declare_message_ttl_negative(host: str, port: int) -> Observation:
    """queue.declare x-message-ttl=-5."""
    with connection(host, port) as conn:
        return attempt(
            lambda: conn.channel().queue_declare("compat-q-badarg", arguments={"x-message-ttl": -5})
        )


@scenario(queues=["compat-q-badarg"])
def s_queue_declare_expires_zero(host: str, port: int) -> Observation:
    """queue.declare x-expires=0."""
    with connection(host, port) as conn:
        return attempt(
            lambda: conn.channel().queue_declare("compat-q-badarg", arguments={"x-expires": 0})
        )


@scenario(queues=["compat-q-badarg"])
def s_queue_declare_overflow_invalid(host: str, port: int) -> Observation:
    """queue.declare x-overflow='compat-bogus'."""
    with connection(host, port) as conn:
        return attempt(
            lambda: conn.channel().queue_declare(
                "compat-q-badarg", arguments={"x-overflow": "compat-bogus"}
            )
        )


@scenario(queues=["compat-q-badarg"])
def s_queue_declare_max_priority_too_big(host: str, port: int) -> Observation:
    """queue.declare x-max-priority=256."""
    with connection(host, port) as conn:
        return attempt(
            lambda: conn.channel().queue_declare(
                "compat-q-badarg", arguments={"x-max-priority": 256}
            )
        )


@scenario(queues=["compat-q-badarg"])
def s_queue_declare_dead_letter_routing_key_without_exchange(host: str, port: int) -> Observation:
    """queue.declare x-dead-letter-routing-key without x-dead-letter-exchange."""
    with connection(host, port) as conn:
        return attempt(
            lambda: conn.channel().queue_declare(
                "compat-q-badarg", arguments={"x-dead-letter-routing-key": "k"}
            )
        )


@scenario(queues=["compat-q-del"])
def s_queue_delete_if_unused_with_consumer(host: str, port: int) -> Observation:
    """queue.delete if-unused on a queue with a consumer (on another channel)."""
    with connection(host, port) as conn:
        consumer_ch = conn.channel()
        consumer_ch.queue_declare("compat-q-del")
        consumer_ch.basic_consume("compat-q-del", lambda *_: None)
        return attempt(lambda: conn.channel().queue_delete("compat-q-del", if_unused=True))


@scenario(queues=["compat-q-del"])
def s_queue_delete_if_empty_with_messages(host: str, port: int) -> Observation:
    """queue.delete if-empty on a queue holding two messages."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-del")
        ch.confirm_delivery()
        publish_bodies(ch, "compat-q-del", ["m1", "m2"])
        return attempt(lambda: ch.queue_delete("compat-q-del", if_empty=True))


@scenario(queues=["compat-q-del"])
def s_queue_delete_if_empty_with_unacked_only(host: str, port: int) -> Observation:
    """queue.delete if-empty on a queue whose only message is unacked."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-del")
        ch.confirm_delivery()
        publish_bodies(ch, "compat-q-del", ["m1"])
        get_one(ch, "compat-q-del")
        return attempt(lambda: conn.channel().queue_delete("compat-q-del", if_empty=True))


@scenario()
def s_queue_delete_missing(host: str, port: int) -> Observation:
    """queue.delete of a queue that does not exist."""
    with connection(host, port) as conn:
        return attempt(lambda: conn.channel().queue_delete("compat-q-missing"))


@scenario(queues=["compat-q-del"])
def s_queue_delete_message_count(host: str, port: int) -> Observation:
    """queue.delete-ok message_count with 3 ready and 1 unacked message."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-del")
        ch.confirm_delivery()
        publish_bodies(ch, "compat-q-del", ["m1", "m2", "m3", "m4"])
        get_one(ch, "compat-q-del")
        return attempt(lambda: conn.channel().queue_delete("compat-q-del"))


@scenario(queues=["compat-q-purge"])
def s_queue_purge_count(host: str, port: int) -> Observation:
    """purge-ok message_count with 3 ready + 1 unacked; then the unacked one is requeued."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-purge")
        ch.confirm_delivery()
        publish_bodies(ch, "compat-q-purge", ["m1", "m2", "m3", "m4"])
        got = get_one(ch, "compat-q-purge")
        assert got is not None
        purge = method_dict(ch.queue_purge("compat-q-purge"))
        ch.basic_nack(got["delivery_tag"], requeue=True)
        return {"purge": purge, "after_nack": get_all(ch, "compat-q-purge")}


@scenario()
def s_queue_purge_missing(host: str, port: int) -> Observation:
    """queue.purge of a missing queue."""
    with connection(host, port) as conn:
        return attempt(lambda: conn.channel().queue_purge("compat-q-missing"))


@scenario()
def s_queue_bind_empty_name_after_declare(host: str, port: int) -> Observation:
    """queue.bind with queue '' right after declaring a server-named queue on the channel."""
    with connection(host, port) as conn:
        ch = conn.channel()
        name = ch.queue_declare("", exclusive=True).method.queue
        bind = attempt(lambda: ch.queue_bind("", "amq.direct", "compat-empty-bind"))
        ch.confirm_delivery()
        ch.basic_publish("amq.direct", "compat-empty-bind", b"m")
        count = ch.queue_declare(name, passive=True).method.message_count
        return {"bind": bind, "message_count_of_declared_queue": count}


@scenario()
def s_queue_bind_empty_name_fresh_channel(host: str, port: int) -> Observation:
    """queue.bind with queue '' on a channel that never declared a queue."""
    with connection(host, port) as conn:
        return attempt(lambda: conn.channel().queue_bind("", "amq.direct", "k"))


@scenario()
def s_queue_purge_empty_name_fresh_channel(host: str, port: int) -> Observation:
    """queue.purge with queue '' on a channel that never declared a queue."""
    with connection(host, port) as conn:
        return attempt(lambda: conn.channel().queue_purge(""))


@scenario()
def s_queue_delete_empty_name_fresh_channel(host: str, port: int) -> Observation:
    """queue.delete with queue '' on a channel that never declared a queue."""
    with connection(host, port) as conn:
        return attempt(lambda: conn.channel().queue_delete(""))


@scenario()
def s_basic_get_empty_name_fresh_channel(host: str, port: int) -> Observation:
    """basic.get with queue '' on a channel that never declared a queue."""
    with connection(host, port) as conn:
        return attempt(lambda: get_one(conn.channel(), ""))


@scenario()
def s_basic_consume_empty_name_fresh_channel(host: str, port: int) -> Observation:
    """basic.consume with queue '' on a channel that never declared a queue."""
    with connection(host, port) as conn:
        return attempt(
            lambda: conn.channel().basic_consume("", lambda *_: None, consumer_tag="compat-tag")
        )


@scenario()
def s_queue_empty_name_uses_last_declared(host: str, port: int) -> Observation:
    """After declaring a server-named queue, purge/get/delete with '' act on it."""
    with connection(host, port) as conn:
        ch = conn.channel()
        name = ch.queue_declare("", exclusive=True).method.queue
        ch.confirm_delivery()
        ch.basic_publish("", name, b"m1")
        ch.basic_publish("", name, b"m2")
        out: Observation = {}
        out["get"] = attempt(lambda: get_one(ch, "", auto_ack=True))
        out["purge"] = attempt(lambda: ch.queue_purge(""))
        out["delete"] = attempt(lambda: ch.queue_delete(""))
        out["declare_passive_after_delete"] = attempt(lambda: ch.queue_declare("", passive=True))
        return out


@scenario(queues=["compat-q-bind"])
def s_queue_bind_missing_exchange(host: str, port: int) -> Observation:
    """queue.bind to a missing exchange."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-bind")
        return attempt(lambda: ch.queue_bind("compat-q-bind", "compat-x-missing", "k"))


@scenario()
def s_queue_bind_missing_queue(host: str, port: int) -> Observation:
    """queue.bind of a missing queue to amq.direct."""
    with connection(host, port) as conn:
        return attempt(lambda: conn.channel().queue_bind("compat-q-missing", "amq.direct", "k"))


@scenario()
def s_queue_bind_missing_queue_and_exchange(host: str, port: int) -> Observation:
    """queue.bind where both queue and exchange are missing."""
    with connection(host, port) as conn:
        return attempt(
            lambda: conn.channel().queue_bind("compat-q-missing", "compat-x-missing", "k")
        )


@scenario(queues=["compat-q-bind"])
def s_queue_unbind_missing_binding(host: str, port: int) -> Observation:
    """queue.unbind of a binding that does not exist (queue and exchange exist)."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-bind")
        return attempt(lambda: ch.queue_unbind("compat-q-bind", "amq.direct", "compat-nothing"))


@scenario()
def s_queue_unbind_missing_queue(host: str, port: int) -> Observation:
    """queue.unbind of a missing queue."""
    with connection(host, port) as conn:
        return attempt(lambda: conn.channel().queue_unbind("compat-q-missing", "amq.direct", "k"))


@scenario(queues=["compat-q-bind"])
def s_queue_unbind_missing_exchange(host: str, port: int) -> Observation:
    """queue.unbind from a missing exchange."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-bind")
        return attempt(lambda: ch.queue_unbind("compat-q-bind", "compat-x-missing", "k"))


@scenario(queues=["compat-q-maxlen"])
def s_queue_max_length_drop_head(host: str, port: int) -> Observation:
    """x-max-length=2; publish m1..m4: which remain."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-maxlen", arguments={"x-max-length": 2})
        ch.confirm_delivery()
        publish_bodies(ch, "compat-q-maxlen", ["m1", "m2", "m3", "m4"])
        return {"remaining": [m["body"] for m in get_all(ch, "compat-q-maxlen")]}


@scenario(queues=["compat-q-maxlen"])
def s_queue_max_length_reject_publish(host: str, port: int) -> Observation:
    """x-max-length=1, x-overflow=reject-publish, confirm mode: acks/nacks per publish."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare(
            "compat-q-maxlen", arguments={"x-max-length": 1, "x-overflow": "reject-publish"}
        )
        ch.confirm_delivery()
        outcomes = []
        for body in ("m1", "m2"):
            try:
                ch.basic_publish("", "compat-q-maxlen", body.encode())
                outcomes.append("ack")
            except pika.exceptions.NackError:
                outcomes.append("nack")
        return {
            "outcomes": outcomes,
            "remaining": [m["body"] for m in get_all(ch, "compat-q-maxlen")],
        }


@scenario(queues=["compat-q-ttl"])
def s_queue_message_ttl_zero(host: str, port: int) -> Observation:
    """x-message-ttl=0 and no consumer: the message is gone at once."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-ttl", arguments={"x-message-ttl": 0})
        ch.confirm_delivery()
        publish_bodies(ch, "compat-q-ttl", ["m1"])
        return {"get": get_one(ch, "compat-q-ttl", auto_ack=True)}


@scenario(queues=["compat-q-ttl"])
def s_message_expiration_zero(host: str, port: int) -> Observation:
    """Per-message expiration '0' and no consumer: the message is gone at once."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-ttl")
        ch.confirm_delivery()
        ch.basic_publish("", "compat-q-ttl", b"m1", pika.BasicProperties(expiration="0"))
        ch.basic_publish("", "compat-q-ttl", b"m2", pika.BasicProperties(expiration="60000"))
        return {"remaining": [m["body"] for m in get_all(ch, "compat-q-ttl")]}


@scenario(queues=["compat-q-ttl"])
def s_message_expiration_invalid(host: str, port: int) -> Observation:
    """Per-message expiration 'soon' (not a number)."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-ttl")

        def go() -> None:
            ch.basic_publish("", "compat-q-ttl", b"m1", pika.BasicProperties(expiration="soon"))
            sync(ch)

        return attempt(go)


@scenario(queues=["compat-q-dlx", "compat-q-dlq"])
def s_dead_letter_on_reject(host: str, port: int) -> Observation:
    """Rejected (requeue=false) message dead-lettered via the default exchange: x-death contents."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-dlq")
        ch.queue_declare(
            "compat-q-dlx",
            arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "compat-q-dlq"},
        )
        ch.confirm_delivery()
        ch.basic_publish("", "compat-q-dlx", b"m1", pika.BasicProperties(headers={"h": "v"}))
        got = get_one(ch, "compat-q-dlx")
        assert got is not None
        ch.basic_reject(got["delivery_tag"], requeue=False)
        sync(ch)
        dead = get_one(ch, "compat-q-dlq", auto_ack=True)
        if dead is not None:
            for death in dead["properties"].get("headers", {}).get("x-death", []):
                death.pop("time", None)
        return {"dead_lettered": dead}


@scenario(queues=["compat-q-prio"])
def s_queue_priority_order(host: str, port: int) -> Observation:
    """x-max-priority=10; messages with priorities 1, 5, none, 3, 5 come out in priority order."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-prio", arguments={"x-max-priority": 10})
        ch.confirm_delivery()
        for body, prio in (("p1", 1), ("p5a", 5), ("none", None), ("p3", 3), ("p5b", 5)):
            ch.basic_publish(
                "", "compat-q-prio", body.encode(), pika.BasicProperties(priority=prio)
            )
        return {"order": [m["body"] for m in get_all(ch, "compat-q-prio")]}


@scenario(queues=["compat-q-autodel"])
def s_queue_auto_delete_after_cancel(host: str, port: int) -> Observation:
    """An auto-delete queue: exists before any consumer, gone after its only consumer cancels."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-autodel", auto_delete=True)
        before = attempt(lambda: conn.channel().queue_declare("compat-q-autodel", passive=True))
        tag = ch.basic_consume("compat-q-autodel", lambda *_: None)
        ch.basic_cancel(tag)
        after = attempt(lambda: conn.channel().queue_declare("compat-q-autodel", passive=True))
        return {"before_consumers": before, "after_cancel": after}
