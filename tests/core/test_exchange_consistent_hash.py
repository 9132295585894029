"""The x-consistent-hash exchange (rabbitmq_consistent_hash_exchange) as a
client sees it.

The error texts and the accepted binding keys were checked against RabbitMQ
3.10.8 with the plugin enabled.

In memory (issue 29): a tests/harness broker, pika's calls over MemoryAMQP
(harness.channel, frames by pamqp; pika over a socket before); a restart is a
new Harness on the same data dir.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from harness import Channel, Harness, Session, channel_error, harness_fixture
from harness.channel import Unroutable
from pamqp import commands

CHX = "x-consistent-hash"

broker = harness_fixture()


@pytest.fixture
def s(broker: Harness) -> Session:
    return Session(broker)


def counts(ch: Channel, queues: list[str]) -> list[int]:
    ch.barrier()
    return [ch.queue_declare(q, passive=True).method.message_count for q in queues]


def publish_keys(
    ch: Channel,
    exchange: str,
    keys: list[str],
    props: Callable[[str], commands.Basic.Properties] | None = None,
    routing_key: Callable[[str], str] = lambda key: key,
) -> None:
    for key in keys:
        properties = props(key) if props is not None else None
        ch.basic_publish(exchange, routing_key(key), key.encode(), properties)
    ch.barrier()


def drain(ch: Channel, queues: list[str]) -> dict[str, str]:
    """Empty the queues; which queue each message body (a key) was in."""
    where: dict[str, str] = {}
    for q in queues:
        while True:
            method, _props, body = ch.basic_get(q, auto_ack=True)
            if method is None:
                break
            key = body.decode()
            assert key not in where, f"{key} routed to {where[key]} and {q}"
            where[key] = q
    return where


def mapping(
    ch: Channel,
    exchange: str,
    keys: list[str],
    queues: list[str],
    **kwargs: Any,
) -> dict[str, str]:
    publish_keys(ch, exchange, keys, **kwargs)
    where = drain(ch, queues)
    assert sorted(where) == sorted(keys), "every message goes to exactly one queue"
    return where


def setup(s: Session, weights: dict[str, str], **declare: Any) -> str:
    ex = s.exchange(CHX, **declare)
    for q, weight in weights.items():
        s.queue(q)
        s.ch.queue_bind(q, ex, weight)
    return ex


def test_distribution_follows_the_weights(s: Session) -> None:
    weights = {"chx-w1": "1", "chx-w2": "2", "chx-w3": "3"}
    ex = setup(s, weights)
    n = 10_000
    publish_keys(s.ch, ex, [f"order-{i}" for i in range(n)])
    got = counts(s.ch, list(weights))
    assert sum(got) == n
    for count, weight in zip(got, weights.values(), strict=True):
        expected = n * int(weight) / 6
        assert abs(count - expected) < 0.12 * expected, (got, weight)


def test_the_same_key_always_goes_to_the_same_queue(s: Session) -> None:
    queues = ["chx-a", "chx-b", "chx-c"]
    ex = setup(s, dict.fromkeys(queues, "1"))
    keys = [f"user-{i}" for i in range(300)]
    first = mapping(s.ch, ex, keys, queues)
    assert set(first.values()) == set(queues)
    assert mapping(s.ch, ex, keys, queues) == first
    # Many messages with one key: all in one queue.
    publish_keys(s.ch, ex, ["same"] * 50)
    assert sorted(counts(s.ch, queues)) == [0, 0, 50]


def test_adding_a_binding_moves_only_its_share(s: Session) -> None:
    queues = ["chx-1", "chx-2"]
    ex = setup(s, dict.fromkeys(queues, "1"))
    keys = [f"k{i}" for i in range(1500)]
    before = mapping(s.ch, ex, keys, queues)
    s.queue("chx-3")
    s.ch.queue_bind("chx-3", ex, "1")
    after = mapping(s.ch, ex, keys, [*queues, "chx-3"])
    moved = [k for k in keys if before[k] != after[k]]
    assert all(after[k] == "chx-3" for k in moved), "keys only move to the new queue"
    assert 0.25 * len(keys) < len(moved) < 0.42 * len(keys)  # about a third


def test_unbinding_moves_only_that_queues_keys(s: Session) -> None:
    queues = ["chx-x", "chx-y", "chx-z"]
    ex = setup(s, {"chx-x": "1", "chx-y": "1", "chx-z": "2"})
    keys = [f"k{i}" for i in range(1200)]
    before = mapping(s.ch, ex, keys, queues)
    s.ch.queue_unbind("chx-z", ex, "2")
    after = mapping(s.ch, ex, keys, queues)
    assert "chx-z" not in after.values()
    assert all(after[k] == before[k] for k in keys if before[k] != "chx-z")
    # Bound again: exactly the old mapping is back.
    s.ch.queue_bind("chx-z", ex, "2")
    assert mapping(s.ch, ex, keys, queues) == before


def test_deleting_a_bound_queue_takes_it_off_the_ring(s: Session) -> None:
    queues = ["chx-d1", "chx-d2"]
    ex = setup(s, dict.fromkeys(queues, "1"))
    s.ch.queue_delete("chx-d2")
    publish_keys(s.ch, ex, [f"k{i}" for i in range(100)])
    assert counts(s.ch, ["chx-d1"]) == [100]


@pytest.mark.parametrize("argument", ["hash-header", "x-hash-on"])
def test_hashing_on_a_header(s: Session, argument: str) -> None:
    queues = ["chx-h1", "chx-h2", "chx-h3"]
    ex = setup(s, dict.fromkeys(queues, "1"), arguments={argument: "tenant"})
    keys = [f"tenant-{i}" for i in range(300)]

    def with_header(key: str) -> commands.Basic.Properties:
        return commands.Basic.Properties(headers={"tenant": key})

    # The routing key changes with every message; only the header decides.
    counter = iter(range(10**6))
    first = mapping(
        s.ch, ex, keys, queues, props=with_header, routing_key=lambda k: str(next(counter))
    )
    assert set(first.values()) == set(queues)
    again = mapping(
        s.ch, ex, keys, queues, props=with_header, routing_key=lambda k: f"other-{next(counter)}"
    )
    assert again == first
    # No header: routed all the same, all to one queue (RabbitMQ hashes 'undefined').
    publish_keys(s.ch, ex, [f"r{i}" for i in range(60)])
    assert sorted(counts(s.ch, queues)) == [0, 0, 60]


@pytest.mark.parametrize("prop", ["message_id", "correlation_id", "timestamp"])
def test_hashing_on_a_property(s: Session, prop: str) -> None:
    queues = ["chx-p1", "chx-p2", "chx-p3"]
    ex = setup(s, dict.fromkeys(queues, "1"), arguments={"hash-property": prop})
    keys = [str(1_700_000_000 + i) for i in range(300)]

    def props(key: str) -> commands.Basic.Properties:
        value: Any = key
        if prop == "timestamp":  # pamqp's timestamp is a datetime (pika's an int)
            value = datetime.datetime.fromtimestamp(int(key), datetime.UTC)
        return commands.Basic.Properties(**{prop: value})

    first = mapping(s.ch, ex, keys, queues, props=props, routing_key=lambda k: "fixed")
    assert set(first.values()) == set(queues)
    assert mapping(s.ch, ex, keys, queues, props=props, routing_key=lambda k: "other") == first


def test_binding_keys_are_weights(s: Session) -> None:
    ex = s.exchange(CHX)
    q = s.queue()
    texts = {
        "abc": 'The binding key must be an integer: <<"abc">>',
        "": "The binding key must be an integer: <<>>",
        " 5": 'The binding key must be an integer: <<" 5">>',
        "1.5": 'The binding key must be an integer: <<"1.5">>',
        "0": "The binding key must be greater than 0",
        "-1": "The binding key must be greater than 0",
        "1001": "The binding key must be at most 1000",
    }
    for key, text in texts.items():
        assert channel_error(406, s.ch.queue_bind, q, ex, key) == f"PRECONDITION_FAILED - {text}"
        s.reopen()
    for key in ("+5", "05", "1000"):  # list_to_integer/1 takes these, as RabbitMQ does
        s.ch.queue_bind(q, ex, key)


@pytest.mark.parametrize(
    ("arguments", "text"),
    [
        ({"hash-property": "app_id"}, "Unsupported property: app_id"),
        (
            {"hash-property": "message_id", "hash-header": "h"},
            "hash-header and hash-property are mutually exclusive",
        ),
        ({"hash-header": 5}, "invalid type 'signedint' for arg 'hash-header': expected longstr"),
        ({"hash-property": True}, "invalid type 'bool' for arg 'hash-property': expected longstr"),
    ],
)
def test_invalid_arguments(s: Session, arguments: dict[str, Any], text: str) -> None:
    reply = channel_error(406, s.ch.exchange_declare, "chx-bad", CHX, arguments=arguments)
    assert reply == f"PRECONDITION_FAILED - {text}"
    s.reopen()
    channel_error(404, s.ch.exchange_declare, "chx-bad", CHX, passive=True)


def test_redeclaring_with_other_arguments_keeps_the_first(s: Session) -> None:
    # RabbitMQ compares only alternate-exchange on redeclaration, for this type too.
    queues = ["chx-r1", "chx-r2"]
    ex = setup(s, dict.fromkeys(queues, "1"), arguments={"hash-header": "h"})
    s.ch.exchange_declare(ex, CHX, arguments={"hash-header": "other"})
    s.ch.exchange_declare(ex, CHX)
    publish_keys(s.ch, ex, [f"k{i}" for i in range(50)])  # no header h: one queue
    assert sorted(counts(s.ch, queues)) == [0, 50]


def test_exchange_to_exchange(s: Session) -> None:
    # Into a consistent-hash exchange from a fanout, and from it into a fanout.
    front = s.exchange("fanout")
    ex = s.exchange(CHX)
    s.ch.exchange_bind(ex, front)
    back = s.exchange("fanout")
    s.queue("chx-e1")
    s.queue("chx-e2")
    s.queue("chx-e3")
    s.ch.queue_bind("chx-e1", ex, "1")
    s.ch.exchange_bind(back, ex, "1")
    s.ch.queue_bind("chx-e2", back)
    s.ch.queue_bind("chx-e3", back)
    publish_keys(s.ch, front, [f"k{i}" for i in range(400)])
    direct, via_back, via_back2 = counts(s.ch, ["chx-e1", "chx-e2", "chx-e3"])
    assert direct + via_back == 400
    assert via_back == via_back2 > 100 and direct > 100


def test_unroutable_without_bindings(s: Session) -> None:
    ex = s.exchange(CHX)
    s.ch.confirm_delivery()
    with pytest.raises(Unroutable):
        s.ch.basic_publish(ex, "k", b"x", mandatory=True)


def test_exchange_bindings_and_mapping_survive_a_restart(tmp_path: Path) -> None:
    queues = ["chx-s1", "chx-s2", "chx-s3"]
    keys = [f"account-{i}" for i in range(600)]

    def props(key: str) -> commands.Basic.Properties:
        return commands.Basic.Properties(headers={"acct": key})

    with Harness(tmp_path / "data") as b:
        conn = b.amqp_connection()
        ch = conn.channel()
        ch.exchange_declare("chx-durable", CHX, durable=True, arguments={"hash-header": "acct"})
        for q, weight in zip(queues, ("1", "2", "1"), strict=True):
            ch.queue_declare(q, durable=True)
            ch.queue_bind(q, "chx-durable", weight)
        before = mapping(ch, "chx-durable", keys, queues, props=props)
        conn.close()

    with Harness(tmp_path / "data") as b:
        conn = b.amqp_connection()
        ch = conn.channel()
        ch.exchange_declare("chx-durable", CHX, passive=True)
        assert mapping(ch, "chx-durable", keys, queues, props=props) == before
        # Restored bindings unbind like any other.
        ch.queue_unbind("chx-s2", "chx-durable", "2")
        after = mapping(ch, "chx-durable", keys, queues, props=props)
        assert all(after[k] == before[k] for k in keys if before[k] != "chx-s2")
        conn.close()
