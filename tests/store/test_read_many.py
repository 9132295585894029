"""Reading a run of records back at once (SegmentLog.read_many,
MessageStore.read_many): for every position, exactly what reading it alone
gives, damaged records, dropped segments, the buffered write segment and
positions that are no record included; and a nacked span to a dead-letter
exchange with a record damaged on disk in the middle of it still sets that one
aside and reports it, dead-lettering the others in order (issue 27)."""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import BrokerThread, start_broker
from damage_helpers import PERSISTENT, aside_files, flip, layout, overwrite
from pikahelp import connect, uniq, wait_until

from warren.core.message import Message
from warren.core.store import READ_AHEAD
from warren.store.priority_store import INNER_MASK, LEVEL_SHIFT, PriorityStore
from warren.store.segment_store import SegmentStore


def _message(i: int) -> Message:
    # Sizes from a few bytes to more than a segment: windows end mid-record.
    size = 7000 if i % 23 == 15 else 3 + (i * 97) % 900
    return Message("ex", f"k{i}", PERSISTENT, f"{i}:".encode().ljust(size, b"."))


def _fields(m: Message | None) -> tuple[str, str, bytes, bytes, int] | None:
    return None if m is None else (m.exchange, m.routing_key, m.properties, m.body, m.timestamp)


def _orders(seqs: list[int]) -> list[list[int]]:
    rng = random.Random(27)
    shuffled = seqs[:]
    rng.shuffle(shuffled)
    doubled = [s for s in seqs for _ in (0, 1)]
    return [seqs, seqs[::-1], shuffled, doubled, seqs[::7], [seqs[3]]]


def _assert_same_as_one_by_one(store: SegmentStore, seqs: list[int]) -> None:
    log = store._log
    for order in _orders(seqs):
        assert log.read_many(order) == [log.read(s) for s in order]
        for seq, got in zip(order, store.read_many(order), strict=True):
            try:
                alone: Message | None = store.read(seq)
            except (KeyError, ValueError):
                alone = None
            assert _fields(got) == _fields(alone)


def test_read_many_reads_what_read_reads(tmp_path: Path) -> None:
    d = tmp_path / "q"
    store = SegmentStore(d, segment_size=16384)
    seqs = [store.append_shifted(_message(i)) for i in range(120)]
    segments = sorted({s >> 32 for s in seqs})
    assert len(segments) > 4
    store.flush()
    # Not a record: past a segment's data, inside a record, in its header,
    # past what the write segment holds, in a segment that never was.
    last = seqs[-1]
    strays = [
        (segments[0] << 32) | 16383,
        seqs[1] + 3,
        segments[1] << 32,
        last + 100_000,
        (segments[-1] + 7) << 32 | 64,
    ]
    # Damage: a flipped body byte (CRC), a length under the minimum, a length
    # running past the data; a segment file cut short; a segment dropped.
    first = d / f"msgs.{segments[0]:010d}"
    recs = layout(first)
    assert len(recs) > 6
    flip(first, recs[2][0] + recs[2][1] - 6)
    overwrite(first, recs[4][0], (5).to_bytes(4, "big"))
    overwrite(first, recs[6][0], (1 << 30).to_bytes(4, "big"))
    third = d / f"msgs.{segments[2]:010d}"
    cut = layout(third)
    with open(third, "r+b") as f:
        f.truncate(cut[1][0] + 10)
    for seq in seqs:
        if seq >> 32 == segments[3]:
            store.ack(seq)
    assert not (d / f"msgs.{segments[3]:010d}").exists()
    # The write segment's last records still buffered.
    seqs += [store.append_shifted(_message(i)) for i in range(120, 124)]
    assert store._log._chunks
    _assert_same_as_one_by_one(store, seqs + strays)
    intact = [s for s in seqs if s >> 32 not in (segments[2], segments[3])]
    read = store.read_many(intact)
    assert sum(m is None for m in read) == 3  # the three damaged records
    for seq, m in zip(intact, read, strict=True):
        if m is not None:
            assert _fields(m) == _fields(store.read(seq))
    store.close()


def test_read_many_of_a_priority_store_reads_each_level(tmp_path: Path) -> None:
    store = PriorityStore(5, lambda level: SegmentStore(tmp_path / str(level), 4096))
    seqs = []
    for i in range(60):
        m = _message(i)
        prioritised = Message(m.exchange, m.routing_key, b"\x08\x00" + bytes([i % 6]), m.body)
        seqs.append(store.append(prioritised))
    assert len({s >> LEVEL_SHIFT for s in seqs}) == 6
    taken = []
    while (item := store.shift()) is not None:
        taken.append(item[0])
    order = sorted(seqs) + seqs + [(9 << LEVEL_SHIFT) | (seqs[0] & INNER_MASK)]
    got = store.read_many(order)
    assert [_fields(m) for m in got[:-1]] == [_fields(store.read(s)) for s in order[:-1]]
    assert got[-1] is None  # no such level: read() raises KeyError
    store.close()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerThread]:
    b = start_broker(tmp_path / "data", segment_size=64 * 1024)
    try:
        yield b
    finally:
        b.stop()


def test_a_damaged_record_in_a_nacked_span_is_set_aside_and_reported(
    broker: BrokerThread, caplog: pytest.LogCaptureFixture
) -> None:
    """More than READ_AHEAD deliveries nacked at once to a dead-letter queue,
    one record damaged on disk after its delivery: that one is kept aside,
    logged and dropped, the others are dead-lettered in order."""
    n = READ_AHEAD + 100
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    dlq = uniq("dlq")
    ch.queue_declare(dlq, durable=True)
    q = uniq("q")
    args = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq}
    ch.queue_declare(q, durable=True, arguments=args)
    bodies = [f"m{i:04d}".encode() for i in range(n)]
    for body in bodies:
        ch.basic_publish("", q, body)
    consumer = conn.channel()
    consumer.basic_qos(prefetch_count=n)
    got: list[int] = []
    consumer.basic_consume(q, lambda _c, m, _p, _b: got.append(m.delivery_tag))
    wait_until(conn, lambda: len(got) == n)
    directory = broker.call(lambda: broker.broker.vhosts["/"].queues[q].store.directory)
    (path,) = sorted(directory.glob("msgs.*"))
    recs = layout(path)
    assert len(recs) == n
    bad = READ_AHEAD + 7  # in the second stretch read ahead
    flip(path, recs[bad][0] + recs[bad][1] - 6)
    caplog.set_level(logging.ERROR)
    consumer.basic_nack(0, multiple=True, requeue=False)
    dead: list[bytes] = []
    d = conn.channel()
    d.basic_consume(dlq, lambda _c, _m, _p, b: dead.append(b), auto_ack=True)
    wait_until(conn, lambda: len(dead) == n - 1)
    assert dead == bodies[:bad] + bodies[bad + 1 :]
    assert ch.queue_declare(q, passive=True).method.message_count == 0
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any(f"record at offset {recs[bad][0]}" in line for line in lines), lines
    assert any("does not read back" in line for line in lines), lines
    assert len(aside_files(directory)) == 1
    conn.close()
