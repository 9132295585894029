"""osiris's chunk, the unit a stream is stored and delivered in (osiris_log.erl's
"Chunk format"): a 48-byte header, a bloom filter of the chunk's filter values,
the data entries, and a trailer (the writers' deduplication sequences).

    magic(4 bits)=5 version(4 bits)=0 | chunk type u8 | num entries u16
    num records u32 | timestamp i64 (ms) | epoch u64 | first offset u64
    data CRC-32 u32 | data length u32 | trailer length u32
    bloom size u8 | reserved 24 bits

Only the header and the data go to a stream protocol consumer (Deliver), with
the header as stored, bloom size and trailer length included: the CRC covers
the data alone so the client can check it. A data entry is simple (high bit 0,
31-bit length, body) or a sub-entry batch (high bit 1, compression in the next
3 bits, then records u16, uncompressed length u32, length u32 and the records,
each u32-length-prefixed, compressed as a whole). Publish v1 frames carry
entries in this same form, so the broker can copy them into a chunk as they are.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Final

from warren.stream_protocol.constants import ChunkType, Compression, ResponseCode
from warren.stream_protocol.wire import BytesLike, StreamProtocolError

__all__ = [
    "CHUNK_HEADER_SIZE",
    "DEFAULT_MAX_UNCOMPRESSED",
    "MAGIC_VERSION",
    "Chunk",
    "ChunkHeader",
    "Entry",
    "build_chunk",
    "decode_delivered_chunk",
    "entry_at",
    "iter_entries",
    "read_records",
    "simple_entry",
    "sub_batch_entry",
]

CHUNK_HEADER_SIZE: Final = 48
#: osiris's magic 5 in the high nibble, chunk format version 0 in the low one.
MAGIC_VERSION: Final = 0x50
#: The most a sub-entry batch may decompress to (RabbitMQ's default, 64 MiB).
DEFAULT_MAX_UNCOMPRESSED: Final = 64 << 20

_HEADER: Final = struct.Struct(">BBHIqQQIIIB3s")
_SIMPLE: Final = struct.Struct(">I")
_BATCH: Final = struct.Struct(">BHII")
_SUB_RECORD: Final = struct.Struct(">I")


@dataclass(frozen=True, slots=True)
class ChunkHeader:
    chunk_type: int
    num_entries: int
    num_records: int
    timestamp: int
    epoch: int
    first_offset: int
    crc: int
    data_length: int
    trailer_length: int
    bloom_size: int = 0
    magic_version: int = MAGIC_VERSION

    def pack(self) -> bytes:
        try:
            return _HEADER.pack(
                self.magic_version,
                self.chunk_type,
                self.num_entries,
                self.num_records,
                self.timestamp,
                self.epoch,
                self.first_offset,
                self.crc,
                self.data_length,
                self.trailer_length,
                self.bloom_size,
                b"\0\0\0",
            )
        except struct.error as exc:
            raise StreamProtocolError(f"chunk header field out of range: {exc}") from None

    @classmethod
    def unpack(cls, buf: BytesLike, pos: int = 0) -> ChunkHeader:
        if len(buf) - pos < CHUNK_HEADER_SIZE:
            raise StreamProtocolError("chunk shorter than its header")
        mv, ctype, entries, records, ts, epoch, first, crc, dlen, tlen, bloom, _ = (
            _HEADER.unpack_from(buf, pos)
        )
        if mv >> 4 != 5:
            raise StreamProtocolError(f"not an osiris chunk (magic byte {mv:#04x})")
        return cls(ctype, entries, records, ts, epoch, first, crc, dlen, tlen, bloom, mv)


@dataclass(frozen=True, slots=True)
class Chunk:
    """A chunk as stored: header, bloom filter, data and trailer."""

    header: ChunkHeader
    data: bytes
    bloom: bytes = b""
    trailer: bytes = b""

    def stored(self) -> bytes:
        return b"".join((self.header.pack(), self.bloom, self.data, self.trailer))

    def delivered(self) -> bytes:
        """What Deliver carries after its subscription id: header and data."""
        return self.header.pack() + self.data


def simple_entry(body: BytesLike) -> bytes:
    """One record as a simple data entry."""
    if len(body) >= 1 << 31:
        raise StreamProtocolError("record too large for a simple entry")
    return _SIMPLE.pack(len(body)) + bytes(body)


def sub_batch_entry(
    records: Sequence[BytesLike], compression: Compression = Compression.NONE
) -> bytes:
    """Records as one sub-entry batch (compressed with gzip when asked: the one
    codec besides none that the broker itself writes and reads)."""
    raw = b"".join(_SUB_RECORD.pack(len(r)) + bytes(r) for r in records)
    if compression == Compression.NONE:
        body = raw
    elif compression == Compression.GZIP:
        comp = zlib.compressobj(wbits=31)
        body = comp.compress(raw) + comp.flush()
    else:
        raise StreamProtocolError(
            f"cannot compress with {compression!r}", ResponseCode.PRECONDITION_FAILED
        )
    if len(records) > 0xFFFF:
        raise StreamProtocolError("more than 65535 records in a sub-entry batch")
    return _BATCH.pack(0x80 | (compression << 4), len(records), len(raw), len(body)) + body


@dataclass(frozen=True, slots=True)
class Entry:
    """A data entry located in a buffer: ``start``/``end`` span the whole entry
    (its header included, as copied into a chunk); ``body`` starts after it.
    ``compression`` is None for a simple entry."""

    start: int
    body: int
    end: int
    records: int
    compression: int | None = None
    uncompressed: int = 0


def entry_at(buf: BytesLike, pos: int, end: int) -> Entry:
    """The data entry at ``pos``, checked to end by ``end``."""
    if pos >= end:
        raise StreamProtocolError("data ends before its entries do")
    if buf[pos] & 0x80 == 0:
        if pos + 4 > end:
            raise StreamProtocolError("data ends inside an entry header")
        (size,) = _SIMPLE.unpack_from(buf, pos)
        stop = pos + 4 + size
        if stop > end:
            raise StreamProtocolError("entry longer than the data")
        return Entry(pos, pos + 4, stop, 1)
    if pos + _BATCH.size > end:
        raise StreamProtocolError("data ends inside a sub-entry batch header")
    first, count, uncompressed, size = _BATCH.unpack_from(buf, pos)
    stop = pos + _BATCH.size + size
    if stop > end:
        raise StreamProtocolError("sub-entry batch longer than the data")
    compression = (first >> 4) & 0x07
    if compression == Compression.NONE and uncompressed != size:
        raise StreamProtocolError("uncompressed sub-entry batch with two sizes")
    return Entry(pos, pos + _BATCH.size, stop, count, compression, uncompressed)


def iter_entries(
    data: BytesLike, num_entries: int, pos: int = 0, end: int | None = None
) -> Iterator[Entry]:
    """The ``num_entries`` entries of ``data[pos:end]``, which they must fill exactly."""
    stop = len(data) if end is None else end
    for _ in range(num_entries):
        entry = entry_at(data, pos, stop)
        yield entry
        pos = entry.end
    if pos != stop:
        raise StreamProtocolError("bytes after the last entry")


def read_records(
    data: BytesLike, entry: Entry, max_uncompressed: int = DEFAULT_MAX_UNCOMPRESSED
) -> list[bytes]:
    """The records of one entry, a sub-entry batch's decompressed."""
    body = memoryview(data)[entry.body : entry.end]
    if entry.compression is None:
        return [bytes(body)]
    if entry.uncompressed > max_uncompressed:
        raise StreamProtocolError("sub-entry batch too large", ResponseCode.PRECONDITION_FAILED)
    if entry.compression == Compression.NONE:
        raw: BytesLike = body
    elif entry.compression == Compression.GZIP:
        raw = _gunzip(body, entry.uncompressed)
    else:
        raise StreamProtocolError(
            f"unsupported sub-entry compression {entry.compression}",
            ResponseCode.PRECONDITION_FAILED,
        )
    records: list[bytes] = []
    pos, end = 0, len(raw)
    for _ in range(entry.records):
        if pos + 4 > end:
            raise StreamProtocolError("sub-entry batch ends inside a record")
        (size,) = _SUB_RECORD.unpack_from(raw, pos)
        if pos + 4 + size > end:
            raise StreamProtocolError("sub-entry record longer than its batch")
        records.append(bytes(raw[pos + 4 : pos + 4 + size]))
        pos += 4 + size
    if pos != end:
        raise StreamProtocolError("bytes after a sub-entry batch's last record")
    return records


def _gunzip(body: BytesLike, expected: int) -> bytes:
    """Inflate at most ``expected`` bytes (one more would be a lie about the size)."""
    d = zlib.decompressobj(wbits=31)
    try:
        raw = d.decompress(bytes(body), expected + 1)
    except zlib.error as exc:
        raise StreamProtocolError(f"bad gzip sub-entry batch: {exc}") from None
    if len(raw) != expected or not d.eof:
        raise StreamProtocolError("gzip sub-entry batch does not inflate to its stated size")
    return raw


def build_chunk(
    entries: Sequence[BytesLike],
    *,
    first_offset: int,
    timestamp: int,
    epoch: int = 1,
    chunk_type: ChunkType = ChunkType.USER,
    bloom: bytes = b"",
    trailer: bytes = b"",
) -> Chunk:
    """A chunk of already-encoded data entries (simple_entry/sub_batch_entry, or
    the entries of a Publish frame as they came)."""
    data = b"".join(bytes(e) for e in entries)
    records = sum(e.records for e in iter_entries(data, len(entries)))
    if len(bloom) > 255:
        raise StreamProtocolError("bloom filter larger than 255 bytes")
    header = ChunkHeader(
        chunk_type,
        len(entries),
        records,
        timestamp,
        epoch,
        first_offset,
        zlib.crc32(data),
        len(data),
        len(trailer),
        len(bloom),
    )
    return Chunk(header, data, bloom, trailer)


def decode_delivered_chunk(
    buf: BytesLike, *, check_crc: bool = True
) -> tuple[ChunkHeader, memoryview, list[Entry]]:
    """A chunk as Deliver carries it (header then data, nothing after): its
    header, its data and the entries located in the data."""
    header = ChunkHeader.unpack(buf)
    data = memoryview(buf)[CHUNK_HEADER_SIZE:]
    if len(data) != header.data_length:
        raise StreamProtocolError(
            f"chunk data is {len(data)} bytes, its header says {header.data_length}"
        )
    if check_crc and zlib.crc32(data) != header.crc:
        raise StreamProtocolError("chunk CRC does not match its data")
    entries = list(iter_entries(data, header.num_entries))
    if sum(e.records for e in entries) != header.num_records:
        raise StreamProtocolError("chunk's record count does not match its entries")
    return header, data, entries
