"""Durable deduplication: a durable queue's (and a stream's) cache survives kill -9
and restarts, with its TTL and size (docs/storage.md, "Deduplication keys").

A real broker process is killed with SIGKILL and started again on the same data
directory; pika publishes with confirms. The TTL test gives the broker a
ManualClock (core/clock.py) and moves it instead of waiting.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from conftest import BrokerThread, start_broker
from procs import Process, start_warren

from warren.core.clock import ManualClock
from warren.core.dedup import DEFAULT_HEADER, Deduplicator
from warren.store.dedup_journal import FILE_NAME, DedupJournal, decode_entries, encode_entry

ARGS = {"x-message-deduplication": True, "x-cache-size": 100_000}


def keyed(key: str, persistent: bool = True) -> pika.BasicProperties:
    return pika.BasicProperties(headers={DEFAULT_HEADER: key}, delivery_mode=2 if persistent else 1)


class Proc:
    """A broker process on one data directory: kill -9 and start again."""

    def __init__(self, data: Path) -> None:
        self.data = data
        self.proc: Process | None = None
        self.port = 0

    def start(self) -> Proc:
        self.proc, self.port = start_warren(self.data)
        return self

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self.proc = None

    def channel(self) -> tuple[pika.BlockingConnection, Any]:
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", self.port))
        ch = conn.channel()
        ch.confirm_delivery()
        return conn, ch


@pytest.fixture
def proc(tmp_path: Path) -> Iterator[Proc]:
    p = Proc(tmp_path / "data")
    yield p
    if p.proc is not None:
        p.kill()


def publish(ch: Any, queue: str, keys: range, persistent: bool = True) -> None:
    for i in keys:
        ch.basic_publish("", queue, f"m{i}".encode(), keyed(f"k{i}", persistent))


def depth(ch: Any, queue: str) -> int:
    return int(ch.queue_declare(queue, passive=True).method.message_count)


def test_kill_9_keeps_the_keys_of_stored_and_of_consumed_messages(proc: Proc) -> None:
    """200 confirmed keyed messages, 100 of them consumed and acked, then kill -9:
    republishing all 200 keys after the restart stores none of them again."""
    proc.start()
    conn, ch = proc.channel()
    ch.queue_declare("dd", durable=True, arguments=ARGS)
    publish(ch, "dd", range(200))
    for _ in range(100):
        method, _props, _body = ch.basic_get("dd")
        assert method is not None
        ch.basic_ack(method.delivery_tag)
    assert depth(ch, "dd") == 100  # a round trip: the acks were processed
    conn.close()
    proc.kill()

    proc.start()
    conn, ch = proc.channel()
    publish(ch, "dd", range(200))  # the retry of every publish
    publish(ch, "dd", range(200, 210))  # new keys still get in
    assert depth(ch, "dd") == 110
    conn.close()


def test_transient_messages_leave_no_durable_key(proc: Proc) -> None:
    """A transient message does not survive a restart, so neither does its key: a
    retry after the restart is stored (else it would be lost)."""
    proc.start()
    conn, ch = proc.channel()
    ch.queue_declare("dt", durable=True, arguments=ARGS)
    publish(ch, "dt", range(5), persistent=False)
    publish(ch, "dt", range(5, 10))
    assert depth(ch, "dt") == 10
    conn.close()
    proc.kill()

    proc.start()
    conn, ch = proc.channel()
    assert depth(ch, "dt") == 5  # the transient ones are gone
    publish(ch, "dt", range(10))
    assert depth(ch, "dt") == 10  # their keys are new again, the others duplicates
    conn.close()


def broker_with_clock(data: Path, clock: ManualClock) -> BrokerThread:
    return start_broker(data, clock=clock)


def test_ttl_and_size_hold_across_a_restart(tmp_path: Path) -> None:
    """x-cache-ttl counts on across a restart (one ManualClock, moved while the
    broker is down too), and x-cache-size keeps the most recent keys."""
    clock = ManualClock()
    data = tmp_path / "data"
    b = broker_with_clock(data, clock)
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", b.port))
    ch = conn.channel()
    ch.confirm_delivery()
    args = {"x-message-deduplication": True, "x-cache-ttl": 10_000, "x-cache-size": 3}
    ch.queue_declare("dl", durable=True, arguments=args)
    for i, key in enumerate(("a", "b", "c", "d")):  # "a" is evicted by "d"
        b.advance(1)
        ch.basic_publish("", "dl", key.encode(), keyed(key))
        ch.basic_get("dl", auto_ack=True)  # consumed: only the journal keeps the key
        assert i >= 0
    conn.close()
    b.stop()

    clock.advance(5_000)  # within the TTL, while stopped
    b = broker_with_clock(data, clock)
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", b.port))
    ch = conn.channel()
    ch.confirm_delivery()
    for key in ("b", "c", "d"):
        ch.basic_publish("", "dl", key.encode(), keyed(key))
    assert depth(ch, "dl") == 0
    conn.close()
    b.stop()

    clock.advance(6_000)  # past the TTL of b, c and d
    b = broker_with_clock(data, clock)
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", b.port))
    ch = conn.channel()
    ch.confirm_delivery()
    for key in ("b", "c", "d"):
        ch.basic_publish("", "dl", key.encode(), keyed(key))
    assert depth(ch, "dl") == 3
    conn.close()
    b.stop()


def test_journal_entries_round_trip_and_a_torn_tail_is_cut(tmp_path: Path) -> None:
    entries = [("s", 1.0, None), (b"\x00b", 2.0, 50.0), (7, 3.0, None), (("bool", True), 4.0, None)]
    data = b"".join(encode_entry(e) for e in entries)
    assert decode_entries(data) == (entries, len(data))
    path = tmp_path / FILE_NAME
    path.write_bytes(data + encode_entry(("torn", 5.0, None))[:-3])
    journal = DedupJournal(path, Deduplicator(10), lambda: None)
    assert journal.load() == entries
    assert path.read_bytes() == data  # cut back to the last intact entry


def test_a_stream_deduplicates_and_keeps_its_keys_through_kill_9(proc: Proc) -> None:
    """A stream accepts x-message-deduplication (RabbitMQ refuses it: its streams
    deduplicate by publisher id in the stream protocol); its keys are rebuilt
    from its records after kill -9."""
    proc.start()
    conn, ch = proc.channel()
    args = {"x-queue-type": "stream", **ARGS}
    ch.queue_declare("ds", durable=True, arguments=args)
    publish(ch, "ds", range(50))
    publish(ch, "ds", range(50))
    assert depth(ch, "ds") == 50
    conn.close()
    proc.kill()

    proc.start()
    conn, ch = proc.channel()
    publish(ch, "ds", range(60))
    assert depth(ch, "ds") == 60
    conn.close()


def publish_to(ch: Any, exchange: str, keys: range, persistent: bool = True) -> None:
    for i in keys:
        ch.basic_publish(exchange, "", f"m{i}".encode(), keyed(f"k{i}", persistent))


@pytest.mark.parametrize(
    ("exchange_type", "arguments"),
    [
        ("fanout", ARGS),  # LavinMQ's way: any exchange with x-message-deduplication
        ("x-message-deduplication", {"x-cache-size": 100_000}),  # the plugin's type
    ],
    ids=["argument", "plugin-type"],
)
def test_a_durable_exchange_keeps_its_keys_through_kill_9(
    proc: Proc, exchange_type: str, arguments: dict[str, Any]
) -> None:
    """Keys of confirmed messages a durable exchange routed into durable queues
    survive kill -9, also once those messages were consumed; a transient
    message's key does not (its message is gone after the restart)."""
    proc.start()
    conn, ch = proc.channel()
    ch.exchange_declare("dx", exchange_type, durable=True, arguments=arguments)
    ch.queue_declare("dxq", durable=True)
    ch.queue_bind("dxq", "dx")
    publish_to(ch, "dx", range(100))
    publish_to(ch, "dx", range(100, 105), persistent=False)
    for _ in range(50):
        method, _props, _body = ch.basic_get("dxq")
        assert method is not None
        ch.basic_ack(method.delivery_tag)
    assert depth(ch, "dxq") == 55
    conn.close()
    proc.kill()

    proc.start()
    conn, ch = proc.channel()
    assert depth(ch, "dxq") == 50  # the transient five are gone
    publish_to(ch, "dx", range(110))  # every retry: only the transient keys and new ones
    assert depth(ch, "dxq") == 60
    conn.close()


def test_memory_persistence_and_transient_exchanges_keep_no_keys(proc: Proc) -> None:
    """The plugin type with x-cache-persistence "memory", and a transient exchange,
    forget their keys at a restart (and write no journal)."""
    proc.start()
    conn, ch = proc.channel()
    memory = {"x-cache-size": 10, "x-cache-persistence": "memory"}
    ch.exchange_declare("mx", "x-message-deduplication", durable=True, arguments=memory)
    ch.exchange_declare("tx", "fanout", durable=False, arguments=ARGS)
    ch.queue_declare("mq", durable=True)
    ch.queue_bind("mq", "mx")
    publish_to(ch, "mx", range(3))
    publish_to(ch, "mx", range(3))
    assert depth(ch, "mq") == 3
    conn.close()
    assert not list(proc.data.rglob(f"exchanges/*/{FILE_NAME}"))
    proc.kill()

    proc.start()
    conn, ch = proc.channel()
    publish_to(ch, "mx", range(3))
    assert depth(ch, "mq") == 6
    conn.close()


def test_deleting_a_deduplicating_exchange_removes_its_journal(proc: Proc) -> None:
    proc.start()
    conn, ch = proc.channel()
    ch.exchange_declare("gone", "fanout", durable=True, arguments=ARGS)
    ch.queue_declare("gq", durable=True)
    ch.queue_bind("gq", "gone")
    publish_to(ch, "gone", range(3))
    journals = list(proc.data.rglob(f"exchanges/*/{FILE_NAME}"))
    assert len(journals) == 1 and decode_entries(journals[0].read_bytes())[0]
    ch.exchange_delete("gone")
    assert not journals[0].parent.exists()
    # Declared again, it starts with an empty cache.
    ch.exchange_declare("gone", "fanout", durable=True, arguments=ARGS)
    ch.queue_bind("gq", "gone")
    publish_to(ch, "gone", range(3))
    assert depth(ch, "gq") == 6
    conn.close()
