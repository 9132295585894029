"""A stream's chunk records (StreamStore.append_chunk): many messages in one
record, read message by message or whole, found by offset and time, kept
over restarts and crashes, set aside when damaged, and cut by retention as
any record: real StreamStore instances over real files. docs/storage.md,
"Chunk records"."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

from damage_helpers import flip

import warren
from warren.amqp.record_deliveries import deliver_records_python
from warren.core.message import Message
from warren.core.properties import peek_headers
from warren.core.stream import OFFSET_HEADER, TIMESTAMP_HEADER
from warren.store.records import chunk_at, decode_records, encode_record, inspect_record
from warren.store.segment_damage import next_record_python
from warren.store.stream_records import (
    EntryDecoder,
    chunk_record,
    chunk_trailer,
    chunk_trailers,
    parse_trailer,
    parse_trailers,
    record_offsets,
)
from warren.store.stream_replica import ReplicaStreamStore
from warren.store.stream_store import StreamStore

PLAIN = b"\x00\x00"


def entries(*bodies: bytes) -> bytes:
    """Simple data entries as a Publish frame carries them."""
    return b"".join(struct.pack(">I", len(b)) + b for b in bodies)


def decoder(data: bytes) -> tuple[bytes, bytes, bytes | None]:
    """A stand-in for the broker's AMQP 1.0 mapping: the entry is the body,
    kept as the native form too (as a bare message would be)."""
    return PLAIN, b"body:" + data, data


def own_decoder() -> EntryDecoder:
    """The test's decoder, not the process's (SHARED_DECODER)."""
    own = EntryDecoder()
    own.decode = decoder
    return own


def read(store: StreamStore, start: int = 0) -> list[tuple[int, bytes]]:
    """(offset, body) of every message a reader from ``start`` gets, checking
    each carries its offset and timestamp headers."""
    cursor = store.cursor(start)
    out = []
    while (item := cursor.next()) is not None:
        offset, msg = item
        headers = peek_headers(msg.properties) or {}
        assert headers[OFFSET_HEADER] == offset
        assert headers[TIMESTAMP_HEADER] == msg.timestamp
        out.append((offset, bytes(msg.body)))
    cursor.close()
    return out


def mixed(d: Path, segment_size: int = 8 * 1024 * 1024) -> StreamStore:
    """Offsets 0 (a message), 1-3 (a chunk), 4 (a message), 5-6 (a chunk)."""
    store = StreamStore(d, segment_size)
    store.decoder = own_decoder()
    assert store.append(Message("", "s", PLAIN, b"m0", 1000)) == 0
    assert store.append_chunk(entries(b"a", b"bb", b"ccc"), 3, 2000, "pub", 7) == 1
    assert store.append(Message("", "s", PLAIN, b"m4", 3000)) == 4
    assert store.append_chunk(entries(b"d", b"e"), 2, 4000, "pub", 9) == 5
    return store


EXPECTED = [
    (0, b"m0"),
    (1, b"body:a"),
    (2, b"body:bb"),
    (3, b"body:ccc"),
    (4, b"m4"),
    (5, b"body:d"),
    (6, b"body:e"),
]


def test_a_chunk_record_counts_its_entries_and_reads_message_by_message(tmp_path: Path) -> None:
    store = mixed(tmp_path / "s")
    assert (store.next_offset, store.ready_count) == (7, 7)
    store.flush()
    assert read(store) == EXPECTED
    assert store.publisher_sequence("pub") == 9
    assert store.publisher_sequence("other") == 0
    store.close()


def test_a_reader_can_start_in_the_middle_of_a_chunk(tmp_path: Path) -> None:
    store = mixed(tmp_path / "s")
    store.flush()
    sid, pos, offset = store.position_of(2)
    assert (sid, offset) == (store.position_of(1)[0], 2)
    assert pos == store.position_of(1)[1] == store.position_of(3)[1]
    assert read(store, 2) == EXPECTED[2:]
    assert read(store, 6) == EXPECTED[6:]
    store.close()


def test_offset_at_finds_a_chunk_by_its_timestamp(tmp_path: Path) -> None:
    store = mixed(tmp_path / "s")
    store.flush()
    assert store.offset_at(1500) == 1
    assert store.offset_at(2000) == 1
    assert store.offset_at(2500) == 4
    assert store.offset_at(3500) == 5
    assert store.offset_at(9999) == 7
    store.close()


def test_a_cursor_hands_over_a_chunk_whole(tmp_path: Path) -> None:
    store = mixed(tmp_path / "s")
    store.flush()
    cursor = store.cursor(2)  # inside the first chunk: the whole chunk comes
    got = cursor.chunk()
    assert got is not None
    first, count, m, start, end = got
    assert (first, count) == (1, 3)
    chunk = bytes(m[start:end])
    # The chunk as the stream protocol delivers it: header then the entries.
    assert chunk[0] == 0x50 and struct.unpack_from(">Q", chunk, 24)[0] == 1
    assert chunk[48:] == entries(b"a", b"bb", b"ccc")
    assert cursor.offset == 4
    assert cursor.chunk() is None  # a single message: next() reads it
    assert cursor.next() is not None
    assert cursor.chunk() is not None and cursor.offset == 7
    assert cursor.chunk() is None
    cursor.close()
    store.close()


def test_a_span_stops_before_a_chunk_record(tmp_path: Path) -> None:
    store = mixed(tmp_path / "s")
    store.flush()
    cursor = store.cursor(0)
    assert cursor.span() is not None  # offset 0, a single message
    assert cursor.next() is not None
    assert cursor.span() is None  # offset 1: the chunk
    cursor.close()
    store.close()


def test_chunk_records_are_recovered_after_a_restart(tmp_path: Path) -> None:
    d = tmp_path / "s"
    mixed(d, 4096).close()
    store = StreamStore(d, 4096)
    store.decoder = own_decoder()
    assert (store.first_offset, store.next_offset) == (0, 7)
    assert read(store) == EXPECTED
    assert read(store, 3) == EXPECTED[3:]
    assert store.publisher_sequence("pub") == 9
    assert store.append(Message("", "s", PLAIN, b"m7", 5000)) == 7
    store.close()


_CRASH = """
import os, struct, sys
from pathlib import Path
from warren.store.stream_store import StreamStore
store = StreamStore(Path(sys.argv[1]))
store.track("\\x00pub\\x00pub", 3, at_once=True)
store.sync()
data = b"".join(struct.pack(">I", 1) + bytes([65 + i]) for i in range(5))
store.append_chunk(data, 5, 1000, "pub", 8)
store.sync()  # the records are durable; the tracking file's last write is not made
os._exit(9)
"""


def test_the_publisher_sequence_survives_a_crash_in_the_trailer(tmp_path: Path) -> None:
    d = tmp_path / "s"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    done = subprocess.run([sys.executable, "-c", _CRASH, str(d)], env=env, timeout=120)
    assert done.returncode == 9
    store = StreamStore(d)
    assert store.next_offset == 5
    assert store.tracked("\x00pub\x00pub") == 3  # what the tracking file kept
    assert store.publisher_sequence("pub") == 8  # what the records say
    assert [b for _o, b in read(store)] == [b"A", b"B", b"C", b"D", b"E"]
    store.close()


def test_a_damaged_chunk_record_costs_its_offsets_only(tmp_path: Path) -> None:
    d = tmp_path / "s"
    store = mixed(d)
    sid, pos, _ = store.position_of(1)
    store.close()
    path = d / f"msgs.{sid:010d}"
    flip(path, pos + 80)  # inside the first chunk's entries
    store = StreamStore(d)
    store.decoder = own_decoder()
    assert store.next_offset == 7
    assert read(store) == [EXPECTED[0], *EXPECTED[4:]]
    assert read(store, 2) == EXPECTED[4:]
    assert list(d.glob("*damaged*"))
    store.close()


def test_a_chunk_record_damaged_while_open_is_never_served(tmp_path: Path) -> None:
    d = tmp_path / "s"
    store = mixed(d)
    store.flush()
    sid, pos, _ = store.position_of(5)
    flip(d / f"msgs.{sid:010d}", pos + 78)
    assert read(store) == EXPECTED[:5]
    cursor = store.cursor(5)
    assert cursor.chunk() is None and cursor.offset == 7
    cursor.close()
    store.close()


def test_retention_drops_segments_of_chunks_by_offsets(tmp_path: Path) -> None:
    store = StreamStore(tmp_path / "s", 4096)
    for i in range(40):
        assert store.append_chunk(entries(*[b"x" * 100] * 10), 10, 1000 + i) == 10 * i
    assert store.segment_count > 2
    dropped = store.apply_retention(100, None, None, 0)
    assert dropped and dropped % 10 == 0
    assert store.ready_count == 400 - dropped
    assert store.first_offset == dropped
    assert store.ready_count >= 100
    store.flush()
    assert read(store)[0][0] == dropped
    store.close()


def test_the_record_layout_and_its_readers(tmp_path: Path) -> None:
    store = mixed(tmp_path / "s")
    store.flush()
    sid, pos, _ = store.position_of(1)
    store.close()
    data = (tmp_path / "s" / f"msgs.{sid:010d}").read_bytes()
    length, p_off, p_len, b_len = inspect_record(data, pos, len(data), False)
    assert chunk_at(data, p_off, p_len) and p_len == 0 and b_len == 48 + 3 * 4 + 6
    assert record_offsets(data, p_off, p_len) == (1, 3)
    trailer = data[p_off + 8 + b_len + 4 : pos + length - 4]
    assert parse_trailer(trailer) == ("pub", 7)
    # A failed write-out's records, given back as messages: a chunk gives none.
    assert [m.body for m in decode_records(data[pos : pos + length])] == []


def test_a_trailer_of_several_publishers(tmp_path: Path) -> None:
    """Publish frames of several publishers merged into one record: each
    reference's last id in the trailer, back after a reopen; a one-publisher
    trailer is one entry of the same layout."""
    assert chunk_trailers({"p": 3}) == chunk_trailer("p", 3)
    both = chunk_trailers({"a": 4, "bb": 2})
    assert parse_trailers(both) == [("a", 4), ("bb", 2)]
    assert parse_trailer(both) is None  # not a one-publisher trailer
    assert parse_trailers(both[:-1]) is None and parse_trailers(b"") is None
    store = StreamStore(tmp_path / "s")
    data = entries(b"a", b"b", b"c")
    assert store.append_chunk(data, 3, 1000, sequences={"a": 4, "bb": 2}) == 0
    assert store.append_chunk(data, 3, 2000, "a", 6, sequences={"cc": 1}) == 3
    store.close()
    store = StreamStore(tmp_path / "s")
    assert [store.publisher_sequence(r) for r in ("a", "bb", "cc", "dd")] == [6, 2, 1, 0]
    store.close()


def test_a_replica_counts_chunk_records(tmp_path: Path) -> None:
    d = tmp_path / "s"
    mixed(d).close()
    replica = ReplicaStreamStore(d)
    replica.decoder = own_decoder()
    assert (replica.first_offset, replica.next_offset) == (0, 7)
    assert read(replica, 2) == EXPECTED[2:]
    replica.close()


def _framers() -> list[Any]:
    native = warren.native_module("_fastpath")
    return [deliver_records_python] + ([native.deliver_records] if native is not None else [])


def _finders() -> list[Any]:
    native = warren.native_module("_fastpath")
    return [next_record_python] + ([native.find_record] if native is not None else [])


def test_c_and_python_readers_of_records_know_a_chunk_record() -> None:
    """deliver_records (one message per record) stops before a chunk record;
    the damage scan (find_record) takes one for a whole record."""
    plain = encode_record(b"", b"s", PLAIN, b"m0", 1000)
    chunk = chunk_record(entries(b"a", b"bb"), 2, 1, 2000, chunk_trailer("p", 3), 0)
    data = plain + chunk + plain
    head = b"\x00\x3c\x00\x3c" + bytes([3]) + b"tag"
    for framer in _framers():
        _frames, n, end, _sizes, _offsets = framer(data, 0, len(data), 0, 10, 1, head, 1, 0)
        assert (n, end) == (1, len(plain))
        assert framer(data, len(plain), len(data), 0, 10, 1, head, 1, 0)[1] == 0
    for find in _finders():
        assert find(data, 1, len(data), 0, False) == len(plain)
        assert find(data, len(plain) + 1, len(data), 0, False) == len(plain) + len(chunk)
