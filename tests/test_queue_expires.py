"""x-expires: a queue unused (no consumers, no basic.get, no redeclare) for the
given time is deleted; consumers keep it alive."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import BrokerThread
from pikahelp import connect, uniq

from warren.config import Config


def _exists(conn: Any, q: str) -> bool:
    ch = conn.channel()
    try:
        ch.queue_declare(q, passive=True)
    except Exception:
        return False
    ch.close()
    return True


def test_unused_queue_is_deleted(broker: BrokerThread) -> None:
    conn = connect(broker)
    ch = conn.channel()
    q = uniq()
    ch.queue_declare(q, arguments={"x-expires": 300})
    ch.basic_publish("", q, b"publishing does not count as use")
    start = time.monotonic()
    vhost = broker.call(lambda: broker.broker.vhosts["/"])
    while broker.call(lambda: q in vhost.queues):
        assert time.monotonic() - start < 5, "queue did not expire"
        conn.process_data_events(time_limit=0.05)
    assert time.monotonic() - start >= 0.3
    assert not _exists(conn, q)
    conn.close()


def test_a_consumer_keeps_the_queue_and_its_departure_restarts_the_clock(
    broker: BrokerThread,
) -> None:
    conn = connect(broker)
    ch = conn.channel()
    q = uniq()
    ch.queue_declare(q, arguments={"x-expires": 300})
    tag = ch.basic_consume(q, lambda *a: None, auto_ack=True)
    deadline = time.monotonic() + 0.8
    while time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)
    vhost = broker.call(lambda: broker.broker.vhosts["/"])
    assert broker.call(lambda: q in vhost.queues)
    ch.basic_cancel(tag)
    cancelled = time.monotonic()
    while broker.call(lambda: q in vhost.queues):
        assert time.monotonic() - cancelled < 5, "queue did not expire"
        conn.process_data_events(time_limit=0.05)
    assert time.monotonic() - cancelled >= 0.3
    conn.close()


def test_redeclare_and_get_count_as_use(broker: BrokerThread) -> None:
    conn = connect(broker)
    ch = conn.channel()
    q = uniq()
    ch.queue_declare(q, arguments={"x-expires": 600})
    vhost = broker.call(lambda: broker.broker.vhosts["/"])
    start = time.monotonic()
    for i in range(6):  # 1.2 s of use, every 200 ms
        deadline = start + 0.2 * (i + 1)
        while time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.02)
        if i % 2:
            ch.queue_declare(q, arguments={"x-expires": 600})
        else:
            ch.basic_get(q)
    assert broker.call(lambda: q in vhost.queues)
    conn.close()


# -- what counts as use: RabbitMQ 3.10's answers ------------------------------------------

#: Recorded by tests/record_rabbitmq_expires.py: whether each use renews the expiry
#: of a classic and of a quorum queue (a redeclaration renews only a classic one's).
RENEWS = json.loads((Path(__file__).parent / "data" / "rabbitmq_expires_renewal.json").read_text())[
    "renews"
]


class Clock:
    """The broker's x-expires clock (Broker.expires_clock), moved by the test."""

    def __init__(self) -> None:
        self.now = int(time.time() * 1000)

    def __call__(self) -> int:
        return self.now


@pytest.mark.parametrize("kind", ["classic", "quorum"])
@pytest.mark.parametrize("use", ["declare", "passive_declare", "basic_get"])
def test_what_renews_the_expiry_is_rabbitmqs(tmp_path: Path, kind: str, use: str) -> None:
    clock = Clock()
    config = Config(
        data_dir=str(tmp_path / "data"), amqp_port=0, http_port=0, mqtt_port=0, prometheus_port=0
    )
    b = BrokerThread(config)
    b.broker.expires_clock = clock
    b.start()
    conn = connect(b)
    try:
        ch = conn.channel()
        q = uniq()
        arguments: dict[str, Any] = {"x-expires": 60_000}
        if kind == "quorum":
            arguments["x-queue-type"] = "quorum"
        ch.queue_declare(q, durable=True, arguments=arguments)
        clock.now += 50_000
        if use == "declare":
            ch.queue_declare(q, durable=True, arguments=arguments)
        elif use == "passive_declare":
            ch.queue_declare(q, passive=True)
        else:
            ch.basic_get(q)
        clock.now += 20_000  # past the first deadline, before a renewed one
        vhost = b.broker.vhosts["/"]
        queue = vhost.queues[q]
        b.call(queue.check_expires)  # the x-expires timer's check, now
        assert b.call(lambda: q in vhost.queues) is RENEWS[kind][use]
        clock.now += 40_000  # past a renewed deadline too
        b.call(queue.check_expires)
        assert b.call(lambda: q in vhost.queues) is False
    finally:
        conn.close()
        b.stop()
