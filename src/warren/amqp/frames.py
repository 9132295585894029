"""Building AMQP frames for the outgoing side.

Incoming frames are parsed inline in the connection's read loop, where a
function call per frame would cost measurably; outgoing frames are built here.
"""

from __future__ import annotations

import struct

from warren.amqp.spec import BASIC_CLASS_ID, Method
from warren.core.codec_errors import DecodeError

FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
FRAME_END_BYTE = b"\xce"
# A frame's header plus its end octet: what frame_max allows beyond the payload.
FRAME_OVERHEAD = 8

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
HEARTBEAT_FRAME = b"\x08\x00\x00\x00\x00\x00\x00\xce"

_frame_header = struct.Struct(">BHI")
_HEADER = struct.Struct(">HHQ")  # content header payload: class id, weight, body size
_content_header = struct.Struct(">BHIHHQ")  # frame header + class, weight, body size
unpack_frame_header = _frame_header.unpack_from
# The end octet of the previous frame travels with the next frame's header.
_end_and_content_header = struct.Struct(">BBHIHHQ")
_end_and_body_header = struct.Struct(">BBHI")


def method_frame(channel: int, method: Method) -> bytes:
    payload = method.encode()
    return _frame_header.pack(FRAME_METHOD, channel, len(payload)) + payload + FRAME_END_BYTE


def content_frames(
    channel: int, properties: bytes, body: bytes, frame_max: int, class_id: int = 60
) -> list[bytes]:
    """Header frame and body frames for one message, bodies split at frame_max."""
    size = len(body)
    out = [
        _content_header.pack(FRAME_HEADER, channel, 12 + len(properties), class_id, 0, size),
        properties,
        FRAME_END_BYTE,
    ]
    if size:
        chunk = frame_max - FRAME_OVERHEAD
        if size <= chunk:
            out.append(_frame_header.pack(FRAME_BODY, channel, size))
            out.append(body)
            out.append(FRAME_END_BYTE)
        else:
            view = memoryview(body)
            for start in range(0, size, chunk):
                part = view[start : start + chunk]
                out.append(_frame_header.pack(FRAME_BODY, channel, len(part)))
                out.append(bytes(part))
                out.append(FRAME_END_BYTE)
    return out


def message_frames(
    channel: int, method_payload: bytes, properties: bytes, body: bytes, frame_max: int
) -> list[bytes]:
    """A content-carrying method (deliver, get-ok, return) with its message.

    The common case, a body that fits one frame, is four struct packs and the
    caller's bytes; properties and body go out exactly as they were received.
    """
    size = len(body)
    head = _frame_header.pack(FRAME_METHOD, channel, len(method_payload))
    if 0 < size <= frame_max - FRAME_OVERHEAD:
        return [
            head,
            method_payload,
            _end_and_content_header.pack(
                0xCE, FRAME_HEADER, channel, 12 + len(properties), 60, 0, size
            ),
            properties,
            _end_and_body_header.pack(0xCE, FRAME_BODY, channel, size),
            body,
            FRAME_END_BYTE,
        ]
    return [head, method_payload, FRAME_END_BYTE] + content_frames(
        channel, properties, body, frame_max
    )


def header_payload(body_size: int, raw_properties: bytes) -> bytes:
    """Build a class-60 content header payload around already-encoded properties."""
    try:
        return _HEADER.pack(BASIC_CLASS_ID, 0, body_size) + raw_properties
    except struct.error as exc:
        raise ValueError(f"invalid body size {body_size}: {exc}") from exc


def split_header_payload(payload: bytes | bytearray | memoryview) -> tuple[int, int, bytes]:
    """Split a content header payload into (class_id, body_size, raw properties).

    The weight field is ignored (it must be zero and nobody uses it).
    """
    if len(payload) < _HEADER.size + 2:
        raise DecodeError(f"content header payload too short ({len(payload)} bytes)")
    class_id, _weight, body_size = _HEADER.unpack_from(payload, 0)
    return class_id, body_size, bytes(payload[_HEADER.size :])
