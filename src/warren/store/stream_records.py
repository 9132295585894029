"""A stream's records: a message stored with its offset and publish time.

Every record of a stream carries its offset and publish time in its headers
(``x-stream-offset``, ``x-stream-timestamp``, both longs), so deliveries send
the stored properties as they are and any reader of the data directory (the
Spark connector, a replica, recovery) learns offsets from the records alone.
This module writes those two headers into a message's properties, encodes
one message or a run of publishes as stamped records (in C for the C run
type), and reads the stored offset back; StreamStore (store/stream_store.py)
decides which offsets they get.

A chunk record holds many messages at once: its body is an osiris chunk
(header and simple data entries, as the stream protocol delivers it), whose
first offset the store writes at append, and its trailer section each
publisher's reference and last publishing id (``chunk_record``; several when
Publish frames of several publishers were merged into one record). It counts
one offset per message (its header's num_records): a sub-entry batch entry
is stored closed, whatever its compression, and holds as many offsets as
records (osiris's rule); ``record_offsets`` reads either kind's, and
``open_batch`` opens a batch for a reader of one message at a time (none
and gzip; snappy, lz4 and zstd stay closed: no such codec is a dependency).
"""

from __future__ import annotations

import mmap
import struct
import zlib
from array import array
from collections.abc import Callable, Mapping
from typing import Final

import warren
from warren.core.message import Message, MessageRun
from warren.core.properties import edit_properties, peek_headers
from warren.core.stream import OFFSET_HEADER, TIMESTAMP_HEADER
from warren.store.records import (
    CHUNK_FLAG,
    RECORD_OVERHEAD,
    chunk_at,
    encode_message_record,
    encode_record,
)

__all__ = [
    "CHUNK_HEADER",
    "SHARED_DECODER",
    "MAX_CHUNK_ENTRIES",
    "EntryDecoder",
    "RECORD_TS",
    "CHUNK_BODY_AT",
    "chunk_count",
    "chunk_record",
    "chunk_trailer",
    "entry_span",
    "open_batch",
    "chunk_trailers",
    "parse_trailer",
    "parse_trailers",
    "record_offsets",
    "run_records",
    "stamp_properties",
    "stored_offset",
    "stream_record",
]

_I64: Final = struct.Struct(">q")
_U32: Final = struct.Struct(">I")
#: A record's timestamp, after its u32 length.
RECORD_TS: Final = struct.Struct(">Q")

_OFFSET_KEY: Final = bytes([len(OFFSET_HEADER)]) + OFFSET_HEADER.encode() + b"l"
_TIMESTAMP_KEY: Final = bytes([len(TIMESTAMP_HEADER)]) + TIMESTAMP_HEADER.encode() + b"l"
_OFFSET_NAME: Final = _OFFSET_KEY[:-1]
_TIMESTAMP_NAME: Final = _TIMESTAMP_KEY[:-1]
#: The two entries' size in a headers table: keys, tags and two 8-byte longs.
_ENTRIES_SIZE: Final = len(_OFFSET_KEY) + len(_TIMESTAMP_KEY) + 16
_HEADERS_BIT: Final = 0x2000
_CONTINUED_BIT: Final = 0x0001

_native = warren.native_module("_fastpath")
_encode_stream_records: Callable[..., tuple[bytes, bytes] | None] | None = (
    None if _native is None else getattr(_native, "encode_stream_records", None)
)
_NativeRun: type | None = None if _native is None else _native.PublishRun

#: osiris's chunk header (stream_protocol/chunk.py's layout, which core and store
#: may not import): magic/version, type, entries, records, timestamp, epoch,
#: first offset, data CRC, data length, trailer length, bloom size, reserved.
CHUNK_HEADER: Final = struct.Struct(">BBHIqQQIIIB3s")
_CHUNK_MAGIC: Final = 0x50
_CHUNK_USER: Final = 0
_CHUNK_EPOCH: Final = 1
#: A chunk header counts its entries in a u16.
MAX_CHUNK_ENTRIES: Final = 0xFFFF
#: Where a chunk record's body (its chunk header) starts, after the record's
#: head with empty exchange and routing key and no properties.
CHUNK_BODY_AT: Final = 13 + 1 + 4 + 8
_RECORD_HEAD: Final = struct.Struct(">IQBBIQ")
_TRAILER: Final = struct.Struct(">H")
_U64: Final = struct.Struct(">Q")
_HEADER_COUNTS: Final = struct.Struct(">I")  # num_records, 4 bytes into the chunk header
#: A sub-entry batch's head: type/compression byte, records, uncompressed and stored length.
_BATCH_HEAD: Final = struct.Struct(">BHII")
#: Sub-entry batch compressions by number (osiris), for log lines.
CODEC_NAMES: Final = ("none", "gzip", "snappy", "lz4", "zstd")
#: EntryDecoder's cache holds at most this many layouts, each at most this long
#: (a stream whose messages each have their own properties goes one by one).
MAX_LAYOUTS: Final = 1024
MAX_LAYOUT_BYTES: Final = 1024
#: Stamps learn looks for in a layout's properties (unlike any other bytes there).
_PROBE_OFFSET: Final = 0x5A17C0DE0FF5E7A1
_PROBE_TS: Final = 0x5A17C0DE07135A4B


class EntryDecoder:
    """How a chunk entry (an AMQP 1.0 message as published) becomes a core
    message's (properties, body, native) for readers of one message at a time:
    the broker's StreamMessageCodec's ``to_core``, which the composition root
    (warren.app) sets on SHARED_DECODER, the one every stream store (a
    follower's replica too) uses unless given its own: core and store import
    no protocol. None: the entry is the body.

    ``layouts`` is C's cache for framing many entries at once
    (warren._fastpath's deliver_entries): the sections of a message before its
    one data section -> its stamped properties (``learn``), so the mapping
    runs once per layout, not per message. Setting ``decode`` clears it."""

    __slots__ = ("_decode", "layouts")

    def __init__(self) -> None:
        self._decode: Callable[[bytes], tuple[bytes, bytes, bytes | None]] | None = None
        self.layouts: dict[bytes, tuple[bytes, int, int] | None] = {}

    @property
    def decode(self) -> Callable[[bytes], tuple[bytes, bytes, bytes | None]] | None:
        return self._decode

    @decode.setter
    def decode(self, decode: Callable[[bytes], tuple[bytes, bytes, bytes | None]] | None) -> None:
        self._decode = decode
        self.layouts = {}

    def learn(self, prefix: bytes, entry: bytes) -> tuple[bytes, int, int] | None:
        """The layout of ``entry`` (an AMQP 1.0 message whose sections before its
        data section are ``prefix``), stored in ``layouts`` while there is room:
        (its properties stamped with offset and timestamp 0, where the two
        8-byte values go), checked against stamp_properties; None when the
        mapping's body is not the data section, or the stamps are not two
        fixed places (that layout goes one message at a time)."""
        layouts = self.layouts
        if len(layouts) >= MAX_LAYOUTS or len(prefix) > MAX_LAYOUT_BYTES:
            return None
        layout = _layout(self._decode, prefix, entry)
        layouts[prefix] = layout
        return layout


def _layout(
    decode: Callable[[bytes], tuple[bytes, bytes, bytes | None]] | None, prefix: bytes, entry: bytes
) -> tuple[bytes, int, int] | None:
    """EntryDecoder.learn's layout of ``entry``, not stored."""
    at = len(prefix)
    if decode is None or len(entry) < at + 5 or entry[at + 3] not in (0xA0, 0xB0):
        return None
    props, body, _native = decode(entry)
    if body != entry[at + (5 if entry[at + 3] == 0xA0 else 8) :]:
        return None
    probe = stamp_properties(props, _PROBE_OFFSET, _PROBE_TS)
    offset_at = probe.find(_I64.pack(_PROBE_OFFSET))
    ts_at = probe.find(_I64.pack(_PROBE_TS))
    if offset_at < 0 or ts_at < 0 or abs(offset_at - ts_at) < 8:
        return None
    template = bytearray(probe)
    template[offset_at : offset_at + 8] = bytes(8)
    template[ts_at : ts_at + 8] = bytes(8)
    for offset, ts in ((0, 0), (0x7FFFFFFFFFFFFFFF, 0x0000018C2E5F3B9A)):
        filled = bytearray(template)
        filled[offset_at : offset_at + 8] = _I64.pack(offset)
        filled[ts_at : ts_at + 8] = _I64.pack(ts)
        if filled != stamp_properties(props, offset, ts):
            return None
    return bytes(template), offset_at, ts_at


#: The process's decoder of chunk entries (EntryDecoder), set by warren.app.
SHARED_DECODER: Final = EntryDecoder()


def chunk_trailer(reference: str, last_id: int) -> bytes:
    """A chunk record's trailer for one publisher: its reference (u16 length,
    UTF-8) and the last publishing id of the chunk (u64); empty without a
    reference."""
    return chunk_trailers({reference: last_id} if reference else {})


def chunk_trailers(sequences: Mapping[str, int]) -> bytes:
    """A chunk record's trailer: for each publisher reference with entries in
    the chunk, the reference (u16 length, UTF-8) and its last publishing id
    (u64), one after the other (a one-publisher trailer is chunk_trailer's)."""
    parts: list[bytes] = []
    for reference, last_id in sequences.items():
        ref = reference.encode("utf-8", "surrogateescape")
        parts.append(_TRAILER.pack(len(ref)) + ref + _U64.pack(last_id))
    return b"".join(parts)


def parse_trailer(trailer: bytes) -> tuple[str, int] | None:
    """(reference, last publishing id) of a one-publisher chunk record's
    trailer, None when empty, not understood or of several publishers."""
    found = parse_trailers(trailer)
    return found[0] if found is not None and len(found) == 1 else None


def parse_trailers(trailer: bytes) -> list[tuple[str, int]] | None:
    """Every (reference, last publishing id) of a chunk record's trailer; None
    when empty or not understood (then none is taken)."""
    found: list[tuple[str, int]] = []
    pos, end = 0, len(trailer)
    while pos < end:
        if end - pos < 10:
            return None
        (n,) = _TRAILER.unpack_from(trailer, pos)
        stop = pos + 2 + n + 8
        if stop > end:
            return None
        reference = bytes(trailer[pos + 2 : pos + 2 + n]).decode("utf-8", "surrogateescape")
        found.append((reference, _U64.unpack_from(trailer, pos + 2 + n)[0]))
        pos = stop
    return found or None


def chunk_record(
    data: bytes | memoryview,
    num_entries: int,
    offset: int,
    ts: int,
    trailer: bytes,
    seed: int,
    data_crc: int = -1,
    num_records: int = -1,
) -> bytes:
    """A chunk record: ``data`` (``num_entries`` data entries, as a Publish
    frame carries them, holding ``num_records`` messages: -1, one each)
    behind a chunk header whose first offset is ``offset``, the trailer
    section after it, all under one CRC seeded with ``seed``. ``data`` is
    copied once; its own CRC (the chunk header's, which a client checks) is
    ``data_crc`` when the caller has it."""
    if not 0 < num_entries <= MAX_CHUNK_ENTRIES:
        raise ValueError(f"a chunk holds 1 to {MAX_CHUNK_ENTRIES} entries, not {num_entries}")
    if num_records < 0:
        num_records = num_entries
    elif not num_entries <= num_records < 1 << 32:
        raise ValueError(f"{num_entries} entries cannot hold {num_records} messages")
    d_len = len(data)
    if data_crc < 0:
        data_crc = zlib.crc32(data)
    body_len = CHUNK_HEADER.size + d_len
    length = RECORD_OVERHEAD + body_len + 4 + len(trailer)
    head = _RECORD_HEAD.pack(length, ts, 0, 0, 0, body_len | CHUNK_FLAG) + CHUNK_HEADER.pack(
        _CHUNK_MAGIC,
        _CHUNK_USER,
        num_entries,
        num_records,
        ts,
        _CHUNK_EPOCH,
        offset,
        data_crc,
        d_len,
        0,
        0,
        b"\0\0\0",
    )
    tail = _U32.pack(len(trailer)) + trailer
    crc = zlib.crc32(tail, zlib.crc32(data, zlib.crc32(head, seed)))
    return b"".join((head, data, tail, _U32.pack(crc)))


def record_offsets(m: mmap.mmap | bytes, p_off: int, p_len: int) -> tuple[int, int]:
    """(first offset, offsets held) of a checked record whose properties
    inspect_record located: a chunk record's from its chunk header, another's
    from its x-stream-offset header (-1 when it has none) and 1."""
    if chunk_at(m, p_off, p_len):
        at = p_off + p_len + 8
        return _U64.unpack_from(m, at + 24)[0], _HEADER_COUNTS.unpack_from(m, at + 4)[0]
    return stored_offset(m, p_off, p_len), 1


def chunk_count(m: mmap.mmap | bytes, pos: int) -> int:
    """Offsets the record at ``pos`` (structure checked) holds when it is a chunk
    record, else 0; cheap: a chunk record has no names and no properties."""
    if m[pos + 12] or m[pos + 13] or _U32.unpack_from(m, pos + 14)[0]:
        return 0
    if not _U64.unpack_from(m, pos + 18)[0] & CHUNK_FLAG:
        return 0
    return int(_HEADER_COUNTS.unpack_from(m, pos + CHUNK_BODY_AT + 4)[0])


def entry_span(m: mmap.mmap | bytes, pos: int) -> tuple[int, int]:
    """(end, messages held) of the stored chunk entry at ``pos``: a simple
    entry holds one, a sub-entry batch its records."""
    if not m[pos] & 0x80:
        return pos + 4 + (_U32.unpack_from(m, pos)[0] & 0x7FFFFFFF), 1
    _first, count, _raw, size = _BATCH_HEAD.unpack_from(m, pos)
    return pos + _BATCH_HEAD.size + size, count


def open_batch(m: mmap.mmap | bytes, pos: int) -> tuple[list[bytes] | None, str]:
    """The records of the sub-entry batch at ``pos`` (checked by the record's
    CRC, not its contents), and its compression's name; None when they cannot
    be read here: compressed with a codec other than gzip, or not what its
    head says (a client's bad batch is stored as it came, as osiris does)."""
    first, count, raw_len, size = _BATCH_HEAD.unpack_from(m, pos)
    codec = (first >> 4) & 0x07
    name = CODEC_NAMES[codec] if codec < len(CODEC_NAMES) else str(codec)
    body = m[pos + _BATCH_HEAD.size : pos + _BATCH_HEAD.size + size]
    if codec == 1:
        d = zlib.decompressobj(wbits=31)
        try:
            raw = d.decompress(body, raw_len + 1)
        except zlib.error:
            return None, name
        if len(raw) != raw_len or not d.eof:
            return None, name
    elif codec != 0:
        return None, name
    else:
        raw = bytes(body)
    records: list[bytes] = []
    at, end = 0, len(raw)
    for _ in range(count):
        if at + 4 > end:
            return None, name
        (n,) = _U32.unpack_from(raw, at)
        if at + 4 + n > end:
            return None, name
        records.append(raw[at + 4 : at + 4 + n])
        at += 4 + n
    return (records if at == end else None), name


def stamp_properties(raw: bytes, offset: int, ts: int) -> bytes:
    """``raw`` with the x-stream-offset and x-stream-timestamp headers set.

    The common cases, no headers yet or headers without either key, splice the
    two entries in as bytes (a third of the cost of a stream append was the
    general edit_properties); anything else goes through edit_properties.
    """
    entries = _OFFSET_KEY + _I64.pack(offset) + _TIMESTAMP_KEY + _I64.pack(ts)
    try:
        flags = (raw[0] << 8) | raw[1]
        if not flags & _CONTINUED_BIT:
            pos = 2
            if flags & 0x8000:  # content-type
                pos += 1 + raw[pos]
            if flags & 0x4000:  # content-encoding
                pos += 1 + raw[pos]
            if not flags & _HEADERS_BIT:
                if pos <= len(raw):
                    return (
                        bytes(((flags | _HEADERS_BIT) >> 8, flags & 0xFF))
                        + raw[2:pos]
                        + _U32.pack(_ENTRIES_SIZE)
                        + entries
                        + raw[pos:]
                    )
            else:
                (size,) = _U32.unpack_from(raw, pos)
                end = pos + 4 + size
                table = raw[pos + 4 : end]
                if end <= len(raw) and _OFFSET_NAME not in table and _TIMESTAMP_NAME not in table:
                    return raw[:pos] + _U32.pack(size + _ENTRIES_SIZE) + table + entries + raw[end:]
    except (IndexError, struct.error):
        pass  # malformed: edit_properties says how
    return edit_properties(
        raw,
        set_headers={
            OFFSET_HEADER: b"l" + _I64.pack(offset),
            TIMESTAMP_HEADER: b"l" + _I64.pack(ts),
        },
    )


def stream_record(msg: Message, offset: int, ts: int, seed: int) -> bytes:
    """``msg`` as a record stamped with its offset and timestamp (its CRC
    seeded with ``seed``, the write segment's salt)."""
    props = stamp_properties(msg.properties, offset, ts)
    stored = Message(msg.exchange, msg.routing_key, props, msg.body, ts, msg.native)
    stored._ex_rk = msg._ex_rk
    return encode_message_record(stored, seed)


def run_records(
    run: MessageRun, start: int, stop: int, offset: int, ts: int, seed: int
) -> tuple[bytes, array[int]]:
    """The records of a run's messages ``start .. stop - 1`` stamped with
    offsets from ``offset`` on (as stream_record stamps one), back to back, and
    where each ends. In C for the C run type (warren._fastpath's
    encode_stream_records), this loop otherwise (and for properties whose
    headers already name x-stream-offset or x-stream-timestamp)."""
    raw = run.raw
    ends = array("I")
    if _encode_stream_records is not None and type(raw) is _NativeRun:
        done = _encode_stream_records(raw, start, stop, run.ex_rk, ts, offset, seed)
        if done is not None:
            ends.frombytes(done[1])
            return done[0], ends
    ex_rk = run.ex_rk
    ex_len = ex_rk[0]
    exchange = ex_rk[1 : 1 + ex_len]
    routing_key = ex_rk[2 + ex_len :]
    parts: list[bytes] = []
    at = 0
    for i in range(start, stop):
        props = stamp_properties(raw.properties(i), offset + i - start, ts)
        rec = encode_record(exchange, routing_key, props, raw.body(i), ts, seed)
        parts.append(rec)
        at += len(rec)
        ends.append(at)
    return b"".join(parts), ends


def stored_offset(m: mmap.mmap | bytes, p_off: int, p_len: int) -> int:
    """The x-stream-offset a record's properties carry, -1 when they do not."""
    headers = peek_headers(m[p_off : p_off + p_len]) or {}
    stored = headers.get(OFFSET_HEADER)
    if isinstance(stored, int) and not isinstance(stored, bool):
        return stored
    return -1
