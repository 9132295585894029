"""AMQP field tables and arrays, in the dialect RabbitMQ sends and accepts.

Type tags follow RabbitMQ's errata rather than the original 0-9-1 grammar
(e.g. 's' is a signed 16-bit int, not a short string; 'x' is a byte array;
'L' is signed, like 'l'). Decoding only ever raises DecodeError so hostile
input cannot escape the connection's error handling; encoding raises
ValueError/TypeError because those are programming errors on our side.

Nothing here recurses on the peer's nesting depth: decoding and validation
keep an explicit stack, and refuse tables and arrays nested deeper than
MAX_DEPTH levels.
"""

from __future__ import annotations

import datetime
import decimal
import math
import struct
from collections.abc import Callable, Collection, Mapping
from typing import Any

from warren.core.codec_errors import DecodeError, UnsafeValue

__all__ = [
    "MAX_DEPTH",
    "MAX_TIMESTAMP",
    "array_items",
    "check_table",
    "decode_field_array",
    "decode_field_value",
    "decode_table",
    "edit_table",
    "encode_field_array",
    "encode_field_value",
    "encode_table",
    "skip_field_value",
    "table_entries",
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

_UTC = datetime.UTC
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=_UTC)
_ONE_SECOND = datetime.timedelta(seconds=1)
_Decimal = decimal.Decimal

_U8 = struct.Struct(">B")
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

_EMPTY_TABLE = b"\x00\x00\x00\x00"

_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_UINT64_MAX = (1 << 64) - 1

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

_FIXED_SIZES: dict[int, int] = {
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
for _tag, _size in _FIXED_SIZES.items():
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


# --------------------------------------------------------------------------
# Walking a table's top level without decoding its values: for editing a
# few headers while every other byte stays as the publisher sent it.
# --------------------------------------------------------------------------

_PREFIXED = (ord("S"), ord("x"), _TABLE, _ARRAY)
_SKIP_SIZES: dict[int, int] = {**_FIXED_SIZES, ord("f"): 4, ord("d"): 8, ord("T"): 8}


def skip_field_value(data: _Buffer, offset: int) -> int:
    """The offset after the tagged value at ``offset``; nested containers are
    skipped by their length prefix, never entered."""
    tag = data[offset]
    size = _SKIP_SIZES.get(tag)
    if size is not None:
        return offset + 1 + size
    if tag in _PREFIXED:
        return offset + 5 + _U32.unpack_from(data, offset + 1)[0]
    raise DecodeError(f"unknown field type tag {tag:#04x}")


def table_entries(data: _Buffer, offset: int) -> tuple[list[tuple[str, int, int]], int]:
    """The top-level entries of the table at ``offset`` as (key, start, end) byte
    ranges (each an encoded key and tagged value), and the table's end."""
    try:
        (length,) = _U32.unpack_from(data, offset)
        offset += 4
        end = offset + length
        entries: list[tuple[str, int, int]] = []
        while offset < end:
            start = offset
            key_end = offset + 1 + data[offset]
            key = str(data[offset + 1 : key_end], "utf-8", "surrogateescape")
            offset = skip_field_value(data, key_end)
            entries.append((key, start, offset))
    except (struct.error, IndexError):
        raise DecodeError("truncated field table") from None
    if offset != end or end > len(data):
        raise DecodeError("field table contents overrun its declared length")
    return entries, end


def edit_table(
    data: _Buffer,
    offset: int | None,
    set_entries: Mapping[str, bytes],
    remove: Collection[str] = (),
) -> bytes:
    """The table at ``offset`` (None: an empty one) with entries set and removed,
    length-prefixed; every other entry is copied as bytes. ``set_entries`` maps
    keys to tagged, encoded values: replaced where the key is (its first
    occurrence; later duplicates go), else appended in order."""
    entries = table_entries(data, offset)[0] if offset is not None else []
    parts: list[bytes] = []
    done: set[str] = set()
    for key, start, end in entries:
        if key in remove or key in done:
            continue
        encoded = set_entries.get(key)
        if encoded is None:
            parts.append(bytes(data[start:end]))
        else:
            parts.append(_entry_key(key) + encoded)
            done.add(key)
    for key, encoded in set_entries.items():
        if key not in done:
            parts.append(_entry_key(key) + encoded)
    body = b"".join(parts)
    return _U32.pack(len(body)) + body


def _entry_key(key: str) -> bytes:
    raw = key.encode("utf-8", "surrogateescape")
    return _U8.pack(len(raw)) + raw


def array_items(data: _Buffer, offset: int) -> list[tuple[int, int]]:
    """The (start, end) byte ranges of the tagged values of the array at ``offset``."""
    try:
        (length,) = _U32.unpack_from(data, offset)
        offset += 4
        end = offset + length
        items: list[tuple[int, int]] = []
        while offset < end:
            start = offset
            offset = skip_field_value(data, offset)
            items.append((start, offset))
    except (struct.error, IndexError):
        raise DecodeError("truncated field array") from None
    if offset != end or end > len(data):
        raise DecodeError("field array contents overrun its declared length")
    return items


# --------------------------------------------------------------------------
# Encoding.  Encoders append to a list of parts; the caller joins once.
# --------------------------------------------------------------------------


def _enc_int(value: int, out: list[bytes], depth: int) -> None:
    if _INT32_MIN <= value <= _INT32_MAX:
        out.append(b"I" + _I32.pack(value))
    elif _INT64_MIN <= value <= _INT64_MAX:
        out.append(b"l" + _I64.pack(value))
    else:
        raise ValueError(f"integer {value} does not fit any AMQP field type")


def _enc_bool(value: bool, out: list[bytes], depth: int) -> None:
    out.append(b"t\x01" if value else b"t\x00")


def _enc_float(value: float, out: list[bytes], depth: int) -> None:
    out.append(b"d" + _F64.pack(value))


def _enc_decimal(value: decimal.Decimal, out: list[bytes], depth: int) -> None:
    sign, digits, exponent = value.as_tuple()
    if not isinstance(exponent, int):
        raise ValueError(f"cannot encode non-finite decimal {value}")
    unscaled = 0
    for digit in digits:
        unscaled = unscaled * 10 + digit
    if exponent > 0:
        unscaled *= 10**exponent
        scale = 0
    else:
        scale = -exponent
    if sign:
        unscaled = -unscaled
    if scale > 255 or not _INT32_MIN <= unscaled <= _INT32_MAX:
        raise ValueError(f"decimal {value} does not fit AMQP decimal (scale octet, int32)")
    out.append(b"D" + _DEC.pack(scale, unscaled))


def _enc_str(value: str, out: list[bytes], depth: int) -> None:
    raw = value.encode("utf-8", "surrogateescape")
    out.append(b"S" + _U32.pack(len(raw)))
    out.append(raw)


def _enc_bytes(value: bytes | bytearray | memoryview, out: list[bytes], depth: int) -> None:
    raw = bytes(value)
    out.append(b"x" + _U32.pack(len(raw)))
    out.append(raw)


def _enc_list(value: list[Any] | tuple[Any, ...], out: list[bytes], depth: int) -> None:
    out.append(b"A")
    out.append(_encode_array(value, depth + 1))


def _enc_dict(value: Mapping[str, Any], out: list[bytes], depth: int) -> None:
    out.append(b"F")
    out.append(_encode_table(value, depth + 1))


def _enc_datetime(value: datetime.datetime, out: list[bytes], depth: int) -> None:
    if value.tzinfo is None:
        value = value.replace(tzinfo=_UTC)  # naive datetimes are taken as UTC
    seconds = (value - _EPOCH) // _ONE_SECOND
    if not 0 <= seconds <= _UINT64_MAX:
        raise ValueError(f"timestamp {value} is before the Unix epoch")
    out.append(b"T" + _U64.pack(seconds))


def _enc_none(value: None, out: list[bytes], depth: int) -> None:
    out.append(b"V")


_ENCODERS: dict[type, Callable[[Any, list[bytes], int], None]] = {
    bool: _enc_bool,
    int: _enc_int,
    float: _enc_float,
    decimal.Decimal: _enc_decimal,
    str: _enc_str,
    bytes: _enc_bytes,
    bytearray: _enc_bytes,
    memoryview: _enc_bytes,
    list: _enc_list,
    tuple: _enc_list,
    dict: _enc_dict,
    datetime.datetime: _enc_datetime,
    type(None): _enc_none,
}

# Order matters: bool before int (bool is an int subclass).
_ENCODERS_BY_BASE: tuple[
    tuple[type | tuple[type, ...], Callable[[Any, list[bytes], int], None]], ...
] = (
    (bool, _enc_bool),
    (int, _enc_int),
    (float, _enc_float),
    (decimal.Decimal, _enc_decimal),
    (str, _enc_str),
    ((bytes, bytearray, memoryview), _enc_bytes),
    ((list, tuple), _enc_list),
    (Mapping, _enc_dict),
    (datetime.datetime, _enc_datetime),
)


def _enc_value(value: Any, out: list[bytes], depth: int) -> None:
    encoder = _ENCODERS.get(type(value))
    if encoder is None:
        for base, candidate in _ENCODERS_BY_BASE:
            if isinstance(value, base):
                encoder = candidate
                break
        else:
            raise TypeError(f"cannot encode {type(value).__name__} in an AMQP field table")
    encoder(value, out, depth)


def encode_field_value(value: Any) -> bytes:
    """Encode one value with its type tag."""
    out: list[bytes] = []
    _enc_value(value, out, 0)
    return b"".join(out)


def encode_field_array(values: list[Any] | tuple[Any, ...]) -> bytes:
    """Encode a field array with its 4-byte length prefix."""
    return _encode_array(values, 1)


def encode_table(table: Mapping[str, Any] | None) -> bytes:
    """Encode a field table with its 4-byte length prefix; None means empty."""
    return _encode_table(table, 1)


def _check_depth(depth: int) -> None:
    # The same bound decoding has, so that recursion here stays shallow too.
    if depth > MAX_DEPTH:
        raise ValueError(f"field tables and arrays nested deeper than {MAX_DEPTH} levels")


def _encode_array(values: list[Any] | tuple[Any, ...], depth: int) -> bytes:
    _check_depth(depth)
    out: list[bytes] = []
    for value in values:
        _enc_value(value, out, depth)
    body = b"".join(out)
    return _U32.pack(len(body)) + body


def _encode_table(table: Mapping[str, Any] | None, depth: int) -> bytes:
    if not table:
        return _EMPTY_TABLE
    _check_depth(depth)
    out: list[bytes] = []
    for key, value in table.items():
        if not isinstance(key, str):
            raise TypeError(f"field table keys must be str, not {type(key).__name__}")
        raw_key = key.encode("utf-8", "surrogateescape")
        if len(raw_key) > 255:
            raise ValueError(f"field table key longer than 255 bytes: {key[:40]!r}...")
        out.append(_U8.pack(len(raw_key)) + raw_key)
        _enc_value(value, out, depth)
    body = b"".join(out)
    return _U32.pack(len(body)) + body
