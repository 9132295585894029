"""Scenarios: exchanges."""

from __future__ import annotations

from contextlib import suppress
from typing import Any

import pika
import pika.exceptions
import pika.spec

from .common import Observation, scenario
from .pika_helpers import attempt, connection, get_all, get_one, method_dict, sync

# ======================================================================================
# Scenarios: exchanges
# ======================================================================================


def declare_then(
    host: str, port: int, first: dict[str, Any], second: dict[str, Any], name: str
) -> Observation:
    """exchange.declare ``name`` with ``first`` kwargs, then again with ``second``."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.exchange_declare(name, **first)
        return attempt(lambda: ch.exchange_declare(name, **second))


@scenario(exchanges=["compat-x-badtype"])
def s_exchange_declare_unknown_type(host: str, port: int) -> Observation:
    """exchange.declare with type 'compat-bogus'."""
    with connection(host, port) as conn:
        ch = conn.channel()
        return attempt(lambda: ch.exchange_declare("compat-x-badtype", "compat-bogus"))


@scenario(exchanges=["compat-x-badtype"])
def s_exchange_declare_unknown_type_passive(host: str, port: int) -> Observation:
    """Passive exchange.declare of a missing exchange with type 'compat-bogus'."""
    with connection(host, port) as conn:
        ch = conn.channel()
        return attempt(
            lambda: ch.exchange_declare("compat-x-badtype", "compat-bogus", passive=True)
        )


@scenario(exchanges=["compat-x-redeclare"])
def s_exchange_redeclare_same(host: str, port: int) -> Observation:
    """Redeclare an exchange with identical properties."""
    return declare_then(
        host, port, {"exchange_type": "direct"}, {"exchange_type": "direct"}, "compat-x-redeclare"
    )


@scenario(exchanges=["compat-x-redeclare"])
def s_exchange_redeclare_different_type(host: str, port: int) -> Observation:
    """Declared direct, redeclared fanout."""
    return declare_then(
        host, port, {"exchange_type": "direct"}, {"exchange_type": "fanout"}, "compat-x-redeclare"
    )


@scenario(exchanges=["compat-x-redeclare"])
def s_exchange_redeclare_different_durable(host: str, port: int) -> Observation:
    """Declared non-durable, redeclared durable."""
    return declare_then(host, port, {"durable": False}, {"durable": True}, "compat-x-redeclare")


@scenario(exchanges=["compat-x-redeclare"])
def s_exchange_redeclare_different_auto_delete(host: str, port: int) -> Observation:
    """Declared auto_delete=false, redeclared auto_delete=true."""
    return declare_then(
        host, port, {"auto_delete": False}, {"auto_delete": True}, "compat-x-redeclare"
    )


@scenario(exchanges=["compat-x-redeclare"])
def s_exchange_redeclare_different_internal(host: str, port: int) -> Observation:
    """Declared internal=false, redeclared internal=true."""
    return declare_then(host, port, {"internal": False}, {"internal": True}, "compat-x-redeclare")


@scenario(exchanges=["compat-x-redeclare"])
def s_exchange_redeclare_different_arguments(host: str, port: int) -> Observation:
    """Declared with alternate-exchange 'amq.fanout', redeclared with 'amq.topic'."""
    return declare_then(
        host,
        port,
        {"arguments": {"alternate-exchange": "amq.fanout"}},
        {"arguments": {"alternate-exchange": "amq.topic"}},
        "compat-x-redeclare",
    )


@scenario(exchanges=["compat-x-redeclare"])
def s_exchange_redeclare_passive_different_type(host: str, port: int) -> Observation:
    """Declared direct; passive redeclare saying fanout."""
    return declare_then(
        host,
        port,
        {"exchange_type": "direct"},
        {"exchange_type": "fanout", "passive": True},
        "compat-x-redeclare",
    )


@scenario()
def s_exchange_declare_amq_prefix(host: str, port: int) -> Observation:
    """Non-passive exchange.declare of 'amq.compat'."""
    with connection(host, port) as conn:
        ch = conn.channel()
        return attempt(lambda: ch.exchange_declare("amq.compat", "direct"))


@scenario()
def s_exchange_declare_amq_prefix_passive(host: str, port: int) -> Observation:
    """Passive exchange.declare of 'amq.compat' (does not exist)."""
    with connection(host, port) as conn:
        ch = conn.channel()
        return attempt(lambda: ch.exchange_declare("amq.compat", "direct", passive=True))


@scenario()
def s_exchange_declare_amq_direct(host: str, port: int) -> Observation:
    """Non-passive exchange.declare of 'amq.direct' with its own properties (durable direct)."""
    with connection(host, port) as conn:
        ch = conn.channel()
        return attempt(lambda: ch.exchange_declare("amq.direct", "direct", durable=True))


@scenario()
def s_exchange_declare_amq_direct_mismatch(host: str, port: int) -> Observation:
    """Non-passive exchange.declare of 'amq.direct' as a non-durable fanout."""
    with connection(host, port) as conn:
        ch = conn.channel()
        return attempt(lambda: ch.exchange_declare("amq.direct", "fanout"))


@scenario()
def s_exchange_declare_amq_direct_passive(host: str, port: int) -> Observation:
    """Passive exchange.declare of 'amq.direct'."""
    with connection(host, port) as conn:
        ch = conn.channel()
        return attempt(lambda: ch.exchange_declare("amq.direct", passive=True))


@scenario()
def s_exchange_declare_builtin_passive_all(host: str, port: int) -> Observation:
    """Passive exchange.declare of every built-in exchange name."""
    names = [
        "amq.direct", "amq.fanout", "amq.topic", "amq.headers", "amq.match",
        "amq.rabbitmq.trace", "amq.rabbitmq.log", "amq.default",
    ]  # fmt: skip
    out: Observation = {}
    with connection(host, port) as conn:
        for name in names:
            ch = conn.channel()

            def declare(ch: Any = ch, name: str = name) -> Any:
                return ch.exchange_declare(name, passive=True)

            out[name] = attempt(declare)
            with suppress(Exception):
                ch.close()
    return out


@scenario()
def s_exchange_declare_default_exchange(host: str, port: int) -> Observation:
    """Non-passive exchange.declare of '' (the default exchange)."""
    with connection(host, port) as conn:
        ch = conn.channel()
        return attempt(lambda: ch.exchange_declare("", "direct", durable=True))


@scenario()
def s_exchange_declare_default_exchange_passive(host: str, port: int) -> Observation:
    """Passive exchange.declare of '' (the default exchange)."""
    with connection(host, port) as conn:
        ch = conn.channel()
        return attempt(lambda: ch.exchange_declare("", passive=True))


@scenario()
def s_exchange_declare_passive_missing(host: str, port: int) -> Observation:
    """Passive exchange.declare of a missing exchange."""
    with connection(host, port) as conn:
        ch = conn.channel()
        return attempt(lambda: ch.exchange_declare("compat-x-missing", passive=True))


@scenario()
def s_exchange_declare_name_with_space(host: str, port: int) -> Observation:
    """exchange.declare of a name containing a space and a slash (allowed by RabbitMQ)."""
    with connection(host, port) as conn:
        ch = conn.channel()
        result = attempt(lambda: ch.exchange_declare("compat x/space", "fanout"))
        with suppress(Exception):
            ch.exchange_delete("compat x/space")
        return result


@scenario()
def s_exchange_delete_default(host: str, port: int) -> Observation:
    """exchange.delete of '' (the default exchange)."""
    with connection(host, port) as conn:
        ch = conn.channel()
        return attempt(lambda: ch.exchange_delete(""))


@scenario()
def s_exchange_delete_amq_direct(host: str, port: int) -> Observation:
    """exchange.delete of 'amq.direct'."""
    with connection(host, port) as conn:
        ch = conn.channel()
        return attempt(lambda: ch.exchange_delete("amq.direct"))


@scenario()
def s_exchange_delete_missing(host: str, port: int) -> Observation:
    """exchange.delete of an exchange that does not exist."""
    with connection(host, port) as conn:
        ch = conn.channel()
        return attempt(lambda: ch.exchange_delete("compat-x-missing"))


@scenario(queues=["compat-q-xdel"], exchanges=["compat-x-xdel"])
def s_exchange_delete_if_unused_bound(host: str, port: int) -> Observation:
    """exchange.delete if-unused of an exchange with a queue bound to it."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.exchange_declare("compat-x-xdel", "direct")
        ch.queue_declare("compat-q-xdel")
        ch.queue_bind("compat-q-xdel", "compat-x-xdel", "k")
        return attempt(lambda: ch.exchange_delete("compat-x-xdel", if_unused=True))


@scenario(exchanges=["compat-x-xdel"])
def s_exchange_delete_if_unused_unbound(host: str, port: int) -> Observation:
    """exchange.delete if-unused of an exchange without bindings."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.exchange_declare("compat-x-xdel", "direct")
        return attempt(lambda: ch.exchange_delete("compat-x-xdel", if_unused=True))


@scenario(exchanges=["compat-x-xdel", "compat-x-xdel-src"])
def s_exchange_delete_if_unused_destination_only(host: str, port: int) -> Observation:
    """exchange.delete if-unused of an exchange that is only the destination of an e2e binding."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.exchange_declare("compat-x-xdel", "fanout")
        ch.exchange_declare("compat-x-xdel-src", "fanout")
        ch.exchange_bind("compat-x-xdel", "compat-x-xdel-src")
        return attempt(lambda: ch.exchange_delete("compat-x-xdel", if_unused=True))


@scenario(queues=["compat-q-xdel"], exchanges=["compat-x-xdel"])
def s_exchange_delete_removes_bindings(host: str, port: int) -> Observation:
    """Delete an exchange with a bound queue, redeclare it: the old binding is gone."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.exchange_declare("compat-x-xdel", "fanout")
        ch.queue_declare("compat-q-xdel")
        ch.queue_bind("compat-q-xdel", "compat-x-xdel")
        ch.exchange_delete("compat-x-xdel")
        ch.exchange_declare("compat-x-xdel", "fanout")
        ch.confirm_delivery()
        ch.basic_publish("compat-x-xdel", "", b"m")
        return {"queue_after": method_dict(ch.queue_declare("compat-q-xdel", passive=True))}


@scenario(queues=["compat-q-bind"])
def s_queue_bind_default_exchange(host: str, port: int) -> Observation:
    """queue.bind to the default exchange."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-bind")
        return attempt(lambda: ch.queue_bind("compat-q-bind", "", "compat-q-bind"))


@scenario(queues=["compat-q-bind"])
def s_queue_unbind_default_exchange(host: str, port: int) -> Observation:
    """queue.unbind from the default exchange."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-bind")
        return attempt(lambda: ch.queue_unbind("compat-q-bind", "", "compat-q-bind"))


@scenario()
def s_exchange_bind_default_destination(host: str, port: int) -> Observation:
    """exchange.bind with destination '' (the default exchange), source amq.direct."""
    with connection(host, port) as conn:
        ch = conn.channel()
        return attempt(lambda: ch.exchange_bind("", "amq.direct", "k"))


@scenario()
def s_exchange_bind_default_source(host: str, port: int) -> Observation:
    """exchange.bind with source '' (the default exchange), destination amq.fanout."""
    with connection(host, port) as conn:
        ch = conn.channel()
        return attempt(lambda: ch.exchange_bind("amq.fanout", "", "k"))


@scenario()
def s_exchange_bind_missing_source(host: str, port: int) -> Observation:
    """exchange.bind from a missing source exchange."""
    with connection(host, port) as conn:
        ch = conn.channel()
        return attempt(lambda: ch.exchange_bind("amq.fanout", "compat-x-missing", "k"))


@scenario()
def s_exchange_bind_missing_destination(host: str, port: int) -> Observation:
    """exchange.bind to a missing destination exchange."""
    with connection(host, port) as conn:
        ch = conn.channel()
        return attempt(lambda: ch.exchange_bind("compat-x-missing", "amq.fanout", "k"))


@scenario()
def s_exchange_bind_both_missing(host: str, port: int) -> Observation:
    """exchange.bind where both source and destination are missing."""
    with connection(host, port) as conn:
        ch = conn.channel()
        return attempt(lambda: ch.exchange_bind("compat-x-missing-d", "compat-x-missing-s", "k"))


@scenario()
def s_exchange_unbind_missing_binding(host: str, port: int) -> Observation:
    """exchange.unbind of a binding that does not exist (both exchanges exist)."""
    with connection(host, port) as conn:
        ch = conn.channel()
        return attempt(lambda: ch.exchange_unbind("amq.fanout", "amq.direct", "compat-nothing"))


@scenario(queues=["compat-q-e2e"], exchanges=["compat-x-e2e-src", "compat-x-e2e-dst"])
def s_exchange_to_exchange_routing(host: str, port: int) -> Observation:
    """topic source bound to fanout destination bound to a queue; which keys arrive."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.exchange_declare("compat-x-e2e-src", "topic")
        ch.exchange_declare("compat-x-e2e-dst", "fanout")
        ch.exchange_bind("compat-x-e2e-dst", "compat-x-e2e-src", "a.*")
        ch.queue_declare("compat-q-e2e")
        ch.queue_bind("compat-q-e2e", "compat-x-e2e-dst")
        ch.confirm_delivery()
        for key in ("a.b", "a.b.c", "b.a", "a.x"):
            ch.basic_publish("compat-x-e2e-src", key, key.encode())
        return {"received": [m["body"] for m in get_all(ch, "compat-q-e2e")]}


@scenario(queues=["compat-q-hdr"])
def s_headers_bind_invalid_x_match(host: str, port: int) -> Observation:
    """queue.bind to amq.headers with x-match 'compat-bogus'."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-hdr")
        return attempt(
            lambda: ch.queue_bind(
                "compat-q-hdr", "amq.headers", "", arguments={"x-match": "compat-bogus"}
            )
        )


@scenario(queues=["compat-q-hdr"])
def s_headers_bind_x_match_not_string(host: str, port: int) -> Observation:
    """queue.bind to amq.headers with x-match given as an integer."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-hdr")
        return attempt(
            lambda: ch.queue_bind("compat-q-hdr", "amq.headers", "", arguments={"x-match": 1})
        )


@scenario(queues=["compat-q-hdr-all", "compat-q-hdr-any", "compat-q-hdr-none"])
def s_headers_exchange_routing(host: str, port: int) -> Observation:
    """amq.headers with all / any / no-x-match bindings; which messages each queue gets."""
    with connection(host, port) as conn:
        ch = conn.channel()
        for q in ("compat-q-hdr-all", "compat-q-hdr-any", "compat-q-hdr-none"):
            ch.queue_declare(q)
        ch.queue_bind(
            "compat-q-hdr-all", "amq.headers", arguments={"x-match": "all", "a": "1", "b": "2"}
        )
        ch.queue_bind(
            "compat-q-hdr-any", "amq.headers", arguments={"x-match": "any", "a": "1", "b": "2"}
        )
        ch.queue_bind("compat-q-hdr-none", "amq.headers", arguments={"a": "1", "b": "2"})
        ch.confirm_delivery()
        cases = {
            "ab": {"a": "1", "b": "2"},
            "a": {"a": "1"},
            "ab-extra": {"a": "1", "b": "2", "c": "3"},
            "a-wrong-b": {"a": "1", "b": "x"},
            "none": {},
            "a-int": {"a": 1, "b": "2"},
            "x-only": {"x-a": "1"},
        }
        for body, headers in cases.items():
            props = pika.BasicProperties(headers=headers or None)
            ch.basic_publish("amq.headers", "", body.encode(), props)
        return {
            q: [m["body"] for m in get_all(ch, q)]
            for q in ("compat-q-hdr-all", "compat-q-hdr-any", "compat-q-hdr-none")
        }


@scenario(queues=["compat-q-topic-1", "compat-q-topic-2", "compat-q-topic-3", "compat-q-topic-4"])
def s_topic_exchange_routing(host: str, port: int) -> Observation:
    """amq.topic with patterns '#', 'a.*', 'a.#', '*.b.#'; which keys each queue gets."""
    patterns = {
        "compat-q-topic-1": "#",
        "compat-q-topic-2": "a.*",
        "compat-q-topic-3": "a.#",
        "compat-q-topic-4": "*.b.#",
    }
    with connection(host, port) as conn:
        ch = conn.channel()
        for q, pattern in patterns.items():
            ch.queue_declare(q)
            ch.queue_bind(q, "amq.topic", pattern)
        ch.confirm_delivery()
        for key in ("a", "a.b", "a.b.c", "b.b", "x.b", "a..b", "", "A.b"):
            ch.basic_publish("amq.topic", key, (key or "<empty>").encode())
        return {f"{q} ({patterns[q]})": [m["body"] for m in get_all(ch, q)] for q in patterns}


@scenario(queues=["compat-q-direct-1", "compat-q-direct-2"])
def s_direct_exchange_multiple_bindings(host: str, port: int) -> Observation:
    """A queue bound twice (keys k1, k2) and another bound with k1: one copy per queue."""
    with connection(host, port) as conn:
        ch = conn.channel()
        for q in ("compat-q-direct-1", "compat-q-direct-2"):
            ch.queue_declare(q)
        ch.queue_bind("compat-q-direct-1", "amq.direct", "k1")
        ch.queue_bind("compat-q-direct-1", "amq.direct", "k2")
        ch.queue_bind("compat-q-direct-1", "amq.direct", "k1")
        ch.queue_bind("compat-q-direct-2", "amq.direct", "k1")
        ch.confirm_delivery()
        for key in ("k1", "k2", "k3"):
            ch.basic_publish("amq.direct", key, key.encode())
        return {
            q: [m["body"] for m in get_all(ch, q)]
            for q in ("compat-q-direct-1", "compat-q-direct-2")
        }


@scenario(queues=["compat-q-fanout"])
def s_fanout_exchange_ignores_key(host: str, port: int) -> Observation:
    """amq.fanout delivers regardless of binding and routing keys."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-fanout")
        ch.queue_bind("compat-q-fanout", "amq.fanout", "some-key")
        ch.confirm_delivery()
        for key in ("some-key", "other", ""):
            ch.basic_publish("amq.fanout", key, (key or "<empty>").encode())
        return {"received": [m["body"] for m in get_all(ch, "compat-q-fanout")]}


@scenario(queues=["compat-q-ae"], exchanges=["compat-x-ae", "compat-x-ae-main"])
def s_alternate_exchange_routing(host: str, port: int) -> Observation:
    """Unroutable messages go to the alternate exchange; mandatory is then satisfied."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.exchange_declare("compat-x-ae", "fanout")
        ch.exchange_declare(
            "compat-x-ae-main", "direct", arguments={"alternate-exchange": "compat-x-ae"}
        )
        ch.queue_declare("compat-q-ae")
        ch.queue_bind("compat-q-ae", "compat-x-ae")
        returns: list[Any] = []
        ch.add_on_return_callback(
            lambda _c, m, _p, b: returns.append([m.reply_code, m.reply_text, b.decode()])
        )
        ch.confirm_delivery()
        ch.basic_publish("compat-x-ae-main", "nowhere", b"m1", mandatory=True)
        msg = get_one(ch, "compat-q-ae", auto_ack=True)
        return {"returns": returns, "ae_queue_got": msg}


@scenario(queues=["compat-q-ae"], exchanges=["compat-x-ae-main"])
def s_alternate_exchange_missing(host: str, port: int) -> Observation:
    """alternate-exchange names a missing exchange: mandatory publish returns 312."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.exchange_declare(
            "compat-x-ae-main", "direct", arguments={"alternate-exchange": "compat-x-nope"}
        )
        returns: list[Any] = []
        ch.add_on_return_callback(
            lambda _c, m, _p, b: returns.append([m.reply_code, m.reply_text, b.decode()])
        )
        ch.basic_publish("compat-x-ae-main", "nowhere", b"m1", mandatory=True)
        sync(ch)
        conn.process_data_events(0)
        return {"returns": returns}


@scenario(queues=["compat-q-autodel-x"], exchanges=["compat-x-autodel"])
def s_exchange_auto_delete_after_unbind(host: str, port: int) -> Observation:
    """An auto-delete exchange disappears when its last binding is removed."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.exchange_declare("compat-x-autodel", "direct", auto_delete=True)
        before = attempt(lambda: ch.exchange_declare("compat-x-autodel", passive=True))
        ch.queue_declare("compat-q-autodel-x")
        ch.queue_bind("compat-q-autodel-x", "compat-x-autodel", "k")
        ch.queue_unbind("compat-q-autodel-x", "compat-x-autodel", "k")
        after = attempt(lambda: ch.exchange_declare("compat-x-autodel", passive=True))
        return {"before_any_binding": before, "after_last_unbind": after}


@scenario(exchanges=["compat-x-internal"])
def s_publish_internal_exchange(host: str, port: int) -> Observation:
    """basic.publish to an internal exchange."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.exchange_declare("compat-x-internal", "fanout", internal=True)

        def go() -> None:
            ch.basic_publish("compat-x-internal", "", b"m")
            sync(ch)

        return attempt(go)


@scenario()
def s_publish_missing_exchange(host: str, port: int) -> Observation:
    """basic.publish to an exchange that does not exist."""
    with connection(host, port) as conn:
        ch = conn.channel()

        def go() -> None:
            ch.basic_publish("compat-x-missing", "", b"m")
            sync(ch)

        return attempt(go)


@scenario()
def s_publish_missing_exchange_confirm(host: str, port: int) -> Observation:
    """basic.publish to a missing exchange in confirm mode (close vs nack)."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        return attempt(lambda: ch.basic_publish("compat-x-missing", "", b"m"))


@scenario(queues=["compat-q-amqdefault"])
def s_publish_amq_default(host: str, port: int) -> Observation:
    """basic.publish to exchange 'amq.default' with a queue's name as key."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-amqdefault")

        def go() -> Any:
            ch.basic_publish("amq.default", "compat-q-amqdefault", b"m")
            sync(ch)
            return get_one(ch, "compat-q-amqdefault", auto_ack=True)

        return attempt(go)
