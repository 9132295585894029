"""x-expires: a queue unused (no consumers, no basic.get, no redeclare) for the
given time is deleted; consumers keep it alive."""

from __future__ import annotations

import time
from typing import Any

from conftest import BrokerThread
from pikahelp import connect, uniq


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
