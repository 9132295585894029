"""Damaged message files never cost intact messages, and damaged bytes are never served.

Real files on disk, damaged the way a disk or an operator damages them (a length
field overwritten, bits flipped, bytes cut off), under real SegmentStore,
and PriorityStore instances that are closed and reopened, and one queue end to
end through the broker with pika (streams: test_stream_damage.py). docs/storage.md, "Damage to
message files", is what these check. The hypothesis tests try 150 damages each;
DAMAGE_EXAMPLES=3000 in the environment tries more (about two minutes).
"""

from __future__ import annotations

import logging
import os
import shutil
import struct
import tempfile
from collections.abc import Callable
from pathlib import Path

import pika
import pytest
from conftest import start_broker
from damage_helpers import (
    DAMAGE_SETTINGS,
    Written,
    ack_batch,
    aside_files,
    check_served,
    damage,
    drain,
    errors,
    filled,
    flip,
    hit_by,
    layout,
    msg,
    noise,
    numbers,
    overwrite,
    sha1,
    varied,
)
from hypothesis import given
from hypothesis import strategies as st
from pikahelp import connect

from warren.core.message import Message
from warren.store import records
from warren.store.priority_store import PriorityStore, level_name
from warren.store.segment_format import parse_header
from warren.store.segment_store import SegmentStore

# -- recovery -------------------------------------------------------------------------


def test_a_damaged_length_field_costs_only_its_record_across_restarts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    d = tmp_path / "q"
    store = SegmentStore(d, 4096)
    seqs = [store.append(msg(i)) for i in range(100)]
    # Two messages after the victim are delivered and acked before the damage.
    while (item := store.shift()) is not None and item[1].timestamp < 1007:
        if item[1].timestamp in (1005, 1006):
            store.ack(item[0])
    store.close()
    path = d / f"msgs.{seqs[3] >> 32:010d}"
    recs = layout(path)
    victim, length = recs[3]
    in_segment = len(recs)
    original = path.read_bytes()[victim : victim + length]
    overwrite(path, victim, b"\x00\x01\x02\x03")  # a length past the end

    caplog.set_level(logging.INFO, logger="warren.store")
    store = SegmentStore(d, 4096)
    assert store.ready_count == 97  # 100 - the damaged one - the two acked
    (line,) = errors(caplog)
    assert str(d) in line and path.name in line
    assert f"bytes {victim}-{victim + length}" in line
    assert f"{in_segment - 4} intact records after them" in line
    assert aside_files(d) == [f"{path.name}.damaged-{victim:010d}"]
    assert (d / aside_files(d)[0]).read_bytes() == b"\x00\x01\x02\x03" + original[4:]
    assert (d / f"acks.{seqs[0] >> 32:010d}").exists()  # the acks kept
    store.close()

    # A second start: the same damage, known already, is not reported as new loss.
    caplog.clear()
    store = SegmentStore(d, 4096)
    assert store.ready_count == 97
    assert not errors(caplog)
    assert "earlier start" in caplog.text
    assert aside_files(d) == [f"{path.name}.damaged-{victim:010d}"]
    got = drain(store)
    assert numbers(got) == [i for i in range(100) if i not in (3, 5, 6)]
    assert [m.body for m in got] == [msg(i).body for i in range(100) if i not in (3, 5, 6)]
    store.close()
    store = SegmentStore(d, 4096)
    assert store.ready_count == 0
    store.close()
    assert not path.exists()  # fully acked: deleted, its damaged bytes kept aside
    assert aside_files(d) == [f"{path.name}.damaged-{victim:010d}"]


def test_delivered_marks_and_seqs_hold_across_damage(tmp_path: Path) -> None:
    d = tmp_path / "q"
    seqs = filled(d, 20)
    overwrite(d / f"msgs.{seqs[5] >> 32:010d}", seqs[5] & 0xFFFFFFFF, b"\xff\xff\x00\x00")
    store = SegmentStore(d, 4096, delivered_mark=0)  # as after a clean stop
    first = [store.shift() for _ in range(10)]  # 0-4 and 6-10, left unacked
    assert [item[0] for item in first if item] == [s for i, s in enumerate(seqs[:11]) if i != 5]
    marks = store.delivered_marks()
    store.close()
    store = SegmentStore(d, 4096, delivered_mark=marks[d])
    assert store.ready_count == 19
    again = []
    while (item := store.shift()) is not None:
        again.append((item[0], item[1].timestamp - 1000, item[2]))
    expected = [(s, i, i <= 10) for i, s in enumerate(seqs) if i != 5]
    assert again == expected  # the same seqs; redelivered exactly those delivered before
    store.close()


def test_garbage_over_several_records_costs_only_those(tmp_path: Path) -> None:
    d = tmp_path / "q"
    seqs = filled(d)
    path = d / f"msgs.{seqs[0] >> 32:010d}"
    recs = layout(path)
    start = recs[4][0] + 20
    end = recs[7][0] + 3  # into records 4, 5, 6 and 7's length field
    overwrite(path, start, noise(end - start))
    store = SegmentStore(d, 4096)
    assert numbers(drain(store)) == [i for i in range(100) if i not in (4, 5, 6, 7)]
    store.close()


def test_a_damaged_last_record_is_kept_aside_before_the_cut(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Version 1: the file's size is the end of its data."""
    d = tmp_path / "q"
    seqs = filled(d, 10, version=1)
    path = d / f"msgs.{seqs[-1] >> 32:010d}"
    size = path.stat().st_size
    last = seqs[-1] & 0xFFFFFFFF
    flip(path, last + 40)  # in the body: the record is whole, and damaged
    original = path.read_bytes()[last:]
    caplog.set_level(logging.WARNING, logger="warren.store")
    store = SegmentStore(d, 4096)
    assert store.ready_count == 9
    assert path.stat().st_size == last
    (line,) = errors(caplog)
    assert f"bytes {last}-{size}" in line and "cut off" in line
    assert (d / f"{path.name}.damaged-{last:010d}").read_bytes() == original
    store.append(msg(10))
    store.close()
    caplog.clear()
    store = SegmentStore(d, 4096)
    assert not errors(caplog)
    assert numbers(drain(store)) == [*range(9), 10]
    store.close()


def test_a_torn_last_write_is_cut_without_a_copy(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Version 1: the file's size is the end of its data."""
    d = tmp_path / "q"
    seqs = filled(d, 10, version=1)
    path = d / f"msgs.{seqs[-1] >> 32:010d}"
    os.truncate(path, path.stat().st_size - 30)
    caplog.set_level(logging.WARNING, logger="warren.store")
    store = SegmentStore(d, 4096)
    assert store.ready_count == 9
    assert not errors(caplog) and "torn" in caplog.text
    assert aside_files(d) == []
    store.close()


def test_a_damaged_file_header_does_not_hide_the_records(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    d = tmp_path / "q"
    seqs = filled(d, 10)
    path = d / f"msgs.{seqs[0] >> 32:010d}"
    flip(path, 1)  # b"WSEG" -> b"WREG"
    caplog.set_level(logging.WARNING, logger="warren.store")
    store = SegmentStore(d, 4096)
    assert numbers(drain(store, ack=False)) == list(range(10))
    assert "header is damaged" in caplog.text
    store.close()
    # A later format version is not ours to read: left alone, never deleted.
    future = tmp_path / "future"
    seqs = filled(future, 10)
    path = future / f"msgs.{seqs[0] >> 32:010d}"
    overwrite(path, 4, struct.pack(">I", 7))  # two bits from both 1 and 2
    before = path.read_bytes()
    store = SegmentStore(future, 4096)
    assert store.ready_count == 0
    store.close()
    assert path.read_bytes() == before


def test_a_zeroed_header_costs_no_record_and_removes_only_files_never_written(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A header of zeros is what a file allocated and never written holds, but
    also what a block zeroed on the disk leaves: the records after it are read
    (the salt worked out from them), the bytes of a file that holds anything
    else are left as they are; only a file of zeros, or one shorter than its
    header, goes."""
    caplog.set_level(logging.WARNING, logger="warren.store")
    d = tmp_path / "q"
    seqs = filled(d, 10)
    path = d / f"msgs.{seqs[0] >> 32:010d}"
    overwrite(path, 0, bytes(24))
    store = SegmentStore(d, 4096)
    assert numbers(drain(store, ack=False)) == list(range(10))
    assert "header is damaged" in caplog.text
    store.close()
    # Not records after it either: not ours to read, and never deleted.
    other = tmp_path / "other"
    seqs = filled(other, 10)
    path = other / f"msgs.{seqs[0] >> 32:010d}"
    overwrite(path, 0, bytes(64))
    before = path.read_bytes()
    store = SegmentStore(other, 4096)
    assert store.ready_count == 0
    store.close()
    assert path.read_bytes() == before
    # Zeros throughout, or cut inside its header: it never held a record.
    for name, content in (("zeros", bytes(65536)), ("cut", path.read_bytes()[:16])):
        empty = tmp_path / name
        empty.mkdir()
        (empty / "msgs.0000000001").write_bytes(content)
        store = SegmentStore(empty, 4096)
        assert store.ready_count == 0
        store.close()
        assert not (empty / "msgs.0000000001").exists(), name


# -- ack files ------------------------------------------------------------------------


def test_a_damaged_ack_batch_brings_its_messages_back_and_nothing_else(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    d = tmp_path / "q"
    store = SegmentStore(d, 1 << 20)
    seqs = [store.append(msg(i)) for i in range(20)]
    items = [store.shift() for _ in range(6)]
    for item in items[:3]:
        assert item is not None
        store.ack(item[0])
    store.flush()  # batch one: 0, 1, 2
    for item in items[3:]:
        assert item is not None
        store.ack(item[0])
    store.close()  # batch two: 3, 4, 5
    acks = d / f"acks.{seqs[0] >> 32:010d}"
    offsets = [s & 0xFFFFFFFF for s in seqs]
    assert acks.read_bytes() == ack_batch(offsets[:3]) + ack_batch(offsets[3:6])
    # An entry of batch one is turned into another message's offset: without
    # the batch's CRC, message 10 would be taken for acknowledged.
    overwrite(acks, 4, struct.pack(">I", offsets[10]))
    caplog.set_level(logging.WARNING, logger="warren.store")
    store = SegmentStore(d, 1 << 20)
    assert numbers(drain(store)) == [0, 1, 2, *range(6, 20)]
    (line,) = errors(caplog)
    assert acks.name in line and "bytes 0-20" in line and "delivered again" in line
    assert (d / f"{acks.name}.damaged-{0:010d}").exists()
    store.close()


def test_an_ack_file_cut_short_never_costs_an_unacked_message(tmp_path: Path) -> None:
    d = tmp_path / "q"
    store = SegmentStore(d, 1 << 20)
    seqs = [store.append(msg(i)) for i in range(10)]
    for _ in range(4):
        item = store.shift()
        assert item is not None
        store.ack(item[0])
    store.close()
    acks = d / f"acks.{seqs[0] >> 32:010d}"
    whole = acks.read_bytes()
    for cut in range(len(whole)):
        acks.write_bytes(whole[:cut])
        store = SegmentStore(d, 1 << 20)
        got = numbers(drain(store, ack=False))
        assert got[-6:] == list(range(4, 10)), cut  # 0-3 may come back
        store.close()


def test_an_ack_entry_at_a_damaged_record_is_not_taken_for_a_record(tmp_path: Path) -> None:
    d = tmp_path / "q"
    store = SegmentStore(d, 4096)
    seqs = [store.append(msg(i)) for i in range(10)]
    for _ in range(3):
        item = store.shift()
        assert item is not None
        store.ack(item[0])  # 0, 1, 2
    store.close()
    path = d / f"msgs.{seqs[0] >> 32:010d}"
    overwrite(path, seqs[1] & 0xFFFFFFFF, b"\xff\xff\xff\xff")  # acked message 1
    store = SegmentStore(d, 4096)
    assert numbers(drain(store, ack=False)) == list(range(3, 10))
    store.close()
    acks = (d / f"acks.{seqs[0] >> 32:010d}").read_bytes()
    assert acks == ack_batch([seqs[0] & 0xFFFFFFFF, seqs[2] & 0xFFFFFFFF])


def test_an_ack_file_of_the_old_format_is_read_and_rewritten(tmp_path: Path) -> None:
    d = tmp_path / "q"
    seqs = filled(d, 10)
    acks = d / f"acks.{seqs[0] >> 32:010d}"
    acks.write_bytes(struct.pack(">3I", *(s & 0xFFFFFFFF for s in seqs[2:5])))
    store = SegmentStore(d, 4096)
    assert numbers(drain(store, ack=False)) == [0, 1, *range(5, 10)]
    store.close()
    assert acks.read_bytes() == ack_batch([s & 0xFFFFFFFF for s in seqs[2:5]])


# -- the read path --------------------------------------------------------------------


def test_a_record_damaged_while_the_store_is_open_is_never_served(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    d = tmp_path / "q"
    store = SegmentStore(d, 4096)
    seqs = [store.append(msg(i)) for i in range(100)]
    got = [store.shift() for _ in range(5)]
    path = d / f"msgs.{seqs[20] >> 32:010d}"
    store.flush()
    flip(path, (seqs[20] & 0xFFFFFFFF) + 50)  # a body byte: only the CRC tells
    path2 = d / f"msgs.{seqs[60] >> 32:010d}"
    overwrite(path2, seqs[60] & 0xFFFFFFFF, b"\x00\x00\x00\x40")  # a length field
    caplog.set_level(logging.WARNING, logger="warren.store")
    rest = drain(store)
    for item in got:
        assert item is not None
        store.ack(item[0])
    assert numbers(rest) == [i for i in range(5, 100) if i not in (20, 60)]
    assert [m.body for m in rest] == [msg(i).body for i in range(5, 100) if i not in (20, 60)]
    assert store.ready_count == 0 and store.ready_bytes == 0
    lines = errors(caplog)
    assert len(lines) == 2
    assert path.name in lines[0] and f"offset {seqs[20] & 0xFFFFFFFF}" in lines[0]
    assert path2.name in lines[1] and f"offset {seqs[60] & 0xFFFFFFFF}" in lines[1]
    assert f"{path.name}.damaged-{seqs[20] & 0xFFFFFFFF:010d}" in aside_files(d)
    # Appends go on, and a restart finds nothing to report anew.
    store.append(msg(100))
    store.close()
    caplog.clear()
    store = SegmentStore(d, 4096)
    assert not errors(caplog)
    assert numbers(drain(store)) == [100]
    store.close()


def test_peek_steps_over_a_record_damaged_on_disk(tmp_path: Path) -> None:
    d = tmp_path / "q"
    store = SegmentStore(d, 4096)
    seqs = [store.append(msg(i)) for i in range(10)]
    store.flush()
    flip(d / f"msgs.{seqs[0] >> 32:010d}", (seqs[0] & 0xFFFFFFFF) + 40)
    peeked = store.peek()
    assert peeked is not None and peeked[1].timestamp == 1001
    assert store.ready_count == 9
    assert numbers(drain(store)) == list(range(1, 10))
    store.close()


def test_a_dead_record_damaged_after_recovery_is_stepped_over(tmp_path: Path) -> None:
    d = tmp_path / "q"
    store = SegmentStore(d, 4096)
    seqs = [store.append(msg(i)) for i in range(10)]
    store.close()
    store = SegmentStore(d, 4096)
    assert store.remove_ready(seqs[4]) is not None  # dead, still ahead of the cursor
    store.close()
    store = SegmentStore(d, 4096)  # recovery's skip list holds it
    overwrite(d / f"msgs.{seqs[4] >> 32:010d}", seqs[4] & 0xFFFFFFFF, b"\x00\x00\x00\x01")
    assert numbers(drain(store)) == [i for i in range(10) if i != 4]
    assert store.ready_count == 0
    store.close()


def test_priority_levels_recover_and_read_the_same_way(tmp_path: Path) -> None:
    d = tmp_path / "pq"

    def opened() -> PriorityStore:
        return PriorityStore(10, lambda p: SegmentStore(d / level_name(p), 4096), d)

    def pmsg(i: int, priority: int) -> Message:
        props = bytes([0x18, 0x00, 2, priority])  # delivery-mode, priority
        return Message("ex", "rk", props, f"m{i}:".encode().ljust(100, b"."), 1000 + i)

    store = opened()
    seqs = [store.append(pmsg(i, 5 if i % 2 else 0)) for i in range(60)]
    store.close()
    level5 = d / level_name(5)
    inner = seqs[21] & ((1 << 66) - 1)
    overwrite(level5 / f"msgs.{inner >> 32:010d}", inner & 0xFFFFFFFF, b"\xff\x00\x00\x00")
    store = opened()
    assert store.ready_count == 59
    got = numbers(drain(store, ack=False))
    assert got == [i for i in range(1, 60, 2) if i != 21] + list(range(0, 60, 2))
    assert aside_files(level5)
    store.close()
    # Damaged while open, in the other level.
    store = opened()
    level0 = d / level_name(0)
    inner = seqs[40] & ((1 << 66) - 1)
    flip(level0 / f"msgs.{inner >> 32:010d}", (inner & 0xFFFFFFFF) + 60)
    got = numbers(drain(store))
    assert got == [i for i in range(1, 60, 2) if i != 21] + [i for i in range(0, 60, 2) if i != 40]
    assert store.ready_count == 0
    store.close()


# -- every flip and cut in the last KB ------------------------------------------------


def uniform(i: int) -> Message:
    """Records of 128 bytes: a flipped bit 7 or higher in an ack entry makes it
    another record's offset."""
    return msg(i, size=91)


def write_queue(directory: Path, make: Callable[[int], Message], version: int = 2) -> Written:
    w = Written(directory)
    store = SegmentStore(w.directory, 2048, format_version=version)
    seqs = [store.append(make(i)) for i in range(60)]
    while (item := store.shift()) is not None:
        i = item[1].timestamp - 1000
        if i % 3 == 0:
            store.ack(item[0])
            w.acked.add(i)
        if i % 7 == 0:
            store.flush()  # acks in several batches
    store.close()
    for i, seq in enumerate(seqs):
        name = f"msgs.{seq >> 32:010d}"
        layout_ = dict(layout(w.directory / name))
        w.where[i] = (name, seq & 0xFFFFFFFF, layout_[seq & 0xFFFFFFFF])
    return w


@pytest.fixture(scope="module", params=[1, 2], ids=["version-1", "version-2"])
def written_queue(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Written:
    return write_queue(tmp_path_factory.mktemp("damage") / "q", varied, request.param)


@pytest.fixture(scope="module", params=[1, 2], ids=["version-1", "version-2"])
def written_uniform(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Written:
    return write_queue(tmp_path_factory.mktemp("damage") / "q", uniform, request.param)


@DAMAGE_SETTINGS
@given(data=st.data(), while_open=st.booleans())
def test_any_flip_or_cut_in_a_segment_costs_only_what_it_hits(
    written_queue: Written, data: st.DataObject, while_open: bool
) -> None:
    w = written_queue
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "q"
        shutil.copytree(w.directory, d)
        name = data.draw(st.sampled_from(sorted({f for f, _o, _n in w.where.values()})))
        path = d / name
        store = SegmentStore(d, 2048) if while_open else None
        kind, at = damage(data, path, bits_only=while_open)
        hit = hit_by(w, name, kind, at)
        if store is None:
            store = SegmentStore(d, 2048)
        ready = store.ready_count
        got = drain(store, ack=False)
        unacked = set(range(60)) - w.acked
        check_served(got, unacked - hit, unacked)
        if not while_open:
            assert ready == len(got)
        store.close()
        reopened = SegmentStore(d, 2048)
        assert reopened.ready_count == len(got) or while_open
        check_served(drain(reopened, ack=False), unacked - hit, unacked)
        reopened.close()


@DAMAGE_SETTINGS
@given(data=st.data())
def test_any_flip_or_cut_in_an_ack_file_costs_no_unacked_message(
    written_uniform: Written, data: st.DataObject
) -> None:
    w = written_uniform
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "q"
        shutil.copytree(w.directory, d)
        name = data.draw(st.sampled_from(sorted(n for n in os.listdir(d) if n.startswith("acks."))))
        damage(data, d / name)
        store = SegmentStore(d, 2048)
        got = drain(store, ack=False)
        assert store.ready_count == 0
        unacked = set(range(60)) - w.acked
        check_served(got, unacked, set(range(60)), uniform)
        store.close()
        reopened = SegmentStore(d, 2048)
        again = drain(reopened, ack=False)
        check_served(again, set(numbers(got)), set(numbers(got)), uniform)
        reopened.close()


# -- end to end -----------------------------------------------------------------------


def test_a_damaged_record_through_the_broker_costs_only_itself(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Confirmed persistent messages, the broker stopped, one record's length field
    in the middle of a segment overwritten, the broker restarted on the same data
    directory: every other message arrives, in order; the damaged one does not,
    the log says where; a further restart finds nothing new."""
    data = tmp_path / "data"
    broker = start_broker(data, segment_size=64 * 1024)
    try:
        with connect(broker) as conn:
            ch = conn.channel()
            ch.confirm_delivery()
            ch.queue_declare("orders", durable=True)
            for i in range(2000):
                body = f"order {i}".encode().ljust(100, b".")
                ch.basic_publish("", "orders", body, pika.BasicProperties(delivery_mode=2))
    finally:
        broker.stop()
    qdir = data / "vhosts" / sha1("/") / "queues" / sha1("orders")
    segments = sorted(qdir.glob("msgs.*"))
    assert len(segments) >= 3
    path = segments[1]
    recs = layout(path)
    victim, length = recs[len(recs) // 2]
    record = path.read_bytes()[victim : victim + length]
    seed = parse_header(path.read_bytes()[:24]).seed
    damaged_body = records.decode_record(record, 0, len(record), True, seed)[0].body
    overwrite(path, victim, b"\x7f\x00\x00\x01")

    caplog.set_level(logging.WARNING, logger="warren.store")
    broker = start_broker(data, segment_size=64 * 1024)
    try:
        (line,) = errors(caplog)
        assert str(qdir) in line and path.name in line
        assert f"bytes {victim}-{victim + length}" in line
        assert f"{len(recs) - len(recs) // 2 - 1} intact records after them" in line
        with connect(broker) as conn:
            ch = conn.channel()
            assert ch.queue_declare("orders", passive=True).method.message_count == 1999
    finally:
        broker.stop()

    caplog.clear()
    broker = start_broker(data, segment_size=64 * 1024)
    try:
        assert not errors(caplog)
        with connect(broker) as conn:
            ch = conn.channel()
            got = []
            while True:
                method, _props, body = ch.basic_get("orders", auto_ack=True)
                if method is None:
                    break
                got.append(body)
    finally:
        broker.stop()
    expected = [f"order {i}".encode().ljust(100, b".") for i in range(2000)]
    expected.remove(damaged_body)
    assert got == expected
    assert (qdir / f"{path.name}.damaged-{victim:010d}").read_bytes()[4:] == record[4:]
