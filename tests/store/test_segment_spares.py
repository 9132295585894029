"""Spare segment files (docs/storage.md, "Writing" and "Recovery"): a fully
acknowledged segment is kept as ``spare.<id>`` (its header says spare), reused
for a new segment once a sync round has made that durable, and every state a
crash can leave between those steps opens to the same messages, with the file
still a spare: never served, never lost track of."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from warren.core.message import Message
from warren.store.disk_budget import DiskBudget
from warren.store.priority_store import PriorityStore
from warren.store.segment_format import SPARE_ID, V2_HEADER_SIZE, encode_header, parse_header
from warren.store.segment_spares import MAX_SPARES
from warren.store.segment_store import SegmentStore
from warren.store.stream_store import StreamStore

SEGMENT = 8192  # about seven 1 KiB messages a segment


def msg(i: int, size: int = 1000) -> Message:
    return Message("ex", "rk", b"\x10\x00\x02", f"m{i}:".encode().ljust(size, b"."), 1000 + i)


def take(store: SegmentStore, n: int, ack: bool = True) -> list[int]:
    out = []
    for _ in range(n):
        item = store.shift()
        assert item is not None
        out.append(item[1].timestamp - 1000)
        if ack:
            store.ack(item[0])
    return out


def drain(store: SegmentStore) -> list[int]:
    return take(store, store.ready_count)


def segments(d: Path) -> list[Path]:
    return sorted(d.glob("msgs.??????????"))


def spares(d: Path) -> list[Path]:
    return sorted(d.glob("spare.??????????"))


def header_id(path: Path) -> int:
    header = parse_header(path.read_bytes()[:V2_HEADER_SIZE])
    assert not header.problem
    return header.segment_id


@pytest.fixture
def budget() -> DiskBudget:
    """A data directory's budget of its own, given to every store of the test:
    its spares are counted apart from other tests'."""
    return DiskBudget(on_spent=lambda: None)


def retired_one(d: Path, budget: DiskBudget) -> tuple[SegmentStore, int]:
    """A store whose first segment (7 messages) was consumed and acked: a spare.
    Returns the store (messages 7-19 ready) and the spare's id."""
    store = SegmentStore(d, segment_size=SEGMENT, budget=budget)
    first = [store.append(msg(i)) for i in range(20)]
    store.sync()
    assert take(store, 7) == list(range(7))
    store.flush()
    sid = first[0] >> 32
    assert first[7] >> 32 == sid + 1  # seven to a segment
    return store, sid


def test_a_fully_acknowledged_segment_becomes_a_spare_reused_after_a_sync(
    tmp_path: Path, budget: DiskBudget
) -> None:
    d = tmp_path / "q"
    store, sid = retired_one(d, budget)
    (spare,) = spares(d)
    assert spare.name == f"spare.{sid:010d}"
    assert not (d / f"msgs.{sid:010d}").exists() and not (d / f"acks.{sid:010d}").exists()
    assert header_id(spare) == SPARE_ID
    assert budget.spare_bytes == spare.stat().st_size == SEGMENT
    inode = spare.stat().st_ino
    # Not before a sync round has made the spare durable: a fresh file.
    fresh = [store.append(msg(i)) for i in range(20, 27)]
    assert (d / f"msgs.{fresh[-1] >> 32:010d}").stat().st_ino != inode
    assert spares(d) == [spare]
    store.sync()  # fdatasyncs the spare (and the directory)
    store.sync()  # the round after: it is ready
    reused = [store.append(msg(i)) for i in range(27, 34)]
    new_id = reused[-1] >> 32
    path = d / f"msgs.{new_id:010d}"
    assert path.stat().st_ino == inode and not spares(d)
    assert budget.spare_bytes == 0
    store.sync()
    header = parse_header(path.read_bytes()[:V2_HEADER_SIZE])
    assert header.segment_id == new_id and not header.problem
    assert drain(store) == list(range(7, 34))
    store.close()
    store = SegmentStore(d, segment_size=SEGMENT, budget=budget)
    assert store.ready_count == 0
    store.close()


def test_the_previous_lifes_records_never_come_back(tmp_path: Path, budget: DiskBudget) -> None:
    """A reused file holds the acknowledged records of its previous life past the
    new life's end mark: after a crash (no clean close) they are not read."""
    d = tmp_path / "q"
    store, sid = retired_one(d, budget)
    inode = spares(d)[0].stat().st_ino
    store.sync()
    store.sync()
    later = [store.append(msg(i)) for i in range(20, 22)]
    # 20 goes where 19 left room; 21 starts the next segment in the spare.
    assert (d / f"msgs.{later[-1] >> 32:010d}").stat().st_ino == inode
    store.flush()  # handed to the OS: then kill -9
    again = SegmentStore(d, segment_size=SEGMENT, budget=budget)
    assert drain(again) == list(range(7, 22))
    again.close()
    store.close()


def spare_header(path: Path) -> None:
    with open(path, "r+b") as f:
        f.write(encode_header(SPARE_ID, 12345))


@pytest.mark.parametrize(
    "state",
    [
        "retire: spare header written, rename lost",
        "retire: renamed, spare header lost",
        "reuse: renamed, new header lost",
        "reuse: new header and records written, rename lost",
    ],
)
def test_every_state_a_crash_leaves_opens_to_the_same_messages(
    tmp_path: Path, budget: DiskBudget, state: str
) -> None:
    """Each state is made from real files as the step it names leaves them; the
    store opens with messages 7-19 (nothing of the spare's life, acked), the file
    is a spare again (``spare.<id>``, counted), and a later segment reuses it."""
    d = tmp_path / "q"
    store, sid = retired_one(d, budget)
    store.sync()
    store.close()
    (spare,) = spares(d)
    inode = spare.stat().st_ino
    old_acks = d / f"acks.{sid:010d}"
    if state.startswith("retire: spare header"):
        # The segment as it was (its acks too), but with the spare header.
        spare.rename(d / f"msgs.{sid:010d}")
        old_acks.write_bytes(b"")
    elif state.startswith("retire: renamed"):
        # The old header back: records that check out, in a spare's name.
        with open(spare, "r+b") as f:
            f.write(encode_header(sid, 0x5A5A5A5A))
    elif state.startswith("reuse: renamed"):
        # Renamed to the next segment's name; its spare header durable, not the new one.
        spare.rename(d / f"msgs.{sid + 9:010d}")
    else:
        # The new life's header and a record in it, in the spare's name.
        other = SegmentStore(tmp_path / "other", segment_size=SEGMENT, budget=budget)
        other.append(msg(99))
        other.close()
        (written,) = segments(tmp_path / "other")
        with open(spare, "r+b") as f:
            f.write(written.read_bytes()[: V2_HEADER_SIZE + 1100])
    store = SegmentStore(d, segment_size=SEGMENT, budget=budget)
    assert store.ready_count == 13
    assert [p.stat().st_ino for p in spares(d)] == [inode]
    # Its header says spare again: a reuse whose new header a power cut loses
    # leaves a spare, never a file whose header names another segment.
    assert header_id(spares(d)[0]) == SPARE_ID
    assert not old_acks.exists()
    assert budget.spare_bytes == SEGMENT
    store.sync()
    store.sync()
    for i in range(20, 30):
        store.append(msg(i))
    assert inode in [p.stat().st_ino for p in segments(d)] and not spares(d)
    assert drain(store) == list(range(7, 30))
    store.close()
    store = SegmentStore(d, segment_size=SEGMENT, budget=budget)
    assert store.ready_count == 0
    store.close()


def test_spares_are_bounded_per_store(tmp_path: Path, budget: DiskBudget) -> None:
    d = tmp_path / "q"
    store = SegmentStore(d, segment_size=SEGMENT, budget=budget)
    for i in range(50):
        store.append(msg(i))
    assert drain(store) == list(range(50))
    store.flush()
    assert len(spares(d)) == MAX_SPARES
    assert budget.spare_bytes == MAX_SPARES * SEGMENT
    store.close()
    assert budget.spare_bytes == 0  # a closed store's spares no longer count
    # A start finds more than it may keep (made by hand): the rest are deleted.
    for n in range(5):
        (d / f"spare.{900 + n:010d}").write_bytes(bytes(SEGMENT))
    store = SegmentStore(d, segment_size=SEGMENT, budget=budget)
    assert len(spares(d)) == MAX_SPARES and budget.spare_bytes == MAX_SPARES * SEGMENT
    # Its ids are never handed out again.
    assert store.append(msg(0)) >> 32 > 904
    store.close()


@pytest.mark.parametrize("limit", ["spare_limit", "left"])
def test_no_spare_is_kept_beyond_the_data_directorys_budget(
    tmp_path: Path, budget: DiskBudget, limit: str
) -> None:
    """At most ``spare_limit`` bytes of spares per data directory, and none while
    the free-disk budget is low: the file is deleted as before."""
    if limit == "spare_limit":
        budget.spare_limit = SEGMENT
    d = tmp_path / "q"
    store = SegmentStore(d, segment_size=SEGMENT, budget=budget)
    for i in range(30):
        store.append(msg(i))
    if limit == "left":
        budget.left = SEGMENT // 2
    assert drain(store) == list(range(30))
    store.flush()
    assert len(spares(d)) == (1 if limit == "spare_limit" else 0)
    store.close()


def test_spares_are_deleted_when_the_disk_runs_short(tmp_path: Path, budget: DiskBudget) -> None:
    """A spare is disk space the free-disk alarm would count: once the budget has
    less room than the spares hold, the next sync round deletes them."""
    d = tmp_path / "q"
    store = SegmentStore(d, segment_size=SEGMENT, budget=budget)
    for i in range(30):
        store.append(msg(i))
    assert drain(store) == list(range(30))
    store.sync()
    assert len(spares(d)) == 2
    budget.left = SEGMENT
    store.sync()
    assert not spares(d) and budget.spare_bytes == 0
    store.close()


def test_a_purged_queue_keeps_its_files_as_spares(tmp_path: Path, budget: DiskBudget) -> None:
    d = tmp_path / "q"
    store = SegmentStore(d, segment_size=SEGMENT, budget=budget)
    for i in range(12):
        store.append(msg(i))
    store.sync()
    assert store.purge() == 12
    store.flush()
    assert not segments(d) and len(spares(d)) == 2
    store.close()
    store = SegmentStore(d, segment_size=SEGMENT, budget=budget)
    assert store.ready_count == 0
    store.close()


def test_a_priority_queues_levels_reuse_their_files(tmp_path: Path, budget: DiskBudget) -> None:
    d = tmp_path / "pq"
    store = PriorityStore(
        2, lambda level: SegmentStore(d / f"p{level}", segment_size=SEGMENT, budget=budget)
    )
    for i in range(10):
        store.append(Message("ex", "rk", b"\x10\x00\x02", b"x" * 1000, i))
    store.sync()
    for _ in range(10):
        item = store.shift()
        assert item is not None
        store.ack(item[0])
    store.flush()
    assert spares(d / "p0")
    store.close()


def test_a_delete_removes_the_spares_and_their_count(tmp_path: Path, budget: DiskBudget) -> None:
    d = tmp_path / "q"
    store, _sid = retired_one(d, budget)
    assert budget.spare_bytes == SEGMENT
    store.delete()
    assert not d.exists() and budget.spare_bytes == 0


def test_a_transient_store_keeps_no_spares(tmp_path: Path, budget: DiskBudget) -> None:
    d = tmp_path / "t"
    store = SegmentStore(d, segment_size=SEGMENT, preallocate=False, budget=budget)
    for i in range(20):
        store.append(msg(i))
    assert drain(store) == list(range(20))
    store.flush()
    assert not spares(d) and os.listdir(d)
    store.close()


def test_a_streams_retention_deletes_what_it_drops(tmp_path: Path, budget: DiskBudget) -> None:
    """Streams keep no spares: their readers may still map a segment that
    retention drops, and a reused file would change under them."""
    d = tmp_path / "s"
    stream = StreamStore(d, segment_size=SEGMENT, budget=budget)
    for i in range(40):
        stream.append(msg(i))
    stream.sync()
    before = len(segments(d))
    assert stream.apply_retention(None, 2 * SEGMENT, None, 0) > 0
    stream.sync()
    assert len(segments(d)) < before and not spares(d) and budget.spare_bytes == 0
    stream.close()
