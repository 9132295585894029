"""The segment file format's version 2 (docs/storage.md, "Segment file header"):
its header, its end and close marks, record CRCs seeded with the segment's
salt (a record copied from another file never checks out), a damaged salt
given back by a record's CRC, and the search past damaged bytes (C and
Python agree)."""

from __future__ import annotations

import importlib
import zlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warren.core.message import Message
from warren.store import records
from warren.store.records import CorruptRecord, decode_record, encode_message_record, inspect_record
from warren.store.segment_damage import next_record_python
from warren.store.segment_format import (
    CLOSE_MARK,
    END_MARK,
    V2,
    V2_HEADER_SIZE,
    encode_header,
    mark,
    mark_at,
    parse_header,
    recover_seed,
)

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
