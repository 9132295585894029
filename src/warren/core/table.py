"""AMQP field tables and arrays, in the dialect RabbitMQ sends and accepts.

Type tags follow RabbitMQ's errata rather than the original 0-9-1 grammar
(e.g. 's' is a signed 16-bit int, not a short string; 'x' is a byte array).
Decoding only ever raises DecodeError so hostile input cannot escape the
connection's error handling; encoding raises ValueError/TypeError because
those are programming errors on our side.
"""

from __future__ import annotations

import datetime
import decimal
import struct
from collections.abc import Callable, Mapping
from typing import Any

from warren.core.codec_errors import DecodeError

__all__ = [
    "decode_field_array",
    "decode_field_value",
    "decode_table",
    "encode_field_array",
    "encode_field_value",
    "encode_table",
]

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
    try:
        return _EPOCH + datetime.timedelta(seconds=seconds), offset + 8
    except OverflowError:
        # datetime cannot go past year 9999; such a value is not a usable time.
        raise DecodeError(f"timestamp {seconds} out of datetime range") from None


def _dec_void(data: _Buffer, offset: int) -> tuple[None, int]:
    return None, offset


def _dec_array(data: _Buffer, offset: int) -> tuple[list[Any], int]:
    (length,) = _U32.unpack_from(data, offset)
    offset += 4
    end = offset + length
    if end > len(data):
        raise DecodeError("field array runs past end of data")
    decoders = _DECODERS
    result: list[Any] = []
    append = result.append
    while offset < end:
        decoder = decoders.get(data[offset])
        if decoder is None:
            raise DecodeError(f"unknown field type tag {data[offset]:#04x}")
        value, offset = decoder(data, offset + 1)
        append(value)
    if offset != end:
        raise DecodeError("field array contents overrun its declared length")
    return result, end


def _dec_table(data: _Buffer, offset: int) -> tuple[dict[str, Any], int]:
    (length,) = _U32.unpack_from(data, offset)
    offset += 4
    end = offset + length
    if end > len(data):
        raise DecodeError("field table runs past end of data")
    decoders = _DECODERS
    result: dict[str, Any] = {}
    while offset < end:
        key_end = offset + 1 + data[offset]
        key = str(data[offset + 1 : key_end], "utf-8", "surrogateescape")
        if key_end >= end:
            raise DecodeError("field table entry truncated")
        decoder = decoders.get(data[key_end])
        if decoder is None:
            raise DecodeError(f"unknown field type tag {data[key_end]:#04x}")
        result[key], offset = decoder(data, key_end + 1)
    if offset != end:
        raise DecodeError("field table contents overrun its declared length")
    return result, end


_DECODERS: dict[int, _Decoder] = {
    ord("t"): _dec_bool,
    ord("b"): _dec_i8,
    ord("B"): _dec_u8,
    ord("s"): _dec_i16,
    ord("u"): _dec_u16,
    ord("I"): _dec_i32,
    ord("i"): _dec_u32,
    ord("l"): _dec_i64,
    ord("L"): _dec_u64,
    ord("f"): _dec_f32,
    ord("d"): _dec_f64,
    ord("D"): _dec_decimal,
    ord("S"): _dec_longstr,
    ord("x"): _dec_bytes,
    ord("A"): _dec_array,
    ord("F"): _dec_table,
    ord("T"): _dec_timestamp,
    ord("V"): _dec_void,
}

# Errors a decoder may hit on malformed input; all become DecodeError.
# RecursionError: a frame can nest thousands of empty tables/arrays.
_DECODE_FAILURES = (struct.error, IndexError, RecursionError, OverflowError)


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
# Encoding.  Encoders append to a list of parts; the caller joins once.
# --------------------------------------------------------------------------


def _enc_int(value: int, out: list[bytes]) -> None:
    if _INT32_MIN <= value <= _INT32_MAX:
        out.append(b"I" + _I32.pack(value))
    elif _INT64_MIN <= value <= _INT64_MAX:
        out.append(b"l" + _I64.pack(value))
    elif 0 <= value <= _UINT64_MAX:
        out.append(b"L" + _U64.pack(value))
    else:
        raise ValueError(f"integer {value} does not fit any AMQP field type")


def _enc_bool(value: bool, out: list[bytes]) -> None:
    out.append(b"t\x01" if value else b"t\x00")


def _enc_float(value: float, out: list[bytes]) -> None:
    out.append(b"d" + _F64.pack(value))


def _enc_decimal(value: decimal.Decimal, out: list[bytes]) -> None:
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


def _enc_str(value: str, out: list[bytes]) -> None:
    raw = value.encode("utf-8", "surrogateescape")
    out.append(b"S" + _U32.pack(len(raw)))
    out.append(raw)


def _enc_bytes(value: bytes | bytearray | memoryview, out: list[bytes]) -> None:
    raw = bytes(value)
    out.append(b"x" + _U32.pack(len(raw)))
    out.append(raw)


def _enc_list(value: list[Any] | tuple[Any, ...], out: list[bytes]) -> None:
    out.append(b"A")
    out.append(encode_field_array(value))


def _enc_dict(value: Mapping[str, Any], out: list[bytes]) -> None:
    out.append(b"F")
    out.append(encode_table(value))


def _enc_datetime(value: datetime.datetime, out: list[bytes]) -> None:
    if value.tzinfo is None:
        value = value.replace(tzinfo=_UTC)  # naive datetimes are taken as UTC
    seconds = (value - _EPOCH) // _ONE_SECOND
    if not 0 <= seconds <= _UINT64_MAX:
        raise ValueError(f"timestamp {value} is before the Unix epoch")
    out.append(b"T" + _U64.pack(seconds))


def _enc_none(value: None, out: list[bytes]) -> None:
    out.append(b"V")


_ENCODERS: dict[type, Callable[[Any, list[bytes]], None]] = {
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
    tuple[type | tuple[type, ...], Callable[[Any, list[bytes]], None]], ...
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


def _enc_value(value: Any, out: list[bytes]) -> None:
    encoder = _ENCODERS.get(type(value))
    if encoder is None:
        for base, candidate in _ENCODERS_BY_BASE:
            if isinstance(value, base):
                encoder = candidate
                break
        else:
            raise TypeError(f"cannot encode {type(value).__name__} in an AMQP field table")
    encoder(value, out)


def encode_field_value(value: Any) -> bytes:
    """Encode one value with its type tag."""
    out: list[bytes] = []
    _enc_value(value, out)
    return b"".join(out)


def encode_field_array(values: list[Any] | tuple[Any, ...]) -> bytes:
    """Encode a field array with its 4-byte length prefix."""
    out: list[bytes] = []
    for value in values:
        _enc_value(value, out)
    body = b"".join(out)
    return _U32.pack(len(body)) + body


def encode_table(table: Mapping[str, Any] | None) -> bytes:
    """Encode a field table with its 4-byte length prefix; None means empty."""
    if not table:
        return _EMPTY_TABLE
    out: list[bytes] = []
    for key, value in table.items():
        if not isinstance(key, str):
            raise TypeError(f"field table keys must be str, not {type(key).__name__}")
        raw_key = key.encode("utf-8", "surrogateescape")
        if len(raw_key) > 255:
            raise ValueError(f"field table key longer than 255 bytes: {key[:40]!r}...")
        out.append(_U8.pack(len(raw_key)) + raw_key)
        _enc_value(value, out)
    body = b"".join(out)
    return _U32.pack(len(body)) + body
