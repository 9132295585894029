"""Vhost limits (max-connections, max-queues) as a client of RabbitMQ 3.10.8 sees them.

Texts checked against RabbitMQ 3.10.8 with ``rabbitmqctl set_vhost_limits`` and pika:
a connection beyond the limit is closed with 530 NOT_ALLOWED at connection.open
(before the user's access to the vhost is checked), a queue beyond the limit is
refused with 406 PRECONDITION_FAILED.

In memory (issue 29): a tests/harness broker, pika's calls over MemoryAMQP
(harness.channel, frames by pamqp); a restart is a new Harness on the same data.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from harness import Connection, ConnectionClosed, Harness, channel_error, harness_fixture

from warren.core.errors import NotFound
from warren.core.runtime_parameters import ValidationFailed

broker = harness_fixture()


def set_limits(broker: Harness, limits: dict[str, Any], vhost: str = "/") -> None:
    broker.call(lambda: broker.broker.set_vhost_limits(vhost, limits))


def connect(broker: Harness, virtual_host: str = "/") -> Connection:
    return broker.amqp_connection(vhost=virtual_host)


def refused_connection(broker: Harness, virtual_host: str = "/") -> str:
    with pytest.raises(ConnectionClosed) as info:
        connect(broker, virtual_host)
    assert info.value.reply_code == 530, info.value
    return info.value.reply_text


def test_connection_beyond_max_connections_gets_530(broker: Harness) -> None:
    set_limits(broker, {"max-connections": 1})
    first = connect(broker)
    try:
        text = refused_connection(broker)
        assert (
            "NOT_ALLOWED - access to vhost '/' refused for user 'guest': "
            "connection limit (1) is reached" in text
        )
    finally:
        first.close()
    # The closed connection no longer counts.
    with connect(broker) as again:
        assert again.is_open


def test_max_connections_zero_allows_none_and_negative_means_no_limit(
    broker: Harness,
) -> None:
    set_limits(broker, {"max-connections": 0})
    assert "connection limit (0) is reached" in refused_connection(broker)
    set_limits(broker, {"max-connections": -1})
    conns = [connect(broker) for _ in range(3)]
    try:
        assert all(c.is_open for c in conns)
        assert broker.call(lambda: broker.broker.vhosts["/"].limiter.connection_count) == 3
    finally:
        for c in conns:
            c.close()


def test_connection_limit_is_checked_before_access(broker: Harness) -> None:
    # RabbitMQ 3.10.8: a user without permissions on a vhost at its limit is told
    # about the limit (rabbit_reader checks it first).
    def setup() -> None:
        b = broker.broker
        b.add_vhost("full")
        b.set_vhost_limits("full", {"max-connections": 0})

    broker.call(setup)
    text = refused_connection(broker, virtual_host="full")
    assert (
        "access to vhost 'full' refused for user 'guest': connection limit (0) is reached" in text
    )


def test_limit_applies_per_vhost(broker: Harness) -> None:
    def setup() -> None:
        b = broker.broker
        b.add_vhost("other")
        b.users.set_permissions("guest", "other")
        b.set_vhost_limits("other", {"max-connections": 1})

    broker.call(setup)
    root = [connect(broker) for _ in range(2)]
    other = connect(broker, virtual_host="other")
    try:
        assert "connection limit (1) is reached" in refused_connection(broker, virtual_host="other")
    finally:
        for c in [*root, other]:
            c.close()


def test_queue_beyond_max_queues_gets_406(broker: Harness) -> None:
    set_limits(broker, {"max-queues": 1})
    with connect(broker) as conn:
        ch = conn.channel()
        ch.queue_declare("lq1")
        ch.queue_declare("lq1")  # redeclaring an existing queue is not a new queue
        text = channel_error(406, ch.queue_declare, "lq2")
        assert text == (
            "PRECONDITION_FAILED - cannot declare queue 'lq2': queue limit in vhost '/' (1) is reached"
        )
        ch = conn.channel()
        text = channel_error(406, ch.queue_declare, "")
        assert text.startswith("PRECONDITION_FAILED - cannot declare queue 'amq.gen-")
        assert text.endswith("': queue limit in vhost '/' (1) is reached")
        # A passive declare of a missing queue is still a 404.
        ch = conn.channel()
        channel_error(404, ch.queue_declare, "lq3", passive=True)
        # The limit is checked before the arguments (RabbitMQ 3.10.8's order).
        ch = conn.channel()
        text = channel_error(406, ch.queue_declare, "lq4", arguments={"x-max-length": -1})
        assert "queue limit in vhost '/' (1) is reached" in text
        ch = conn.channel()
        ch.queue_delete("lq1")
        ch.queue_declare("lq5")


def test_max_queues_zero_and_exclusive_queues_count(broker: Harness) -> None:
    set_limits(broker, {"max-queues": 0})
    with connect(broker) as conn:
        text = channel_error(406, conn.channel().queue_declare, "none")
        assert text.endswith("queue limit in vhost '/' (0) is reached")
        set_limits(broker, {"max-queues": 1})
        ch = conn.channel()
        ch.queue_declare("mine", exclusive=True)
        text = channel_error(406, ch.queue_declare, "second")
        assert "(1) is reached" in text


def test_lowering_a_limit_keeps_what_exists(broker: Harness) -> None:
    with connect(broker) as conn:
        ch = conn.channel()
        for name in ("k1", "k2", "k3"):
            ch.queue_declare(name)
        set_limits(broker, {"max-queues": 1, "max-connections": 1})
        assert ch.queue_declare("k2", passive=True).method.queue == "k2"
        assert conn.is_open
        channel_error(406, ch.queue_declare, "k4")


def test_limits_validation_texts(broker: Harness) -> None:
    b = broker.broker

    def refused(limits: Any) -> list[str]:
        with pytest.raises(ValidationFailed) as info:
            broker.call(lambda: b.set_vhost_limits("/", limits))
        return info.value.errors

    # As rabbitmqctl set_vhost_limits reports them (RabbitMQ 3.10.8).
    assert refused({"max-connections": "x"}) == [
        'max-connections should be a number, actually was <<"x">>'
    ]
    assert refused({"max-channels": 3}) == ['Unrecognised terms [{<<"max-channels">>,3}] in limits']
    assert refused({"max-queues": 1.5}) == ["max-queues should be a number, actually was 1.5"]
    assert broker.call(lambda: b.vhosts["/"].limits) == {}
    with pytest.raises(NotFound, match="Virtual host 'nope' does not exist"):
        broker.call(lambda: b.set_vhost_limits("nope", {"max-queues": 1}))


def test_set_replaces_and_clear_removes(broker: Harness) -> None:
    b = broker.broker
    v = broker.call(lambda: b.vhosts["/"])
    with pytest.raises(NotFound, match="Parameter does not exist"):
        broker.call(lambda: b.clear_vhost_limits("/"))
    set_limits(broker, {"max-connections": 5, "max-queues": 7})
    set_limits(broker, {"max-queues": 3})  # replaces: max-connections is gone
    assert broker.call(lambda: v.limits) == {"max-queues": 3}
    set_limits(broker, {"max-queues": 3, "max-connections": 2})
    broker.call(lambda: b.clear_vhost_limits("/", "max-queues"))
    assert broker.call(lambda: v.limits) == {"max-connections": 2}
    broker.call(lambda: b.clear_vhost_limits("/"))
    assert broker.call(lambda: (v.limits, v.has_limits)) == ({}, False)


def test_limits_survive_a_restart(tmp_path: Path) -> None:
    with Harness(tmp_path / "data") as first:
        set_limits(first, {"max-queues": 1, "max-connections": 1})
    with Harness(tmp_path / "data") as second:
        assert second.call(lambda: second.broker.vhosts["/"].limits) == {
            "max-queues": 1,
            "max-connections": 1,
        }
        with connect(second) as conn:
            assert "connection limit (1) is reached" in refused_connection(second)
            ch = conn.channel()
            ch.queue_declare("only")
            channel_error(406, ch.queue_declare, "too-many")
        second.call(lambda: second.broker.clear_vhost_limits("/"))
    with Harness(tmp_path / "data") as third:
        assert third.call(lambda: third.broker.vhosts["/"].has_limits) is False
