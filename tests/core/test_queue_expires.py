"""x-expires: a queue unused (no consumers, no basic.get, no redeclare) for the
given time is deleted; consumers keep it alive. Time is the broker's ManualClock,
moved by the tests (core/clock.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import BrokerThread, start_broker
from paths import DATA
from pikahelp import connect, uniq

from warren.core.clock import ManualClock


def _exists(conn: Any, q: str) -> bool:
    ch = conn.channel()
    try:
        ch.queue_declare(q, passive=True)
    except Exception:
        return False
    ch.close()
    return True


def test_unused_queue_is_deleted(broker_factory: Callable[..., BrokerThread]) -> None:
    b = broker_factory(clock=ManualClock())
    conn = connect(b)
    ch = conn.channel()
    q = uniq()
    ch.queue_declare(q, arguments={"x-expires": 300})
    ch.basic_publish("", q, b"publishing does not count as use")
    ch.queue_declare(q, passive=True)  # the publish is in before the clock moves
    vhost = b.call(lambda: b.broker.vhosts["/"])
    b.advance(299)
    assert b.call(lambda: q in vhost.queues)
    b.advance(1)
    assert not b.call(lambda: q in vhost.queues)
    assert not _exists(conn, q)
    conn.close()


def test_a_consumer_keeps_the_queue_and_its_departure_restarts_the_clock(
    broker_factory: Callable[..., BrokerThread],
) -> None:
    b = broker_factory(clock=ManualClock())
    conn = connect(b)
    ch = conn.channel()
    q = uniq()
    ch.queue_declare(q, arguments={"x-expires": 300})
    tag = ch.basic_consume(q, lambda *a: None, auto_ack=True)
    vhost = b.call(lambda: b.broker.vhosts["/"])
    b.advance(800)
    assert b.call(lambda: q in vhost.queues)
    ch.basic_cancel(tag)
    b.advance(299)
    assert b.call(lambda: q in vhost.queues)
    b.advance(1)
    assert not b.call(lambda: q in vhost.queues)
    conn.close()


def test_redeclare_and_get_count_as_use(broker_factory: Callable[..., BrokerThread]) -> None:
    b = broker_factory(clock=ManualClock())
    conn = connect(b)
    ch = conn.channel()
    q = uniq()
    ch.queue_declare(q, arguments={"x-expires": 600})
    vhost = b.call(lambda: b.broker.vhosts["/"])
    for i in range(6):  # 1.2 s of use, every 200 ms
        b.advance(200)
        if i % 2:
            ch.queue_declare(q, arguments={"x-expires": 600})
        else:
            ch.basic_get(q)
    assert b.call(lambda: q in vhost.queues)
    b.advance(600)  # unused since the last declaration: gone
    assert not b.call(lambda: q in vhost.queues)
    conn.close()


# -- what counts as use: RabbitMQ 3.10's answers ------------------------------------------

#: Recorded by tests/record_rabbitmq_expires.py: whether each use renews the expiry
#: of a classic and of a quorum queue (a redeclaration renews only a classic one's).
RENEWS = json.loads((DATA / "rabbitmq_expires_renewal.json").read_text())[
    "renews"
]


@pytest.mark.parametrize("kind", ["classic", "quorum"])
@pytest.mark.parametrize("use", ["declare", "passive_declare", "basic_get"])
def test_what_renews_the_expiry_is_rabbitmqs(tmp_path: Path, kind: str, use: str) -> None:
    b = start_broker(tmp_path / "data", clock=ManualClock())
    conn = connect(b)
    try:
        ch = conn.channel()
        q = uniq()
        arguments: dict[str, Any] = {"x-expires": 60_000}
        if kind == "quorum":
            arguments["x-queue-type"] = "quorum"
        ch.queue_declare(q, durable=True, arguments=arguments)
        b.advance(50_000)
        if use == "declare":
            ch.queue_declare(q, durable=True, arguments=arguments)
        elif use == "passive_declare":
            ch.queue_declare(q, passive=True)
        else:
            ch.basic_get(q)
        vhost = b.call(lambda: b.broker.vhosts["/"])
        b.advance(20_000)  # past the first deadline, before a renewed one
        assert b.call(lambda: q in vhost.queues) is RENEWS[kind][use]
        b.advance(40_000)  # past a renewed deadline too
        assert b.call(lambda: q in vhost.queues) is False
    finally:
        conn.close()
        b.stop()
