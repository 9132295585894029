"""Encoding AMQP field tables, arrays and values, in the dialect RabbitMQ accepts.

The writing half of table.py (which decodes and validates). Encoding raises
ValueError/TypeError: a value that cannot be encoded is a programming error on
Warren's side, not hostile input. Encoding recurses per nesting level, so it
stops at table.MAX_DEPTH levels, the bound decoding has.
"""

from __future__ import annotations

import datetime
import decimal
import struct
from collections.abc import Callable, Mapping
from typing import Any

from warren.core.table import MAX_DEPTH

__all__ = ["encode_field_array", "encode_field_value", "encode_table"]

_UTC = datetime.UTC
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=_UTC)
_ONE_SECOND = datetime.timedelta(seconds=1)

_U8 = struct.Struct(">B")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_U64 = struct.Struct(">Q")
_F64 = struct.Struct(">d")
_DEC = struct.Struct(">Bi")

_EMPTY_TABLE = b"\x00\x00\x00\x00"

_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_UINT64_MAX = (1 << 64) - 1


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
