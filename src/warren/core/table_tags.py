"""The wire type of each top-level entry of a declare's arguments table.

RabbitMQ keeps a table's values with their AMQP types, and its 406 texts name
them: ``received the value '5' of type 'byte' but current is none`` for a
one-byte integer (what pamqp sends for small numbers), 'short', 'unsignedint',
'long', 'binary'... Warren's decoded integers and strings do not remember
their tag, so the arguments of exchange.declare and queue.declare (not a hot
path) are decoded into an ArgumentTable that keeps the top-level tags beside
the values. Message headers, decoded per publish, stay plain dicts.

The definitions log stores arguments with these tags too (encode_arguments),
so a queue recovered after a restart still names its arguments' types.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any

from warren.core.erlang_format import field_type
from warren.core.table import decode_table
from warren.core.table_edit import table_entries
from warren.core.table_encode import encode_table

__all__ = ["ArgumentTable", "decode_arguments", "encode_arguments", "wire_type"]

#: RabbitMQ's names of the AMQP field types (rabbit_binary_parser), by tag.
#: 'L' is left out: Warren reads it as a signed 64-bit integer, named as one.
TAG_NAMES: dict[int, str] = {
    ord("t"): "bool",
    ord("b"): "byte",
    ord("B"): "unsignedbyte",
    ord("s"): "short",
    ord("u"): "unsignedshort",
    ord("I"): "signedint",
    ord("i"): "unsignedint",
    ord("l"): "long",
    ord("f"): "float",
    ord("d"): "double",
    ord("D"): "decimal",
    ord("S"): "longstr",
    ord("x"): "binary",
    ord("T"): "timestamp",
    ord("V"): "void",
    ord("F"): "table",
    ord("A"): "array",
}

#: The integer tags, with how each packs its value (re-encoding keeps the tag).
_INT_FORMATS: dict[int, struct.Struct] = {
    ord("b"): struct.Struct(">b"),
    ord("B"): struct.Struct(">B"),
    ord("s"): struct.Struct(">h"),
    ord("u"): struct.Struct(">H"),
    ord("I"): struct.Struct(">i"),
    ord("i"): struct.Struct(">I"),
    ord("l"): struct.Struct(">q"),
}
_U32 = struct.Struct(">I")


class ArgumentTable(dict[str, Any]):
    """Decoded arguments, with ``tags``: the type tag each key's value had."""

    __slots__ = ("tags",)

    def __init__(
        self, table: Mapping[str, Any] | None = None, tags: dict[str, int] | None = None
    ) -> None:
        super().__init__(table or {})
        self.tags: dict[str, int] = tags or {}


def decode_arguments(data: bytes | memoryview, offset: int = 0) -> tuple[dict[str, Any], int]:
    """decode_table, keeping the top-level type tags (an ArgumentTable)."""
    table, end = decode_table(data, offset)
    if not table:
        return table, end
    entries, _ = table_entries(data, offset)
    tags = {key: data[start + 1 + data[start]] for key, start, _end in entries}
    return ArgumentTable(table, tags), end


def wire_type(table: Mapping[str, Any], key: str) -> str:
    """RabbitMQ's name for the type of ``table[key]``: the tag it arrived with,
    else (a table from JSON, or built by Warren) the name erlang_format infers."""
    tags = getattr(table, "tags", None)
    if tags:
        name = TAG_NAMES.get(tags.get(key, -1))
        if name is not None:
            return name
    return field_type(table[key])


def encode_arguments(table: Mapping[str, Any] | None) -> bytes:
    """encode_table, but an integer or byte string of an ArgumentTable keeps the
    tag it arrived with (so decode_arguments gives the same types back)."""
    tags = getattr(table, "tags", None)
    if not table or not tags:
        return encode_table(table)
    parts: list[bytes] = []
    for key, value in table.items():
        tag = tags.get(key, -1)
        fmt = _INT_FORMATS.get(tag)
        raw_key = key.encode("utf-8", "surrogateescape")
        head = bytes([len(raw_key)]) + raw_key + bytes([tag])
        if fmt is not None and isinstance(value, int) and not isinstance(value, bool):
            try:
                parts.append(head + fmt.pack(value))
                continue
            except struct.error:
                pass  # changed since it was decoded: encoded as encode_table would
        elif tag == ord("x") and isinstance(value, bytes):
            parts.append(head + _U32.pack(len(value)) + value)
            continue
        parts.append(encode_table({key: value})[4:])
    body = b"".join(parts)
    return _U32.pack(len(body)) + body
