"""AMQP field tables and arrays, in the dialect RabbitMQ sends and accepts: reading them.

Decoding, and the validation every publish with headers runs; this module is
compiled with mypyc (setup.py). Encoding is in table_encode.py; walking and
editing a table's top level without decoding it, in table_edit.py.

Type tags follow RabbitMQ's errata rather than the original 0-9-1 grammar
(e.g. 's' is a signed 16-bit int, not a short string; 'x' is a byte array;
'L' is signed, like 'l'). Decoding only ever raises DecodeError so hostile
input cannot escape the connection's error handling.

Nothing here recurses on the peer's nesting depth: decoding and validation
keep an explicit stack, and refuse tables and arrays nested deeper than
MAX_DEPTH levels.
"""

from __future__ import annotations

import datetime
import decimal
import math
import struct
from collections.abc import Callable
from typing import Any

from warren.core.codec_errors import DecodeError, UnsafeValue

__all__ = [
    "FIXED_SIZES",
    "MAX_DEPTH",
    "MAX_TIMESTAMP",
    "check_table",
    "decode_field_array",
    "decode_field_value",
    "decode_table",
    "validate_table",
]

#: How deeply tables and arrays may nest, counting the outermost as level 1.
#: RabbitMQ has no limit; the Python clients (pika, pamqp under aio-pika,
#: py-amqp) decode recursively and fail at about 490 levels even from an empty
#: stack, so 128 keeps every message Warren accepts readable by them from a
#: consumer callback however deep its own stack is. x-death uses 4 levels.
MAX_DEPTH = 128

#: The last second of the year 9999: the largest timestamp Python's datetime,
#: and so pika and py-amqp, can represent.
MAX_TIMESTAMP = 253_402_300_799

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_Decimal = decimal.Decimal

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_U16 = struct.Struct(">H")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_U64 = struct.Struct(">Q")
_F32 = struct.Struct(">f")
_F64 = struct.Struct(">d")
_DEC = struct.Struct(">Bi")

_Buffer = bytes | bytearray | memoryview
_Decoder = Callable[[Any, int], tuple[Any, int]]


# --------------------------------------------------------------------------
# Decoding.  Every decoder takes (data, offset) and returns (value, offset).
# Slicing past the end does not raise, so each container re-checks that it
# consumed exactly its declared length.
# --------------------------------------------------------------------------


def _dec_bool(data: _Buffer, offset: int) -> tuple[bool, int]:
    return data[offset] != 0, offset + 1


def _dec_i8(data: _Buffer, offset: int) -> tuple[int, int]:
    return _I8.unpack_from(data, offset)[0], offset + 1


def _dec_u8(data: _Buffer, offset: int) -> tuple[int, int]:
    return data[offset], offset + 1


def _dec_i16(data: _Buffer, offset: int) -> tuple[int, int]:
    return _I16.unpack_from(data, offset)[0], offset + 2


def _dec_u16(data: _Buffer, offset: int) -> tuple[int, int]:
    return _U16.unpack_from(data, offset)[0], offset + 2


def _dec_i32(data: _Buffer, offset: int) -> tuple[int, int]:
    return _I32.unpack_from(data, offset)[0], offset + 4


def _dec_u32(data: _Buffer, offset: int) -> tuple[int, int]:
    return _U32.unpack_from(data, offset)[0], offset + 4


def _dec_i64(data: _Buffer, offset: int) -> tuple[int, int]:
    return _I64.unpack_from(data, offset)[0], offset + 8


def _dec_u64(data: _Buffer, offset: int) -> tuple[int, int]:
    return _U64.unpack_from(data, offset)[0], offset + 8


def _dec_f32(data: _Buffer, offset: int) -> tuple[float, int]:
    return _F32.unpack_from(data, offset)[0], offset + 4


def _dec_f64(data: _Buffer, offset: int) -> tuple[float, int]:
    return _F64.unpack_from(data, offset)[0], offset + 8


def _dec_decimal(data: _Buffer, offset: int) -> tuple[decimal.Decimal, int]:
    scale, unscaled = _DEC.unpack_from(data, offset)
    return _Decimal(unscaled).scaleb(-scale), offset + 5


def _dec_longstr(data: _Buffer, offset: int) -> tuple[str | bytes, int]:
    (length,) = _U32.unpack_from(data, offset)
    start = offset + 4
    end = start + length
    if end > len(data):
        raise DecodeError("long string runs past end of data")
    raw = data[start:end]
    try:
        return str(raw, "utf-8"), end
    except UnicodeDecodeError:
        return bytes(raw), end


def _dec_bytes(data: _Buffer, offset: int) -> tuple[bytes, int]:
    (length,) = _U32.unpack_from(data, offset)
    start = offset + 4
    end = start + length
    if end > len(data):
        raise DecodeError("byte array runs past end of data")
    return bytes(data[start:end]), end


def _dec_timestamp(data: _Buffer, offset: int) -> tuple[datetime.datetime, int]:
    (seconds,) = _U64.unpack_from(data, offset)
    if seconds > MAX_TIMESTAMP:
        # datetime stops at year 9999, and so do pika's and py-amqp's decoders.
        raise DecodeError(f"timestamp {seconds} is after the year 9999")
    return _EPOCH + datetime.timedelta(seconds=seconds), offset + 8


def _dec_void(data: _Buffer, offset: int) -> tuple[None, int]:
    return None, offset


_SCALAR_DECODERS: dict[int, _Decoder] = {
    ord("t"): _dec_bool,
    ord("b"): _dec_i8,
    ord("B"): _dec_u8,
    ord("s"): _dec_i16,
    ord("u"): _dec_u16,
    ord("I"): _dec_i32,
    ord("i"): _dec_u32,
    ord("l"): _dec_i64,
    # 'L' is signed too: RabbitMQ (AMQP errata), pika, pamqp and py-amqp all read it so.
    ord("L"): _dec_i64,
    ord("f"): _dec_f32,
    ord("d"): _dec_f64,
    ord("D"): _dec_decimal,
    ord("S"): _dec_longstr,
    ord("x"): _dec_bytes,
    ord("T"): _dec_timestamp,
    ord("V"): _dec_void,
}

_TABLE = ord("F")
_ARRAY = ord("A")


def _dec_nested(data: _Buffer, offset: int, is_table: bool) -> tuple[Any, int]:
    """Decode a table or array, however deep, with an explicit stack.

    Recursing per level would let a peer choose Python's stack depth; instead
    each open container is pushed with its end offset, and nesting beyond
    MAX_DEPTH is refused.
    """
    (length,) = _U32.unpack_from(data, offset)
    offset += 4
    end = offset + length
    if end > len(data):
        raise DecodeError(f"field {'table' if is_table else 'array'} runs past end of data")
    scalars = _SCALAR_DECODERS
    root: Any = {} if is_table else []
    container = root
    stack: list[tuple[Any, int, bool]] = []
    key = ""
    while True:
        if offset >= end:
            if offset != end:
                kind = "table" if is_table else "array"
                raise DecodeError(f"field {kind} contents overrun its declared length")
            if not stack:
                return root, end
            container, end, is_table = stack.pop()
            continue
        if is_table:
            key_end = offset + 1 + data[offset]
            if key_end >= end:
                raise DecodeError("field table entry truncated")
            key = str(data[offset + 1 : key_end], "utf-8", "surrogateescape")
            offset = key_end
        tag = data[offset]
        decoder = scalars.get(tag)
        if decoder is not None:
            value, offset = decoder(data, offset + 1)
        elif tag in (_TABLE, _ARRAY):
            if len(stack) + 1 >= MAX_DEPTH:
                raise DecodeError(f"field tables and arrays nested deeper than {MAX_DEPTH} levels")
            (length,) = _U32.unpack_from(data, offset + 1)
            child_start = offset + 5
            child_end = child_start + length
            if child_end > end:
                raise DecodeError("nested field table or array runs past its container")
            value = {} if tag == _TABLE else []
            if is_table:
                container[key] = value
            else:
                container.append(value)
            stack.append((container, end, is_table))
            container, end, is_table, offset = value, child_end, tag == _TABLE, child_start
            continue
        else:
            raise DecodeError(f"unknown field type tag {tag:#04x}")
        if is_table:
            container[key] = value
        else:
            container.append(value)


def _dec_array(data: _Buffer, offset: int) -> tuple[list[Any], int]:
    return _dec_nested(data, offset, False)


def _dec_table(data: _Buffer, offset: int) -> tuple[dict[str, Any], int]:
    return _dec_nested(data, offset, True)


_DECODERS: dict[int, _Decoder] = {
    **_SCALAR_DECODERS,
    _ARRAY: _dec_array,
    _TABLE: _dec_table,
}

# Errors a decoder may hit on malformed input; all become DecodeError.
_DECODE_FAILURES = (struct.error, IndexError, OverflowError)


def decode_table(data: _Buffer, offset: int = 0) -> tuple[dict[str, Any], int]:
    """Decode a length-prefixed field table at ``offset``; return it and the offset after it."""
    try:
        return _dec_table(data, offset)
    except DecodeError:
        raise
    except _DECODE_FAILURES as exc:
        raise DecodeError(f"malformed field table: {exc!r}") from exc


def decode_field_array(data: _Buffer, offset: int = 0) -> tuple[list[Any], int]:
    """Decode a length-prefixed field array at ``offset``; return it and the offset after it."""
    try:
        return _dec_array(data, offset)
    except DecodeError:
        raise
    except _DECODE_FAILURES as exc:
        raise DecodeError(f"malformed field array: {exc!r}") from exc


def decode_field_value(data: _Buffer, offset: int = 0) -> tuple[Any, int]:
    """Decode one tagged field value at ``offset``; return it and the offset after it."""
    try:
        decoder = _DECODERS.get(data[offset])
        if decoder is None:
            raise DecodeError(f"unknown field type tag {data[offset]:#04x}")
        value, end = decoder(data, offset + 1)
    except DecodeError:
        raise
    except _DECODE_FAILURES as exc:
        raise DecodeError(f"malformed field value: {exc!r}") from exc
    if end > len(data):
        raise DecodeError("field value runs past end of data")
    return value, end


# --------------------------------------------------------------------------
# Validation of a table a client sent for others to read (message headers).
# --------------------------------------------------------------------------

#: The size of each fixed-size value after its type tag (floats and timestamps,
#: which validation reads, are not among them).
FIXED_SIZES: dict[int, int] = {
    ord("t"): 1,
    ord("b"): 1,
    ord("B"): 1,
    ord("s"): 2,
    ord("u"): 2,
    ord("I"): 4,
    ord("i"): 4,
    ord("l"): 8,
    ord("L"): 8,
    ord("D"): 5,
    ord("V"): 0,
}
# What validation does per type tag: skip a fixed size (>= 0), or one of these.
_SIZED, _NESTED, _FLOAT32, _FLOAT64, _TIME, _UNKNOWN = -1, -2, -3, -4, -5, -6
_ACTIONS: list[int] = [_UNKNOWN] * 256
for _tag, _size in FIXED_SIZES.items():
    _ACTIONS[_tag] = _size
for _letter, _action in (
    ("S", _SIZED),
    ("x", _SIZED),
    ("F", _NESTED),
    ("A", _NESTED),
    ("f", _FLOAT32),
    ("d", _FLOAT64),
    ("T", _TIME),
):
    _ACTIONS[ord(_letter)] = _action
_isfinite = math.isfinite


def validate_table(data: bytes, offset: int, end: int) -> int:
    """Check the field table at ``offset`` (which must end by ``end``); return its end.

    Raises DecodeError for bytes that are not a field table as RabbitMQ parses
    them (unknown type tag, lengths that overrun), and UnsafeValue for a table
    that is well formed but that Warren refuses to pass on, because the client
    libraries its consumers use could not decode it: nesting deeper than
    MAX_DEPTH, a timestamp after the year 9999, a NaN or infinite float, a key
    that is not UTF-8. Walks the bytes with an explicit stack and builds no
    values, so it is cheap enough to run on every publish. A table that is both
    is malformed: the whole table is read before an unsafe value is reported.
    """
    end, unsafe = check_table(data, offset, end)
    if unsafe is not None:
        raise UnsafeValue(unsafe)
    return end


def check_table(data: bytes, offset: int, end: int) -> tuple[int, str | None]:
    """validate_table's walk: the table's end and the first reason it is unsafe
    (None when it is not); raises DecodeError only."""
    try:
        return _validate(data, offset, end)
    except (struct.error, IndexError):
        raise DecodeError("truncated field table") from None


def _validate(data: bytes, offset: int, limit: int) -> tuple[int, str | None]:
    (length,) = _U32.unpack_from(data, offset)
    offset += 4
    end = offset + length
    if end > limit:
        raise DecodeError("the headers table runs past the end of the properties")
    table_end = end
    actions = _ACTIONS
    is_table = True
    top_key = 0  # offset of the current top-level key, for error messages
    unsafe: str | None = None  # the first reason to refuse, once the table is read
    stack: list[tuple[int, bool]] = []
    while True:
        if offset >= end:
            if offset != end:
                raise DecodeError(
                    f"{_where(data, top_key)}a table or array overruns its declared length"
                )
            if not stack:
                return table_end, unsafe
            end, is_table = stack.pop()
            continue
        if is_table:
            if not stack:
                top_key = offset
            key_start = offset + 1
            offset = key_start + data[offset]
            if offset >= end:
                raise DecodeError(f"{_where(data, top_key)}a truncated table entry")
            key = data[key_start:offset]
            if not key.isascii() and unsafe is None:
                try:
                    key.decode()
                except UnicodeDecodeError:
                    where = _where(data, top_key) if stack else "in the headers: "
                    unsafe = f"{where}a key that is not UTF-8 (bytes {key.hex(' ')})"
        tag = data[offset]
        offset += 1
        action = actions[tag]
        if action >= 0:
            offset += action
        elif action == _SIZED:
            offset += 4 + _U32.unpack_from(data, offset)[0]
        elif action == _NESTED:
            if len(stack) + 1 >= MAX_DEPTH and unsafe is None:
                unsafe = f"headers nested deeper than {MAX_DEPTH} levels"
            child_end = offset + 4 + _U32.unpack_from(data, offset)[0]
            if child_end > end:
                raise DecodeError(
                    f"{_where(data, top_key)}a table or array runs past its container"
                )
            stack.append((end, is_table))
            end, is_table, offset = child_end, tag == _TABLE, offset + 4
        elif action in (_FLOAT32, _FLOAT64):
            fmt = _F32 if action == _FLOAT32 else _F64
            if not _isfinite(fmt.unpack_from(data, offset)[0]) and unsafe is None:
                unsafe = f"{_where(data, top_key)}a NaN or infinite float"
            offset += fmt.size
        elif action == _TIME:
            if _U64.unpack_from(data, offset)[0] > MAX_TIMESTAMP and unsafe is None:
                unsafe = f"{_where(data, top_key)}a timestamp after the year 9999"
            offset += 8
        else:
            raise DecodeError(f"{_where(data, top_key)}unknown field type {_tag_name(tag)}")


def _where(data: bytes, key_at: int) -> str:
    """Which top-level header an error is in, from the offset of its key."""
    key = data[key_at + 1 : key_at + 1 + data[key_at]].decode("utf-8", "replace")
    return f"in header '{key}': "


def _tag_name(tag: int) -> str:
    return f"'{chr(tag)}'" if 0x21 <= tag < 0x7F else f"{tag:#04x}"
