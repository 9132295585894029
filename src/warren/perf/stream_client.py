"""The stream protocol client side of ``warren perf stream``: a small blocking
client on warren.stream_protocol's codec.

Setup (PeerProperties, SASL PLAIN, Tune, Open, Create, DeclarePublisher,
Subscribe) is correct rather than fast: every frame is decoded with the codec.
The workers' hot loops use what is here for the rest: :class:`PublishTemplate`
(Publish frames built as bytes from one pre-encoded AMQP 1.0 message, the
publishing ids packed in bulk) and :func:`walk_frames` (frame boundaries and
keys, the Deliver chunk's header read in place: a chunk's records are counted
from its header, not decoded).
"""

from __future__ import annotations

import contextlib
import socket
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar
from urllib.parse import unquote, urlsplit

from warren.stream_protocol.chunk import ChunkHeader, iter_entries, read_records
from warren.stream_protocol.commands import (
    Close,
    Command,
    Create,
    CreateResponse,
    DeclarePublisher,
    DeclarePublisherResponse,
    Delete,
    DeleteResponse,
    Heartbeat,
    MetadataUpdate,
    Open,
    OpenResponse,
    PeerProperties,
    PeerPropertiesResponse,
    SaslAuthenticate,
    SaslAuthenticateResponse,
    SaslHandshake,
    SaslHandshakeResponse,
    Subscribe,
    SubscribeResponse,
    Tune,
    TuneResponse,
)
from warren.stream_protocol.constants import Key, OffsetType, ResponseCode
from warren.stream_protocol.frames import decode_frame
from warren.stream_protocol.wire import OffsetSpec, StreamProtocolError

__all__ = [
    "CREDIT",
    "HEARTBEAT",
    "PublishTemplate",
    "StreamConnection",
    "StreamError",
    "StreamURI",
    "chunk_info",
    "chunk_timestamps",
    "connect",
    "credit_frame",
    "walk_frames",
]

CONNECT_TIMEOUT = 10.0
DEFAULT_PORT: Final = 5552
#: The frame_max this client accepts (the broker's proposal wins when smaller).
FRAME_MAX: Final = 1 << 20
#: Frame keys the hot loops look for.
DELIVER: Final = int(Key.DELIVER)
PUBLISH_CONFIRM: Final = int(Key.PUBLISH_CONFIRM)
PUBLISH_ERROR: Final = int(Key.PUBLISH_ERROR)
CREDIT: Final = int(Key.CREDIT)
HEARTBEAT: Final = Heartbeat().encode()
_SIZE: Final = struct.Struct(">I")
_CREDIT: Final = struct.Struct(">IHHBH")
_PUBLISH_HEAD: Final = struct.Struct(">IHHBI")
_CHUNK: Final = struct.Struct(">BBHI")  # magic/version, chunk type, entries, records
_TS: Final = struct.Struct(">Q")
#: Where a Deliver's chunk header starts (after size, key, version, subscription id).
_CHUNK_AT = {1: 9, 2: 17}
#: A chunk header is 48 bytes; its data length is at offset 36.
_DATA_LENGTH_AT: Final = 36
#: The AMQP 1.0 data section this client publishes: descriptor 0x75, vbin8 / vbin32.
_DATA8: Final = b"\x00\x53\x75\xa0"
_DATA32: Final = b"\x00\x53\x75\xb0"

C = TypeVar("C", bound=Command)


class StreamError(Exception):
    """The broker refused a command, closed the connection, or sent nonsense."""


@dataclass(frozen=True)
class StreamURI:
    """``rabbitmq-stream://user:password@host:port/vhost`` (the Java client's form)."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    username: str = "guest"
    password: str = "guest"
    vhost: str = "/"

    @classmethod
    def parse(cls, uri: str) -> StreamURI:
        parts = urlsplit(uri)
        if parts.scheme not in ("rabbitmq-stream", "stream"):
            raise ValueError(f"unsupported URI scheme {parts.scheme!r} (rabbitmq-stream://)")
        try:
            port = parts.port or DEFAULT_PORT
        except ValueError as exc:
            raise ValueError(f"bad port in {uri!r}: {exc}") from None
        path = parts.path[1:] if parts.path.startswith("/") else parts.path
        return cls(
            host=parts.hostname or "127.0.0.1",
            port=port,
            username=unquote(parts.username) if parts.username is not None else "guest",
            password=unquote(parts.password) if parts.password is not None else "guest",
            vhost=unquote(path) if path else "/",
        )

    def masked(self, uri: str) -> str:
        """``uri`` with its password shown as ``***``."""
        parts = urlsplit(uri)
        if parts.password is None:
            return uri
        return uri.replace(f":{parts.password}@", ":***@", 1)


class StreamConnection:
    """An open connection: requests answered in order, one at a time."""

    def __init__(self, sock: socket.socket, frame_max: int, heartbeat: int) -> None:
        self.sock = sock
        self.frame_max = frame_max
        #: Seconds agreed in Tune (0: none).
        self.heartbeat = heartbeat
        #: Bytes received after the last answer, not yet handled (Deliver frames...).
        self.rest = b""
        self._corr = 100

    def next_id(self) -> int:
        self._corr += 1
        return self._corr

    def read_frame(self) -> bytes:
        """One frame (without its size), blocking."""
        buf = self.rest
        while True:
            if len(buf) >= 4:
                size = _SIZE.unpack_from(buf, 0)[0]
                if len(buf) >= 4 + size:
                    self.rest = buf[4 + size :]
                    return buf[4 : 4 + size]
            data = self.sock.recv(65536)
            if not data:
                raise StreamError("the broker closed the connection")
            buf += data

    def expect(self, kind: type[C]) -> C:
        """The next command, which must be a ``kind`` (heartbeats skipped); a Close
        or MetadataUpdate instead is a StreamError."""
        while True:
            try:
                command = decode_frame(self.read_frame())
            except StreamProtocolError as exc:
                raise StreamError(f"bad frame from the broker: {exc}") from None
            if isinstance(command, kind):
                return command
            if isinstance(command, Heartbeat):
                continue
            if isinstance(command, Close):
                raise StreamError(f"the broker closed the connection: {command.reason}")
            raise StreamError(f"expected {kind.__name__}, got {type(command).__name__}")

    def request(self, command: Command, answer: type[C], ok: tuple[int, ...] = (1,)) -> C:
        """Send ``command`` and return its answer, whose code must be in ``ok``."""
        self.sock.sendall(command.encode())
        response = self.expect(answer)
        code = getattr(response, "code", ResponseCode.OK)
        if code not in ok:
            name = type(command).__name__
            raise StreamError(f"{name} refused: {_code_name(code)}")
        return response

    def create(self, stream: str, arguments: dict[str, str] | None = None) -> bool:
        """Create ``stream``; False when it existed already."""
        r = self.request(
            Create(self.next_id(), stream, arguments or {}),
            CreateResponse,
            (ResponseCode.OK, ResponseCode.STREAM_ALREADY_EXISTS),
        )
        return r.code == ResponseCode.OK

    def delete(self, stream: str) -> None:
        self.request(Delete(self.next_id(), stream), DeleteResponse)

    def declare_publisher(self, publisher_id: int, stream: str, reference: str = "") -> None:
        self.request(
            DeclarePublisher(self.next_id(), publisher_id, reference, stream),
            DeclarePublisherResponse,
        )

    def subscribe(self, subscription_id: int, stream: str, offset: str, credit: int) -> None:
        spec = OffsetSpec(OffsetType[offset.upper()])
        self.request(
            Subscribe(self.next_id(), subscription_id, stream, spec, credit), SubscribeResponse
        )

    def close(self) -> None:
        """Close (the Close frame, no wait for the broker's answer), ignoring a
        connection the broker already dropped."""
        with contextlib.suppress(OSError):
            self.sock.sendall(Close(self.next_id(), ResponseCode.OK, "OK").encode())
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


def _code_name(code: int) -> str:
    try:
        return ResponseCode(code).name
    except ValueError:
        return f"code {code:#06x}"


def connect(uri: StreamURI, name: str) -> StreamConnection:
    """Connect, log in (PLAIN), tune and open ``uri.vhost``. Returns with the socket
    blocking and without a timeout."""
    sock = socket.create_connection((uri.host, uri.port), timeout=CONNECT_TIMEOUT)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = StreamConnection(sock, FRAME_MAX, 0)
        conn.request(
            PeerProperties(1, {"product": "warren perf", "connection_name": name}),
            PeerPropertiesResponse,
        )
        mechanisms = conn.request(SaslHandshake(2), SaslHandshakeResponse).mechanisms
        if "PLAIN" not in mechanisms:
            raise StreamError(f"the broker offers no PLAIN login: {mechanisms}")
        plain = b"\0" + uri.username.encode() + b"\0" + uri.password.encode()
        conn.request(SaslAuthenticate(3, "PLAIN", plain), SaslAuthenticateResponse)
        tune = conn.expect(Tune)
        frame_max = min(tune.frame_max, FRAME_MAX) if tune.frame_max else FRAME_MAX
        conn.frame_max = frame_max
        conn.heartbeat = tune.heartbeat
        sock.sendall(TuneResponse(frame_max, tune.heartbeat).encode())
        conn.request(Open(4, uri.vhost), OpenResponse)
        sock.settimeout(None)
        return conn
    except BaseException:
        sock.close()
        raise


# -- the hot path ----------------------------------------------------------------------------


def message_bytes(size: int) -> tuple[bytes, int]:
    """One AMQP 1.0 message of a ``size``-byte data section, and where its body
    starts (a send timestamp goes in the body's first 8 bytes)."""
    head = _DATA8 + bytes((size,)) if size < 256 else _DATA32 + _SIZE.pack(size)
    return head + bytes(size), len(head)


@dataclass
class PublishTemplate:
    """Publish v1 frames of ``per_frame`` messages each, built from one pre-encoded
    message: a message is ``publishing id (u64) + entry`` where the entry (its
    length and the AMQP message) is the same for every message of a batch but for
    the send timestamp, so a frame is one ``struct.pack`` of the frame header,
    the ids and the one entry, repeated."""

    size: int
    per_frame: int
    latency: bool = False
    entry_len: int = field(init=False)
    message_len: int = field(init=False)
    _entry: bytes = field(init=False)
    _ts_at: int = field(init=False)
    _structs: dict[int, struct.Struct] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        message, body_at = message_bytes(self.size)
        self._entry = _SIZE.pack(len(message)) + message
        self._ts_at = 4 + body_at
        self.entry_len = len(self._entry)
        self.message_len = 8 + self.entry_len

    def _struct(self, n: int) -> struct.Struct:
        s = self._structs.get(n)
        if s is None:
            s = self._structs[n] = struct.Struct(_PUBLISH_HEAD.format + f"Q{self.entry_len}s" * n)
        return s

    def entry(self, ts: int) -> bytes:
        """The entry with ``ts`` as its body's first 8 bytes (with ``latency``)."""
        e = self._entry
        if not self.latency:
            return e
        return e[: self._ts_at] + _TS.pack(ts) + e[self._ts_at + 8 :]

    def pack(self, publisher_id: int, first: int, n: int, ts: int = 0) -> bytes:
        """Frames for ``n`` messages with publishing ids ``first, first + 1, ...``,
        ``per_frame`` to a frame (the last one may hold fewer)."""
        entry = self.entry(ts)
        frames: list[bytes] = []
        per = self.per_frame
        pid = first
        end = first + n
        while pid < end:
            k = min(per, end - pid)
            args: list[Any] = [entry] * (2 * k)
            args[0::2] = range(pid, pid + k)
            frames.append(
                self._struct(k).pack(
                    9 + k * self.message_len, Key.PUBLISH, 1, publisher_id, k, *args
                )
            )
            pid += k
        return b"".join(frames)


def credit_frame(subscription_id: int, credit: int) -> bytes:
    return _CREDIT.pack(7, Key.CREDIT, 1, subscription_id, credit)


def walk_frames(buf: bytes) -> Iterator[tuple[int, int, int]]:
    """``(start, end, key)`` of each whole frame in ``buf``; ``start`` is the key's
    offset (after the size), ``end`` the frame's end. Stops at an incomplete one."""
    n = len(buf)
    pos = 0
    unpack_size = _SIZE.unpack_from
    while n - pos >= 4:
        size = unpack_size(buf, pos)[0]
        if size < 4:
            raise StreamError(f"frame of {size} bytes from the broker")
        end = pos + 4 + size
        if end > n:
            return
        yield pos + 4, end, (buf[pos + 4] << 8 | buf[pos + 5])
        pos = end


def chunk_info(buf: bytes, start: int, end: int, latency: bool) -> tuple[int, int]:
    """A Deliver frame's chunk (``start``: the frame's key): its record count from
    the header, and the send timestamp in its first record's body (-1 when not
    asked for, or no AMQP 1.0 data section there)."""
    version = buf[start + 3]
    at = start - 4 + _CHUNK_AT.get(version, 9)
    magic, chunk_type, _entries, records = _CHUNK.unpack_from(buf, at)
    if magic >> 4 != 5:
        raise StreamError(f"not an osiris chunk (magic byte {magic:#04x})")
    if chunk_type != 0 or not latency:
        return (records if chunk_type == 0 else 0), -1
    data = end - _SIZE.unpack_from(buf, at + _DATA_LENGTH_AT)[0]
    if data + 4 > end or buf[data] & 0x80:  # none there, or a sub-entry batch
        return records, -1
    return records, _timestamp(buf, data + 4, min(end, data + 4 + _SIZE.unpack_from(buf, data)[0]))


def chunk_timestamps(buf: bytes, start: int, end: int) -> list[int]:
    """Every record of a Deliver frame's chunk, located with the codec (sub-entry
    batches opened): the send timestamp in each record's body, -1 where there is
    none. The record count is checked against the chunk's header."""
    version = buf[start + 3]
    at = start - 4 + _CHUNK_AT.get(version, 9)
    try:
        header = ChunkHeader.unpack(buf, at)
        if header.chunk_type != 0:
            return []
        data = end - header.data_length
        stamps: list[int] = []
        for entry in iter_entries(buf, header.num_entries, data, end):
            if entry.compression is None:
                stamps.append(_timestamp(buf, entry.body, entry.end))
            else:
                stamps += [_timestamp(r, 0, len(r)) for r in read_records(buf, entry)]
    except StreamProtocolError as exc:
        raise StreamError(f"bad chunk from the broker: {exc}") from None
    if len(stamps) != header.num_records:
        raise StreamError(f"chunk of {header.num_records} records holds {len(stamps)}")
    return stamps


def _timestamp(buf: bytes, m: int, end: int) -> int:
    """The send timestamp at the start of the first data section of the AMQP 1.0
    message at ``buf[m:end]`` (after a header, annotations, properties: sections
    skipped by their sizes), or -1."""
    while m + 4 <= end and buf[m] == 0 and buf[m + 1] == 0x53:
        code, kind = buf[m + 2], buf[m + 3]
        if code == 0x75:
            if kind == 0xA0:
                body = m + 5
            elif kind == 0xB0:
                body = m + 8
            else:
                return -1
            if body + 8 > end:
                return -1
            ts: int = _TS.unpack_from(buf, body)[0]
            return ts
        if not 0x70 <= code <= 0x74:
            return -1
        if kind in (0x40, 0x45):  # null, list0
            m += 4
        elif kind in (0xC0, 0xC1):  # list8, map8
            m = m + 5 + buf[m + 4] if m + 5 <= end else end
        elif kind in (0xD0, 0xD1):  # list32, map32
            m = m + 8 + _SIZE.unpack_from(buf, m + 4)[0] if m + 8 <= end else end
        else:
            return -1
    return -1


def metadata_update_text(frame: bytes) -> str:
    """What a MetadataUpdate or Close frame (without its size) says."""
    with contextlib.suppress(StreamProtocolError):
        command = decode_frame(frame)
        if isinstance(command, MetadataUpdate):
            return f"stream {command.stream!r} is gone ({_code_name(command.code)})"
        if isinstance(command, Close):
            return f"the broker closed the connection: {command.reason}"
    return "unexpected frame from the broker"
