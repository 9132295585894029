"""PriorityStore: RabbitMQ's priority order over one store per level, on disk and in RAM,
and a priority queue end to end through the broker, across a restart."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pika
import pytest
from conftest import BrokerThread
from store_model import STATE_MACHINE_SETTINGS, StoreModel

from warren.core.message import Message
from warren.core.properties import BasicProperties
from warren.core.store import MemoryStore, MessageStore
from warren.core.vhost import VHost
from warren.store import segment_log
from warren.store.priority_store import LEVEL_SHIFT, PriorityStore, level_name
from warren.store.segment_store import SEQ_BITS, SegmentStore


def props(priority: int | None, persistent: bool = True) -> bytes:
    return BasicProperties(delivery_mode=2 if persistent else 1, priority=priority).encode()


def msg(i: int, priority: int | None, persistent: bool = True) -> Message:
    return Message("ex", "rk", props(priority, persistent), b"m%d" % i, 1000 + i)


def on_disk(
    d: Path,
    max_priority: int = 10,
    segment_size: int = 8 * 1024 * 1024,
    marks: dict[Path, int] | None = None,
) -> PriorityStore:
    """Levels on disk under ``d``, opened with a clean close's delivered marks
    (None: as after a crash)."""

    def level(p: int) -> SegmentStore:
        where = d / level_name(p)
        mark = None if marks is None else marks.get(where, 0)
        return SegmentStore(where, segment_size, delivered_mark=mark)

    return PriorityStore(max_priority, level, d)


def drain(store: MessageStore) -> list[tuple[int, Message, bool]]:
    out = []
    while (item := store.shift()) is not None:
        out.append(item)
        store.ack(item[0])
    return out


def ids(items: list[tuple[int, Message, bool]]) -> list[int]:
    return [m.timestamp - 1000 for _, m, _ in items]


# Priorities of messages 0..11: none counts as 0, above the maximum (10) as 10.
PRIORITIES = [0, 5, None, 10, 5, 200, 1, 0, 11, 5, 10, 3]
# Highest first, oldest first within a priority.
EXPECTED = [3, 5, 8, 10, 1, 4, 9, 11, 6, 0, 2, 7]


def test_priority_order_and_levels(tmp_path: Path) -> None:
    d = tmp_path / "q"
    store = on_disk(d)
    seqs = [store.append(msg(i, p)) for i, p in enumerate(PRIORITIES)]
    assert len(set(seqs)) == len(seqs)
    levels = [min(p or 0, 10) for p in PRIORITIES]
    assert [s >> LEVEL_SHIFT for s in seqs] == levels
    assert sorted(p.name for p in d.iterdir()) == ["p000", "p001", "p003", "p005", "p010"]
    assert store.ready_count == 12
    assert store.ready_bytes == sum(len(msg(i, p).body) for i, p in enumerate(PRIORITIES))
    head = store.peek()
    assert head is not None and head[0] == seqs[3] and head[2] is False
    out = drain(store)
    assert ids(out) == EXPECTED
    assert [s for s, _, _ in out] == [seqs[i] for i in EXPECTED]
    assert (store.ready_count, store.ready_bytes) == (0, 0)
    assert store.shift() is None and store.peek() is None
    store.close()


def test_level_shift_is_above_every_segment_store_seq() -> None:
    assert LEVEL_SHIFT >= SEQ_BITS
    highest = (segment_log.MAX_SEGMENT_ID << 32) | 0xFFFFFFFF
    assert highest >> LEVEL_SHIFT == 0


def test_malformed_properties_count_as_priority_zero(tmp_path: Path) -> None:
    store = on_disk(tmp_path / "q", max_priority=3)
    bad = Message("ex", "rk", b"\x08\x00", b"torn", 1)  # priority flag, no value
    store.append(msg(0, 2))
    seq = store.append(bad)
    assert seq >> LEVEL_SHIFT == 0
    assert [m.body for _, m, _ in drain(store)] == [b"m0", b"torn"]
    store.close()


def test_requeue_returns_to_its_place_within_its_priority(tmp_path: Path) -> None:
    store = on_disk(tmp_path / "q")
    for i, p in enumerate([1, 1, 1, 7, 7]):
        store.append(msg(i, p))
    taken = [store.shift() for _ in range(4)]  # 3, 4, 0, 1
    assert [t[1].timestamp - 1000 for t in taken if t] == [3, 4, 0, 1]
    for s, m, _ in reversed(taken):  # type: ignore[misc]
        store.requeue(s, m)
    assert store.ready_count == 5
    head = store.peek()
    assert head is not None and head[1].body == b"m3" and head[2] is True
    out = drain(store)
    assert [(m.body, r) for _, m, r in out] == [
        (b"m3", True),
        (b"m4", True),
        (b"m0", True),
        (b"m1", True),
        (b"m2", False),
    ]
    store.close()


def test_append_shifted_only_while_nothing_is_ready(tmp_path: Path) -> None:
    store = on_disk(tmp_path / "q")
    store.append(msg(0, 1))
    with pytest.raises(ValueError):
        store.append_shifted(msg(1, 9))  # another level has a backlog
    drain(store)
    seq = store.append_shifted(msg(2, 9))
    assert seq >> LEVEL_SHIFT == 9
    assert store.ready_count == 0 and store.shift() is None
    store.append(msg(3, 9))
    store.requeue(seq, msg(2, 9))
    out = drain(store)
    assert [(m.body, r) for _, m, r in out] == [(b"m2", True), (b"m3", False)]
    store.close()


def test_remove_ready_in_any_level(tmp_path: Path) -> None:
    store = on_disk(tmp_path / "q")
    seqs = [store.append(msg(i, p)) for i, p in enumerate(PRIORITIES)]
    taken = store.shift()  # message 3
    assert taken is not None and taken[0] == seqs[3]
    for i in (5, 9, 2):  # head of level 10, middle of level 5, level 0
        removed = store.remove_ready(seqs[i])
        assert removed is not None and removed.body == b"m%d" % i
    assert store.remove_ready(seqs[5]) is None  # already removed
    assert store.remove_ready(seqs[3]) is None  # unacked
    assert store.remove_ready((200 << LEVEL_SHIFT) | 8) is None  # no such level
    assert store.remove_ready((300 << LEVEL_SHIFT) | 8) is None  # beyond any level
    store.requeue(taken[0], taken[1])
    removed = store.remove_ready(taken[0])  # requeued: ready again
    assert removed is not None and removed.body == b"m3"
    gone = {2, 3, 5, 9}
    assert store.ready_count == 12 - len(gone)
    assert store.ready_bytes == sum(
        len(msg(i, p).body) for i, p in enumerate(PRIORITIES) if i not in gone
    )
    expected = [i for i in EXPECTED if i not in gone]
    assert [s for s, _, _ in store.scan_ready()] == [seqs[i] for i in expected]
    assert ids(drain(store)) == expected
    store.close()


def test_scan_ready_in_shift_order(tmp_path: Path) -> None:
    store = on_disk(tmp_path / "q")
    seqs = [store.append(msg(i, p)) for i, p in enumerate(PRIORITIES)]
    scanned = list(store.scan_ready())
    assert scanned == [(seqs[i], 1000 + i, props(PRIORITIES[i])) for i in EXPECTED]
    assert store.ready_count == 12  # nothing taken
    assert ids(drain(store)) == EXPECTED
    store.close()


def test_restart_keeps_priorities_and_removals(tmp_path: Path) -> None:
    d = tmp_path / "q"
    store = on_disk(d, segment_size=256)
    seqs = [store.append(msg(i, p, persistent=i != 7)) for i, p in enumerate(PRIORITIES)]
    first = store.shift()  # message 3: acked
    second = store.shift()  # message 5: unacked at the restart
    assert first is not None and second is not None
    store.ack(first[0])
    assert store.remove_ready(seqs[4]) is not None
    assert store.remove_ready(seqs[11]) is not None
    marks = store.delivered_marks()
    store.close()

    store = on_disk(d, segment_size=256, marks=marks)
    gone = {3, 4, 11, 7}  # acked, removed twice, transient
    expected = [i for i in EXPECTED if i not in gone]
    assert store.ready_count == len(expected)
    assert [s for s, _, _ in store.scan_ready()] == [seqs[i] for i in expected]
    assert store.remove_ready(seqs[4]) is None
    head = store.peek()
    assert head is not None and head[0] == seqs[5] and head[2] is True  # unacked at the close
    items = drain(store)
    assert ids(items) == expected
    assert [r for _, _, r in items] == [i == 5 for i in expected]
    store.close()

    store = on_disk(d, segment_size=256)
    assert store.ready_count == 0
    store.append(msg(20, 4))
    assert ids(drain(store)) == [20]
    store.close()


def test_levels_above_255_on_disk_are_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="warren.store")
    d = tmp_path / "q"
    (d / "p999").mkdir(parents=True)
    (d / "notes").mkdir()
    store = on_disk(d)
    assert "p999" in caplog.text
    assert store.ready_count == 0 and store.shift() is None
    store.close()


def test_files_flush_sync_dirty_close_delete(tmp_path: Path) -> None:
    d = tmp_path / "q"
    store = on_disk(d)
    assert not store.dirty
    store.append(msg(0, 2))
    store.append(msg(1, 8))
    assert store.dirty
    store.sync()
    assert not store.dirty
    s = store.shift()
    assert s is not None
    store.ack(s[0])
    store.flush()
    assert store.dirty
    store.close(sync=False)
    store.close()  # twice is fine
    with pytest.raises(ValueError):
        store.append(msg(2, 5))  # a new level on a closed store
    store = on_disk(d)
    assert ids(drain(store)) == [0]
    store.delete()
    assert not d.exists()


def test_sync_in_a_worker_thread_while_levels_appear(tmp_path: Path) -> None:
    store = on_disk(tmp_path / "q", max_priority=255)
    stop = threading.Event()
    errors: list[BaseException] = []

    def syncer() -> None:
        try:
            while not stop.is_set():
                store.sync()
        except BaseException as exc:  # reported below
            errors.append(exc)

    t = threading.Thread(target=syncer)
    t.start()
    try:
        for i in range(2000):
            store.append(msg(i, i % 256))
    finally:
        stop.set()
        t.join()
    assert errors == []
    store.sync()
    assert not store.dirty
    assert store.ready_count == 2000
    store.close()


def test_levels_in_ram() -> None:
    store = PriorityStore(10, lambda level: MemoryStore())
    seqs = [store.append(msg(i, p)) for i, p in enumerate(PRIORITIES)]
    assert store.remove_ready(seqs[8]) is not None
    assert [s for s, _, _ in store.scan_ready()] == [seqs[i] for i in EXPECTED if i != 8]
    assert store.purge() == 11
    assert (store.ready_count, store.ready_bytes) == (0, 0)
    store.append(msg(12, 1))
    store.append(msg(13, 2))
    assert ids(drain(store)) == [13, 12]
    store.delete()


@pytest.mark.parametrize("bad", [0, 256, -1])
def test_max_priority_bounds(bad: int) -> None:
    with pytest.raises(ValueError):
        PriorityStore(bad, lambda level: MemoryStore())


def test_vhost_asks_for_a_priority_store() -> None:
    calls: list[tuple[str, bool, int]] = []

    def factory(vhost: VHost, name: str, persistent: bool, max_priority: int) -> MessageStore:
        calls.append((name, persistent, max_priority))
        return MemoryStore()

    vhost = VHost("/", lambda fn: None, factory)
    vhost.declare_queue("plain")
    vhost.declare_queue("prio", arguments={"x-max-priority": 7})
    vhost.declare_queue("zero", durable=False, arguments={"x-max-priority": 0})
    assert calls == [("plain", True, 0), ("prio", True, 7), ("zero", False, 0)]
    default = VHost("/", lambda fn: None)
    q = default.declare_queue("prio", arguments={"x-max-priority": 7})
    assert isinstance(q.store, PriorityStore) and q.store.max_priority == 7
    assert isinstance(default.declare_queue("plain").store, MemoryStore)


class PriorityStoreModel(StoreModel):
    def open_store(self, marks: dict[Path, int] | None = None) -> PriorityStore:
        return on_disk(self.dir / "q", max_priority=3, segment_size=512, marks=marks)

    def level(self, priority: int | None) -> int:
        return min(priority or 0, 3)


TestPriorityStoreModel = PriorityStoreModel.TestCase
TestPriorityStoreModel.settings = STATE_MACHINE_SETTINGS


# -- end to end ------------------------------------------------------------------------


def _publish_and_restart(
    broker_factory: Callable[..., BrokerThread], durable: bool
) -> tuple[BrokerThread, list[tuple[int, bytes]]]:
    b = broker_factory()
    priorities = [None, 3, 10, 0, 200, 3, 7, 11, None, 10, 1, 3, 255, 7]
    sent = []
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", b.port))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("pq", durable=durable, arguments={"x-max-priority": 10})
    for i, p in enumerate(priorities):
        body = f"{i}:{p}".encode()
        ch.basic_publish(
            "", "pq", body, pika.BasicProperties(delivery_mode=2, priority=p), mandatory=True
        )
        sent.append((min(p or 0, 10), body))
    conn.close()
    return b, sent


def _get_all(b: BrokerThread, queue: str) -> list[tuple[int | None, bytes]]:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", b.port))
    ch = conn.channel()
    got = []
    while True:
        method, properties, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            break
        got.append((properties.priority, body))
    conn.close()
    return got


def test_priority_queue_survives_a_restart(
    broker_factory: Callable[..., BrokerThread], tmp_path: Path
) -> None:
    b, sent = _publish_and_restart(broker_factory, durable=True)
    b.stop()
    b = broker_factory()  # the same data dir
    queue_dir = b.broker.layout.queue_dir("/", "pq")
    assert sorted(p.name for p in queue_dir.iterdir()) == [
        "definition.json",  # the queue's definition again (warren orphans)
        "p000",
        "p001",
        "p003",
        "p007",
        "p010",
    ]
    got = _get_all(b, "pq")
    # Highest priority first, publication order within a priority (a stable sort).
    expected = [body for _, body in sorted(sent, key=lambda s: -s[0])]
    assert [body for _, body in got] == expected
    assert got[0] == (10, b"2:10") and got[-1] == (None, b"8:None")


def test_transient_priority_queue(broker_factory: Callable[..., BrokerThread]) -> None:
    b, sent = _publish_and_restart(broker_factory, durable=False)
    queue_dir = b.broker.layout.transient_queue_dir("/", "pq")
    assert (queue_dir / "p010").is_dir() and not list(queue_dir.glob("msgs.*"))
    got: list[Any] = _get_all(b, "pq")
    assert [body for _, body in got] == [body for _, body in sorted(sent, key=lambda s: -s[0])]
