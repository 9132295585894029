"""The free-disk alarm blocks publishers with connection.blocked, as RabbitMQ does."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pika
from conftest import BrokerThread
from pikahelp import wait_until


def wait_for(conn: pika.BlockingConnection, predicate: Callable[[], bool]) -> None:
    wait_until(conn, predicate, timeout=10)


def test_publisher_blocked_below_free_disk_min_and_unblocked_after(
    broker_factory: Callable[..., BrokerThread],
) -> None:
    # More free space than any disk has: the alarm is raised at start.
    b = broker_factory(free_disk_min=2**62)
    assert b.call(lambda: b.broker.disk_alarm)
    publisher = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", b.port))
    observer = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", b.port))
    events: list[str] = []
    publisher.add_on_connection_blocked_callback(lambda _c, m: events.append(m.method.NAME))
    publisher.add_on_connection_unblocked_callback(lambda _c, m: events.append(m.method.NAME))
    other: list[str] = []
    observer.add_on_connection_blocked_callback(lambda _c, m: other.append(m.method.NAME))
    try:
        ch = publisher.channel()
        ch.queue_declare("alarm")
        ch.basic_publish("", "alarm", b"first")
        wait_for(publisher, lambda: events == ["Connection.Blocked"])
        # While blocked, the broker does not read the publisher's socket.
        ch.basic_publish("", "alarm", b"second")
        obs = observer.channel()
        obs.queue_declare("alarm", passive=True)
        assert obs.queue_declare("alarm", passive=True).method.message_count == 1
        assert other == []  # a connection that never published is not blocked

        def clear() -> Any:
            b.broker.config.free_disk_min = 0
            return b.broker.resource_alarms.check_disk()

        assert b.call(clear) is False
        wait_for(publisher, lambda: events == ["Connection.Blocked", "Connection.Unblocked"])
        wait_for(
            observer, lambda: obs.queue_declare("alarm", passive=True).method.message_count == 2
        )
        ch.queue_declare("alarm", passive=True)
    finally:
        publisher.close()
        observer.close()
