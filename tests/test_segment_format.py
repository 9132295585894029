"""The segment file format's version 2 (docs/storage.md, "Segment file header"):
record CRCs seeded with the segment's salt, so a record a recycled file kept
from its previous life never checks out in the new one. C and Python agree."""

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
