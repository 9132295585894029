"""Confirms for persistent messages wait for fdatasync, and one sync serves many."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pika
from conftest import BrokerThread

PERSISTENT = pika.BasicProperties(delivery_mode=2)


def _publish(port: int, queue: str, count: int, errors: list[BaseException]) -> None:
    try:
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
        ch = conn.channel()
        ch.confirm_delivery()
        for i in range(count):
            ch.basic_publish("", queue, b"%d" % i, PERSISTENT)
        conn.close()
    except BaseException as exc:  # reported to the test thread
        errors.append(exc)


def test_concurrent_publishers_share_sync_rounds(broker: BrokerThread) -> None:
    with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port)) as conn:
        conn.channel().queue_declare("gc", durable=True)
    rounds_before = broker.call(lambda: broker.broker.syncer.rounds)
    errors: list[BaseException] = []
    threads = [
        threading.Thread(target=_publish, args=(broker.port, "gc", 100, errors)) for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    rounds = broker.call(lambda: broker.broker.syncer.rounds) - rounds_before
    # Every one of the 400 confirms waited for a sync, but rounds were shared.
    assert 0 < rounds < 400
    with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port)) as conn:
        assert conn.channel().queue_declare("gc", passive=True).method.message_count == 400


def test_transient_messages_do_not_wait_for_sync(broker: BrokerThread) -> None:
    with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port)) as conn:
        ch = conn.channel()
        ch.queue_declare("durable-q", durable=True)
        ch.queue_declare("transient-q", durable=False)
        ch.confirm_delivery()
        before = broker.call(lambda: broker.broker.syncer.rounds)
        for _ in range(50):
            ch.basic_publish("", "durable-q", b"t", pika.BasicProperties(delivery_mode=1))
            ch.basic_publish("", "transient-q", b"p", PERSISTENT)
        assert broker.call(lambda: broker.broker.syncer.rounds) == before
        ch.basic_publish("", "durable-q", b"p", PERSISTENT)
        assert broker.call(lambda: broker.broker.syncer.rounds) == before + 1


def test_tx_commit_of_persistent_messages_syncs(
    broker_factory: Callable[..., BrokerThread],
) -> None:
    b = broker_factory()
    with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", b.port)) as conn:
        ch = conn.channel()
        ch.queue_declare("txq", durable=True)
        ch.tx_select()
        before = b.call(lambda: b.broker.syncer.rounds)
        for i in range(10):
            ch.basic_publish("", "txq", b"%d" % i, PERSISTENT)
        assert b.call(lambda: b.broker.syncer.rounds) == before
        ch.tx_commit()
        assert b.call(lambda: b.broker.syncer.rounds) == before + 1
        assert ch.queue_declare("txq", passive=True).method.message_count == 10


def test_no_sync_mode_confirms_without_sync_rounds(
    broker_factory: Callable[..., BrokerThread],
) -> None:
    b = broker_factory(sync=False)
    with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", b.port)) as conn:
        ch = conn.channel()
        ch.queue_declare("ns", durable=True)
        ch.confirm_delivery()
        for _ in range(20):
            ch.basic_publish("", "ns", b"x", PERSISTENT)
        assert b.call(lambda: b.broker.syncer.rounds) == 0
