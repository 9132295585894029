"""Records that carry a message's native (AMQP 1.0) form after the body
(store/records.py, docs/storage.md "Records"): they round-trip, the common
record is byte for byte the old one, damage to the native section is caught
like any other, a store reopened on the same directory gives them back, and
the C readers (find_record, deliver_records) agree with Python's."""

from __future__ import annotations

import importlib
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest
from damage_helpers import drain, flip, numbers
from hypothesis import given
from hypothesis import strategies as st

from warren.amqp.record_deliveries import deliver_records_python
from warren.core.message import Message
from warren.store import records
from warren.store.records import (
    NATIVE_FLAG,
    CorruptRecord,
    decode_record,
    decode_records,
    encode_message_record,
    inspect_record,
)
from warren.store.segment_damage import next_record_python, torn_tail
from warren.store.segment_store import SegmentStore

try:
    _fast: Any = importlib.import_module("warren._fastpath")
except ImportError:
    _fast = None
needs_c = pytest.mark.skipif(_fast is None, reason="warren._fastpath is not built")

PERSISTENT = b"\x10\x00\x02"
seeds = st.integers(0, 0xFFFFFFFF)
natives = st.none() | st.binary(max_size=3000)


def message(i: int, body: bytes, native: bytes | None) -> Message:
    return Message("ex", f"rk{i}", PERSISTENT, body, 1000 + i, native)


def old_layout(exchange: bytes, key: bytes, props: bytes, body: bytes, ts: int, seed: int) -> bytes:
    """A record as docs/storage.md laid it out before native sections, by hand."""
    length = 4 + 8 + 1 + len(exchange) + 1 + len(key) + 4 + len(props) + 8 + len(body) + 4
    rec = (
        struct.pack(">IQB", length, ts, len(exchange))
        + exchange
        + struct.pack(">B", len(key))
        + key
        + struct.pack(">I", len(props))
        + props
        + struct.pack(">Q", len(body))
        + body
    )
    return rec + struct.pack(">I", zlib.crc32(rec, seed))


@given(body=st.binary(max_size=5000), native=natives, seed=seeds)
def test_a_record_round_trips_with_and_without_a_native_form(
    body: bytes, native: bytes | None, seed: int
) -> None:
    m = message(1, body, native)
    rec = encode_message_record(m, seed)
    assert rec == records.encode_message(m, seed)
    got, length = decode_record(rec, 0, len(rec), True, seed)
    assert (got.body, got.native, got.properties, length) == (body, native, PERSISTENT, len(rec))
    assert (got.exchange, got.routing_key, got.timestamp) == ("ex", "rk1", 1001)
    assert inspect_record(rec, 0, len(rec), True, seed)[3] == len(body)
    assert [(x.body, x.native) for x in decode_records(rec + rec)] == [(body, native)] * 2
    has_flag = (
        struct.unpack_from(
            ">Q", rec, len(rec) - 4 - len(body) - 8 - (0 if native is None else 4 + len(native))
        )[0]
        & NATIVE_FLAG
    )
    assert bool(has_flag) == (native is not None)


@given(body=st.binary(max_size=3000), seed=seeds)
def test_a_record_without_a_native_form_is_the_old_record(body: bytes, seed: int) -> None:
    """The common record costs nothing: its bytes are the old layout's, and an
    old record reads as a message without a native form."""
    old = old_layout(b"ex", b"rk1", PERSISTENT, body, 1001, seed)
    assert encode_message_record(message(1, body, None), seed) == old
    got, _ = decode_record(old, 0, len(old), True, seed)
    assert (got.body, got.native) == (body, None)


@given(
    body=st.binary(max_size=300),
    native=st.binary(min_size=1, max_size=300),
    seed=seeds,
    at=st.data(),
)
def test_damage_to_the_native_section_is_caught(
    body: bytes, native: bytes, seed: int, at: st.DataObject
) -> None:
    rec = bytearray(encode_message_record(message(1, body, native), seed))
    start = len(rec) - 4 - len(native) - 4  # the native length field
    where = at.draw(st.integers(start, len(rec) - 5))
    rec[where] ^= at.draw(st.integers(1, 255))
    with pytest.raises(CorruptRecord):
        decode_record(bytes(rec), 0, len(rec), True, seed)
    with pytest.raises(CorruptRecord):
        inspect_record(rec, 0, len(rec), True, seed)


def test_a_native_length_that_does_not_end_the_record_is_structural_damage() -> None:
    rec = bytearray(encode_message_record(message(1, b"body", b"native"), 0))
    rec[-4 - 6 - 4 : -4 - 6] = struct.pack(">I", 5)
    with pytest.raises(CorruptRecord, match="add up"):
        inspect_record(rec, 0, len(rec), False)
    rec = bytearray(encode_message_record(message(1, b"body", None), 0))
    body_len = len(rec) - 4 - 4 - 8
    rec[body_len : body_len + 8] = struct.pack(">Q", NATIVE_FLAG | 2)  # a flag with no section
    with pytest.raises(CorruptRecord, match="add up"):
        inspect_record(rec, 0, len(rec), False)


def test_a_torn_native_record_is_a_torn_tail() -> None:
    rec = encode_message_record(message(1, b"body" * 20, b"native" * 20), 0)
    for cut in range(4, len(rec)):
        assert torn_tail(rec[:cut], 0, cut), cut


def test_native_messages_come_back_after_a_reopen_and_damage_costs_only_its_record(
    tmp_path: Path,
) -> None:
    d = tmp_path / "q"
    store = SegmentStore(d, 4096)
    natives = [None if i % 3 == 0 else b"\x00Su\xa0\x03n%02d" % i for i in range(30)]
    seqs = [store.append(message(i, b"m%d" % i, n)) for i, n in enumerate(natives)]
    store.close()
    # The native section's last byte of message 10: only the CRC tells.
    length = struct.unpack(
        ">I",
        (d / f"msgs.{seqs[10] >> 32:010d}").read_bytes()[
            seqs[10] & 0xFFFFFFFF : (seqs[10] & 0xFFFFFFFF) + 4
        ],
    )[0]
    flip(d / f"msgs.{seqs[10] >> 32:010d}", (seqs[10] & 0xFFFFFFFF) + length - 5)
    store = SegmentStore(d, 4096)
    got = drain(store)
    assert numbers(got) == [i for i in range(30) if i != 10]
    assert [m.native for m in got] == [n for i, n in enumerate(natives) if i != 10]
    store.close()


def scattered_records(draw: st.DrawFn, seed: int) -> bytes:
    parts = []
    for i in range(draw(st.integers(1, 6))):
        native = draw(natives.filter(lambda n: n is None or len(n) < 200))
        rec = encode_message_record(message(i, draw(st.binary(max_size=60)), native), seed)
        if draw(st.integers(0, 5)) == 0:  # damaged
            rec = bytearray(rec)
            rec[draw(st.integers(0, len(rec) - 1))] ^= 0x10
            rec = bytes(rec)
        parts.append(rec)
    return b"".join(parts)


# The C fast path against the Python readers: in the compiled pass, whose build
# is the current one (the pure pass starts beside the build, on the last one's
# extension, which may predate a change to the record format).
@pytest.mark.passes("compiled")
@needs_c
@given(data=st.data(), seed=st.integers(1, 0xFFFFFFFF), start=st.integers(0, 40))
def test_the_c_readers_agree_with_python_on_native_records(
    data: st.DataObject, seed: int, start: int
) -> None:
    buf = scattered_records(data.draw, seed)
    found = _fast.find_record(buf, start, len(buf), seed, False)
    assert found == next_record_python(buf, start, len(buf), seed, False)
    args = (buf, 0, len(buf), seed, 100, 1, b"\x00\x3c\x00\x3c\x01x", 1, 4096)
    assert _fast.deliver_records(*args) == deliver_records_python(*args)
