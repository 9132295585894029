"""The kernel written for mypyc rather than for the interpreter: the same
steps as fastpath_py.py, but fields read by indexing the bytes (native ints
in mypyc) instead of struct tuples, and no per-frame body list. Compiled by
mypyc as fastpath_mypyc_idx (build.sh). Semantics: fastpath_py.py."""

from __future__ import annotations

from typing import Final

from mypy_extensions import i64

FRAME_END: Final = 0xCE
FRAME_END_BYTE: Final = b"\xce"


def _u16(d: bytes, p: i64) -> i64:
    return (i64(d[p]) << 8) | d[p + 1]


def _u32(d: bytes, p: i64) -> i64:
    return (i64(d[p]) << 24) | (i64(d[p + 1]) << 16) | (i64(d[p + 2]) << 8) | d[p + 3]


def _head(ftype: int, channel: i64, size: i64) -> bytes:
    return bytes([ftype, channel >> 8, channel & 255, (size >> 24) & 255, (size >> 16) & 255,
                  (size >> 8) & 255, size & 255])


def _frame_at(d: bytes, n: i64, p: i64, ftype: i64, channel: i64, limit: i64) -> i64:
    """The payload size of a complete frame of this type on this channel at p, or -1."""
    if n - p < 8 or d[p] != ftype or _u16(d, p + 1) != channel:
        return -1
    size = _u32(d, p + 3)
    if size > limit or size > n - p - 8 or d[p + 7 + size] != FRAME_END:
        return -1
    return size


def publish_to_deliver(
    data: bytes, start: int, channel: int, ctag_head: bytes, first_tag: int, frame_max: int
) -> tuple[int, int, bytes]:
    n: i64 = len(data)
    ch: i64 = channel
    limit: i64 = frame_max - 8
    pos: i64 = start
    count = 0
    tag = first_tag
    parts: list[bytes] = []
    deliver_head = b"\x00\x3c\x00\x3c" + ctag_head
    while True:
        p = pos
        size = _frame_at(data, n, p, 1, ch, limit)
        if size < 9 or _u16(data, p + 7) != 60 or _u16(data, p + 9) != 40:
            break
        names_at = p + 13
        rk_at = names_at + 1 + data[names_at]
        end = p + 7 + size
        if rk_at >= end:
            break
        bits_at = rk_at + 1 + data[rk_at]
        if bits_at + 1 != end or data[bits_at] & 3:
            break
        p = end + 1
        size = _frame_at(data, n, p, 2, ch, limit)
        if size < 14 or _u16(data, p + 7) != 60 or _u16(data, p + 9) != 0:
            break
        header_at = p
        header_end = p + 8 + size
        body_size = (_u32(data, p + 11) << 32) | _u32(data, p + 15) if data[p + 11] < 128 else -1
        if body_size < 0:
            break  # 2**63 or more: never complete in a buffer
        p = header_end
        body_at = p
        frames = 0
        remaining = body_size
        while remaining > 0:
            size = _frame_at(data, n, p, 3, ch, limit)
            if size <= 0 or size > remaining:
                break
            remaining -= size
            frames += 1
            p += 8 + size
        if remaining > 0:
            break
        parts.append(_head(1, ch, len(deliver_head) + 9 + (bits_at - names_at)))
        parts.append(deliver_head)
        parts.append(tag.to_bytes(8, "big"))
        parts.append(b"\x00")
        parts.append(data[names_at:bits_at])
        parts.append(FRAME_END_BYTE)
        parts.append(data[header_at:header_end])
        if frames == 1:
            parts.append(data[body_at:p])
        elif frames > 1:
            body = b"".join([data[at + 7 : at + 7 + _u32(data, at + 3)] for at in _frame_starts(data, body_at, p)])
            at = 0
            while at < body_size:
                chunk = body[at : at + limit]
                parts.append(_head(3, ch, len(chunk)))
                parts.append(chunk)
                parts.append(FRAME_END_BYTE)
                at += limit
        tag += 1
        count += 1
        pos = p
    return pos, count, b"".join(parts)


def _frame_starts(data: bytes, p: i64, end: i64) -> list[i64]:
    starts: list[i64] = []
    while p < end:
        starts.append(p)
        p += 8 + _u32(data, p + 3)
    return starts
