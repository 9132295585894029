"""AMQP 0-9-1 field values <-> AMQP 1.0 values, with their types, as RabbitMQ 4 converts them.

mapping.py's headers: a 1.0 application property or annotation becomes a
0-9-1 header of the matching type (a uint an ``unsignedint``, 'i'; a
timestamp a 0-9-1 timestamp in seconds) and back. Values are encoded to and
read from the table's bytes with their type tags, since core/table.py's
Python values do not keep an integer's width. A value RabbitMQ 4 has no
conversion for (uuid, char, decimal, described; a 0-9-1 decimal) is left
out. x-death (0-9-1) and x-opt-deaths (1.0) are the same records in each
protocol's shape.
"""

from __future__ import annotations

import math
import struct
from typing import Any

from warren.amqp1.formats import MAP8, STR8
from warren.amqp1.formats import MAX_DEPTH as AMQP1_MAX_DEPTH
from warren.amqp1.types import (
    Array,
    Byte,
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
from warren.core.codec_errors import DecodeError
from warren.core.table import MAX_DEPTH, MAX_TIMESTAMP

__all__ = [
    "SKIP",
    "deaths_to_amqp1",
    "deaths_to_core",
    "from_field",
    "key_bytes",
    "longstr",
    "read_headers",
    "table_key",
    "to_field",
    "to_table",
]

_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_U64 = struct.Struct(">Q")
_F32 = struct.Struct(">f")
_F64 = struct.Struct(">d")

#: How long a 0-9-1 longstr may be to be tried as UTF-8 (RabbitMQ 4 takes a
#: longer one as binary rather than scan it).
_UTF8_SCAN_LIMIT = 4096


# --------------------------------------------------------------------------
# AMQP 1.0 values -> 0-9-1 field values (type tag and bytes).
# --------------------------------------------------------------------------


def longstr(raw: bytes) -> bytes:
    return b"S" + _U32.pack(len(raw)) + raw


def to_field(value: Any, depth: int = 1) -> bytes | None:
    """``value`` as a tagged 0-9-1 field value, or None where RabbitMQ 4 has no
    conversion (the entry is then left out)."""
    kind = type(value)
    if kind is bool:
        return b"t\x01" if value else b"t\x00"
    if value is None:
        return b"V"
    if isinstance(value, str):
        if kind is not str and kind is not Symbol:
            return None  # a char
        return longstr(value.encode("utf-8", "surrogateescape"))
    if isinstance(value, bytes):
        if kind is not bytes:
            return None  # decimal32/64/128
        return longstr(value)  # RabbitMQ 4 sends a 1.0 binary as a longstr
    if isinstance(value, int):
        try:
            if kind is UByte:
                return b"B" + _U8.pack(value)
            if kind is Byte:
                return b"b" + _I8.pack(value)
            if kind is Short:
                return b"s" + _I16.pack(value)
            if kind is UShort:
                return b"u" + _U16.pack(value)
            if kind is Int:
                return b"I" + _I32.pack(value)
            if kind is UInt:
                return b"i" + _U32.pack(value)
            if kind is Timestamp:
                seconds = value // 1000  # Erlang's div (towards zero; negatives are left out)
                if value < 0 or seconds > MAX_TIMESTAMP:
                    return None
                return b"T" + _U64.pack(seconds)
            return b"l" + _I64.pack(value)  # long, ulong (if it fits), int
        except struct.error:
            return None
    if isinstance(value, float):
        if not math.isfinite(value):
            return None  # Warren refuses these in headers (core/table.py)
        return (b"f" + _F32.pack(value)) if kind is Float else (b"d" + _F64.pack(value))
    if depth >= MAX_DEPTH:
        return None
    if isinstance(value, list | tuple | Array):
        items = value.items if isinstance(value, Array) else value
        parts = [p for p in (to_field(item, depth + 1) for item in items) if p is not None]
        body = b"".join(parts)
        return b"A" + _U32.pack(len(body)) + body
    if isinstance(value, dict):
        return b"F" + to_table(value.items(), depth + 1)
    return None  # uuid, described


def key_bytes(key: Any) -> bytes | None:
    if not isinstance(key, str):
        return None
    raw = key.encode("utf-8", "surrogateescape")
    return raw if len(raw) < 256 else None


def to_table(entries: Any, depth: int = 1) -> bytes:
    parts = []
    for key, value in entries:
        raw_key = key_bytes(key)
        if raw_key is None:
            continue
        encoded = to_field(value, depth)
        if encoded is not None:
            parts.append(bytes((len(raw_key),)) + raw_key + encoded)
    body = b"".join(parts)
    return _U32.pack(len(body)) + body


# --------------------------------------------------------------------------
# 0-9-1 field values -> AMQP 1.0 values, from the table's bytes (with types).
# --------------------------------------------------------------------------


def _text_or_binary(raw: bytes) -> str | bytes:
    """A 0-9-1 longstr: a string when it is short UTF-8 without NULs (RabbitMQ 4)."""
    if len(raw) <= _UTF8_SCAN_LIMIT and b"\x00" not in raw:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            pass
    return raw


_FIXED: dict[int, tuple[struct.Struct, type]] = {
    ord("b"): (_I8, Byte),
    ord("B"): (_U8, UByte),
    ord("s"): (_I16, Short),
    ord("u"): (_U16, UShort),
    ord("I"): (_I32, Int),
    ord("i"): (_U32, UInt),
    ord("l"): (_I64, Long),
    ord("L"): (_I64, Long),
    ord("f"): (_F32, Float),
    ord("d"): (_F64, float),
}

#: How deep 0-9-1 headers nest into 1.0 values: within the codec's limit,
#: less the section's own levels.
_FROM_CORE_DEPTH = AMQP1_MAX_DEPTH - 4

SKIP = object()  # a value with no 1.0 conversion (a decimal)


def from_field(data: bytes, pos: int, depth: int) -> tuple[Any, int]:
    tag = data[pos]
    pos += 1
    fixed = _FIXED.get(tag)
    if fixed is not None:
        fmt, kind = fixed
        return kind(fmt.unpack_from(data, pos)[0]), pos + fmt.size
    if tag == 0x53 or tag == 0x78:  # S, x
        end = pos + 4 + _U32.unpack_from(data, pos)[0]
        raw = data[pos + 4 : end]
        return (_text_or_binary(raw) if tag == 0x53 else raw), end
    if tag == 0x74:  # t
        return data[pos] != 0, pos + 1
    if tag == 0x54:  # T
        return Timestamp(_U64.unpack_from(data, pos)[0] * 1000), pos + 8
    if tag == 0x56:  # V
        return None, pos
    if tag == 0x44:  # D
        return SKIP, pos + 5
    if tag == 0x41 or tag == 0x46:  # A, F
        end = pos + 4 + _U32.unpack_from(data, pos)[0]
        pos += 4
        if depth >= _FROM_CORE_DEPTH:
            return SKIP, end
        if tag == 0x41:
            items = []
            while pos < end:
                item, pos = from_field(data, pos, depth + 1)
                if item is not SKIP:
                    items.append(item)
            return items, end
        table: dict[Any, Any] = {}
        while pos < end:
            key, pos = table_key(data, pos)
            item, pos = from_field(data, pos, depth + 1)
            if item is not SKIP:
                # Keys become symbols, which are ASCII; another key stays a string.
                table[Symbol(key) if key.isascii() else key] = item
        return table, end
    raise DecodeError(f"unknown field type {chr(tag)!r} in the headers")


def table_key(data: bytes, pos: int) -> tuple[str, int]:
    end = pos + 1 + data[pos]
    return str(data[pos + 1 : end], "utf-8", "surrogateescape"), end


def read_headers(raw: bytes, offset: int) -> list[tuple[str, int, Any]]:
    """The top-level headers as (key, type tag, 1.0 value)."""
    (length,) = _U32.unpack_from(raw, offset)
    pos = offset + 4
    end = pos + length
    out = []
    while pos < end:
        key, pos = table_key(raw, pos)
        tag = raw[pos]
        value, pos = from_field(raw, pos, 1)
        if value is not SKIP:
            out.append((key, tag, value))
    return out


def deaths_to_core(value: Any) -> bytes | None:
    """x-opt-deaths (an array of maps) as RabbitMQ 4's x-death header, or None
    when it is not shaped as RabbitMQ 4 writes it."""
    items = value.items if isinstance(value, Array) else value
    if not isinstance(items, list | tuple):
        return None
    tables = []
    for death in items:
        if not isinstance(death, dict):
            return None
        try:
            keys = death["routing-keys"]
            keys = keys.items if isinstance(keys, Array) else keys
            entry: dict[str, Any] = {
                "count": Long(death["count"]),
                "exchange": str(death["exchange"]),
                "queue": str(death["queue"]),
                "reason": str(death["reason"]),
                "routing-keys": [str(k) for k in keys],
                "time": Timestamp(death["first-time"]),
            }
            if "ttl" in death:
                entry["original-expiration"] = str(death["ttl"])
        except (KeyError, TypeError, ValueError):
            return None
        tables.append(entry)
    return to_field(tables)


def deaths_to_amqp1(value: Any) -> Array | None:
    """The x-death header as RabbitMQ 4's x-opt-deaths annotation."""
    if not isinstance(value, list):
        return None
    maps = []
    for death in value:
        if not isinstance(death, dict):
            return None
        try:
            first = Timestamp(death["time"])
            keys = death.get("routing-keys") or []
            entry: dict[Any, Any] = {}
            expiration = death.get("original-expiration")
            if expiration is not None:
                entry[Symbol("ttl")] = UInt(int(expiration))
            entry.update(
                {
                    Symbol("queue"): str(death["queue"]),
                    Symbol("reason"): Symbol(str(death["reason"])),
                    Symbol("count"): ULong(death["count"]),
                    Symbol("first-time"): first,
                    # 0-9-1's x-death keeps the first time only.
                    Symbol("last-time"): first,
                    Symbol("exchange"): str(death["exchange"]),
                    Symbol("routing-keys"): Array(STR8, tuple(str(k) for k in keys)),
                }
            )
        except (KeyError, TypeError, ValueError):
            return None
        maps.append(entry)
    return Array(MAP8, tuple(maps))
