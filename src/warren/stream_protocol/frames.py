"""Framing: a sans-IO reader that splits the byte stream into frames, and
the decoder from a frame to its command.

Every frame is ``Size(uint32)`` and that many bytes (key, version, body). The
reader checks a frame's declared size against the connection's ``frame_max``
before buffering any of it (RabbitMQ compares the size without its own four
bytes; 0 means no limit), so a client cannot make the broker hold more than
that. Before Open the broker keeps frame_max at INITIAL_FRAME_MAX.
"""

from __future__ import annotations

import struct
from typing import Final

from warren.stream_protocol import publish as _publish  # noqa: F401  - registers Publish and Deliver
from warren.stream_protocol.commands import COMMANDS, Command
from warren.stream_protocol.constants import RESPONSE_BIT, ResponseCode
from warren.stream_protocol.wire import BytesLike, Reader, StreamProtocolError

__all__ = ["FrameReader", "decode_frame", "frame_key"]

_SIZE: Final = struct.Struct(">I")
_HEAD: Final = struct.Struct(">HH")
#: The smallest frame: a key and a version (Heartbeat).
MIN_FRAME_SIZE: Final = 4


class FrameReader:
    """Bytes in as they arrive, whole frames (key, version and body, without
    the size) out, as memoryviews over the bytes read. A frame that is too
    large or too small makes ``feed`` raise StreamProtocolError with the code
    to close with; frames completed before it in the same call are returned
    first and the error is raised by the next call (RabbitMQ also handles the
    frames before an oversized one). The pieces of an unfinished frame are
    joined once, when it is complete, not on every read."""

    __slots__ = ("_error", "_need", "_parts", "_held", "frame_max")

    def __init__(self, frame_max: int = 0) -> None:
        self.frame_max = frame_max
        self._parts: list[bytes] = []
        self._held = 0
        self._need = 0
        self._error: StreamProtocolError | None = None

    def buffered(self) -> int:
        """Bytes held for a frame not yet complete."""
        return self._held

    def eof(self) -> None:
        """The peer closed: refuse a frame it left unfinished (a short frame)."""
        if self._held:
            raise StreamProtocolError(f"connection closed {self._held} bytes into a frame")

    def feed(self, data: BytesLike) -> list[memoryview]:
        if self._error is not None:
            raise self._error
        if self._parts:
            self._parts.append(bytes(data))
            self._held += len(data)
            if self._held < self._need:
                return []
            buf = b"".join(self._parts)
            self._parts, self._held = [], 0
        else:
            buf = bytes(data)
        view = memoryview(buf)
        frames: list[memoryview] = []
        pos, end = 0, len(buf)
        limit = self.frame_max
        need = 4
        while end - pos >= 4:
            (size,) = _SIZE.unpack_from(buf, pos)
            if (limit and size > limit) or size < MIN_FRAME_SIZE:
                self._error = (
                    StreamProtocolError(f"frame of {size} bytes has no key and version")
                    if size < MIN_FRAME_SIZE
                    else StreamProtocolError(
                        f"frame of {size} bytes over frame_max {limit}",
                        ResponseCode.FRAME_TOO_LARGE,
                    )
                )
                if frames:
                    return frames
                raise self._error
            if end - pos - 4 < size:
                need = 4 + size
                break
            frames.append(view[pos + 4 : pos + 4 + size])
            pos += 4 + size
        if pos < end:
            self._parts = [buf[pos:]]
            self._held = end - pos
            self._need = need
        return frames


def frame_key(frame: BytesLike) -> tuple[int, int]:
    """A frame's key (response bit included) and version, for dispatch."""
    if len(frame) < MIN_FRAME_SIZE:
        raise StreamProtocolError("frame has no key and version")
    key, version = _HEAD.unpack_from(frame, 0)
    return key, version


def decode_frame(frame: BytesLike) -> Command:
    """The command in one frame (as FrameReader returns it: no size prefix).
    An unknown key or version, or bytes left over, refuse it with UNKNOWN_FRAME."""
    key, version = frame_key(frame)
    cls = COMMANDS.get((key, version))
    if cls is None:
        kind = "response" if key & RESPONSE_BIT else "request"
        raise StreamProtocolError(f"unknown {kind} key {key & 0x7FFF:#06x} version {version}")
    r = Reader(frame, MIN_FRAME_SIZE)
    command = cls.decode_body(r, version)
    if r.remaining():
        raise StreamProtocolError(f"{r.remaining()} bytes after a {cls.__name__}")
    return command
