"""The replication protocol between a leader and its followers, sans-IO.

A follower connects to the leader's clustering port and the two exchange
frames: ``u32 size | u8 type | payload`` (size counts type and payload).
Strings are ``u16 size | UTF-8``, 64-bit numbers big-endian.

    follower -> leader   Hello(secret, node_id, stream_reads[, stream_protocol_reads])
    leader -> follower   IndexEntry(path, size, sha1)*, IndexEnd(position)
    follower -> leader   Request(path)*, RequestsEnd
    leader -> follower   FileData(path, offset, data)* per requested file (offset 0
                         creates or truncates it), SyncDone
    leader -> follower   Append(path, offset, data) | Allocate(path, size) |
                         Replace(path, data) | Delete(path) | Rename(path, to),
                         from then on, each one action of the stream
    follower -> leader   Ack(position): every action up to ``position`` is written
                         and fdatasynced on the follower
    either way           Heartbeat; Refused(reason) before the leader closes

``position`` numbers the leader's actions since it started leading: IndexEnd
carries the position the index was taken at, and the actions that follow
count on from it. Paths are relative to the data directory, with ``/``.

Decoder.feed() takes bytes and returns the frames they complete; a frame that
does not parse raises ProtocolError (the peer is then cut off).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

MAGIC = b"WARREN-REPLICATION-3"
#: Frames larger than this are refused (a file travels in chunks of CHUNK).
MAX_FRAME = 64 * 1024 * 1024
CHUNK = 1024 * 1024

_HEAD = struct.Struct(">IB")
_U16 = struct.Struct(">H")
_U64 = struct.Struct(">Q")


class ProtocolError(Exception):
    """The peer sent something that is not this protocol."""


@dataclass(frozen=True)
class Hello:
    secret: str
    node_id: str
    #: host:port of the follower's read-only stream service ("" when it has none).
    stream_reads: str = ""
    magic: bytes = MAGIC
    #: host:port of its stream protocol read service ("" when it has none; left
    #: out of the frame then, so a Hello without it still reads).
    stream_protocol_reads: str = ""


@dataclass(frozen=True)
class IndexEntry:
    path: str
    size: int
    sha1: bytes  # 20 bytes


@dataclass(frozen=True)
class IndexEnd:
    position: int


@dataclass(frozen=True)
class Request:
    path: str


@dataclass(frozen=True)
class RequestsEnd:
    pass


@dataclass(frozen=True)
class FileData:
    path: str
    offset: int
    data: bytes


@dataclass(frozen=True)
class SyncDone:
    pass


@dataclass(frozen=True)
class Append:
    path: str
    offset: int
    data: bytes


@dataclass(frozen=True)
class Allocate:
    """Space allocated ahead of a file's data (a preallocated segment)."""

    path: str
    size: int


@dataclass(frozen=True)
class Rename:
    """A file renamed (a segment file kept as a spare, a spare reused)."""

    path: str
    to: str


@dataclass(frozen=True)
class Replace:
    path: str
    data: bytes


@dataclass(frozen=True)
class Delete:
    path: str


@dataclass(frozen=True)
class Ack:
    position: int


@dataclass(frozen=True)
class Heartbeat:
    pass


@dataclass(frozen=True)
class Refused:
    reason: str


Frame = (
    Hello
    | IndexEntry
    | IndexEnd
    | Request
    | RequestsEnd
    | FileData
    | SyncDone
    | Append
    | Allocate
    | Replace
    | Delete
    | Rename
    | Ack
    | Heartbeat
    | Refused
)
#: The frames that are actions of the replicated stream (each advances the position).
Action = Append | Allocate | Replace | Delete | Rename

_TYPES: dict[type, int] = {
    Hello: 1,
    IndexEntry: 2,
    IndexEnd: 3,
    Request: 4,
    RequestsEnd: 5,
    FileData: 6,
    SyncDone: 7,
    Append: 16,
    Replace: 17,
    Delete: 18,
    Allocate: 19,
    Rename: 20,
    Ack: 32,
    Heartbeat: 48,
    Refused: 127,
}


def _str(text: str) -> bytes:
    raw = text.encode("utf-8", "surrogateescape")
    if len(raw) > 0xFFFF:
        raise ValueError("string longer than 65535 bytes")
    return _U16.pack(len(raw)) + raw


def encode(frame: Frame) -> bytes:
    """The bytes of one frame."""
    if isinstance(frame, Append | FileData):
        body = _str(frame.path) + _U64.pack(frame.offset) + frame.data
    elif isinstance(frame, Replace):
        body = _str(frame.path) + frame.data
    elif isinstance(frame, Allocate):
        body = _str(frame.path) + _U64.pack(frame.size)
    elif isinstance(frame, Rename):
        body = _str(frame.path) + _str(frame.to)
    elif isinstance(frame, Delete | Request):
        body = _str(frame.path)
    elif isinstance(frame, Ack | IndexEnd):
        body = _U64.pack(frame.position)
    elif isinstance(frame, IndexEntry):
        if len(frame.sha1) != 20:
            raise ValueError("sha1 must be 20 bytes")
        body = _str(frame.path) + _U64.pack(frame.size) + frame.sha1
    elif isinstance(frame, Hello):
        body = (
            _str(frame.magic.decode("ascii"))
            + _str(frame.secret)
            + _str(frame.node_id)
            + _str(frame.stream_reads)
            + (_str(frame.stream_protocol_reads) if frame.stream_protocol_reads else b"")
        )
    elif isinstance(frame, Refused):
        body = _str(frame.reason)
    else:  # RequestsEnd, SyncDone, Heartbeat
        body = b""
    size = len(body) + 1
    if size > MAX_FRAME:
        raise ValueError(f"frame of {size} bytes is larger than {MAX_FRAME}")
    return _HEAD.pack(size, _TYPES[type(frame)]) + body


class _Reader:
    def __init__(self, payload: memoryview) -> None:
        self.view = payload
        self.pos = 0

    def str(self) -> str:
        if self.pos + 2 > len(self.view):
            raise ProtocolError("truncated string")
        (n,) = _U16.unpack_from(self.view, self.pos)
        end = self.pos + 2 + n
        if end > len(self.view):
            raise ProtocolError("truncated string")
        raw = bytes(self.view[self.pos + 2 : end])
        self.pos = end
        return raw.decode("utf-8", "surrogateescape")

    def u64(self) -> int:
        if self.pos + 8 > len(self.view):
            raise ProtocolError("truncated number")
        (n,) = _U64.unpack_from(self.view, self.pos)
        self.pos += 8
        return int(n)

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.view):
            raise ProtocolError("truncated frame")
        raw = bytes(self.view[self.pos : self.pos + n])
        self.pos += n
        return raw

    def rest(self) -> bytes:
        raw = bytes(self.view[self.pos :])
        self.pos = len(self.view)
        return raw

    def end(self) -> None:
        if self.pos != len(self.view):
            raise ProtocolError("trailing bytes in frame")


def _path(r: _Reader) -> str:
    path = r.str()
    parts = path.split("/")
    if not path or path.startswith("/") or "\0" in path or any(p in ("", ".", "..") for p in parts):
        raise ProtocolError(f"bad path {path!r}")
    return path


def _decode(kind: int, payload: memoryview) -> Frame:
    r = _Reader(payload)
    frame: Frame
    if kind == 16:
        frame = Append(_path(r), r.u64(), r.rest())
    elif kind == 6:
        frame = FileData(_path(r), r.u64(), r.rest())
    elif kind == 17:
        frame = Replace(_path(r), r.rest())
    elif kind == 18:
        frame = Delete(_path(r))
    elif kind == 19:
        frame = Allocate(_path(r), r.u64())
    elif kind == 20:
        frame = Rename(_path(r), _path(r))
    elif kind == 4:
        frame = Request(_path(r))
    elif kind == 32:
        frame = Ack(r.u64())
    elif kind == 3:
        frame = IndexEnd(r.u64())
    elif kind == 2:
        frame = IndexEntry(_path(r), r.u64(), r.take(20))
    elif kind == 1:
        magic = r.str().encode("ascii", "replace")
        if magic != MAGIC:
            raise ProtocolError("not a Warren replication peer (or another version)")
        frame = Hello(r.str(), r.str(), r.str())
        if r.pos < len(r.view):
            frame = Hello(frame.secret, frame.node_id, frame.stream_reads, MAGIC, r.str())
    elif kind == 127:
        frame = Refused(r.str())
    elif kind == 5:
        frame = RequestsEnd()
    elif kind == 7:
        frame = SyncDone()
    elif kind == 48:
        frame = Heartbeat()
    else:
        raise ProtocolError(f"unknown frame type {kind}")
    r.end()
    return frame


class Decoder:
    """Bytes in, frames out."""

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self._buf = bytearray()
        self._max = max_frame

    def feed(self, data: bytes) -> list[Frame]:
        buf = self._buf
        buf += data
        frames: list[Frame] = []
        pos = 0
        view = memoryview(buf)
        try:
            while len(buf) - pos >= 5:
                size, kind = _HEAD.unpack_from(buf, pos)
                if size < 1 or size > self._max:
                    raise ProtocolError(f"frame size {size} out of range")
                end = pos + 4 + size
                if end > len(buf):
                    break
                frames.append(_decode(kind, view[pos + 5 : end]))
                pos = end
        finally:
            view.release()
        del buf[:pos]
        return frames
