"""The stores on a really full disk (a small tmpfs filled by the test): a write-out
that fails drops exactly the records it could not write, from the counters and
the files alike, and the store goes on once there is room (store/segment_log.py,
store/disk_budget.py)."""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from diskhelp import MiB, ext4, fill, tmpfs

from warren.core.message import Message
from warren.store.definitions import DefinitionsLog
from warren.store.disk_budget import UNMETERED
from warren.store.priority_store import PriorityStore, level_name
from warren.store.segment_store import SegmentStore
from warren.store.stream_store import StreamStore

PERSISTENT = b"\x10\x00\x02"
TRANSIENT = b"\x10\x00\x01"


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "disk", 4 * MiB) as where:
        yield where


def msg(i: int, size: int = 3000, props: bytes = PERSISTENT) -> Message:
    return Message("ex", "rk", props, f"m{i}:".encode().ljust(size, b"."), 1000 + i)


def number(m: Message) -> int:
    return int(m.body[1:].split(b":")[0])


def drain_messages(store: SegmentStore) -> list[Message]:
    out = []
    while (item := store.shift()) is not None:
        out.append(item[1])
        store.ack(item[0])
    return out


def drain(store: SegmentStore | PriorityStore) -> list[int]:
    out = []
    while (item := store.shift()) is not None:
        out.append(number(item[1]))
        store.ack(item[0])
    return out


def test_segment_store_keeps_its_counters_to_what_reached_the_file(
    disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    d = disk / "q"
    store = SegmentStore(d, segment_size=256 * 1024)
    for i in range(20):
        store.append(msg(i))
    store.flush()
    filler = disk / "filler"
    fill(filler)
    before = UNMETERED.gen
    with caplog.at_level(logging.ERROR, "warren.store"):
        for i in range(20, 60):  # past the 32 KiB buffer: write-outs fail as it goes
            store.append(msg(i))
        store.flush()
    assert "messages dropped, never confirmed" in caplog.text
    assert store.lost_between(before, UNMETERED.gen)
    # A few may have fitted in the last page the segment file had: a prefix of them.
    kept = store.ready_count
    assert 20 <= kept < 60
    filler.unlink()
    for i in range(60, 65):
        store.append(msg(i))
    store.flush()
    assert store.ready_count == kept + 5
    assert store.ready_bytes == sum(len(msg(i).body) for i in range(kept + 5))
    expected = list(range(kept)) + list(range(60, 65))
    store.close()
    reopened = SegmentStore(d, segment_size=256 * 1024)
    assert (reopened.ready_count, drain(reopened)) == (kept + 5, expected)
    reopened.close()


def test_a_message_a_consumer_holds_is_dropped_when_given_back(disk: Path) -> None:
    d = disk / "q"
    store = SegmentStore(d)
    store.append(msg(0))
    store.flush()
    first = store.shift()
    assert first is not None
    fill(disk / "filler")
    # Handed to a consumer at once (nothing else ready), then its write fails:
    # larger than the space the segment file allocated ahead (64 KiB).
    seqs = [store.append_shifted(msg(i, size=70_000)) for i in range(1, 3)]
    store.flush()
    assert store.ready_count == 0
    store.requeue(first[0], first[1])  # stored: back in the queue
    store.requeue(seqs[0], msg(1, size=70_000))  # never stored: not requeued
    store.ack(seqs[1])
    assert store.ready_count == 1
    (disk / "filler").unlink()
    store.append(msg(3))
    store.close()
    reopened = SegmentStore(d)
    assert drain(reopened) == [0, 3]
    reopened.close()


def test_transient_counts_follow_what_a_failed_write_out_dropped(
    disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Transient messages among those a failed write-out dropped: the ready ones
    are counted out at once, those a consumer holds when they are acked (as
    they would be had they been written); the rest as ever."""
    d = disk / "q"
    store = SegmentStore(d, segment_size=256 * 1024)

    def mixed(i: int) -> Message:
        return msg(i, size=3000 + i, props=TRANSIENT if i % 3 == 1 else PERSISTENT)

    def transient(ids: list[int]) -> tuple[int, int]:
        hit = [i for i in ids if i % 3 == 1]
        return len(hit), sum(len(mixed(i).body) for i in hit)

    def count(*groups: list[int]) -> tuple[int, int]:
        return transient([i for g in groups for i in g])

    for i in range(20):
        store.append(mixed(i))
    store.flush()
    unacked = [store.shift() for _ in range(20)]
    fill(disk / "filler")
    held = {i: store.append_shifted(mixed(i)) for i in range(20, 30)}  # a consumer has them
    with caplog.at_level(logging.ERROR, "warren.store"):
        for i in range(30, 60):  # past the 32 KiB buffer: write-outs fail as it goes
            store.append(mixed(i))
        store.flush()
    kept = store.ready_count  # a prefix of the ready ones may have fitted
    assert kept < 30
    dropped = sum(
        int(r.args[4])  # type: ignore[index]
        for r in caplog.records
        if "messages dropped" in r.msg
    )
    assert dropped > 30 - kept  # held ones too
    ready = list(range(30, 30 + kept))
    assert store.transient() == count(list(range(30)), ready)
    for i, seq in held.items():
        store.ack(seq)
        assert store.transient() == count(list(range(20)), list(range(i + 1, 30)), ready)
    for item in unacked:
        assert item is not None
        store.ack(item[0])
    assert store.transient() == count(ready)
    (disk / "filler").unlink()
    assert [number(m) for m, _ in zip(drain_messages(store), ready, strict=True)] == ready
    assert store.transient() == (0, 0)
    store.close()


def test_priority_store_totals_follow_its_levels(disk: Path) -> None:
    d = disk / "pq"

    def make(level: int) -> SegmentStore:
        return SegmentStore(d / level_name(level), segment_size=256 * 1024)

    def prio(p: int) -> bytes:
        return b"\x18\x00\x02" + bytes([p])  # delivery-mode 2, priority p

    store = PriorityStore(5, make, d)
    for i in range(10):
        store.append(msg(i, props=prio(i % 3)))
    store.flush()
    fill(disk / "filler")
    for i in range(10, 100):  # past the 64 KiB each level's file allocated ahead
        store.append(msg(i, props=prio(i % 3)))
    store.flush()
    kept = store.ready_count
    assert 10 <= kept < 100
    got = drain(store)
    assert len(got) == kept and store.ready_count == 0 and store.ready_bytes == 0
    assert set(range(10)) <= set(got)
    store.close()


def test_stream_offsets_are_not_skipped(disk: Path) -> None:
    d = disk / "s"
    store = StreamStore(d, segment_size=256 * 1024)
    for i in range(10):
        store.append(msg(i))
    store.flush()
    fill(disk / "filler")
    for i in range(10, 40):
        store.append(msg(i))
    store.flush()
    kept = store.next_offset
    assert 10 <= kept < 40
    (disk / "filler").unlink()
    assert [store.append(msg(i)) for i in range(40, 43)] == [kept, kept + 1, kept + 2]
    store.flush()
    cursor = store.cursor(0)
    read = []
    while (item := cursor.next()) is not None:
        read.append((item[0], number(item[1])))
    assert read == [(o, o) for o in range(kept)] + [(kept + j, 40 + j) for j in range(3)]
    cursor.close()
    store.close()
    reopened = StreamStore(d, segment_size=256 * 1024)
    assert reopened.next_offset == kept + 3
    reopened.close()


def test_acks_wait_in_memory_until_there_is_room(
    disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    d = disk / "q"
    store = SegmentStore(d)  # one segment: no ack frees space by deleting one
    for i in range(40):
        store.append(msg(i))
    store.flush()
    fill(disk / "filler")
    for _ in range(30):
        item = store.shift()
        assert item is not None
        store.ack(item[0])
    with caplog.at_level(logging.ERROR, "warren.store"):
        store.flush()  # the ack file cannot be written: kept, nothing raised
    assert "cannot write acks" in caplog.text
    (disk / "filler").unlink()
    store.flush()
    store.close()
    assert drain(SegmentStore(d)) == list(range(30, 40))


def test_close_on_a_full_disk_logs_what_it_could_not_write(
    disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    d = disk / "q"
    store = SegmentStore(d, segment_size=64 * 1024)
    for i in range(10):
        store.append(msg(i))
    store.flush()
    fill(disk / "filler")
    for _ in range(5):
        item = store.shift()
        assert item is not None
        store.ack(item[0])
    store.append(msg(10, size=40_000))
    with caplog.at_level(logging.ERROR, "warren.store"):
        store.close()  # neither raises nor leaves a file half written
    assert "messages dropped, never confirmed" in caplog.text
    assert "acks could not be written" in caplog.text
    (disk / "filler").unlink()
    # The acks were lost with the process: those messages come back, never a torn file.
    assert drain(SegmentStore(d, segment_size=64 * 1024)) == list(range(10))


def test_definitions_log_changes_nothing_it_could_not_write(disk: Path) -> None:
    path = disk / "definitions.log"
    defs = DefinitionsLog(path)
    defs.put("q:a", {"name": "a"})
    fill(disk / "filler")
    with pytest.raises(OSError):
        defs.put("q:big", {"name": "big", "pad": "x" * 20_000})
    assert set(defs.live) == {"q:a"}
    (disk / "filler").unlink()
    defs.put("q:b", {"name": "b"})
    defs.close()
    assert set(DefinitionsLog(path).live) == {"q:a", "q:b"}


def test_an_allocation_ahead_that_does_not_fit_leaves_room_for_the_records(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # ext4 keeps what a posix_fallocate that ran out of space got: one segment's
    # allocation ahead (double what it had) took the last free blocks, and
    # another queue's records, which needed less, could not be written. The
    # allocation is now given back and only what the records need allocated.
    with ext4(tmp_path / "disk", 16 * MiB) as disk:
        a, b = SegmentStore(disk / "a"), SegmentStore(disk / "b")
        for store in (a, b):
            for i in range(20):  # 60 KB: within the first 64 KiB allocated
                store.append(msg(i))
            store.flush()
        filler = disk / "filler"
        fill(filler)
        os.truncate(filler, filler.stat().st_size - 48 * 1024)
        with caplog.at_level(logging.WARNING, "warren.store"):
            for i in range(20, 30):  # 30 KB more: a's next allocation ahead is 64 KiB
                a.append(msg(i))
            for i in range(20, 23):  # 9 KB more for b
                b.append(msg(i))
            a.flush()
            b.flush()
        assert "cannot write" not in caplog.text, caplog.text
        assert drain(a) == list(range(30))
        assert drain(b) == list(range(23))
        a.close()
        b.close()


def test_stream_chunk_records_lost_give_their_offsets_back(disk: Path) -> None:
    """A chunk record a failed write-out dropped hands all its offsets out again
    (StreamStore._records_lost counts a chunk record's entries)."""
    d = disk / "s"
    store = StreamStore(d, segment_size=256 * 1024)
    entries = b"".join(
        struct.pack(">I", 3000) + f"c{i}:".encode().ljust(3000, b".") for i in range(5)
    )
    for i in range(2):
        assert store.append_chunk(entries, 5, 1000 + i) == 5 * i
    store.flush()
    fill(disk / "filler")
    for i in range(2, 20):
        store.append_chunk(entries, 5, 1000 + i)
    store.flush()
    kept = store.next_offset
    assert 10 <= kept < 100 and kept % 5 == 0
    (disk / "filler").unlink()
    assert store.append_chunk(entries, 5, 2000) == kept
    store.flush()
    cursor = store.cursor(0)
    offsets = []
    while (item := cursor.next()) is not None:
        offsets.append(item[0])
    cursor.close()
    assert offsets == list(range(kept + 5))
    store.close()
    reopened = StreamStore(d, segment_size=256 * 1024)
    assert reopened.next_offset == kept + 5
    reopened.close()
