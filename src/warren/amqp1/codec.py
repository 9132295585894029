"""Decoding the AMQP 1.0 type system (OASIS AMQP 1.0 part 1, 1.6 "Encodings"),
and the codec's API: decode, encode (encoding.py), DecodeError (formats.py).

Sans-IO and on the transfer hot path, so it is plain functions over a dispatch
table indexed by format code, with no classes to instantiate per value; mypyc
compiles it as it is. Decoding recurses, so it stops at MAX_DEPTH levels of
nesting (lists, maps, arrays, described values): compiled calls skip the
interpreter's recursion limit, and a peer must not be able to overflow the C
stack. Every malformed input is a DecodeError (nothing else escapes decode);
the connection closes with its ``condition``.

Described values whose descriptor was registered (performatives.py, the
message sections, ...) decode to their dataclasses through the builder given
to register_described; the descriptor may be the ulong code or the symbolic
name, both are legal on the wire. Unknown ones become types.Described.

An array decodes to types.Array with its element type's canonical code
(formats.py: uint 0x70 for uint0/smalluint/uint, string 0xa1 for
str8/str32, list 0xc0, ...), and encodes with the widest fixed-width code and
the narrowest variable-width code that fits, so arrays round-trip equal.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable
from typing import Any

from warren.amqp1.encoding import encode, encode_value, register_encoder
from warren.amqp1.formats import (
    ARRAY8,
    ARRAY32,
    BOOLEAN,
    BYTE,
    CANONICAL,
    CHAR,
    DECIMAL32,
    DECIMAL64,
    DECIMAL128,
    DESCRIBED,
    DOUBLE,
    F32,
    F64,
    FALSE,
    FLOAT,
    I8,
    I16,
    I32,
    I64,
    INT,
    LIST0,
    LIST8,
    LIST32,
    LONG,
    MAP8,
    MAP32,
    MAX_DEPTH,
    NULL,
    SHORT,
    SMALLINT,
    SMALLLONG,
    SMALLUINT,
    SMALLULONG,
    STR8,
    STR32,
    SYM8,
    SYM32,
    TIMESTAMP,
    TRUE,
    U8U8,
    U16,
    U32,
    U32U32,
    U64,
    UBYTE,
    UINT,
    UINT0,
    ULONG,
    ULONG0,
    USHORT,
    UUID,
    VBIN8,
    VBIN32,
    DecodeError,
)
from warren.amqp1.types import (
    Array,
    Byte,
    Char,
    Decimal32,
    Decimal64,
    Decimal128,
    Described,
    Float,
    Int,
    Short,
    Symbol,
    Timestamp,
    UByte,
    UInt,
    ULong,
    UShort,
)

__all__ = [
    "MAX_DEPTH",
    "DecodeError",
    "decode",
    "decode_value",
    "encode",
    "encode_value",
    "register_described",
    "register_encoder",
]

Buffer = bytes | bytearray | memoryview
#: A decoder reads the value after its constructor: (buf, pos, depth) -> (value, next pos).
Decoder = Callable[[Buffer, int, int], tuple[Any, int]]


def _take(buf: Buffer, pos: int, n: int) -> bytes:
    end = pos + n
    if end > len(buf):
        raise DecodeError("value runs past the end of the data")
    return bytes(buf[pos:end])


def _bad_code(buf: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    raise DecodeError(f"invalid format code 0x{buf[pos - 1]:02x}")


def _null(buf: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    return None, pos


def _true(buf: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    return True, pos


def _false(buf: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    return False, pos


def _boolean(buf: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    b = buf[pos]
    if b > 1:
        raise DecodeError(f"invalid boolean byte 0x{b:02x}")
    return b == 1, pos + 1


def _ubyte(buf: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    return UByte(buf[pos]), pos + 1


def _ushort(buf: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    return UShort(U16.unpack_from(buf, pos)[0]), pos + 2


def _uint(buf: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    return UInt(U32.unpack_from(buf, pos)[0]), pos + 4


def _smalluint(buf: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    return UInt(buf[pos]), pos + 1


def _uint0(buf: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    return UInt(0), pos


def _ulong(buf: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    return ULong(U64.unpack_from(buf, pos)[0]), pos + 8


def _smallulong(buf: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    return ULong(buf[pos]), pos + 1


def _ulong0(buf: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    return ULong(0), pos


def _byte(buf: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    return Byte(I8.unpack_from(buf, pos)[0]), pos + 1


def _short(buf: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    return Short(I16.unpack_from(buf, pos)[0]), pos + 2


def _int(buf: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    return Int(I32.unpack_from(buf, pos)[0]), pos + 4


def _smallint(buf: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    return Int(I8.unpack_from(buf, pos)[0]), pos + 1


def _long(buf: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    return I64.unpack_from(buf, pos)[0], pos + 8


def _smalllong(buf: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    return I8.unpack_from(buf, pos)[0], pos + 1


def _float(buf: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    return Float(F32.unpack_from(buf, pos)[0]), pos + 4


def _double(buf: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    return F64.unpack_from(buf, pos)[0], pos + 8


def _decimal32(buf: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    return Decimal32(_take(buf, pos, 4)), pos + 4


def _decimal64(buf: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    return Decimal64(_take(buf, pos, 8)), pos + 8


def _decimal128(buf: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    return Decimal128(_take(buf, pos, 16)), pos + 16


def _char(buf: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    code = U32.unpack_from(buf, pos)[0]
    if code > 0x10FFFF:
        raise DecodeError(f"char U+{code:X} is not a Unicode code point")
    return Char(chr(code)), pos + 4


def _timestamp(buf: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    return Timestamp(I64.unpack_from(buf, pos)[0]), pos + 8


def _uuid(buf: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    return uuid.UUID(bytes=_take(buf, pos, 16)), pos + 16


def _span8(buf: Buffer, pos: int) -> tuple[int, int]:
    start = pos + 1
    end = start + buf[pos]
    if end > len(buf):
        raise DecodeError("value runs past the end of the data")
    return start, end


def _span32(buf: Buffer, pos: int) -> tuple[int, int]:
    start = pos + 4
    end = start + U32.unpack_from(buf, pos)[0]
    if end > len(buf):
        raise DecodeError("value runs past the end of the data")
    return start, end


def _vbin8(buf: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    start, end = _span8(buf, pos)
    return bytes(buf[start:end]), end


def _vbin32(buf: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    start, end = _span32(buf, pos)
    return bytes(buf[start:end]), end


def _str8(buf: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    start, end = _span8(buf, pos)
    return str(buf[start:end], "utf-8"), end


def _str32(buf: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    start, end = _span32(buf, pos)
    return str(buf[start:end], "utf-8"), end


def _sym8(buf: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    start, end = _span8(buf, pos)
    return Symbol(str(buf[start:end], "ascii")), end


def _sym32(buf: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    start, end = _span32(buf, pos)
    return Symbol(str(buf[start:end], "ascii")), end


def _compound8(buf: Buffer, pos: int, slack: int = 0) -> tuple[int, int, int]:
    """(first item's position, end, count) of a list8/map8/array8 body. Each list
    or map item takes a byte at least; array elements may take none (uint0,
    null...), so arrays give ``slack``: their count is still bounded by the
    input's size, and so is the memory decoding them takes."""
    size, count = U8U8.unpack_from(buf, pos)
    end = pos + 1 + size
    if size < 1 or end > len(buf):
        raise DecodeError("compound size runs past the end of the data")
    if count > size - 1 + slack:
        raise DecodeError(f"count {count} cannot fit in {size - 1} bytes")
    return pos + 2, end, count


def _compound32(buf: Buffer, pos: int, slack: int = 0) -> tuple[int, int, int]:
    size, count = U32U32.unpack_from(buf, pos)
    end = pos + 4 + size
    if size < 4 or end > len(buf):
        raise DecodeError("compound size runs past the end of the data")
    if count > size - 4 + slack:
        raise DecodeError(f"count {count} cannot fit in {size - 4} bytes")
    return pos + 8, end, count


def _items(buf: Buffer, pos: int, end: int, count: int, depth: int) -> list[Any]:
    if depth >= MAX_DEPTH:
        raise DecodeError("nesting too deep")
    depth += 1
    items: list[Any] = []
    for _ in range(count):
        value, pos = _DECODERS[buf[pos]](buf, pos + 1, depth)
        items.append(value)
    if pos != end:
        raise DecodeError("compound items do not fill its size")
    return items


def _list0(buf: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    return [], pos


def _list8(buf: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    start, end, count = _compound8(buf, pos)
    return _items(buf, start, end, count, depth), end


def _list32(buf: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    start, end, count = _compound32(buf, pos)
    return _items(buf, start, end, count, depth), end


def _pairs(items: list[Any]) -> dict[Any, Any]:
    if len(items) & 1:
        raise DecodeError("map with an odd number of elements")
    return {items[i]: items[i + 1] for i in range(0, len(items), 2)}


def _map8(buf: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    start, end, count = _compound8(buf, pos)
    return _pairs(_items(buf, start, end, count, depth)), end


def _map32(buf: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    start, end, count = _compound32(buf, pos)
    return _pairs(_items(buf, start, end, count, depth)), end


def _array_items(buf: Buffer, pos: int, end: int, count: int, depth: int) -> tuple[Any, int]:
    if depth >= MAX_DEPTH:
        raise DecodeError("nesting too deep")
    depth += 1
    descriptor: Any = None
    described = buf[pos] == DESCRIBED
    if described:
        descriptor, pos = decode_value(buf, pos + 1, depth)
    code = buf[pos]
    if code == DESCRIBED:
        raise DecodeError("array element constructor is described twice")
    element = _DECODERS[code]
    if element is _bad_code:
        raise DecodeError(f"invalid array element code 0x{code:02x}")
    pos += 1
    items: list[Any] = []
    for _ in range(count):
        value, pos = element(buf, pos, depth)
        items.append(_describe(descriptor, value) if described else value)
    if pos != end:
        raise DecodeError("array elements do not fill its size")
    return Array(CANONICAL.get(code, code), tuple(items)), end


def _array8(buf: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    start, end, count = _compound8(buf, pos, 1)
    return _array_items(buf, start, end, count, depth)


def _array32(buf: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    start, end, count = _compound32(buf, pos, 4)
    return _array_items(buf, start, end, count, depth)


#: Builders of registered described types, by descriptor code, and codes by name.
_BUILDERS: dict[int, Callable[[Any], Any]] = {}
_CODES: dict[str, int] = {}


def register_described(code: int, name: str, build: Callable[[Any], Any]) -> None:
    """Decode values described by ``code`` (or ``name``) as ``build(value)``;
    build raises DecodeError for a value it cannot take."""
    _BUILDERS[code] = build
    _CODES[name] = code


def _describe(descriptor: Any, value: Any) -> Any:
    code: int | None = None
    if isinstance(descriptor, int) and not isinstance(descriptor, bool):
        code = descriptor
    elif isinstance(descriptor, str):
        code = _CODES.get(descriptor)
    if code is not None:
        build = _BUILDERS.get(code)
        if build is not None:
            return build(value)
    return Described(descriptor, value)


def _described(buf: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    if depth >= MAX_DEPTH:
        raise DecodeError("nesting too deep")
    descriptor, pos = _DECODERS[buf[pos]](buf, pos + 1, depth + 1)
    value, pos = _DECODERS[buf[pos]](buf, pos + 1, depth + 1)
    return _describe(descriptor, value), pos


_DECODERS: list[Decoder] = [_bad_code] * 256
for _code, _fn in (
    (NULL, _null),
    (TRUE, _true),
    (FALSE, _false),
    (BOOLEAN, _boolean),
    (UBYTE, _ubyte),
    (USHORT, _ushort),
    (UINT, _uint),
    (SMALLUINT, _smalluint),
    (UINT0, _uint0),
    (ULONG, _ulong),
    (SMALLULONG, _smallulong),
    (ULONG0, _ulong0),
    (BYTE, _byte),
    (SHORT, _short),
    (INT, _int),
    (SMALLINT, _smallint),
    (LONG, _long),
    (SMALLLONG, _smalllong),
    (FLOAT, _float),
    (DOUBLE, _double),
    (DECIMAL32, _decimal32),
    (DECIMAL64, _decimal64),
    (DECIMAL128, _decimal128),
    (CHAR, _char),
    (TIMESTAMP, _timestamp),
    (UUID, _uuid),
    (VBIN8, _vbin8),
    (VBIN32, _vbin32),
    (STR8, _str8),
    (STR32, _str32),
    (SYM8, _sym8),
    (SYM32, _sym32),
    (LIST0, _list0),
    (LIST8, _list8),
    (LIST32, _list32),
    (MAP8, _map8),
    (MAP32, _map32),
    (ARRAY8, _array8),
    (ARRAY32, _array32),
    (DESCRIBED, _described),
):
    _DECODERS[_code] = _fn


def decode_value(buf: Buffer, pos: int, depth: int) -> tuple[Any, int]:
    """One value at ``pos`` inside a structure ``depth`` levels deep (for the
    registered builders' modules); raises DecodeError or anything Python's
    byte access raises on a truncated buffer (decode turns those into DecodeError)."""
    return _DECODERS[buf[pos]](buf, pos + 1, depth)


def decode(buf: Buffer, pos: int = 0) -> tuple[Any, int]:
    """The value encoded at ``pos`` and the position after it."""
    try:
        return _DECODERS[buf[pos]](buf, pos + 1, 0)
    except DecodeError:
        raise
    except (IndexError, struct.error) as exc:
        raise DecodeError("truncated value") from exc
    except UnicodeDecodeError as exc:
        raise DecodeError(f"invalid text: {exc.reason}") from exc
    except (ValueError, TypeError, KeyError, OverflowError, RecursionError) as exc:
        raise DecodeError(f"malformed value: {exc}") from exc
