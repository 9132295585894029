"""The stream protocol's primitive types (big-endian integers, int16-length
strings, int32-length bytes, int32-counted arrays) and the one error the codec
refuses input with.

A field type is an object with ``put`` (append to a bytearray) and ``get``
(read from a Reader): the command classes in commands.py are declared as a
list of (name, field type), so each command's layout is written once and both
directions follow from it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Final, Protocol, TypeAlias

from warren.core.codec_errors import DecodeError
from warren.stream_protocol.constants import OffsetType, ResponseCode

__all__ = [
    "ANSWERED_OFFSET_SPEC",
    "BOOL8",
    "BROKERS",
    "BYTES",
    "COMMAND_VERSIONS",
    "I16",
    "I64",
    "INT_MAP",
    "MAP",
    "OFFSET_SPEC",
    "OPT_BYTES",
    "OPT_MAP",
    "PUBLISHING_ERRORS",
    "STR",
    "STREAM_METADATA",
    "STRS",
    "U8",
    "U16",
    "U32",
    "U64",
    "U64S",
    "Broker",
    "BytesLike",
    "CommandVersion",
    "FieldType",
    "OffsetSpec",
    "PublishingError",
    "Reader",
    "StreamMetadata",
    "StreamProtocolError",
]

#: What a Reader reads from (a received frame, or a slice of one).
BytesLike: TypeAlias = bytes | bytearray | memoryview

_U8, _U16, _U32, _U64 = (struct.Struct(f">{c}") for c in "BHIQ")
_I16, _I32, _I64 = (struct.Struct(f">{c}") for c in "hiq")


class StreamProtocolError(DecodeError):
    """Bytes that are not a valid stream protocol frame, or a value the codec
    cannot write. ``code`` is the response code to answer (or close) with:
    UNKNOWN_FRAME for garbled bytes, FRAME_TOO_LARGE for an oversized frame."""

    def __init__(self, message: str, code: ResponseCode = ResponseCode.UNKNOWN_FRAME) -> None:
        super().__init__(message)
        self.code = code

    def __reduce__(self) -> tuple[type[StreamProtocolError], tuple[str, ResponseCode]]:
        return (type(self), (str(self), self.code))


class Reader:
    """A cursor over one frame's bytes; every read past its end refuses the
    frame instead of returning short data."""

    __slots__ = ("buf", "end", "pos")

    def __init__(self, buf: BytesLike, pos: int = 0, end: int | None = None) -> None:
        self.buf = memoryview(buf).cast("B")
        self.pos = pos
        self.end = len(self.buf) if end is None else end

    def remaining(self) -> int:
        return self.end - self.pos

    def take(self, n: int) -> memoryview:
        start = self.pos
        if n < 0 or start + n > self.end:
            raise StreamProtocolError(f"frame ends inside a field ({n} bytes at {start})")
        self.pos = start + n
        return self.buf[start : start + n]

    def _unpack(self, s: struct.Struct) -> int:
        start = self.pos
        if start + s.size > self.end:
            raise StreamProtocolError(f"frame ends inside a field ({s.size} bytes at {start})")
        self.pos = start + s.size
        value: int = s.unpack_from(self.buf, start)[0]
        return value

    def u8(self) -> int:
        return self._unpack(_U8)

    def u16(self) -> int:
        return self._unpack(_U16)

    def u32(self) -> int:
        return self._unpack(_U32)

    def u64(self) -> int:
        return self._unpack(_U64)

    def i16(self) -> int:
        return self._unpack(_I16)

    def i32(self) -> int:
        return self._unpack(_I32)

    def i64(self) -> int:
        return self._unpack(_I64)

    def string(self) -> str:
        """An int16-length UTF-8 string; -1 (null) reads as ""."""
        size = self.i16()
        if size == -1:
            return ""
        if size < 0:
            raise StreamProtocolError(f"negative string length {size}")
        try:
            return str(self.take(size), "utf-8")
        except UnicodeDecodeError as exc:
            raise StreamProtocolError(f"string is not UTF-8: {exc}") from None

    def bytes_(self) -> bytes:
        """int32-length bytes; -1 (null) reads as b""."""
        size = self.i32()
        if size == -1:
            return b""
        if size < 0:
            raise StreamProtocolError(f"negative bytes length {size}")
        return bytes(self.take(size))

    def count(self, min_item: int) -> int:
        """An array's int32 count, refused when the items could not fit in the
        rest of the frame (so a forged count cannot make a huge list)."""
        n = self.i32()
        if n < 0 or n * min_item > self.remaining():
            raise StreamProtocolError(f"array of {n} items does not fit the frame")
        return n


def put_string(out: bytearray, value: str) -> None:
    data = value.encode("utf-8")
    if len(data) > 0x7FFF:
        raise StreamProtocolError(f"string of {len(data)} bytes is too long for int16")
    out += _U16.pack(len(data))
    out += data


class FieldType(Protocol):
    def put(self, out: bytearray, value: Any) -> None: ...

    def get(self, r: Reader) -> Any: ...


class _Int:
    __slots__ = ("read", "s")

    def __init__(self, s: struct.Struct, read: str) -> None:
        self.s = s
        self.read = read

    def put(self, out: bytearray, value: int) -> None:
        try:
            out += self.s.pack(value)
        except struct.error as exc:
            raise StreamProtocolError(f"{value!r} does not fit: {exc}") from None

    def get(self, r: Reader) -> int:
        value: int = getattr(r, self.read)()
        return value


U8: Final = _Int(_U8, "u8")
U16: Final = _Int(_U16, "u16")
U32: Final = _Int(_U32, "u32")
U64: Final = _Int(_U64, "u64")
I16: Final = _Int(_I16, "i16")
I64: Final = _Int(_I64, "i64")


class _Bool8:
    def put(self, out: bytearray, value: bool) -> None:
        out.append(1 if value else 0)

    def get(self, r: Reader) -> bool:
        b = r.u8()
        if b > 1:
            raise StreamProtocolError(f"boolean byte {b}")
        return b == 1


class _Str:
    def put(self, out: bytearray, value: str) -> None:
        put_string(out, value)

    def get(self, r: Reader) -> str:
        return r.string()


class _Bytes:
    def put(self, out: bytearray, value: bytes) -> None:
        out += _I32.pack(len(value))
        out += value

    def get(self, r: Reader) -> bytes:
        return r.bytes_()


class _OptTrailingBytes:
    """SaslAuthenticate's response: the challenge only when there is one (int32 length, as PROTOCOL.adoc's bytes)."""

    def put(self, out: bytearray, value: bytes) -> None:
        if value:
            _BYTES_T.put(out, value)

    def get(self, r: Reader) -> bytes:
        return r.bytes_() if r.remaining() else b""


class _List:
    __slots__ = ("item", "min_size", "code")

    def __init__(self, item: FieldType, min_size: int, code: str = "") -> None:
        self.item = item
        self.min_size = min_size
        #: The struct code of a fixed-size integer item: the list packed at once.
        self.code = code

    def put(self, out: bytearray, value: list[Any]) -> None:
        out += _I32.pack(len(value))
        if self.code:
            try:
                out += struct.pack(f">{len(value)}{self.code}", *value)
            except struct.error as exc:
                raise StreamProtocolError(f"a list item does not fit: {exc}") from None
            return
        for v in value:
            self.item.put(out, v)

    def get(self, r: Reader) -> list[Any]:
        return [self.item.get(r) for _ in range(r.count(self.min_size))]


class _Map:
    """[Key Value] of strings, as a dict (a repeated key: the last one wins)."""

    def put(self, out: bytearray, value: dict[str, str]) -> None:
        out += _I32.pack(len(value))
        for k, v in value.items():
            put_string(out, k)
            put_string(out, v)

    def get(self, r: Reader) -> dict[str, str]:
        return {r.string(): r.string() for _ in range(r.count(4))}


class _OptMap(_Map):
    """A trailing map RabbitMQ leaves out when empty (Subscribe's properties,
    Open's connection properties): written only when non-empty, read when present."""

    def put(self, out: bytearray, value: dict[str, str]) -> None:
        if value:
            super().put(out, value)

    def get(self, r: Reader) -> dict[str, str]:
        return super().get(r) if r.remaining() else {}


class _IntMap:
    """StreamStats' [Key int64]."""

    def put(self, out: bytearray, value: dict[str, int]) -> None:
        out += _I32.pack(len(value))
        for k, v in value.items():
            put_string(out, k)
            I64.put(out, v)

    def get(self, r: Reader) -> dict[str, int]:
        return {r.string(): r.i64() for _ in range(r.count(10))}


@dataclass(frozen=True, slots=True)
class OffsetSpec:
    """Where to start: a type and, for OFFSET (uint64) and TIMESTAMP (int64, ms
    since the epoch), a value; the other types carry none on the wire (value 0)."""

    type: OffsetType
    value: int = 0


class _OffsetSpec:
    def put(self, out: bytearray, value: OffsetSpec) -> None:
        out += _U16.pack(value.type)
        if value.type == OffsetType.OFFSET:
            U64.put(out, value.value)
        elif value.type == OffsetType.TIMESTAMP:
            I64.put(out, value.value)

    def get(self, r: Reader) -> OffsetSpec:
        t = r.u16()
        if t == OffsetType.OFFSET:
            return OffsetSpec(OffsetType.OFFSET, r.u64())
        if t == OffsetType.TIMESTAMP:
            return OffsetSpec(OffsetType.TIMESTAMP, r.i64())
        if t in (OffsetType.NONE, OffsetType.FIRST, OffsetType.LAST, OffsetType.NEXT):
            return OffsetSpec(OffsetType(t))
        raise StreamProtocolError(f"unknown offset type {t}", ResponseCode.PRECONDITION_FAILED)


class _AnsweredOffsetSpec(_OffsetSpec):
    """ConsumerUpdate's response: rstream writes an 8-byte value after every
    offset type, which RabbitMQ ignores when the type takes none; so do we."""

    def get(self, r: Reader) -> OffsetSpec:
        spec = super().get(r)
        if spec.type not in (OffsetType.OFFSET, OffsetType.TIMESTAMP) and r.remaining() == 8:
            r.take(8)
        return spec


@dataclass(frozen=True, slots=True)
class CommandVersion:
    key: int
    min_version: int
    max_version: int


class _CommandVersion:
    def put(self, out: bytearray, value: CommandVersion) -> None:
        for v in (value.key, value.min_version, value.max_version):
            U16.put(out, v)

    def get(self, r: Reader) -> CommandVersion:
        return CommandVersion(r.u16(), r.u16(), r.u16())


@dataclass(frozen=True, slots=True)
class Broker:
    """A node in a Metadata response; streams name it by ``reference``."""

    reference: int
    host: str
    port: int


class _Broker:
    def put(self, out: bytearray, value: Broker) -> None:
        U16.put(out, value.reference)
        put_string(out, value.host)
        U32.put(out, value.port)

    def get(self, r: Reader) -> Broker:
        return Broker(r.u16(), r.string(), r.u32())


@dataclass(frozen=True, slots=True)
class StreamMetadata:
    """One stream in a Metadata response: its leader and replicas by broker
    reference (0xFFFF and no replicas when ``code`` is not OK)."""

    stream: str
    code: int
    leader: int
    replicas: tuple[int, ...] = ()


class _StreamMetadata:
    def put(self, out: bytearray, value: StreamMetadata) -> None:
        put_string(out, value.stream)
        U16.put(out, value.code)
        U16.put(out, value.leader)
        out += _I32.pack(len(value.replicas))
        for ref in value.replicas:
            U16.put(out, ref)

    def get(self, r: Reader) -> StreamMetadata:
        stream, code, leader = r.string(), r.u16(), r.u16()
        return StreamMetadata(stream, code, leader, tuple(r.u16() for _ in range(r.count(2))))


@dataclass(frozen=True, slots=True)
class PublishingError:
    publishing_id: int
    code: int


class _PublishingError:
    def put(self, out: bytearray, value: PublishingError) -> None:
        U64.put(out, value.publishing_id)
        U16.put(out, value.code)

    def get(self, r: Reader) -> PublishingError:
        return PublishingError(r.u64(), r.u16())


_BYTES_T: Final = _Bytes()
BOOL8: Final = _Bool8()
STR: Final = _Str()
BYTES: Final = _BYTES_T
OPT_BYTES: Final = _OptTrailingBytes()
STRS: Final = _List(STR, 2)
U64S: Final = _List(U64, 8, "Q")
MAP: Final = _Map()
OPT_MAP: Final = _OptMap()
INT_MAP: Final = _IntMap()
OFFSET_SPEC: Final = _OffsetSpec()
ANSWERED_OFFSET_SPEC: Final = _AnsweredOffsetSpec()
COMMAND_VERSIONS: Final = _List(_CommandVersion(), 6)
BROKERS: Final = _List(_Broker(), 8)
STREAM_METADATA: Final = _List(_StreamMetadata(), 10)
PUBLISHING_ERRORS: Final = _List(_PublishingError(), 10)
