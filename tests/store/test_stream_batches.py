"""Sub-entry batches kept closed in a stream's chunk records (issue 31): a
batch holds one offset per record (osiris's num_records), a reader of one
message at a time opens none and gzip batches and steps over snappy, lz4
and zstd ones with their offsets counted and one log line per stream, from
any start offset, after a restart, a kill -9 and damage, and on a replica.
Real StreamStore instances over real files; batches built by hand here (the
stream protocol's tests build them with rstream's codecs)."""

from __future__ import annotations

import logging
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from damage_helpers import flip
from test_stream_chunks import PLAIN, entries, own_decoder, read

from warren.core.message import Message
from warren.store.stream_replica import ReplicaStreamStore
from warren.store.stream_store import StreamStore


def batch(codec: int, *records: bytes) -> bytes:
    """A sub-entry batch: records u32-length-prefixed, gzip-compressed for
    codec 1, left as they are for the others (snappy, lz4 and zstd bytes are
    never looked into)."""
    raw = b"".join(struct.pack(">I", len(r)) + r for r in records)
    body = raw
    if codec == 1:
        comp = zlib.compressobj(wbits=31)
        body = comp.compress(raw) + comp.flush()
    return struct.pack(">BHII", 0x80 | codec << 4, len(records), len(raw), len(body)) + body


#: One chunk: a simple entry, gzip (3), snappy (2), none (2), simple: 9 offsets.
CHUNK = (
    entries(b"a")
    + batch(1, b"b", b"c", b"d")
    + batch(2, b"e", b"f")
    + batch(0, b"g", b"h")
    + entries(b"i")
)
#: What a reader of one message at a time gets: offsets 5 and 6 are snappy's.
EXPECTED = [
    (0, b"m0"),
    (1, b"body:a"),
    (2, b"body:b"),
    (3, b"body:c"),
    (4, b"body:d"),
    (7, b"body:g"),
    (8, b"body:h"),
    (9, b"body:i"),
    (10, b"m10"),
]


def with_batches(d: Path, segment_size: int = 8 * 1024 * 1024) -> StreamStore:
    store = StreamStore(d, segment_size)
    store.decoder = own_decoder()
    assert store.append(Message("", "s", PLAIN, b"m0", 1000)) == 0
    assert store.append_chunk(CHUNK, 5, 2000, "pub", 4, num_records=9) == 1
    assert store.append(Message("", "s", PLAIN, b"m10", 3000)) == 10
    return store


def test_a_batch_holds_an_offset_per_record(tmp_path: Path) -> None:
    store = with_batches(tmp_path / "s")
    assert (store.next_offset, store.ready_count) == (11, 11)
    store.flush()
    assert read(store) == EXPECTED
    store.close()


@pytest.mark.parametrize("start", range(11))
def test_a_reader_starts_anywhere_in_a_batch(tmp_path: Path, start: int) -> None:
    store = with_batches(tmp_path / "s")
    store.flush()
    assert read(store, start) == [e for e in EXPECTED if e[0] >= start]
    store.close()


def test_the_chunk_goes_whole_with_its_batches_closed(tmp_path: Path) -> None:
    store = with_batches(tmp_path / "s")
    store.flush()
    cursor = store.cursor(6)  # inside the snappy batch: the chunk from its start
    got = cursor.chunk()
    assert got is not None
    first, count, m, start, end = got
    assert (first, count) == (1, 9)
    chunk = m[start:end]
    entries_n, records_n = struct.unpack_from(">HI", chunk, 2)
    assert (entries_n, records_n) == (5, 9)
    assert chunk[48:] == CHUNK  # as published
    assert struct.unpack_from(">I", chunk, 32)[0] == zlib.crc32(CHUNK)
    assert cursor.offset == 10
    cursor.close()
    store.close()


def test_a_closed_batch_is_said_once_per_stream(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = with_batches(tmp_path / "s")
    store.append_chunk(batch(4, b"z1", b"z2"), 1, 4000, num_records=2)
    store.flush()
    with caplog.at_level(logging.WARNING, "warren.store"):
        assert [o for o, _b in read(store)] == [0, 1, 2, 3, 4, 7, 8, 9, 10]
        assert read(store, 5) == EXPECTED[5:]
    said = [r for r in caplog.records if "sub-entry batch" in r.getMessage()]
    assert len(said) == 1
    assert "snappy" in said[0].getMessage() and "5-6" in said[0].getMessage()
    store.close()


def test_a_batch_that_does_not_open_is_stepped_over(tmp_path: Path) -> None:
    """A gzip batch whose bytes are not gzip (a client's, stored as it came,
    as osiris stores it): its offsets are counted and skipped."""
    store = StreamStore(tmp_path / "s")
    store.decoder = own_decoder()
    bad = struct.pack(">BHII", 0x90, 2, 10, 4) + b"junk"
    store.append_chunk(entries(b"x") + bad + entries(b"y"), 3, 1000, num_records=4)
    store.flush()
    assert read(store) == [(0, b"body:x"), (3, b"body:y")]
    store.close()


def test_batches_are_counted_after_a_restart(tmp_path: Path) -> None:
    d = tmp_path / "s"
    with_batches(d, 4096).close()
    store = StreamStore(d, 4096)
    store.decoder = own_decoder()
    assert (store.first_offset, store.next_offset) == (0, 11)
    assert read(store, 3) == EXPECTED[3:]
    assert store.publisher_sequence("pub") == 4
    assert store.append(Message("", "s", PLAIN, b"m11", 5000)) == 11
    store.close()


_CRASH = """
import os, sys
from pathlib import Path
from warren.store.stream_store import StreamStore
store = StreamStore(Path(sys.argv[1]))
store.append_chunk(bytes.fromhex(sys.argv[2]), 5, 1000, "pub", 4, num_records=9)
store.sync()
store.append_chunk(bytes.fromhex(sys.argv[2]), 5, 2000, "pub", 8, num_records=9)
store.flush()  # reached the OS, not the disk: kill -9 keeps it
os._exit(9)
"""


def test_a_kill_9_keeps_the_batches_offsets(tmp_path: Path) -> None:
    d = tmp_path / "s"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    args = [sys.executable, "-c", _CRASH, str(d), CHUNK.hex()]
    assert subprocess.run(args, env=env, timeout=120).returncode == 9
    store = StreamStore(d)
    store.decoder = own_decoder()
    assert store.next_offset == 18
    assert store.publisher_sequence("pub") == 8
    assert [o for o, _b in read(store)] == [0, 1, 2, 3, 6, 7, 8, 9, 10, 11, 12, 15, 16, 17]
    assert store.append(Message("", "s", PLAIN, b"m18", 3000)) == 18
    store.close()


def test_a_damaged_batch_chunk_costs_its_offsets_only(tmp_path: Path) -> None:
    d = tmp_path / "s"
    store = with_batches(d)
    sid, pos, _ = store.position_of(3)
    store.close()
    flip(d / f"msgs.{sid:010d}", pos + 90)  # inside the chunk's entries
    store = StreamStore(d)
    store.decoder = own_decoder()
    assert store.next_offset == 11
    assert read(store) == [EXPECTED[0], EXPECTED[-1]]
    assert read(store, 4) == [EXPECTED[-1]]
    assert list(d.glob("*damaged*"))
    store.close()


def test_a_replica_counts_batches(tmp_path: Path) -> None:
    d = tmp_path / "s"
    with_batches(d).close()
    replica = ReplicaStreamStore(d)
    replica.decoder = own_decoder()
    assert (replica.first_offset, replica.next_offset) == (0, 11)
    assert read(replica, 2) == EXPECTED[2:]
    replica.close()


def test_a_chunk_counts_no_fewer_records_than_entries(tmp_path: Path) -> None:
    store = StreamStore(tmp_path / "s")
    with pytest.raises(ValueError):
        store.append_chunk(entries(b"a", b"b"), 2, 1000, num_records=1)
    assert store.next_offset == 0
    store.close()


def test_last_for_a_reader_of_messages_is_the_last_it_can_read(tmp_path: Path) -> None:
    """x-stream-offset "last" over AMQP (StartSpec.resolve(messages=True)): a
    stream ending in batches such a reader skips starts it at the last
    message it can read, so it (and the Spark planner's probe) gets one."""
    store = StreamStore(tmp_path / "s")
    store.decoder = own_decoder()
    data = entries(b"a") + batch(1, b"b", b"c") + batch(2, b"x", b"y")
    store.append_chunk(data, 3, 1000, num_records=5)
    store.append_chunk(batch(3, b"z"), 1, 2000, num_records=1)
    store.flush()
    assert store.next_offset == 6
    assert store.last_message_offset() == 2
    assert read(store, store.last_message_offset()) == [(2, b"body:c")]
    store.append(Message("", "s", PLAIN, b"m6", 3000))
    store.flush()
    assert store.last_message_offset() == 6
    store.close()
