"""Keyed publish runs (amqp/publish_run.py, ``keyed=True``): publishes to one
exchange with several routing keys, grouped by key (publish order kept across
keys for a topic exchange) in C and in Python alike, and through a broker:
every queue gets its messages in order, confirms cover exactly what is
durable, statistics count every message.

Moved from tests/ to the in-memory harness (tests/harness): the broker part
feeds the same raw frames to AMQPConnection with no socket, each send one
read, so a run is always cut where the test cuts it; nothing here needs a
socket."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from harness import Harness, MemoryAMQP, harness_fixture
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands
from rawamqp import body_frame, header_frame, method_frame
from test_publish_run import SCANNERS

from examples import examples

Scanner = Callable[..., Any]
PERSISTENT = commands.Basic.Properties(delivery_mode=2)


def publish(
    body: bytes,
    rk: str,
    exchange: str = "",
    channel: int = 1,
    properties: commands.Basic.Properties | None = None,
    mandatory: bool = False,
) -> bytes:
    out = method_frame(
        channel, commands.Basic.Publish(exchange=exchange, routing_key=rk, mandatory=mandatory)
    )
    out += header_frame(channel, len(body), properties)
    if body:
        out += body_frame(channel, body)
    return out


def bodies(run: Any) -> list[bytes]:
    return [bytes(run.body(i)) for i in range(len(run))]


@pytest.mark.parametrize("scan", SCANNERS)
@settings(max_examples=examples(150), deadline=None)
@given(
    keys=st.lists(st.sampled_from(["a", "b", "cc", ""]), min_size=1, max_size=30),
    ordered=st.booleans(),
)
def test_groups_are_the_keys_messages_in_order(
    scan: Scanner, keys: list[str], ordered: bool
) -> None:
    data = b"".join(publish(f"{i}".encode(), k) for i, k in enumerate(keys))
    run = scan(data, 0, 131072, 1 << 27, 1000, True)
    assert run is not None and len(run) == len(keys) and run.end == len(data)
    assert run.uniform == (len(set(keys)) == 1)
    groups = run.groups(ordered)
    seen: list[int] = []
    for sub, indexes in groups:
        assert sub.uniform and len(sub) == len(indexes)
        (key,) = {keys[i] for i in indexes}
        assert (
            bytes(sub.method)
            == b"\x00\x3c\x00\x28\x00\x00\x00" + bytes((len(key),)) + key.encode() + b"\x00"
        )
        assert bodies(sub) == [f"{i}".encode() for i in indexes]
        if ordered:
            assert indexes == list(range(indexes[0], indexes[0] + len(indexes)))
        seen += indexes
    assert sorted(seen) == list(range(len(keys)))
    if ordered:
        assert seen == list(range(len(keys)))
        changes = sum(1 for i in range(1, len(keys)) if keys[i] != keys[i - 1])
        assert len(groups) == changes + 1
    else:
        assert len(groups) == len(set(keys))
        assert [indexes[0] for _, indexes in groups] == sorted(indexes[0] for _, indexes in groups)


@pytest.mark.parametrize("scan", SCANNERS)
def test_what_a_keyed_run_does_not_take(scan: Scanner) -> None:
    """Another exchange, another channel, other bits end it; mandatory publishes
    and an unkeyed scan stay one routing key; so does a keyed scan's first key
    when the next message is not a plain one."""
    mixed = publish(b"1", "a") + publish(b"2", "b")
    assert len(scan(mixed, 0, 131072, 1 << 27, 100, True)) == 2
    assert len(scan(mixed, 0, 131072, 1 << 27, 100, False)) == 1
    assert len(scan(mixed, 0, 131072, 1 << 27, 100)) == 1
    assert (
        len(
            scan(
                publish(b"1", "a") + publish(b"2", "b", exchange="x"), 0, 131072, 1 << 27, 100, True
            )
        )
        == 1
    )
    assert (
        len(scan(publish(b"1", "a") + publish(b"2", "b", channel=2), 0, 131072, 1 << 27, 100, True))
        == 1
    )
    assert (
        len(
            scan(
                publish(b"1", "a") + publish(b"2", "b", mandatory=True),
                0,
                131072,
                1 << 27,
                100,
                True,
            )
        )
        == 1
    )
    both_mandatory = publish(b"1", "a", mandatory=True) + publish(b"2", "b", mandatory=True)
    assert len(scan(both_mandatory, 0, 131072, 1 << 27, 100, True)) == 1
    same_mandatory = publish(b"1", "a", mandatory=True) + publish(b"2", "a", mandatory=True)
    assert len(scan(same_mandatory, 0, 131072, 1 << 27, 100, True)) == 2
    props = commands.Basic.Properties(headers={"h": {"nested": "v"}})
    assert (
        len(
            scan(
                publish(b"1", "a") + publish(b"2", "b", properties=props),
                0,
                131072,
                1 << 27,
                100,
                True,
            )
        )
        == 1
    )


# -- through a broker ---------------------------------------------------------------


broker = harness_fixture()


def _get_all(c: MemoryAMQP, queue: str) -> list[bytes]:
    got = []
    while True:
        c.send_method(1, commands.Basic.Get(queue=queue, no_ack=True))
        _, method = c.read_frame()
        if isinstance(method, commands.Basic.GetEmpty):
            return got
        assert isinstance(method, commands.Basic.GetOk)
        _header, body = c.expect_content()
        got.append(body)


def test_round_robin_over_queues_with_confirms(broker: Harness) -> None:
    """One write, publishes spread round-robin over a durable queue (persistent:
    confirmed after the sync), a transient queue with an acking consumer and a
    queue nobody reads, and a key with no queue: every message arrives in order
    where it should, every publish is confirmed once, and the confirms never
    get ahead of the durable queue's sync (no multiple ack covers a publish
    still waiting)."""
    c = broker.amqp_client()
    c.send_method(1, commands.Queue.Declare(queue="dur", durable=True))
    c.expect_method(commands.Queue.DeclareOk)
    for q in ("live", "idle"):
        c.send_method(1, commands.Queue.Declare(queue=q))
        c.expect_method(commands.Queue.DeclareOk)
    c.send_method(1, commands.Basic.Consume(queue="live", consumer_tag="ct"))
    c.expect_method(commands.Basic.ConsumeOk)
    c.send_method(1, commands.Confirm.Select())
    c.expect_method(commands.Confirm.SelectOk)
    keys = ["dur", "live", "idle", "nowhere"]
    n = 200
    sent: dict[str, list[bytes]] = {k: [] for k in keys}
    data = b""
    for i in range(n):
        k = keys[i % 4]
        body = f"{k}-{i}".encode()
        sent[k].append(body)
        data += publish(body, k, properties=PERSISTENT if k == "dur" else None)
    c.send(data)
    confirmed: set[int] = set()
    delivered: list[bytes] = []
    while len(confirmed) < n or len(delivered) < n // 4:
        _, frame = c.read_frame()
        if isinstance(frame, commands.Basic.Ack):
            new = (
                set(range(1, frame.delivery_tag + 1)) - confirmed
                if frame.multiple
                else {frame.delivery_tag}
            )
            assert not (new & confirmed) or frame.multiple
            confirmed |= new
        elif isinstance(frame, commands.Basic.Deliver):
            _header, body = c.expect_content()
            delivered.append(body)
            c.send_method(1, commands.Basic.Ack(delivery_tag=frame.delivery_tag))
        else:
            raise AssertionError(frame)
    assert confirmed == set(range(1, n + 1))
    assert delivered == sent["live"]
    assert _get_all(c, "dur") == sent["dur"]
    assert _get_all(c, "idle") == sent["idle"]

    def counts() -> tuple[int, int]:
        stats = broker.broker.vhosts["/"].default_exchange.stats
        return stats.publish_in, stats.publish_out

    assert broker.call(counts) == (n, 3 * n // 4)
    c.close()


def test_a_topic_refusal_stops_a_keyed_run_where_it_happens(broker: Harness) -> None:
    """Topic permissions may refuse one routing key: the messages before it in
    the write are routed, the refused one closes the channel, none after it
    arrives (a topic exchange keeps publish order across keys)."""
    b = broker.broker
    broker.call(lambda: b.users.add_user("t", "t", tags=[]))
    broker.call(lambda: b.users.set_permissions("t", "/", ".*", ".*", ".*"))
    broker.call(lambda: b.users.set_topic_permission("t", "/", "amq.topic", "^ok", "^ok"))
    c = broker.amqp()
    c.handshake(user="t", password="t")
    c.open_channel(1)
    for q, key in (("t1", "ok.1"), ("t2", "ok.2")):
        c.send_method(1, commands.Queue.Declare(queue=q))
        c.expect_method(commands.Queue.DeclareOk)
        c.send_method(1, commands.Queue.Bind(queue=q, exchange="amq.topic", routing_key=key))
        c.expect_method(commands.Queue.BindOk)
    data = (
        publish(b"a", "ok.1", exchange="amq.topic")
        + publish(b"b", "ok.2", exchange="amq.topic")
        + publish(b"c", "ok.1", exchange="amq.topic")
        + publish(b"refused", "no.1", exchange="amq.topic")
        + publish(b"d", "ok.1", exchange="amq.topic")
        + publish(b"e", "ok.2", exchange="amq.topic")
    )
    c.send(data)
    code, text, _cls, _meth = c.expect_channel_close(1)
    assert code == 403 and "no.1" in text
    c.send_method(1, commands.Channel.CloseOk())
    c.open_channel(1)
    assert _get_all(c, "t1") == [b"a", b"c"]
    assert _get_all(c, "t2") == [b"b"]
    c.close()
