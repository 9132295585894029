"""A span of stored records framed as one consumer's deliveries, in one pass.

The backlog path of a classic queue (core/queue.py) and of a stream
(core/stream_queue.py) hands a consumer a span of records where they lie in a
segment's memory map (core/store.py's StoreSpan); the consumer frames as many
as its credit allows into one bytes object and one transport write, without a
Message per record. ``deliver_records`` is C's (warren._fastpath, in
_fastpath_stream.c) when the extension is built, else
``deliver_records_python``, which is its reference in every detail
(tests/core/test_backlog_spans.py holds the two to the same output).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import warren
from warren.amqp.frames import message_frames
from warren.store.records import CorruptRecord, chunk_at, inspect_record

__all__ = ["DeliverRecords", "deliver_records", "deliver_records_python"]

_U64 = struct.Struct(">Q")
_pack_tag = struct.Struct(">QB").pack
# A frame's header and end octet around each payload, and a content header's
# class, weight and body size.
_FRAME_OVERHEAD = 8
_HEADER_FIELDS = 12
# frame_max up to 8 (0: none negotiated) leaves bodies in one frame, as C does.
_NO_CHUNKS = 1 << 62

#: (frames, n, end, sizes, offsets): see deliver_records_python.
DeliverRecords = Callable[..., tuple[bytes, int, int, bytes, bytes]]


def deliver_records_python(
    buf: Any,
    pos: int,
    limit: int,
    seed: int,
    max_n: int,
    channel: int,
    deliver_head: bytes,
    first_tag: int,
    frame_max: int,
    redelivered: bool = False,
    expired_at: int = -1,
    own_expiry: bool = False,
    max_bytes: int = 0,
) -> tuple[bytes, int, int, bytes, bytes]:
    """The records from ``buf[pos]`` on (up to ``limit``, CRCs seeded with
    ``seed``), at most ``max_n``, as basic.deliver method frames
    (``deliver_head``: class, method, consumer tag; tags from ``first_tag``,
    the ``redelivered`` bit, the stored exchange and routing key), content
    headers with the stored properties and bodies in frames of at most
    ``frame_max - 8`` octets: message_frames' bytes, back to back.

    Stops before the first record that does not check out (structure or CRC)
    or is a stream's chunk record (store/stream_records.py),
    one whose timestamp is at or below ``expired_at`` (-1: no such check), one
    with its own expiration property when ``own_expiry``, and the one that
    would take the frames past ``max_bytes`` (0: no limit; never the first).
    Returns (frames, n, end, sizes, offsets): how many records, where the next
    starts, and each body's size and each record's offset as native u32 bytes."""
    chunk = frame_max - _FRAME_OVERHEAD if frame_max > _FRAME_OVERHEAD else _NO_CHUNKS
    head_size = len(deliver_head) + 9  # the tag and the redelivered octet
    parts: list[bytes] = []
    sizes: list[int] = []
    offsets: list[int] = []
    total = 0
    q = pos
    tag = first_tag
    while len(sizes) < max_n and q < limit:
        try:
            length, p_off, p_len, b_len = inspect_record(buf, q, limit, True, seed)
        except CorruptRecord:
            break
        if chunk_at(buf, p_off, p_len):
            break  # a stream's chunk record: the cursor reads it message by message
        if expired_at >= 0 and _U64.unpack_from(buf, q + 4)[0] <= expired_at:
            break
        props = bytes(buf[p_off : p_off + p_len])
        if own_expiry and p_len >= 2 and props[0] & 0x01:  # the expiration flag
            break
        ex_rk = bytes(buf[q + 12 : p_off - 4])
        size = _FRAME_OVERHEAD + head_size + len(ex_rk)
        size += _FRAME_OVERHEAD + _HEADER_FIELDS + p_len
        if b_len:
            size += b_len + _FRAME_OVERHEAD * ((b_len - 1) // chunk + 1)
        if sizes and max_bytes > 0 and total + size > max_bytes:
            break
        total += size
        body_at = p_off + p_len + 8
        body = bytes(buf[body_at : body_at + b_len])
        payload = deliver_head + _pack_tag(tag, 1 if redelivered else 0) + ex_rk
        parts += message_frames(channel, payload, props, body, min(chunk, _NO_CHUNKS) + 8)
        sizes.append(b_len)
        offsets.append(q)
        q += length
        tag += 1
    n = len(sizes)
    return (
        b"".join(parts),
        n,
        q,
        struct.pack(f"={n}I", *sizes),
        struct.pack(f"={n}I", *offsets),
    )


_native = warren.native_module("_fastpath")
#: The framer the consumers use: C's when built, else the reference.
deliver_records: DeliverRecords = (
    deliver_records_python if _native is None else _native.deliver_records
)
