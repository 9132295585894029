"""The on-disk record format of the segment store (docs/storage.md has the full layout).

One record per message, all integers big-endian::

    u32  record length        the whole record: this field through the CRC
    u64  timestamp            milliseconds since the epoch
    u8   exchange length      + exchange name (UTF-8)
    u8   routing key length   + routing key (UTF-8)
    u32  properties length    + raw basic properties exactly as published
    u64  body length          + body
   [u32  native length        + native bytes]   only when bit 63 of body length is set
   [u32  trailer length       + trailer bytes]  only when bit 62 of body length is set
    u32  CRC32                zlib.crc32 of every byte of the record before it,
                              seeded with the segment's salt (0 in version 1)

A message that keeps its AMQP 1.0 bare message (Message.native) sets the top bit
of the body length (a body is under 4 GiB, so the bit is free) and carries it
after the body; the common record is unchanged and a reader only looks for the
bit when the body length does not end the record, so it costs that record nothing.

A stream's chunk record (store/stream_records.py) sets bit 62 instead: its body
is a whole osiris chunk of many messages, and its section a trailer (the
publisher's reference and last publishing id). Readers of one message per
record check ``chunk_at`` first; the structure and CRC checks treat both
sections alike.

The leading length lets a reader step over a record without parsing it, and the
inner lengths must add up to it, so most corruption of a length field is caught
before the CRC is even computed. Every segment file starts with a file header,
b"WSEG" plus a u32 format version (store/segment_format.py: version 2 adds the
salt that seeds the CRCs), so a foreign or future file is never parsed as
records. FILE_HEADER and check_file_header here are version 1's.
"""

from __future__ import annotations

import mmap
import struct
import zlib
from array import array
from collections.abc import Callable

import warren
from warren.core.message import Message, RawRun
from warren.core.properties import peek_delivery_mode

__all__ = [
    "FILE_HEADER",
    "FILE_HEADER_SIZE",
    "FILE_MAGIC",
    "FORMAT_VERSION",
    "MIN_RECORD_SIZE",
    "CHUNK_FLAG",
    "NATIVE_FLAG",
    "BadFileHeader",
    "CorruptRecord",
    "check_file_header",
    "chunk_at",
    "decode_record",
    "decode_records",
    "encode_message",
    "encode_record",
    "encode_run",
    "inspect_record",
]

FILE_MAGIC = b"WSEG"
FORMAT_VERSION = 1
_FILE_HEADER = struct.Struct(">4sI")
FILE_HEADER = _FILE_HEADER.pack(FILE_MAGIC, FORMAT_VERSION)
FILE_HEADER_SIZE = _FILE_HEADER.size  # 8

# u32 length, u64 timestamp, u8 exchange length: everything before the first string.
_HEAD = struct.Struct(">IQB")
_U8 = struct.Struct(">B")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")

#: Bytes of a record that are not exchange, routing key, properties or body.
RECORD_OVERHEAD = _HEAD.size + 1 + 4 + 8 + 4  # 30
MIN_RECORD_SIZE = RECORD_OVERHEAD
#: The record length is a u32, so no record (and no body) can exceed 4 GiB.
MAX_RECORD_SIZE = 0xFFFFFFFF
#: Set in the body length of a record that carries a native (AMQP 1.0) message
#: after the body: u32 length, then its bytes.
NATIVE_FLAG = 1 << 63
#: Set in the body length of a stream's chunk record (a chunk of messages as
#: its body), with a trailer section after the body like the native one.
CHUNK_FLAG = 1 << 62
_SECTION_FLAGS = NATIVE_FLAG | CHUNK_FLAG

_Buffer = bytes | bytearray | memoryview | mmap.mmap

# Exchange names repeat on nearly every record: decoding each once saves an allocation
# per shift. Bounded so that a queue fed by many exchanges cannot grow it without limit.
_EXCHANGE_NAMES: dict[bytes, str] = {}
_EXCHANGE_CACHE_MAX = 1024


class CorruptRecord(ValueError):
    """A record failed its length bounds, its inner structure or its CRC.

    ``length`` is the record's length field when that value is within bounds (it may
    still be wrong: the store decides whether to trust it by checking that a sane
    record follows), or None when it cannot delimit a record at all.
    """

    def __init__(self, reason: str, offset: int, length: int | None) -> None:
        super().__init__(f"corrupt record at offset {offset}: {reason}")
        self.reason = reason
        self.offset = offset
        self.length = length


class BadFileHeader(ValueError):
    """A segment file does not start with b"WSEG" and a version this code reads."""


def check_file_header(buf: _Buffer) -> None:
    if len(buf) < FILE_HEADER_SIZE:
        raise BadFileHeader(f"file header truncated ({len(buf)} bytes)")
    magic, version = _FILE_HEADER.unpack_from(buf, 0)
    if magic != FILE_MAGIC:
        raise BadFileHeader(f"bad magic {bytes(magic)!r}")
    if version != FORMAT_VERSION:
        raise BadFileHeader(f"unsupported format version {version}")


def encode_record(
    exchange: bytes,
    routing_key: bytes,
    properties: bytes,
    body: bytes,
    timestamp: int,
    seed: int = 0,
    native: bytes | None = None,
) -> bytes:
    """One complete record, ready for a single write; its CRC seeded with
    ``seed`` (zlib.crc32(data, seed): a version-2 segment's salt); with the
    message's ``native`` form after the body when it has one."""
    if native is not None:
        return _native_record(exchange, routing_key, properties, body, timestamp, seed, native)
    ex_len = len(exchange)
    rk_len = len(routing_key)
    if ex_len > 255 or rk_len > 255:
        raise ValueError("exchange and routing key must be at most 255 bytes")
    p_len = len(properties)
    b_len = len(body)
    length = RECORD_OVERHEAD + ex_len + rk_len + p_len + b_len
    if length > MAX_RECORD_SIZE:
        raise ValueError(f"message of {b_len} bytes is too large for a segment record")
    if b_len <= 2048:
        # Small records (the common case): one join, one CRC, one concatenation.
        rec = b"".join(
            (
                _HEAD.pack(length, timestamp, ex_len),
                exchange,
                _U8.pack(rk_len),
                routing_key,
                _U32.pack(p_len),
                properties,
                _U64.pack(b_len),
                body,
            )
        )
        return rec + _U32.pack(zlib.crc32(rec, seed))
    # Large bodies are copied exactly once: CRC the prefix and the body separately.
    prefix = b"".join(
        (
            _HEAD.pack(length, timestamp, ex_len),
            exchange,
            _U8.pack(rk_len),
            routing_key,
            _U32.pack(p_len),
            properties,
            _U64.pack(b_len),
        )
    )
    return b"".join((prefix, body, _U32.pack(zlib.crc32(body, zlib.crc32(prefix, seed)))))


def _native_record(
    exchange: bytes,
    routing_key: bytes,
    properties: bytes,
    body: bytes,
    timestamp: int,
    seed: int,
    native: bytes,
) -> bytes:
    """encode_record for a message with a native form: the flag in the body
    length, the native bytes after the body (rare: AMQP 1.0 messages only)."""
    ex_len = len(exchange)
    rk_len = len(routing_key)
    if ex_len > 255 or rk_len > 255:
        raise ValueError("exchange and routing key must be at most 255 bytes")
    b_len = len(body)
    length = RECORD_OVERHEAD + ex_len + rk_len + len(properties) + b_len + 4 + len(native)
    if length > MAX_RECORD_SIZE:
        raise ValueError(f"message of {b_len} bytes is too large for a segment record")
    rec = b"".join(
        (
            _HEAD.pack(length, timestamp, ex_len),
            exchange,
            _U8.pack(rk_len),
            routing_key,
            _U32.pack(len(properties)),
            properties,
            _U64.pack(b_len | NATIVE_FLAG),
            body,
            _U32.pack(len(native)),
            native,
        )
    )
    return rec + _U32.pack(zlib.crc32(rec, seed))


def _native_end(buf: _Buffer, o: int, b_len: int, end: int) -> int:
    """Where the body ends in a record whose body length ``b_len`` (read just
    before ``o``) does not end it: the section's start if one flag (native or
    chunk) is set and the section's length ends the record exactly, else -1."""
    flag = b_len & _SECTION_FLAGS
    if flag != NATIVE_FLAG and flag != CHUNK_FLAG:
        return -1
    body_end = o + (b_len ^ flag)
    if body_end + 4 > end or body_end + 4 + _U32.unpack_from(buf, body_end)[0] != end:
        return -1
    return body_end


_HEAD_NO_EX = struct.Struct(">IQ")


def encode_message_record(msg: Message, seed: int = 0) -> bytes:
    """encode_record for a message, reusing its encoded exchange and routing key
    (the record stores them exactly as the two AMQP shortstrs a delivery carries)."""
    ex_rk = msg.exchange_and_key()
    props = msg.properties
    body = msg.body
    p_len = len(props)
    b_len = len(body)
    length = RECORD_OVERHEAD - 2 + len(ex_rk) + p_len + b_len
    if b_len > 2048 or length > MAX_RECORD_SIZE or msg.native is not None:
        ex_len = ex_rk[0]
        return encode_record(
            ex_rk[1 : 1 + ex_len],
            ex_rk[2 + ex_len :],
            props,
            body,
            msg.timestamp,
            seed,
            msg.native,
        )
    rec = b"".join(
        (
            _HEAD_NO_EX.pack(length, msg.timestamp),
            ex_rk,
            _U32.pack(p_len),
            props,
            _U64.pack(b_len),
            body,
        )
    )
    return rec + _U32.pack(zlib.crc32(rec, seed))


_native = warren.native_module("_fastpath")
#: The C encoder of a run's records, and the run type it reads (None: not built).
_encode_records: Callable[..., tuple[bytes, bytes, bytes, int]] | None = (
    None if _native is None else _native.encode_records
)
_NativeRun: type | None = None if _native is None else _native.PublishRun
_PERSISTENT_PROPS = b"\x10\x00\x02"
#: The C check of a record's CRC where it lies (None: not built).
_native_crc_ok: Callable[[_Buffer, int, int, int], bool] | None = (
    None if _native is None else _native.crc_ok
)


def encode_run(
    raw: RawRun, start: int, stop: int, ex_rk: bytes, timestamp: int, base: int, seed: int = 0
) -> tuple[bytes, array[int], array[int], int]:
    """The records of messages ``start .. stop - 1`` of a run of publishes
    (core.message.MessageRun), back to back for one write, all with the run's
    exchange and routing key (``ex_rk``, two shortstrs) and ``timestamp``; with
    each record's offset (``base`` + its position in the bytes), each body's
    size, and how many are persistent; CRCs seeded with ``seed``. In C for the C run type
    (warren._fastpath.encode_records), this loop otherwise."""
    if _encode_records is not None and type(raw) is _NativeRun:
        recs, offs, sizes, persistent = _encode_records(
            raw, start, stop, ex_rk, timestamp, base, seed
        )
        offsets = array("I")
        offsets.frombytes(offs)
        body_sizes = array("I")
        body_sizes.frombytes(sizes)
        return recs, offsets, body_sizes, persistent
    ex_len = ex_rk[0]
    exchange = ex_rk[1 : 1 + ex_len]
    routing_key = ex_rk[2 + ex_len :]
    parts: list[bytes] = []
    offsets = array("I")
    body_sizes = array("I")
    persistent = 0
    at = base
    for i in range(start, stop):
        props = raw.properties(i)
        body = raw.body(i)
        rec = encode_record(exchange, routing_key, props, body, timestamp, seed)
        parts.append(rec)
        offsets.append(at)
        body_sizes.append(len(body))
        at += len(rec)
        if props == _PERSISTENT_PROPS or peek_delivery_mode(props) == 2:
            persistent += 1
    return b"".join(parts), offsets, body_sizes, persistent


def encode_message(msg: Message, seed: int = 0) -> bytes:
    """The record for a message (strings as the AMQP codec decodes them)."""
    return encode_record(
        msg.exchange.encode("utf-8", "surrogateescape"),
        msg.routing_key.encode("utf-8", "surrogateescape"),
        msg.properties,
        msg.body,
        msg.timestamp,
        seed,
        msg.native,
    )


def _crc_ok(buf: _Buffer, start: int, end: int, seed: int) -> bool:
    """Check the CRC stored at ``end`` against the bytes from ``start`` (seeded
    with ``seed``, the segment's salt: a record of the file's previous life,
    written with another salt, does not check out).

    This is on the read path (every shift): with the C extension, records up to
    64 KiB are checked in place, without a copy (warren._fastpath.crc_ok).
    Otherwise small records are copied out (cheaper than creating views) and
    large ones checksummed through views that are released before returning,
    so a memory map over ``buf`` can be closed afterwards without BufferError.
    """
    n = end - start
    if _native_crc_ok is not None and n <= 65536:
        return _native_crc_ok(buf, start, end, seed)
    if n <= 4096:
        computed = zlib.crc32(buf[start:end], seed)
    else:
        with memoryview(buf) as view, view[start:end] as part:
            computed = zlib.crc32(part, seed)
    return computed == _U32.unpack_from(buf, end)[0]


def inspect_record(
    buf: _Buffer, offset: int, limit: int, verify_crc: bool = True, seed: int = 0
) -> tuple[int, int, int, int]:
    """Validate the record at ``offset`` (data ends at ``limit``; CRC seeded with
    ``seed``) without building a Message.

    Returns (record length, properties offset, properties length, body length).
    Raises CorruptRecord on a torn or damaged record.
    """
    avail = limit - offset
    if avail < 4:
        raise CorruptRecord(f"only {avail} bytes left, length field torn", offset, None)
    (length,) = _U32.unpack_from(buf, offset)
    if length < MIN_RECORD_SIZE:
        raise CorruptRecord(f"length {length} below the minimum", offset, None)
    if length > avail:
        raise CorruptRecord(f"length {length} runs past the end ({avail} bytes left)", offset, None)
    end = offset + length - 4  # where the CRC starts
    o = offset + _HEAD.size
    o += buf[o - 1] + 1  # exchange, then the routing key length byte
    if o > end:
        raise CorruptRecord("exchange overruns the record", offset, length)
    o += buf[o - 1] + 4  # routing key, then the properties length
    if o > end:
        raise CorruptRecord("routing key overruns the record", offset, length)
    (p_len,) = _U32.unpack_from(buf, o - 4)
    p_off = o
    o += p_len + 8
    if o > end:
        raise CorruptRecord("properties overrun the record", offset, length)
    (b_len,) = _U64.unpack_from(buf, o - 8)
    if o + b_len != end:
        if _native_end(buf, o, b_len, end) < 0:
            raise CorruptRecord("field lengths do not add up to the record length", offset, length)
        b_len &= ~_SECTION_FLAGS
    if verify_crc and not _crc_ok(buf, offset, end, seed):
        raise CorruptRecord("CRC mismatch", offset, length)
    return length, p_off, p_len, b_len


def chunk_at(buf: _Buffer, p_off: int, p_len: int) -> bool:
    """Whether the record whose properties ``inspect_record`` located is a
    stream's chunk record (bit 62 of its body length)."""
    return bool(_U64.unpack_from(buf, p_off + p_len)[0] & CHUNK_FLAG)


def decode_record(
    buf: bytes | mmap.mmap, offset: int, limit: int, verify_crc: bool = True, seed: int = 0
) -> tuple[Message, int]:
    """The message stored at ``offset`` and the record's length. Raises CorruptRecord.

    ``buf`` is bytes or an mmap because slicing those copies: every field of the
    Message is its own bytes object, so no view into a memory map outlives the call
    and the map can be closed at any time. This is the shift() hot path: the
    structure (length bounds, inner lengths adding up) is always checked, the CRC
    unless ``verify_crc`` is False (shift checks it: nothing damaged is served),
    seeded with ``seed`` (the segment's salt).
    """
    try:
        length, timestamp, ex_len = _HEAD.unpack_from(buf, offset)
        if length < MIN_RECORD_SIZE or length > limit - offset:
            raise CorruptRecord(f"length {length} out of bounds", offset, None)
        end = offset + length - 4
        o = offset + 13  # _HEAD.size
        ex_raw = buf[o : o + ex_len]
        o += ex_len
        rk_len = buf[o]
        o += 1
        rk_raw = buf[o : o + rk_len]
        o += rk_len
        (p_len,) = _U32.unpack_from(buf, o)
        o += 4
        props = buf[o : o + p_len]
        o += p_len
        (b_len,) = _U64.unpack_from(buf, o)
        o += 8
    except (struct.error, IndexError) as exc:
        raise CorruptRecord(f"torn record: {exc}", offset, None) from exc
    native = None
    body_end = end
    if o + b_len != end:
        body_end = _native_end(buf, o, b_len, end)
        if body_end < 0:
            raise CorruptRecord("field lengths do not add up to the record length", offset, length)
        native = buf[body_end + 4 : end]
    if verify_crc and not _crc_ok(buf, offset, end, seed):
        raise CorruptRecord("CRC mismatch", offset, length)
    exchange = _EXCHANGE_NAMES.get(ex_raw)
    if exchange is None:
        exchange = ex_raw.decode("utf-8", "surrogateescape")
        if len(_EXCHANGE_NAMES) >= _EXCHANGE_CACHE_MAX:
            _EXCHANGE_NAMES.clear()
        _EXCHANGE_NAMES[ex_raw] = exchange
    msg = Message(
        exchange, rk_raw.decode("utf-8", "surrogateescape"), props, buf[o:body_end], timestamp, native
    )
    # The two shortstrs as stored are what a delivery of this message carries.
    msg._ex_rk = buf[offset + 12 : offset + 14 + ex_len + rk_len]
    return msg, length


def decode_records(data: bytes) -> list[Message]:
    """The messages of records laid back to back in ``data`` (what a failed
    write-out dropped: this process encoded them, so the CRCs are not
    checked); stops at the first that does not decode. A stream's chunk
    records are stepped over: their messages carry no deduplication key."""
    msgs: list[Message] = []
    pos, size = 0, len(data)
    while pos < size:
        try:
            length, p_off, p_len, _b = inspect_record(data, pos, size, False)
            if chunk_at(data, p_off, p_len):
                pos += length
                continue
            msg, length = decode_record(data, pos, size, False)
        except CorruptRecord:
            break
        msgs.append(msg)
        pos += length
    return msgs
