"""AMQP 1.0 encoding (part 1, 1.6): each value in its smallest encoding.

A dispatch table by the value's exact type (types.py's subclasses pick the
AMQP type; a plain int is a long, a plain float a double, a str a string,
bytes binary, a list or tuple a list, a dict a map); a subclass of a table
entry takes its first base's encoder. The encoders of each type are public so
that performatives.py and the message sections can write a field as its
declared AMQP type (a handle is a uint whatever Python int it holds).
Nesting is limited to MAX_DEPTH levels, like decoding (mypyc-compiled
recursion skips Python's recursion limit).
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable
from typing import Any

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
    U8,
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
    Long,
    Short,
    Symbol,
    Timestamp,
    UByte,
    UInt,
    ULong,
    UShort,
)

#: An encoder writes the value with its constructor: (value, out, depth).
Encoder = Callable[[Any, bytearray, int], None]


def encode_null(value: Any, out: bytearray, depth: int = 0) -> None:
    out.append(NULL)


def encode_bool(value: Any, out: bytearray, depth: int = 0) -> None:
    out.append(TRUE if value else FALSE)


def encode_ubyte(value: int, out: bytearray, depth: int = 0) -> None:
    out.append(UBYTE)
    out += U8.pack(value)


def encode_ushort(value: int, out: bytearray, depth: int = 0) -> None:
    out.append(USHORT)
    out += U16.pack(value)


def encode_uint(value: int, out: bytearray, depth: int = 0) -> None:
    if value == 0:
        out.append(UINT0)
    elif 0 < value < 256:
        out.append(SMALLUINT)
        out.append(value)
    else:
        out.append(UINT)
        out += U32.pack(value)


def encode_ulong(value: int, out: bytearray, depth: int = 0) -> None:
    if value == 0:
        out.append(ULONG0)
    elif 0 < value < 256:
        out.append(SMALLULONG)
        out.append(value)
    else:
        out.append(ULONG)
        out += U64.pack(value)


def encode_byte(value: int, out: bytearray, depth: int = 0) -> None:
    out.append(BYTE)
    out += I8.pack(value)


def encode_short(value: int, out: bytearray, depth: int = 0) -> None:
    out.append(SHORT)
    out += I16.pack(value)


def encode_int(value: int, out: bytearray, depth: int = 0) -> None:
    if -128 <= value < 128:
        out.append(SMALLINT)
        out += I8.pack(value)
    else:
        out.append(INT)
        out += I32.pack(value)


def encode_long(value: int, out: bytearray, depth: int = 0) -> None:
    if -128 <= value < 128:
        out.append(SMALLLONG)
        out += I8.pack(value)
    else:
        out.append(LONG)
        out += I64.pack(value)


def encode_float(value: float, out: bytearray, depth: int = 0) -> None:
    out.append(FLOAT)
    out += F32.pack(value)


def encode_double(value: float, out: bytearray, depth: int = 0) -> None:
    out.append(DOUBLE)
    out += F64.pack(value)


def _fixed_bytes(code: int, size: int) -> Encoder:
    def encode_fixed(value: Any, out: bytearray, depth: int = 0) -> None:
        if len(value) != size:
            raise ValueError(f"format 0x{code:02x} takes {size} bytes, not {len(value)}")
        out.append(code)
        out += value

    return encode_fixed


def encode_char(value: str, out: bytearray, depth: int = 0) -> None:
    out.append(CHAR)
    out += U32.pack(ord(value))


def encode_timestamp(value: int, out: bytearray, depth: int = 0) -> None:
    out.append(TIMESTAMP)
    out += I64.pack(value)


def encode_uuid(value: uuid.UUID, out: bytearray, depth: int = 0) -> None:
    out.append(UUID)
    out += value.bytes


def _variable(
    code8: int, code32: int, data: bytes | bytearray | memoryview, out: bytearray
) -> None:
    n = len(data)
    if n < 256:
        out.append(code8)
        out.append(n)
    else:
        out.append(code32)
        out += U32.pack(n)
    out += data


def encode_binary(value: bytes | bytearray | memoryview, out: bytearray, depth: int = 0) -> None:
    _variable(VBIN8, VBIN32, value, out)


def encode_string(value: str, out: bytearray, depth: int = 0) -> None:
    _variable(STR8, STR32, value.encode("utf-8"), out)


def encode_symbol(value: str, out: bytearray, depth: int = 0) -> None:
    _variable(SYM8, SYM32, value.encode("ascii"), out)


def write_compound(
    code8: int, code32: int, body: bytes | bytearray, count: int, out: bytearray
) -> None:
    """A list, map or array header around its already-encoded ``body``."""
    size = len(body) + 1
    if size < 256 and count < 256:
        out.append(code8)
        out.append(size)
        out.append(count)
    else:
        out.append(code32)
        out += U32U32.pack(size + 3, count)
    out += body


def encode_list(value: list[Any] | tuple[Any, ...], out: bytearray, depth: int = 0) -> None:
    if not value:
        out.append(LIST0)
        return
    if depth >= MAX_DEPTH:
        raise ValueError("nesting too deep to encode")
    body = bytearray()
    for item in value:
        encode_value(item, body, depth + 1)
    write_compound(LIST8, LIST32, body, len(value), out)


def encode_map(value: dict[Any, Any], out: bytearray, depth: int = 0) -> None:
    if depth >= MAX_DEPTH:
        raise ValueError("nesting too deep to encode")
    body = bytearray()
    for key, item in value.items():
        encode_value(key, body, depth + 1)
        encode_value(item, body, depth + 1)
    write_compound(MAP8, MAP32, body, 2 * len(value), out)


def encode_described(value: Described, out: bytearray, depth: int = 0) -> None:
    if depth >= MAX_DEPTH:
        raise ValueError("nesting too deep to encode")
    out.append(DESCRIBED)
    encode_value(value.descriptor, out, depth + 1)
    encode_value(value.value, out, depth + 1)


def write_descriptor(code: int, out: bytearray) -> None:
    """The described-type constructor with a ulong descriptor code."""
    out.append(DESCRIBED)
    encode_ulong(code, out)


#: Fixed-width array elements by canonical code.
_ELEMENT_STRUCTS: dict[int, struct.Struct] = {
    UBYTE: U8,
    USHORT: U16,
    UINT: U32,
    ULONG: U64,
    BYTE: I8,
    SHORT: I16,
    INT: I32,
    LONG: I64,
    FLOAT: F32,
    DOUBLE: F64,
    TIMESTAMP: I64,
}
_DECIMAL_SIZES: dict[int, int] = {DECIMAL32: 4, DECIMAL64: 8, DECIMAL128: 16}


def _element_header(wide: bool, body: bytes | bytearray, count: int, out: bytearray) -> None:
    if wide:
        out += U32U32.pack(len(body) + 4, count)
    else:
        out.append(len(body) + 1)
        out.append(count)
    out += body


def _array_parts(value: Array, depth: int) -> tuple[bytearray, int]:
    """An array's element constructor and elements, and its count."""
    if depth >= MAX_DEPTH:
        raise ValueError("nesting too deep to encode")
    code = CANONICAL.get(value.code, value.code)
    items = value.items
    body = bytearray()
    st = _ELEMENT_STRUCTS.get(code)
    if st is not None:
        body.append(code)
        for item in items:
            body += st.pack(item)
    elif code == BOOLEAN:
        body.append(BOOLEAN)
        body += bytes(1 if item else 0 for item in items)
    elif code == NULL:
        if any(item is not None for item in items):
            raise ValueError("an array of nulls holds only None")
        body.append(NULL)
    elif code == CHAR:
        body.append(CHAR)
        for item in items:
            body += U32.pack(ord(item))
    elif code == UUID:
        body.append(UUID)
        for item in items:
            body += item.bytes
    elif code in _DECIMAL_SIZES:
        body.append(code)
        for item in items:
            if len(item) != _DECIMAL_SIZES[code]:
                raise ValueError(f"format 0x{code:02x} takes {_DECIMAL_SIZES[code]} bytes")
            body += item
    elif code in (VBIN8, STR8, SYM8):
        if code == STR8:
            datas = [item.encode("utf-8") for item in items]
        elif code == SYM8:
            datas = [item.encode("ascii") for item in items]
        else:
            datas = [bytes(item) for item in items]
        wide = any(len(data) > 255 for data in datas)
        body.append(code + 0x10 if wide else code)
        for data in datas:
            if wide:
                body += U32.pack(len(data))
            else:
                body.append(len(data))
            body += data
    elif code in (LIST8, MAP8, ARRAY8):
        parts: list[tuple[bytearray, int]] = []
        for item in items:
            if code == ARRAY8:
                parts.append(_array_parts(item, depth + 1))
                continue
            inner = bytearray()
            if code == LIST8:
                for x in item:
                    encode_value(x, inner, depth + 1)
                parts.append((inner, len(item)))
            else:
                for k, v in item.items():
                    encode_value(k, inner, depth + 1)
                    encode_value(v, inner, depth + 1)
                parts.append((inner, 2 * len(item)))
        wide = any(len(part) > 254 or count > 255 for part, count in parts)
        body.append(code + 0x10 if wide else code)
        for part, count in parts:
            _element_header(wide, part, count, body)
    else:
        raise ValueError(f"no array of format code 0x{value.code:02x}")
    return body, len(items)


def encode_array(value: Array, out: bytearray, depth: int = 0) -> None:
    body, count = _array_parts(value, depth)
    write_compound(ARRAY8, ARRAY32, body, count, out)


_ENCODERS: dict[type, Encoder] = {
    type(None): encode_null,
    bool: encode_bool,
    int: encode_long,
    Long: encode_long,
    UByte: encode_ubyte,
    UShort: encode_ushort,
    UInt: encode_uint,
    ULong: encode_ulong,
    Byte: encode_byte,
    Short: encode_short,
    Int: encode_int,
    Timestamp: encode_timestamp,
    float: encode_double,
    Float: encode_float,
    Decimal32: _fixed_bytes(DECIMAL32, 4),
    Decimal64: _fixed_bytes(DECIMAL64, 8),
    Decimal128: _fixed_bytes(DECIMAL128, 16),
    Char: encode_char,
    str: encode_string,
    Symbol: encode_symbol,
    bytes: encode_binary,
    bytearray: encode_binary,
    memoryview: encode_binary,
    uuid.UUID: encode_uuid,
    list: encode_list,
    tuple: encode_list,
    dict: encode_map,
    Array: encode_array,
    Described: encode_described,
}


def register_encoder(cls: type, encoder: Encoder) -> None:
    """Encode instances of ``cls`` (a registered described type's dataclass) with ``encoder``."""
    _ENCODERS[cls] = encoder


def _encoder_for(cls: type) -> Encoder:
    for base in cls.__mro__[1:]:
        found = _ENCODERS.get(base)
        if found is not None:
            _ENCODERS[cls] = found
            return found
    raise TypeError(f"no AMQP 1.0 encoding for {cls.__name__}")


def encode_value(value: Any, out: bytearray, depth: int = 0) -> None:
    """encode() for the encoders of nested values: errors are the encoders' own."""
    fn = _ENCODERS.get(type(value))
    if fn is None:
        fn = _encoder_for(type(value))
    fn(value, out, depth)


def encode(value: Any, out: bytearray) -> None:
    """Append ``value``'s smallest encoding to ``out``: ValueError for a value out
    of its type's range, TypeError for a Python type AMQP 1.0 has no encoding for."""
    try:
        encode_value(value, out, 0)
    except struct.error as exc:
        raise ValueError(f"value out of range: {exc}") from exc
