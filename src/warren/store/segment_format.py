"""Segment file headers and end marks: version 1 (appended files) and version 2
(files allocated ahead and written in place).

Version 1 (``b"WSEG"``, u32 1; 8 bytes): records follow, unseeded CRCs, and the
file's size is where the data ends. Warren reads such files and no longer
writes them.

Version 2 (24 bytes, all big-endian)::

    0   4  b"WSEG"
    4   4  u32 version, 2
    8   8  u64 segment id: the id this content was written under
    16  4  u32 salt: random for each file, never 0
    20  4  u32 CRC32 of the 20 bytes before it

A version-2 file is allocated ahead of its data and written in place
(store/segment_alloc.py), so its size says nothing about where its data ends.
Every write ends with an *end mark*: 8 bytes, a u32 0 (no record is that
short) and the CRC32 of the mark's own offset (u32) and kind (u8) seeded with
the salt, its lowest bit set (so eight zero bytes are never a mark). Data ends
at the first mark after the last record. Every record's CRC is seeded with the
salt too, so a record copied from another file (or left there by an earlier
life of the file, should files ever be reused) never checks out in this one.
A file kept for reuse (a *spare*, store/segment_spares.py) has a header
naming segment id 0 (no segment has it): it holds no data, whatever its name.
A clean close writes a *close mark* (kind 1) instead: the next start may
append after it, where after a crash (an end mark, kind 0) writes that never
reached the disk whole could have left records of this life further on, so a
new segment is started instead. docs/storage.md, "Segment file header".
"""

from __future__ import annotations

import mmap
import os
import struct
import zlib

__all__ = [
    "CLOSE_MARK",
    "END_MARK",
    "FILE_MAGIC",
    "MARK_SIZE",
    "SPARE_ID",
    "V1",
    "V1_HEADER_SIZE",
    "V2",
    "V2_HEADER_SIZE",
    "Header",
    "SegmentFile",
    "encode_header",
    "mark",
    "mark_at",
    "new_salt",
    "parse_header",
    "recover_seed",
]

FILE_MAGIC = b"WSEG"
V1 = 1
V2 = 2
V1_HEADER_SIZE = 8
V2_HEADER_SIZE = 24
MARK_SIZE = 8
#: The segment id in a spare's header: the file holds no data (ids start at 1).
SPARE_ID = 0
#: mark_at()'s answers: an end mark, a close mark (0: no mark).
END_MARK = 1
CLOSE_MARK = 2

_V1_HEADER = struct.Struct(">4sI")
_V2_HEADER = struct.Struct(">4sIQI")  # the CRC follows
_U32 = struct.Struct(">I")
_MARK = struct.Struct(">II")
_MARKED = struct.Struct(">IB")  # what a mark's check covers: its offset and kind


class Header:
    """A segment file's header as read: its version, the CRC seed of its records
    (the salt; 0 in version 1), where its records start, and (version 2) the
    segment id it was written under. ``problem`` says why it is not a header
    this code can use as it stands ("" when it is)."""

    __slots__ = ("version", "seed", "start", "segment_id", "problem")

    def __init__(
        self, version: int, seed: int, start: int, segment_id: int, problem: str = ""
    ) -> None:
        self.version = version
        self.seed = seed
        self.start = start
        self.segment_id = segment_id
        self.problem = problem


class SegmentFile:
    """What the log knows of one of its segment files: the CRC seed of its
    records (its salt; 0 in version 1), where they start (the header's size)
    and where its data ends."""

    __slots__ = ("seed", "start", "end")

    def __init__(self, seed: int, start: int, end: int) -> None:
        self.seed = seed
        self.start = start
        self.end = end


def encode_header(segment_id: int, salt: int) -> bytes:
    """A version-2 header for a new life of a file as segment ``segment_id``."""
    head = _V2_HEADER.pack(FILE_MAGIC, V2, segment_id, salt)
    return head + _U32.pack(zlib.crc32(head))


def parse_header(head: bytes) -> Header:
    """What the first bytes of a segment file say (``problem`` set when they are
    not a whole, intact header of a known version)."""
    if len(head) >= V1_HEADER_SIZE:
        magic, version = _V1_HEADER.unpack_from(head, 0)
        if magic == FILE_MAGIC and version == V1:
            return Header(V1, 0, V1_HEADER_SIZE, 0)
        if magic == FILE_MAGIC and version == V2 and len(head) >= V2_HEADER_SIZE:
            _m, _v, segment_id, salt = _V2_HEADER.unpack_from(head, 0)
            crc = _U32.unpack_from(head, 20)[0]
            if crc == zlib.crc32(head[:20]) and salt:
                return Header(V2, salt, V2_HEADER_SIZE, segment_id)
            return Header(V2, salt, V2_HEADER_SIZE, segment_id, "header checksum mismatch")
        if magic == FILE_MAGIC:
            return Header(version, 0, V1_HEADER_SIZE, 0, f"unsupported format version {version}")
        return Header(0, 0, 0, 0, f"bad magic {bytes(magic)!r}")
    return Header(0, 0, 0, 0, f"file header truncated ({len(head)} bytes)")


def new_salt() -> int:
    """A random salt for a new life of a file (never 0: 0 is version 1's seed)."""
    while True:
        salt = int.from_bytes(os.urandom(4), "big")
        if salt:
            return salt


def mark(offset: int, seed: int, closed: bool = False) -> bytes:
    """The end mark (``closed``: the close mark) written at ``offset`` of a file
    whose salt is ``seed``."""
    return _MARK.pack(0, zlib.crc32(_MARKED.pack(offset, closed), seed) | 1)


def mark_at(buf: bytes | mmap.mmap, offset: int, limit: int, seed: int) -> int:
    """Which of this life's marks is at ``offset`` (data up to ``limit``):
    END_MARK, CLOSE_MARK or 0 (none)."""
    if offset + MARK_SIZE > limit:
        return 0
    zero, check = _MARK.unpack_from(buf, offset)
    if zero or not check:
        return 0
    if check == zlib.crc32(_MARKED.pack(offset, 0), seed) | 1:
        return END_MARK
    if check == zlib.crc32(_MARKED.pack(offset, 1), seed) | 1:
        return CLOSE_MARK
    return 0


def recover_seed(data: bytes, stored: int) -> int:
    """The seed with which ``zlib.crc32(data, seed)`` is ``stored``: exactly one
    exists (for a fixed input the seed's effect on a CRC is linear and
    invertible over GF(2)). How a version-2 segment whose header is damaged gets
    its salt back from an intact record (the caller checks a second one)."""
    base = zlib.crc32(data, 0)
    # Column i of the linear map: what flipping bit i of the seed flips.
    columns = [zlib.crc32(data, 1 << i) ^ base for i in range(32)]
    target = stored ^ base
    # Solve sum(columns[i] for the set bits i of seed) == target: Gaussian
    # elimination, rows kept as (value, which seed bits make it).
    rows: list[tuple[int, int]] = []
    for i, col in enumerate(columns):
        combo = 1 << i
        for value, bits in rows:
            if col ^ value < col:
                col ^= value
                combo ^= bits
        if col:
            rows.append((col, combo))
            rows.sort(reverse=True)
    seed = 0
    for value, bits in rows:
        if target ^ value < target:
            target ^= value
            seed ^= bits
    return seed
