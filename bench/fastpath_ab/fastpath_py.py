"""The kernel as Warren's code is written today: typed Python, struct, slices,
a list of parts and one b"".join. Compiled by mypyc (build.sh) and also run
as it is (the pure-Python fallback). The reference for the other variants."""

from __future__ import annotations

from struct import Struct

_FRAME_HEADER = Struct(">BHI")
_CLASS_METHOD = Struct(">HH")
_HEADER_HEAD = Struct(">HHQ")
_TAG = Struct(">Q")

unpack_frame_header = _FRAME_HEADER.unpack_from
pack_frame_header = _FRAME_HEADER.pack
unpack_class_method = _CLASS_METHOD.unpack_from
unpack_header_head = _HEADER_HEAD.unpack_from
pack_tag = _TAG.pack

FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_END = 0xCE
FRAME_END_BYTE = b"\xce"
DELIVER_CLASS_METHOD = b"\x00\x3c\x00\x3c"
REDELIVERED_NO = b"\x00"


def publish_to_deliver(
    data: bytes, start: int, channel: int, ctag_head: bytes, first_tag: int, frame_max: int
) -> tuple[int, int, bytes]:
    n = len(data)
    limit = frame_max - 8  # the largest frame payload
    pos = start
    count = 0
    tag = first_tag
    parts: list[bytes] = []
    deliver_head = DELIVER_CLASS_METHOD + ctag_head
    while True:
        # basic.publish
        p = pos
        if p + 7 > n:
            break
        ftype, ch, size = unpack_frame_header(data, p)
        if ftype != FRAME_METHOD or ch != channel or size > limit or size < 9:
            break
        end = p + 7 + size
        if end >= n or data[end] != FRAME_END:
            break
        class_id, method_id = unpack_class_method(data, p + 7)
        if class_id != 60 or method_id != 40:
            break
        names_at = p + 13  # after class, method, reserved-1
        rk_at = names_at + 1 + data[names_at]
        if rk_at >= end:
            break
        bits_at = rk_at + 1 + data[rk_at]
        if bits_at + 1 != end or data[bits_at] & 3:
            break
        names = data[names_at:bits_at]  # exchange and routing key, as shortstrs
        # content header
        p = end + 1
        if p + 7 > n:
            break
        ftype, ch, size = unpack_frame_header(data, p)
        if ftype != FRAME_HEADER or ch != channel or size > limit or size < 14:
            break
        end = p + 7 + size
        if end >= n or data[end] != FRAME_END:
            break
        class_id, weight, body_size = unpack_header_head(data, p + 7)
        if class_id != 60 or weight != 0:
            break
        header = data[p : end + 1]
        p = end + 1
        # body frames
        bodies: list[bytes] = []
        remaining = body_size
        while remaining > 0:
            if p + 7 > n:
                break
            ftype, ch, size = unpack_frame_header(data, p)
            if ftype != FRAME_BODY or ch != channel or size > limit or size == 0 or size > remaining:
                break
            end = p + 7 + size
            if end >= n or data[end] != FRAME_END:
                break
            bodies.append(data[p:end + 1])
            remaining -= size
            p = end + 1
        if remaining > 0:
            break
        # basic.deliver, the header as received, the body
        parts.append(pack_frame_header(FRAME_METHOD, channel, len(deliver_head) + 9 + len(names)))
        parts.append(deliver_head)
        parts.append(pack_tag(tag))
        parts.append(REDELIVERED_NO)
        parts.append(names)
        parts.append(FRAME_END_BYTE)
        parts.append(header)
        if len(bodies) == 1:
            parts.append(bodies[0])  # a single frame is already within frame_max
        elif bodies:
            body = b"".join([frame[7:-1] for frame in bodies])
            for at in range(0, len(body), limit):
                chunk = body[at : at + limit]
                parts.append(pack_frame_header(FRAME_BODY, channel, len(chunk)))
                parts.append(chunk)
                parts.append(FRAME_END_BYTE)
        tag += 1
        count += 1
        pos = p
    return pos, count, b"".join(parts)
