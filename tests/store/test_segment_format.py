"""The segment file format's version 2 (docs/storage.md, "Segment file header"):
files allocated ahead and written in place, record CRCs seeded with the
segment's salt (a record copied from another file never checks out; C and
Python agree), the data ended by a mark, not
by the file's size; version-1 files still read."""

from __future__ import annotations

import importlib
import logging
import zlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warren.core.message import Message
from warren.store import records
from warren.store.disk_budget import DiskBudget
from warren.store.records import CorruptRecord, decode_record, encode_message_record, inspect_record
from warren.store.segment_alloc import FIRST_ALLOCATION
from warren.store.segment_damage import next_record_python
from warren.store.segment_format import (
    CLOSE_MARK,
    END_MARK,
    MARK_SIZE,
    V2,
    V2_HEADER_SIZE,
    encode_header,
    mark,
    mark_at,
    parse_header,
    recover_seed,
)
from warren.store.segment_store import SegmentStore

try:
    _fast: Any = importlib.import_module("warren._fastpath")
except ImportError:
    _fast = None
needs_c = pytest.mark.skipif(_fast is None, reason="warren._fastpath is not built")

seeds = st.integers(0, 0xFFFFFFFF)


def message(body: bytes) -> Message:
    return Message("ex", "rk", b"\x10\x00\x02", body, 1234)


@given(body=st.binary(max_size=5000), seed=seeds)
def test_a_seeded_record_is_zlibs_crc32_seeded(body: bytes, seed: int) -> None:
    rec = encode_message_record(message(body), seed)
    assert int.from_bytes(rec[-4:], "big") == zlib.crc32(rec[:-4], seed)
    assert rec == records.encode_message(message(body), seed)
    msg, length = decode_record(rec, 0, len(rec), True, seed)
    assert (msg.body, length) == (body, len(rec))
    assert inspect_record(rec, 0, len(rec), True, seed)[0] == len(rec)


@given(body=st.binary(max_size=70000), seed=seeds, other=seeds)
def test_a_record_checks_out_only_with_its_own_seed(body: bytes, seed: int, other: int) -> None:
    """The salt is what tells a record of a recycled file's previous life from
    one of its current life: with another seed its CRC fails, in C (records up
    to 64 KiB) and Python alike."""
    rec = encode_message_record(message(body), seed)
    if other == seed:
        other ^= 1
    with pytest.raises(CorruptRecord, match="CRC"):
        decode_record(rec, 0, len(rec), True, other)
    with pytest.raises(CorruptRecord, match="CRC"):
        inspect_record(rec, 0, len(rec), True, other)
    assert inspect_record(rec, 0, len(rec), False, other)[0] == len(rec)  # structure holds


@needs_c
@given(data=st.binary(min_size=4, max_size=5000), seed=seeds, cut=st.data())
def test_the_c_crc_check_agrees_with_zlib_for_any_seed(
    data: bytes, seed: int, cut: st.DataObject
) -> None:
    start = cut.draw(st.integers(0, len(data) - 4))
    end = cut.draw(st.integers(start, len(data) - 4))
    stored = int.from_bytes(data[end : end + 4], "big")
    assert _fast.crc_ok(data, start, end, seed) == (zlib.crc32(data[start:end], seed) == stored)
    good = data[:end] + zlib.crc32(data[start:end], seed).to_bytes(4, "big")
    assert _fast.crc_ok(good, start, end, seed)
    unseeded = zlib.crc32(data[start:end]) == int.from_bytes(good[end:], "big")
    assert _fast.crc_ok(good, start, end) == unseeded  # the default seed is 0 (version 1)


@needs_c
def test_the_c_functions_refuse_a_seed_that_is_not_a_u32() -> None:
    with pytest.raises(OverflowError):
        _fast.crc_ok(b"\x00" * 8, 0, 4, 1 << 32)


# -- version-2 files: allocated ahead, written in place, ended by a mark -------------


def test_a_version_2_header_reads_back_and_any_damage_shows() -> None:
    head = encode_header(1234, 0xDEADBEEF)
    header = parse_header(head)
    assert len(head) == V2_HEADER_SIZE and not header.problem
    assert (header.version, header.seed, header.start, header.segment_id) == (V2, 0xDEADBEEF, 24, 1234)
    for bit in range(V2_HEADER_SIZE * 8):
        hit = bytearray(head)
        hit[bit // 8] ^= 1 << (bit % 8)
        assert parse_header(bytes(hit)).problem, bit
    assert parse_header(b"WSEG" + (1).to_bytes(4, "big")).version == 1
    assert "truncated" in parse_header(head[:5]).problem


@given(offset=st.integers(0, 0xFFFFFFFF), seed=st.integers(1, 0xFFFFFFFF), closed=st.booleans())
def test_a_mark_is_its_own_offsets_and_lifes_only(offset: int, seed: int, closed: bool) -> None:
    kind = CLOSE_MARK if closed else END_MARK
    at = bytes(offset % 64) + mark(offset % 64, seed, closed)
    assert mark_at(at, offset % 64, len(at), seed) == kind
    assert mark_at(at, offset % 64, len(at), seed ^ 1) == 0  # another file's
    assert mark_at(mark(offset, seed, closed), 0, 8, seed) == (kind if offset == 0 else 0)
    assert mark_at(at, offset % 64, len(at) - 1, seed) == 0  # cut short
    assert mark_at(bytes(8), 0, 8, seed) == 0  # zeros are no mark


@given(body=st.binary(max_size=300), seed=st.integers(1, 0xFFFFFFFF))
def test_a_damaged_salt_is_given_back_by_a_records_crc(body: bytes, seed: int) -> None:
    rec = encode_message_record(message(body), seed)
    assert recover_seed(rec[:-4], int.from_bytes(rec[-4:], "big")) == seed


def msg(i: int, size: int = 100) -> Message:
    return Message("ex", "rk", b"\x10\x00\x02", f"m{i}:".encode().ljust(size, b"."), 1000 + i)


def numbers(store: SegmentStore, ack: bool = True) -> list[int]:
    out = []
    while (item := store.shift()) is not None:
        out.append(item[1].timestamp - 1000)
        if ack:
            store.ack(item[0])
    return out


def segments(d: Path) -> list[Path]:
    return sorted(d.glob("msgs.??????????"))


def test_a_segment_is_allocated_ahead_and_written_in_place(tmp_path: Path) -> None:
    """An fdatasync of an append changes no file size: the file is allocated
    ahead (64 KiB, then doubling up to the segment size), its header carries its
    id and a salt that seeds every record's CRC, and its data ends with an end
    mark, which the log knows as the end of the data."""
    d = tmp_path / "q"
    store = SegmentStore(d, segment_size=1 << 20)
    seqs = [store.append(msg(i)) for i in range(10)]
    store.sync()
    (path,) = segments(d)
    assert path.stat().st_size == FIRST_ALLOCATION
    raw = path.read_bytes()
    header = parse_header(raw[:V2_HEADER_SIZE])
    assert (header.version, header.segment_id, header.problem) == (V2, seqs[0] >> 32, "")
    assert header.seed and (seqs[0] & 0xFFFFFFFF) == V2_HEADER_SIZE
    end = (seqs[-1] & 0xFFFFFFFF) + len(encode_message_record(msg(9)))
    assert decode_record(raw, seqs[3] & 0xFFFFFFFF, end, True, header.seed)[0].body == msg(3).body
    assert mark_at(raw, end, len(raw), header.seed) == END_MARK
    assert not any(raw[end + MARK_SIZE :])  # allocated, never written
    for i in range(10, 500):  # 64 KiB and more: the next allocation doubles it
        store.append(msg(i))
    store.sync()
    assert path.stat().st_size == 2 * FIRST_ALLOCATION
    assert numbers(store) == list(range(500))
    store.close()


def test_a_clean_close_lets_the_next_start_append_after_it(tmp_path: Path) -> None:
    d = tmp_path / "q"
    store = SegmentStore(d)
    first = store.append(msg(0))
    store.close()
    (path,) = segments(d)
    raw = path.read_bytes()
    end = (first & 0xFFFFFFFF) + len(encode_message_record(msg(0)))
    assert mark_at(raw, end, len(raw), parse_header(raw[:V2_HEADER_SIZE]).seed) == CLOSE_MARK
    store = SegmentStore(d)
    assert store.append(msg(1)) >> 32 == first >> 32  # the same file, after the mark
    store.close()
    store = SegmentStore(d)
    assert numbers(store) == [0, 1]
    store.close()


def test_a_close_mark_with_this_lifes_writes_after_it_is_no_clean_end(tmp_path: Path) -> None:
    """A power cut after a restart that appended past a close mark can keep the
    page that holds the close mark as it was and later pages as written: records
    of this life lie past the close mark then. The next start must not append
    after it (new records would end where those begin, and a later search past
    damage could take one): a new segment, and those records are never read."""
    d = tmp_path / "q"
    store = SegmentStore(d)
    first = [store.append(msg(i)) for i in range(3)]
    store.close()
    (path,) = segments(d)
    end = (first[-1] & 0xFFFFFFFF) + len(encode_message_record(msg(2)))
    closed = path.read_bytes()[end : end + 8]
    store = SegmentStore(d)
    later = [store.append(msg(i, size=3000)) for i in range(3, 6)]
    assert {s >> 32 for s in later} == {first[0] >> 32}  # after the close mark
    store.flush()  # handed to the OS, never synced: then the power goes
    with open(path, "r+b") as f:  # the close mark's page as it was on the disk
        f.seek(end)
        f.write(closed + bytes(4096 - end % 4096 - 8))
    store = SegmentStore(d)
    again = store.append(msg(6))
    assert again >> 32 > first[0] >> 32  # not after that close mark: a new segment
    store.close()
    # Had it gone after that mark, its own mark damaged later would let the
    # search past the damage take those older records (3 is cut, 4 and 5 whole).
    at = (again & 0xFFFFFFFF) + len(encode_message_record(msg(6)))
    with open(d / f"msgs.{again >> 32:010d}", "r+b") as f:
        f.seek(at + 5)
        f.write(b"\xa5")
    store = SegmentStore(d)
    assert numbers(store) == [0, 1, 2, 6]
    store.close()


def test_after_a_crash_new_messages_go_to_a_new_segment(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A crash leaves an end mark (no close mark): whatever writes were under way
    could have left records of this life after it, so the file is not written
    again. Nothing is lost and nothing is reported."""
    d = tmp_path / "q"
    store = SegmentStore(d)
    first = [store.append(msg(i)) for i in range(5)]
    store.flush()  # handed to the OS; no close: as after kill -9
    caplog.set_level(logging.WARNING, logger="warren.store")
    again = SegmentStore(d)
    assert not caplog.records
    later = again.append(msg(5))
    assert later >> 32 > first[0] >> 32
    assert numbers(again, ack=False) == list(range(6))
    again.close()
    store.close()  # the abandoned one's descriptors


def test_what_lies_after_the_end_of_the_data_is_never_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Past the end mark: records of an earlier life (another salt, even where
    this life's records would start) and garbage. They are not damage: no
    warning, nothing kept aside, nothing cut; and damage that makes the walk
    look for the next record that checks out never takes one of them."""
    d = tmp_path / "q"
    store = SegmentStore(d)
    seqs = [store.append(msg(i)) for i in range(20)]
    store.flush()
    (path,) = segments(d)
    raw = path.read_bytes()
    seed = parse_header(raw[:V2_HEADER_SIZE]).seed
    end = (seqs[-1] & 0xFFFFFFFF) + len(encode_message_record(msg(19)))
    old = b"".join(encode_message_record(msg(100 + i), seed ^ 0x5A5A) for i in range(30))
    with open(path, "r+b") as f:  # the old life's records right after the mark
        f.seek(end + MARK_SIZE)
        f.write(old + b"\x00\x00\x01\x00garbage" * 20)
    size = path.stat().st_size
    caplog.set_level(logging.WARNING, logger="warren.store")
    reopened = SegmentStore(d)
    assert reopened.ready_count == 20 and not caplog.records
    assert path.stat().st_size == size and not list(d.glob("*.damaged-*"))
    reopened.close()
    store.close()
    # The last record damaged: kept aside up to the end mark, nothing after it taken.
    with open(path, "r+b") as f:
        f.seek((seqs[-1] & 0xFFFFFFFF) + 40)
        f.write(b"\xff")
    caplog.clear()
    reopened = SegmentStore(d)
    assert numbers(reopened) == list(range(19))
    assert [r.levelno for r in caplog.records] == [logging.ERROR]
    aside = d / f"{path.name}.damaged-{seqs[-1] & 0xFFFFFFFF:010d}"
    assert aside.read_bytes() == path.read_bytes()[seqs[-1] & 0xFFFFFFFF : end]
    reopened.close()


@pytest.mark.parametrize("lost", ["zeros", "old life"])
def test_writes_a_crash_cut_short_end_the_data_without_a_copy(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, lost: str
) -> None:
    """The pages of the last, unsynced writes lost to a power cut: the last
    records and the end mark read back as zeros (a new file) or as what the
    file held before (a recycled one). The data ends at the last intact record,
    with a warning; nothing is copied or cut; an end mark is written there so
    that a later start finds the end quietly, and the file is not written
    again."""
    d = tmp_path / "q"
    store = SegmentStore(d)
    seqs = [store.append(msg(i)) for i in range(10)]
    store.close()
    (path,) = segments(d)
    raw = path.read_bytes()
    seed = parse_header(raw[:V2_HEADER_SIZE]).seed
    cut = (seqs[8] & 0xFFFFFFFF) + 20  # into message 8
    filler = (
        bytes(len(raw) - cut)
        if lost == "zeros"
        else (encode_message_record(msg(50), seed ^ 1) * 100)[: len(raw) - cut]
    )
    with open(path, "r+b") as f:
        f.seek(cut)
        f.write(filler)
    caplog.set_level(logging.WARNING, logger="warren.store")
    store = SegmentStore(d)
    assert store.ready_count == 8
    (line,) = [r.getMessage() for r in caplog.records]
    assert "without an end mark" in line and f"offset {seqs[8] & 0xFFFFFFFF}" in line
    assert path.stat().st_size == len(raw) and not list(d.glob("*.damaged-*"))
    assert store.append(msg(10)) >> 32 > seqs[0] >> 32
    store.close()
    caplog.clear()
    store = SegmentStore(d)
    assert not caplog.records
    assert numbers(store) == [*range(8), 10]
    store.close()


def test_a_damaged_salt_is_recovered_from_the_records(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A flipped bit in the header's salt would fail every record's CRC: the
    salt is worked out from the first record's CRC instead (it is linear in the
    seed), confirmed by the next one, and the header kept aside."""
    d = tmp_path / "q"
    store = SegmentStore(d)
    seqs = [store.append(msg(i)) for i in range(10)]
    store.close()
    (path,) = segments(d)
    with open(path, "r+b") as f:
        f.seek(18)
        byte = f.read(1)[0]
        f.seek(18)
        f.write(bytes([byte ^ 0x10]))
    caplog.set_level(logging.WARNING, logger="warren.store")
    store = SegmentStore(d)
    assert numbers(store) == list(range(10))
    assert "header is damaged" in caplog.text
    assert (d / f"{path.name}.damaged-0000000000").read_bytes()[18] == byte ^ 0x10
    assert store.append(msg(10)) >> 32 > seqs[0] >> 32
    store.close()


def test_a_file_whose_header_names_another_segment_is_left_untouched(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An intact header that names another segment (a file renamed by hand) is
    not this segment's: not read as it, not written, not deleted, its id never
    reused."""
    d = tmp_path / "q"
    store = SegmentStore(d)
    seqs = [store.append(msg(i)) for i in range(10)]
    store.close()
    (path,) = segments(d)
    renamed = path.rename(d / f"msgs.{(seqs[0] >> 32) + 5:010d}")
    before = renamed.read_bytes()
    caplog.set_level(logging.INFO, logger="warren.store")
    store = SegmentStore(d)
    assert store.ready_count == 0
    assert "holds segment" in caplog.text and not list(d.glob("*.damaged-*"))
    assert store.append(msg(10)) >> 32 > (seqs[0] >> 32) + 5  # its id is not reused
    assert numbers(store) == [10]
    store.close()
    assert renamed.read_bytes() == before


def test_a_version_1_data_dir_still_opens(tmp_path: Path) -> None:
    """Files an earlier Warren wrote (version 1: appended, unseeded CRCs, the
    size as the end) are read as they were, with their acks; new messages go
    to a version-2 segment, and a version-1 file is never written again."""
    d = tmp_path / "q"
    old = SegmentStore(d, segment_size=4096, format_version=1)
    seqs = [old.append(msg(i)) for i in range(60)]
    for _ in range(5):
        item = old.shift()
        assert item is not None
        old.ack(item[0])
    old.close()
    before = {p.name: p.read_bytes() for p in segments(d)}
    assert all(parse_header(b[:8]).version == 1 for b in before.values())
    store = SegmentStore(d, segment_size=4096)
    assert store.ready_count == 55
    new = store.append(msg(60))
    assert new >> 32 > seqs[-1] >> 32
    store.close()
    after = {p.name: p.read_bytes() for p in segments(d)}
    assert {n: after[n] for n in before if n in after} == {n: before[n] for n in before if n in after}
    assert parse_header(after[f"msgs.{new >> 32:010d}"][:24]).version == V2
    store = SegmentStore(d, segment_size=4096)
    assert numbers(store) == list(range(5, 61))
    store.close()
    assert not segments(d) or all(parse_header(p.read_bytes()[:24]).version == V2 for p in segments(d))


def test_the_disk_budget_is_charged_per_allocation_not_per_append(tmp_path: Path) -> None:
    """What a segment takes on disk is charged when it is allocated: the first
    64 KiB at the first append, nothing while appends fit them, the next
    allocation (doubling) when they no longer do."""
    budget = DiskBudget(on_spent=lambda: None)
    budget.left = 10 << 20
    store = SegmentStore(tmp_path / "q", segment_size=1 << 20, budget=budget)
    store.append(msg(0))
    assert budget.left == (10 << 20) - FIRST_ALLOCATION
    for i in range(1, 400):  # about 52 KB of records
        store.append(msg(i))
    assert budget.left == (10 << 20) - FIRST_ALLOCATION
    for i in range(400, 600):
        store.append(msg(i))
    assert budget.left == (10 << 20) - 2 * FIRST_ALLOCATION
    store.close()


def test_readers_never_see_past_the_end_of_the_data(tmp_path: Path) -> None:
    d = tmp_path / "q"
    store = SegmentStore(d)
    seqs = [store.append(msg(i)) for i in range(3)]
    store.flush()
    log = store._log
    sid = seqs[0] >> 32
    m = log.map(sid)
    assert m is not None
    end = (seqs[-1] & 0xFFFFFFFF) + len(encode_message_record(msg(2)))
    assert len(m) == end < (sid and segments(d)[0].stat().st_size)
    m.close()
    assert log.read((sid << 32) | end) is None
    assert log.read(seqs[1]) == encode_message_record(msg(1), log.file(sid).seed)
    store.close()


@st.composite
def scattered(draw: st.DrawFn) -> tuple[bytes, int, bool]:
    """Bytes holding records of a life (``seed``) and of an earlier one, end
    marks of both, runs of zeros and noise, in any order."""
    seed = draw(st.integers(1, 0xFFFFFFFF))
    parts = []
    for _ in range(draw(st.integers(0, 8))):
        kind = draw(st.sampled_from(["record", "old record", "mark", "zeros", "noise"]))
        at = sum(len(p) for p in parts)
        if kind in ("record", "old record"):
            body = draw(st.binary(max_size=60))
            parts.append(encode_message_record(message(body), seed if kind == "record" else seed ^ 7))
        elif kind == "mark":
            parts.append(mark(at, draw(st.sampled_from([seed, seed ^ 7])), draw(st.booleans())))
        elif kind == "zeros":
            parts.append(bytes(draw(st.integers(1, 40))))
        else:
            parts.append(draw(st.binary(min_size=1, max_size=40)))
    return b"".join(parts), seed, draw(st.booleans())


@needs_c
@given(case=scattered(), start=st.integers(0, 50))
def test_the_c_search_for_the_next_record_agrees_with_python(
    case: tuple[bytes, int, bool], start: int
) -> None:
    """Where damaged bytes are stepped over to: C and Python find the same
    offset, a record or mark of this life only."""
    data, seed, marks = case
    found = _fast.find_record(data, start, len(data), seed, marks)
    assert found == next_record_python(data, start, len(data), seed, marks)
    if found >= 0 and data[found : found + 4] == bytes(4):
        assert marks and mark_at(data, found, len(data), seed)
    elif found >= 0:
        assert inspect_record(data, found, len(data), True, seed)[0] >= 30
