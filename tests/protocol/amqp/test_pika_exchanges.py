"""Exchanges as a pika (BlockingConnection) client observes them, over real sockets.

Every exchange type and its routing rules, the predeclared exchanges, the
default exchange, durable/auto-delete/internal flags, alternate exchanges,
exchange-to-exchange bindings, and the errors RabbitMQ answers with.
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Iterator
from contextlib import closing
from typing import Any

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection
from pika.exceptions import ChannelClosedByBroker, UnroutableError
from pikahelp import Session, barrier, channel_error, uniq

pytestmark = pytest.mark.timeout(30)


# -- helpers ------------------------------------------------------------------------------


@pytest.fixture
def s(broker: Any) -> Iterator[Session]:
    with closing(Session(broker)) as session:
        yield session


def routed(
    ch: BlockingChannel,
    queues: list[str],
    exchange: str,
    routing_key: str = "",
    headers: dict[str, Any] | None = None,
) -> set[str]:
    """Publish one message; the subset of ``queues`` that got it, each exactly once."""
    body = uuid.uuid4().bytes
    ch.basic_publish(exchange, routing_key, body, pika.BasicProperties(headers=headers))
    got = set()
    for q in queues:
        method, _props, payload = ch.basic_get(q, auto_ack=True)
        if method is not None:
            assert payload == body
            assert method.exchange == exchange
            assert method.routing_key == routing_key
            got.add(q)
            extra = ch.basic_get(q, auto_ack=True)
            assert extra[0] is None, f"{q} got the message more than once"
    return got


def exchange_exists(conn: BlockingConnection, name: str) -> bool:
    ch = conn.channel()
    try:
        ch.exchange_declare(name, passive=True)
    except ChannelClosedByBroker as exc:
        assert exc.reply_code == 404
        return False
    ch.close()
    return True


# -- direct -----------------------------------------------------------------------------


def test_direct_routes_on_exact_key(s: Session) -> None:
    ex = s.exchange("direct")
    q1, q2, q3 = s.queue(), s.queue(), s.queue()
    s.ch.queue_bind(q1, ex, "k1")
    s.ch.queue_bind(q2, ex, "k2")
    s.ch.queue_bind(q3, ex, "k1")
    qs = [q1, q2, q3]
    assert routed(s.ch, qs, ex, "k1") == {q1, q3}
    assert routed(s.ch, qs, ex, "k2") == {q2}
    assert routed(s.ch, qs, ex, "k3") == set()
    assert routed(s.ch, qs, ex, "K1") == set()
    assert routed(s.ch, qs, ex, "") == set()


def test_direct_empty_routing_key_binding(s: Session) -> None:
    ex = s.exchange("direct")
    q = s.queue()
    s.ch.queue_bind(q, ex, "")
    assert routed(s.ch, [q], ex, "") == {q}
    assert routed(s.ch, [q], ex, "a") == set()


def test_duplicate_binding_is_idempotent(s: Session) -> None:
    ex = s.exchange("direct")
    q = s.queue()
    s.ch.queue_bind(q, ex, "k")
    s.ch.queue_bind(q, ex, "k")
    assert routed(s.ch, [q], ex, "k") == {q}
    s.ch.queue_unbind(q, ex, "k")
    assert routed(s.ch, [q], ex, "k") == set()


# -- fanout -----------------------------------------------------------------------------


def test_fanout_ignores_routing_key(s: Session) -> None:
    ex = s.exchange("fanout")
    q1, q2, unbound = s.queue(), s.queue(), s.queue()
    s.ch.queue_bind(q1, ex, "")
    s.ch.queue_bind(q2, ex, "whatever")
    qs = [q1, q2, unbound]
    assert routed(s.ch, qs, ex, "") == {q1, q2}
    assert routed(s.ch, qs, ex, "some.key") == {q1, q2}


def test_fanout_queue_bound_twice_gets_one_copy(s: Session) -> None:
    ex = s.exchange("fanout")
    q = s.queue()
    s.ch.queue_bind(q, ex, "a")
    s.ch.queue_bind(q, ex, "b")
    assert routed(s.ch, [q], ex, "x") == {q}


# -- topic ------------------------------------------------------------------------------

TOPIC_CASES = [
    ("#", "", True),
    ("#", "a", True),
    ("#", "a.b.c", True),
    ("#", ".", True),
    ("*", "a", True),
    ("*", "", False),
    ("*", "a.b", False),
    ("*", ".", False),
    ("*.*", ".", True),
    ("*.*", "a.", True),
    ("*.*", "a", False),
    ("a.*", "a.b", True),
    ("a.*", "a.", True),
    ("a.*", "a", False),
    ("a.*", "a.b.c", False),
    ("a.#", "a", True),
    ("a.#", "a.b", True),
    ("a.#", "a.b.c", True),
    ("a.#", "b.a", False),
    ("a.#", "ab", False),
    ("#.a", "a", True),
    ("#.a", "x.y.a", True),
    ("#.a", ".a", True),
    ("#.a", "a.x", False),
    ("a.#.b", "a.b", True),
    ("a.#.b", "a.x.b", True),
    ("a.#.b", "a.x.y.b", True),
    ("a.#.b", "a.b.b", True),
    ("a.#.b", "a..b", True),
    ("a.#.b", "a.b.c", False),
    ("a.#.b", "a", False),
    ("a.#.b", "b", False),
    ("a.*.b", "a..b", True),
    ("a.*.b", "a.x.b", True),
    ("a.*.b", "a.b", False),
    ("a..b", "a..b", True),
    ("a..b", "a.b", False),
    ("", "", True),
    ("", "a", False),
    ("#.*", "a", True),
    ("#.*", "a.b.c", True),
    ("#.*", "", False),
    ("*.#", "a", True),
    ("*.#", "", False),
    ("#.#", "", True),
    ("#.#", "a.b", True),
    ("a.#.#.b", "a.b", True),
    ("a.*.#", "a", False),
    ("a.*.#", "a.b", True),
    ("*.b.#", "a.b", True),
    ("*.b.#", "b", False),
    ("#.b.*", "b.c", True),
    ("#.b.*", "a.b", False),
    ("a.b", "a.b", True),
    ("a.b", "A.b", False),
    ("a.b", "a.b.", False),
]


@pytest.mark.parametrize(("pattern", "key", "expected"), TOPIC_CASES)
def test_topic_matching(s: Session, pattern: str, key: str, expected: bool) -> None:
    ex = s.exchange("topic")
    q = s.queue()
    s.ch.queue_bind(q, ex, pattern)
    assert routed(s.ch, [q], ex, key) == ({q} if expected else set())


def test_topic_overlapping_patterns_deliver_once(s: Session) -> None:
    ex = s.exchange("topic")
    q, other = s.queue(), s.queue()
    for pattern in ("a.b.c", "a.*.c", "a.#", "#", "#.c"):
        s.ch.queue_bind(q, ex, pattern)
    s.ch.queue_bind(other, ex, "*.b.*")
    assert routed(s.ch, [q, other], ex, "a.b.c") == {q, other}
    assert routed(s.ch, [q, other], ex, "x.y") == {q}


def test_topic_unbind_one_pattern_keeps_the_others(s: Session) -> None:
    ex = s.exchange("topic")
    q = s.queue()
    s.ch.queue_bind(q, ex, "a.*")
    s.ch.queue_bind(q, ex, "#.z")
    assert routed(s.ch, [q], ex, "a.z") == {q}
    s.ch.queue_unbind(q, ex, "a.*")
    assert routed(s.ch, [q], ex, "a.b") == set()
    assert routed(s.ch, [q], ex, "a.z") == {q}
    s.ch.queue_unbind(q, ex, "#.z")
    assert routed(s.ch, [q], ex, "a.z") == set()


# -- headers ----------------------------------------------------------------------------

HEADERS_CASES: list[tuple[str, dict[str, Any], dict[str, Any] | None, bool]] = [
    ("all-exact", {"x-match": "all", "a": 1, "b": "x"}, {"a": 1, "b": "x"}, True),
    ("all-extra-header", {"x-match": "all", "a": 1, "b": "x"}, {"a": 1, "b": "x", "c": 0}, True),
    ("all-missing-one", {"x-match": "all", "a": 1, "b": "x"}, {"a": 1}, False),
    ("all-wrong-value", {"x-match": "all", "a": 1, "b": "x"}, {"a": 2, "b": "x"}, False),
    ("all-no-headers", {"x-match": "all", "a": 1}, None, False),
    ("all-empty-headers", {"x-match": "all", "a": 1}, {}, False),
    ("default-is-all", {"a": 1, "b": 2}, {"a": 1}, False),
    ("default-is-all-match", {"a": 1, "b": 2}, {"a": 1, "b": 2}, True),
    ("all-nothing-required", {"x-match": "all"}, None, True),
    ("all-nothing-required-any-headers", {"x-match": "all"}, {"z": 1}, True),
    ("any-first", {"x-match": "any", "a": 1, "b": "x"}, {"a": 1}, True),
    ("any-second", {"x-match": "any", "a": 1, "b": "x"}, {"b": "x"}, True),
    ("any-one-wrong-one-right", {"x-match": "any", "a": 1, "b": "x"}, {"a": 2, "b": "x"}, True),
    ("any-wrong-value", {"x-match": "any", "a": 1, "b": "x"}, {"a": 2}, False),
    ("any-other-header", {"x-match": "any", "a": 1}, {"c": 1}, False),
    ("any-no-headers", {"x-match": "any", "a": 1}, None, False),
    ("any-nothing-required", {"x-match": "any"}, {"z": 1}, False),
    ("all-ignores-x-args", {"x-match": "all", "x-k": "v", "a": 1}, {"a": 1}, True),
    ("any-ignores-x-args", {"x-match": "any", "x-k": "v"}, {"x-k": "v"}, False),
    ("all-with-x-needs-x", {"x-match": "all-with-x", "x-k": "v", "a": 1}, {"a": 1}, False),
    (
        "all-with-x-match",
        {"x-match": "all-with-x", "x-k": "v", "a": 1},
        {"a": 1, "x-k": "v"},
        True,
    ),
    ("any-with-x-match", {"x-match": "any-with-x", "x-k": "v"}, {"x-k": "v"}, True),
    ("any-with-x-wrong", {"x-match": "any-with-x", "x-k": "v"}, {"x-k": "w"}, False),
    ("void-means-present", {"x-match": "all", "a": None}, {"a": "anything"}, True),
    ("void-matches-void", {"x-match": "all", "a": None}, {"a": None}, True),
    ("void-missing", {"x-match": "all", "a": None}, {"b": 1}, False),
    ("void-any", {"x-match": "any", "a": None, "b": 2}, {"a": 1}, True),
    ("int-vs-string", {"x-match": "all", "a": 1}, {"a": "1"}, False),
    ("bool-vs-int", {"x-match": "all", "a": True}, {"a": 1}, False),
    ("bool", {"x-match": "all", "a": True}, {"a": True}, True),
    ("long-int", {"x-match": "all", "a": 2**40}, {"a": 2**40}, True),
    ("string", {"x-match": "all", "s": "héllo"}, {"s": "héllo"}, True),
    ("string-case", {"x-match": "all", "s": "abc"}, {"s": "ABC"}, False),
    ("bytes-vs-string", {"x-match": "all", "s": "abc"}, {"s": b"abc"}, True),
    ("negative-int", {"x-match": "all", "a": 1}, {"a": -1}, False),
    ("nested-table", {"x-match": "all", "t": {"n": 1}}, {"t": {"n": 1}}, True),
    ("nested-table-differs", {"x-match": "all", "t": {"n": 1}}, {"t": {"n": 2}}, False),
    ("array", {"x-match": "all", "l": [1, "a"]}, {"l": [1, "a"]}, True),
    ("array-differs", {"x-match": "all", "l": [1, "a"]}, {"l": ["a", 1]}, False),
    (
        "timestamp",
        {"x-match": "all", "t": datetime.datetime(2020, 1, 2, 3, 4, 5)},
        {"t": datetime.datetime(2020, 1, 2, 3, 4, 5)},
        True,
    ),
]


@pytest.mark.parametrize(
    ("binding", "headers", "expected"),
    [case[1:] for case in HEADERS_CASES],
    ids=[case[0] for case in HEADERS_CASES],
)
def test_headers_matching(
    s: Session, binding: dict[str, Any], headers: dict[str, Any] | None, expected: bool
) -> None:
    ex = s.exchange("headers")
    q = s.queue()
    s.ch.queue_bind(q, ex, "", arguments=binding)
    assert routed(s.ch, [q], ex, "ignored.key", headers=headers) == ({q} if expected else set())


def test_headers_ignores_routing_key(s: Session) -> None:
    ex = s.exchange("headers")
    q = s.queue()
    s.ch.queue_bind(q, ex, "some-key", arguments={"x-match": "all", "a": 1})
    assert routed(s.ch, [q], ex, "other-key", headers={"a": 1}) == {q}


def test_headers_two_bindings_same_queue_one_copy(s: Session) -> None:
    ex = s.exchange("headers")
    q = s.queue()
    s.ch.queue_bind(q, ex, "", arguments={"x-match": "any", "a": 1})
    s.ch.queue_bind(q, ex, "", arguments={"x-match": "any", "b": 2})
    assert routed(s.ch, [q], ex, headers={"a": 1, "b": 2}) == {q}
    s.ch.queue_unbind(q, ex, "", arguments={"x-match": "any", "a": 1})
    assert routed(s.ch, [q], ex, headers={"a": 1}) == set()
    assert routed(s.ch, [q], ex, headers={"b": 2}) == {q}


def test_headers_invalid_x_match_is_refused(s: Session) -> None:
    ex = s.exchange("headers")
    q = s.queue()
    text = channel_error(406, s.ch.queue_bind, q, ex, "", arguments={"x-match": "some"})
    assert text.startswith("PRECONDITION_FAILED")


# -- predeclared and default exchanges --------------------------------------------------


@pytest.mark.parametrize(
    ("name", "type_"),
    [
        ("amq.direct", "direct"),
        ("amq.fanout", "fanout"),
        ("amq.topic", "topic"),
        ("amq.headers", "headers"),
        ("amq.match", "headers"),
    ],
)
def test_predeclared_exchanges_exist(s: Session, name: str, type_: str) -> None:
    s.ch.exchange_declare(name, passive=True)
    # Redeclaring with the same properties is allowed; a different type is not.
    s.ch.exchange_declare(name, type_, durable=True)
    other = "fanout" if type_ != "fanout" else "direct"
    text = channel_error(406, s.ch.exchange_declare, name, other, durable=True)
    assert "inequivalent arg 'type'" in text


def test_predeclared_exchanges_route_by_their_type(s: Session) -> None:
    q = s.queue()
    s.ch.queue_bind(q, "amq.direct", "dk")
    s.ch.queue_bind(q, "amq.fanout", "")
    s.ch.queue_bind(q, "amq.topic", "t.*")
    s.ch.queue_bind(q, "amq.headers", "", arguments={"x-match": "all", "h": "1"})
    s.ch.queue_bind(q, "amq.match", "", arguments={"x-match": "any", "m": "1"})
    assert routed(s.ch, [q], "amq.direct", "dk") == {q}
    assert routed(s.ch, [q], "amq.direct", "other") == set()
    assert routed(s.ch, [q], "amq.fanout", "anything") == {q}
    assert routed(s.ch, [q], "amq.topic", "t.x") == {q}
    assert routed(s.ch, [q], "amq.topic", "t.x.y") == set()
    assert routed(s.ch, [q], "amq.headers", headers={"h": "1"}) == {q}
    assert routed(s.ch, [q], "amq.headers", headers={"h": "2"}) == set()
    assert routed(s.ch, [q], "amq.match", headers={"m": "1", "z": 0}) == {q}
    assert routed(s.ch, [q], "amq.match", headers={"z": 0}) == set()
    for ex, key in (("amq.direct", "dk"), ("amq.fanout", ""), ("amq.topic", "t.*")):
        s.ch.queue_unbind(q, ex, key)
    assert routed(s.ch, [q], "amq.direct", "dk") == set()
    assert routed(s.ch, [q], "amq.fanout", "") == set()


def test_default_exchange_routes_by_queue_name(s: Session) -> None:
    q1, q2 = s.queue(), s.queue()
    assert routed(s.ch, [q1, q2], "", q1) == {q1}
    assert routed(s.ch, [q1, q2], "", q2) == {q2}
    assert routed(s.ch, [q1, q2], "", "no-such-queue") == set()


def test_default_exchange_unroutable_is_returned(s: Session) -> None:
    s.ch.confirm_delivery()
    with pytest.raises(UnroutableError) as info:
        s.ch.basic_publish("", uniq("missing"), b"x", mandatory=True)
    (returned,) = info.value.messages
    assert returned.method.reply_code == 312
    assert returned.method.reply_text == "NO_ROUTE"
    assert returned.body == b"x"


def test_default_exchange_cannot_be_bound(s: Session) -> None:
    q = s.queue()
    text = channel_error(403, s.ch.queue_bind, q, "", q)
    assert text.startswith("ACCESS_REFUSED")


def test_default_exchange_cannot_be_declared(s: Session) -> None:
    channel_error(403, s.ch.exchange_declare, "", "direct")


def test_default_exchange_passive_declare_refused(s: Session) -> None:
    channel_error(403, s.ch.exchange_declare, "", passive=True)


def test_default_exchange_cannot_be_deleted(s: Session) -> None:
    text = channel_error(403, s.ch.exchange_delete, "")
    assert text.startswith("ACCESS_REFUSED")


def test_predeclared_exchange_cannot_be_deleted(s: Session) -> None:
    channel_error(403, s.ch.exchange_delete, "amq.direct")
    s.reopen()
    assert exchange_exists(s.conn, "amq.direct")


# -- declare, passive, redeclare, delete ----------------------------------------------


def test_passive_declare(s: Session) -> None:
    ex = s.exchange("topic")
    s.ch.exchange_declare(ex, passive=True)
    name = uniq("missing")
    text = channel_error(404, s.ch.exchange_declare, name, passive=True)
    assert text == f"NOT_FOUND - no exchange '{name}' in vhost '/'"


def test_declare_reserved_amq_prefix_refused(s: Session) -> None:
    name = "amq." + uniq("mine")
    text = channel_error(403, s.ch.exchange_declare, name, "direct")
    assert text.startswith("ACCESS_REFUSED")
    assert "amq." in text
    s.reopen()
    assert not exchange_exists(s.conn, name)


def test_redeclare_with_different_type_fails(s: Session) -> None:
    ex = s.exchange("direct")
    text = channel_error(406, s.ch.exchange_declare, ex, "topic")
    assert text == (
        f"PRECONDITION_FAILED - inequivalent arg 'type' for exchange '{ex}' in vhost '/': "
        "received 'topic' but current is 'direct'"
    )


@pytest.mark.parametrize("flag", ["durable", "auto_delete", "internal"])
def test_redeclare_with_different_flag_fails(s: Session, flag: str) -> None:
    ex = s.exchange("direct")
    s.ch.exchange_declare(ex, "direct")  # same again is fine
    text = channel_error(406, s.ch.exchange_declare, ex, "direct", **{flag: True})
    assert f"inequivalent arg '{flag}'" in text


def test_declare_unknown_type_is_a_channel_error(s: Session) -> None:
    """RabbitMQ 3.12.x/3.13 and later (3.10 closed the connection with 503)."""
    text = channel_error(406, s.ch.exchange_declare, uniq("x"), "no-such-type")
    assert text == "PRECONDITION_FAILED - unknown exchange type 'no-such-type'"
    s.reopen()  # the connection lives on
    s.ch.exchange_declare(s.exchange("direct"), "direct")


def test_delete_if_unused(s: Session) -> None:
    ex = s.exchange("fanout")
    q = s.queue()
    s.ch.queue_bind(q, ex)
    text = channel_error(406, s.ch.exchange_delete, ex, if_unused=True)
    assert text.startswith("PRECONDITION_FAILED")
    ch = s.reopen()
    assert exchange_exists(s.conn, ex)
    ch.queue_unbind(q, ex)
    ch.exchange_delete(ex, if_unused=True)
    assert not exchange_exists(s.conn, ex)


def test_delete_if_unused_ignores_inbound_exchange_bindings(s: Session) -> None:
    src, dest = s.exchange("fanout"), s.exchange("fanout")
    s.ch.exchange_bind(dest, src)
    s.ch.exchange_delete(dest, if_unused=True)
    assert not exchange_exists(s.conn, dest)


def test_delete_missing_exchange_succeeds(s: Session) -> None:
    s.ch.exchange_delete(uniq("missing"))
    barrier(s.ch)


def test_delete_removes_bindings(s: Session) -> None:
    ex = s.exchange("direct")
    q = s.queue()
    s.ch.queue_bind(q, ex, "k")
    s.ch.exchange_delete(ex)
    s.ch.exchange_declare(ex, "direct")
    assert routed(s.ch, [q], ex, "k") == set()


def test_publish_to_missing_exchange_is_404(s: Session) -> None:
    name = uniq("missing")
    s.ch.basic_publish(name, "k", b"x")
    text = channel_error(404, barrier, s.ch)
    assert text == f"NOT_FOUND - no exchange '{name}' in vhost '/'"


def test_publish_to_deleted_exchange_is_404(s: Session) -> None:
    ex = s.exchange("fanout")
    q = s.queue()
    s.ch.queue_bind(q, ex)
    assert routed(s.ch, [q], ex) == {q}
    s.ch.exchange_delete(ex)
    s.ch.basic_publish(ex, "", b"x")
    channel_error(404, barrier, s.ch)


# -- durable / auto-delete ----------------------------------------------------------------


def test_durable_and_transient_exchanges_route(s: Session) -> None:
    durable = s.exchange("direct", durable=True)
    transient = s.exchange("direct", durable=False)
    q = s.queue()
    s.ch.queue_bind(q, durable, "k")
    s.ch.queue_bind(q, transient, "k")
    assert routed(s.ch, [q], durable, "k") == {q}
    assert routed(s.ch, [q], transient, "k") == {q}


def test_auto_delete_exchange_goes_with_last_binding(s: Session) -> None:
    ex = s.exchange("direct", auto_delete=True)
    q1, q2 = s.queue(), s.queue()
    s.ch.queue_bind(q1, ex, "a")
    s.ch.queue_bind(q2, ex, "b")
    s.ch.queue_unbind(q1, ex, "a")
    assert exchange_exists(s.conn, ex)
    s.ch.queue_unbind(q2, ex, "b")
    assert not exchange_exists(s.conn, ex)


def test_auto_delete_exchange_goes_when_bound_queue_is_deleted(s: Session) -> None:
    ex = s.exchange("fanout", auto_delete=True)
    q = s.queue()
    s.ch.queue_bind(q, ex)
    s.ch.queue_delete(q)
    assert not exchange_exists(s.conn, ex)


def test_auto_delete_exchange_goes_with_last_exchange_binding(s: Session) -> None:
    src = s.exchange("fanout", auto_delete=True)
    dest = s.exchange("fanout")
    s.ch.exchange_bind(dest, src)
    assert exchange_exists(s.conn, src)
    s.ch.exchange_unbind(dest, src)
    assert not exchange_exists(s.conn, src)
    assert exchange_exists(s.conn, dest)


def test_auto_delete_exchange_never_bound_stays(s: Session) -> None:
    ex = s.exchange("topic", auto_delete=True)
    q = s.queue()
    barrier(s.ch)
    assert exchange_exists(s.conn, ex)
    # Being a destination does not count as use.
    src = s.exchange("fanout")
    s.ch.exchange_bind(ex, src)
    s.ch.exchange_unbind(ex, src)
    assert exchange_exists(s.conn, ex)
    s.ch.queue_bind(q, ex, "#")
    assert routed(s.ch, [q], ex, "a") == {q}


# -- internal exchanges -----------------------------------------------------------------


def test_publish_to_internal_exchange_refused(s: Session) -> None:
    ex = s.exchange("fanout", internal=True)
    q = s.queue()
    s.ch.queue_bind(q, ex)
    s.ch.basic_publish(ex, "", b"x")
    text = channel_error(403, barrier, s.ch)
    assert text == f"ACCESS_REFUSED - cannot publish to internal exchange '{ex}' in vhost '/'"
    ch = s.reopen()
    assert ch.basic_get(q, auto_ack=True)[0] is None


def test_internal_exchange_reachable_through_exchange_binding(s: Session) -> None:
    internal = s.exchange("direct", internal=True)
    front = s.exchange("topic")
    q = s.queue()
    s.ch.queue_bind(q, internal, "a.b")
    s.ch.exchange_bind(internal, front, "a.*")
    assert routed(s.ch, [q], front, "a.b") == {q}
    assert routed(s.ch, [q], front, "a.c") == set()  # the internal direct filters it
    assert routed(s.ch, [q], front, "x.b") == set()


# -- alternate exchange -----------------------------------------------------------------


def test_alternate_exchange_gets_unroutable_messages(s: Session) -> None:
    ae = s.exchange("fanout")
    ae_q = s.queue()
    s.ch.queue_bind(ae_q, ae)
    main = s.exchange("direct", arguments={"alternate-exchange": ae})
    q = s.queue()
    s.ch.queue_bind(q, main, "k")
    assert routed(s.ch, [q, ae_q], main, "k") == {q}
    assert routed(s.ch, [q, ae_q], main, "other") == {ae_q}


def test_mandatory_message_routed_via_alternate_exchange_is_not_returned(s: Session) -> None:
    ae = s.exchange("fanout")
    ae_q = s.queue()
    s.ch.queue_bind(ae_q, ae)
    main = s.exchange("direct", arguments={"alternate-exchange": ae})
    s.ch.confirm_delivery()
    s.ch.basic_publish(main, "nowhere", b"via-ae", mandatory=True)  # no UnroutableError
    method, _props, body = s.ch.basic_get(ae_q, auto_ack=True)
    assert body == b"via-ae"
    assert method.exchange == main
    assert method.routing_key == "nowhere"


def test_alternate_exchange_that_routes_nowhere_returns_mandatory(s: Session) -> None:
    ae = s.exchange("direct")  # no bindings
    main = s.exchange("direct", arguments={"alternate-exchange": ae})
    s.ch.confirm_delivery()
    with pytest.raises(UnroutableError):
        s.ch.basic_publish(main, "nowhere", b"x", mandatory=True)


def test_missing_alternate_exchange_means_unroutable(s: Session) -> None:
    main = s.exchange("direct", arguments={"alternate-exchange": uniq("missing")})
    q = s.queue()
    s.ch.queue_bind(q, main, "k")
    s.ch.confirm_delivery()
    with pytest.raises(UnroutableError):
        s.ch.basic_publish(main, "nowhere", b"x", mandatory=True)
    s.ch.basic_publish(main, "k", b"y", mandatory=True)
    assert s.ch.basic_get(q, auto_ack=True)[2] == b"y"


def test_alternate_exchange_chain(s: Session) -> None:
    last = s.exchange("fanout")
    last_q = s.queue()
    s.ch.queue_bind(last_q, last)
    middle = s.exchange("direct", arguments={"alternate-exchange": last})
    middle_q = s.queue()
    s.ch.queue_bind(middle_q, middle, "m")
    first = s.exchange("direct", arguments={"alternate-exchange": middle})
    qs = [middle_q, last_q]
    assert routed(s.ch, qs, first, "m") == {middle_q}
    assert routed(s.ch, qs, first, "x") == {last_q}


def test_alternate_exchange_cycle_does_not_loop(s: Session) -> None:
    a_name, b_name = uniq("ae-a"), uniq("ae-b")
    a = s.exchange("direct", a_name, arguments={"alternate-exchange": b_name})
    b = s.exchange("direct", b_name, arguments={"alternate-exchange": a_name})
    qa, qb = s.queue(), s.queue()
    s.ch.queue_bind(qa, a, "ka")
    s.ch.queue_bind(qb, b, "kb")
    assert routed(s.ch, [qa, qb], a, "kb") == {qb}
    assert routed(s.ch, [qa, qb], b, "ka") == {qa}
    assert routed(s.ch, [qa, qb], a, "none") == set()


def test_alternate_exchange_not_used_when_a_binding_matched(s: Session) -> None:
    """A match to an exchange that leads nowhere still counts as routed by this exchange."""
    ae = s.exchange("fanout")
    ae_q = s.queue()
    s.ch.queue_bind(ae_q, ae)
    dead_end = s.exchange("direct")
    main = s.exchange("fanout", arguments={"alternate-exchange": ae})
    s.ch.exchange_bind(dead_end, main)
    assert routed(s.ch, [ae_q], main, "k") == set()


def test_alternate_exchange_of_internal_exchange_is_used(s: Session) -> None:
    ae = s.exchange("fanout")
    ae_q = s.queue()
    s.ch.queue_bind(ae_q, ae)
    inner = s.exchange("direct", internal=True, arguments={"alternate-exchange": ae})
    front = s.exchange("fanout")
    s.ch.exchange_bind(inner, front)
    assert routed(s.ch, [ae_q], front, "k") == {ae_q}


# -- exchange-to-exchange bindings ------------------------------------------------------


def test_exchange_binding_chain(s: Session) -> None:
    src = s.exchange("fanout")
    mid = s.exchange("direct")
    leaf = s.exchange("topic")
    q_mid, q_leaf = s.queue(), s.queue()
    s.ch.exchange_bind(mid, src)
    s.ch.exchange_bind(leaf, mid, "a.b")
    s.ch.queue_bind(q_mid, mid, "k")
    s.ch.queue_bind(q_leaf, leaf, "a.*")
    qs = [q_mid, q_leaf]
    assert routed(s.ch, qs, src, "k") == {q_mid}
    assert routed(s.ch, qs, src, "a.b") == {q_leaf}
    assert routed(s.ch, qs, src, "a.c") == set()
    assert routed(s.ch, qs, mid, "a.b") == {q_leaf}
    s.ch.exchange_unbind(leaf, mid, "a.b")
    assert routed(s.ch, qs, src, "a.b") == set()
    s.ch.exchange_unbind(mid, src)
    assert routed(s.ch, qs, src, "k") == set()
    assert routed(s.ch, qs, mid, "k") == {q_mid}


def test_a_long_exchange_binding_chain_routes(s: Session) -> None:
    """Routing follows exchange-to-exchange bindings with an explicit stack: a chain
    far longer than Python's recursion limit routes (and a bound queue half-way)."""
    chain = [s.exchange("fanout") for _ in range(1500)]
    for upstream, downstream in zip(chain, chain[1:], strict=False):
        s.ch.exchange_bind(downstream, upstream)
    middle, end = s.queue(), s.queue()
    s.ch.queue_bind(middle, chain[700])
    s.ch.queue_bind(end, chain[-1])
    assert routed(s.ch, [middle, end], chain[0], "k") == {middle, end}


def test_exchange_binding_cycle_delivers_once(s: Session) -> None:
    a, b, c = s.exchange("fanout"), s.exchange("fanout"), s.exchange("fanout")
    s.ch.exchange_bind(b, a)
    s.ch.exchange_bind(c, b)
    s.ch.exchange_bind(a, c)
    s.ch.exchange_bind(a, a)  # a self-loop too
    qa, qc = s.queue(), s.queue()
    s.ch.queue_bind(qa, a)
    s.ch.queue_bind(qc, c)
    for start in (a, b, c):
        assert routed(s.ch, [qa, qc], start, "k") == {qa, qc}


def test_exchange_binding_diamond_delivers_once(s: Session) -> None:
    top = s.exchange("fanout")
    left, right = s.exchange("fanout"), s.exchange("fanout")
    q = s.queue()
    s.ch.exchange_bind(left, top)
    s.ch.exchange_bind(right, top)
    s.ch.queue_bind(q, left)
    s.ch.queue_bind(q, right)
    assert routed(s.ch, [q], top, "k") == {q}


def test_exchange_binding_with_headers_arguments(s: Session) -> None:
    src = s.exchange("headers")
    dest = s.exchange("fanout")
    q = s.queue()
    s.ch.exchange_bind(dest, src, arguments={"x-match": "all", "color": "red"})
    s.ch.queue_bind(q, dest)
    assert routed(s.ch, [q], src, headers={"color": "red"}) == {q}
    assert routed(s.ch, [q], src, headers={"color": "blue"}) == set()
    s.ch.exchange_unbind(dest, src, arguments={"x-match": "all", "color": "red"})
    assert routed(s.ch, [q], src, headers={"color": "red"}) == set()


def test_exchange_bind_missing_source_is_404(s: Session) -> None:
    dest = s.exchange("fanout")
    text = channel_error(404, s.ch.exchange_bind, dest, uniq("missing"))
    assert text.startswith("NOT_FOUND - no exchange")


def test_exchange_bind_missing_destination_is_404(s: Session) -> None:
    src = s.exchange("fanout")
    text = channel_error(404, s.ch.exchange_bind, uniq("missing"), src)
    assert text.startswith("NOT_FOUND - no exchange")


def test_queue_bind_missing_exchange_is_404(s: Session) -> None:
    q = s.queue()
    text = channel_error(404, s.ch.queue_bind, q, uniq("missing"), "k")
    assert text.startswith("NOT_FOUND - no exchange")


def test_deleting_destination_exchange_removes_its_inbound_bindings(s: Session) -> None:
    src = s.exchange("fanout")
    dest = s.exchange("fanout")
    q = s.queue()
    s.ch.exchange_bind(dest, src)
    s.ch.queue_bind(q, dest)
    assert routed(s.ch, [q], src) == {q}
    s.ch.exchange_delete(dest)
    s.ch.exchange_declare(dest, "fanout")
    s.ch.queue_bind(q, dest)
    assert routed(s.ch, [q], src) == set()
    assert routed(s.ch, [q], dest) == {q}
