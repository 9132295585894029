"""What the damage tests (test_store_damage.py, test_stream_damage.py) share:
messages, reading and damaging segment files, and a model of what was written
to compare a damaged store with."""

from __future__ import annotations

import hashlib
import logging
import os
import struct
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from examples import examples
from warren.core.message import Message
from warren.store import records
from warren.store.priority_store import PriorityStore
from warren.store.segment_format import MARK_SIZE, V2, V2_HEADER_SIZE, mark_at, parse_header
from warren.store.segment_store import SegmentStore

PERSISTENT = b"\x10\x00\x02"


def msg(i: int, size: int = 100) -> Message:
    return Message("ex", "rk", PERSISTENT, f"m{i}:".encode().ljust(size, b"."), 1000 + i)


def layout(path: Path) -> list[tuple[int, int]]:
    """(offset, length) of each record of an undamaged segment file (version 1:
    up to its end; version 2: up to its end mark)."""
    data = path.read_bytes()
    header = parse_header(data[:V2_HEADER_SIZE])
    out = []
    pos = header.start
    while pos < len(data):
        if header.version == V2 and mark_at(data, pos, len(data), header.seed):
            break
        length = records.inspect_record(data, pos, len(data), True, header.seed)[0]
        out.append((pos, length))
        pos += length
    return out


def data_end(path: Path) -> int:
    """Where an undamaged segment file's data ends."""
    recs = layout(path)
    return recs[-1][0] + recs[-1][1] if recs else parse_header(path.read_bytes()[:24]).start


def overwrite(path: Path, at: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(data)


def flip(path: Path, at: int, mask: int = 0x01) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ mask]))


def drain(store: SegmentStore | PriorityStore, ack: bool = True) -> list[Message]:
    out = []
    while (item := store.shift()) is not None:
        out.append(item[1])
        if ack:
            store.ack(item[0])
    return out


def numbers(msgs: list[Message]) -> list[int]:
    return [m.timestamp - 1000 for m in msgs]


def aside_files(d: Path) -> list[str]:
    return sorted(n for n in os.listdir(d) if ".damaged-" in n)


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def sha1(name: str) -> str:
    """A vhost's or queue's directory name (docs/storage.md, "The data directory")."""
    return hashlib.sha1(name.encode()).hexdigest()


def noise(n: int) -> bytes:
    """Bytes that are no record (a fixed pattern: the tests repeat exactly)."""
    return bytes((i * 151 + 77) % 256 for i in range(n))


def ack_batch(offsets: list[int]) -> bytes:
    """One batch of an ack file as docs/storage.md describes it."""
    batch = struct.pack(f">I{len(offsets)}I", 0xAC000000 | len(offsets), *offsets)
    return batch + struct.pack(">I", zlib.crc32(batch))


def filled(d: Path, n: int = 100, segment_size: int = 4096, version: int = V2) -> list[int]:
    """A closed store under ``d`` with messages 0 .. n-1 (in segment files of
    format ``version``); their seqs."""
    store = SegmentStore(d, segment_size, format_version=version)
    seqs = [store.append(msg(i)) for i in range(n)]
    store.close()
    return seqs


# -- every flip and cut in the last KB ------------------------------------------------
#
# A model of what was written: for each message, its segment, position and length,
# and whether it was acknowledged. After damage, every unacknowledged message whose
# record the damage does not touch must be delivered, exactly as published, and no
# other; an acknowledged one may come back only when its ack file was damaged.

KB = 1024
DAMAGE_SETTINGS = settings(
    max_examples=examples(int(os.environ.get("DAMAGE_EXAMPLES", "150"))),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def varied(i: int) -> Message:
    return msg(i, size=10 + (i * 37) % 140)


class Written:
    """A closed store's directory and the model of its records."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.where: dict[int, tuple[str, int, int]] = {}  # i -> (file, offset, length)
        self.acked: set[int] = set()

    def records_in(self, name: str) -> dict[int, tuple[int, int]]:
        return {i: (o, n) for i, (f, o, n) in self.where.items() if f == name}


def damage(data: st.DataObject, path: Path, bits_only: bool = False) -> tuple[str, int]:
    """Flip a bit or cut the file at a byte of its last KB: (kind, byte). For a
    segment of version 2 (allocated ahead: its size is not the end of its data),
    the last KB of its data and the end mark after it."""
    size = path.stat().st_size
    if path.name.startswith("msgs.") and parse_header(path.read_bytes()[:24]).version == V2:
        size = min(size, data_end(path) + MARK_SIZE)
    at = data.draw(st.integers(max(0, size - KB), size - 1), label="byte")
    kind = "flip" if bits_only else data.draw(st.sampled_from(["flip", "cut"]), label="kind")
    if kind == "flip":
        flip(path, at, 1 << data.draw(st.integers(0, 7), label="bit"))
    else:
        os.truncate(path, at)
    return kind, at


def fields(m: Message) -> tuple[str, str, bytes, bytes, int]:
    return m.exchange, m.routing_key, m.properties, m.body, m.timestamp


def hit_by(w: Written, name: str, kind: str, at: int) -> set[int]:
    """The messages whose records a flip at ``at`` or a cut there touches."""
    if kind == "flip":
        return {i for i, (o, n) in w.records_in(name).items() if o <= at < o + n}
    return {i for i, (o, n) in w.records_in(name).items() if o + n > at}


def check_served(
    got: list[Message], must: set[int], may: set[int], make: Callable[[int], Message] = varied
) -> None:
    """Nothing corrupt, nothing twice, every message of ``must``, none outside ``may``."""
    found = numbers(got)
    assert len(set(found)) == len(found)
    assert all(fields(m) == fields(make(i)) for m, i in zip(got, found, strict=True))
    assert must <= set(found), sorted(must - set(found))
    assert set(found) <= may, sorted(set(found) - may)
