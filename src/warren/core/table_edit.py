"""Walking a field table's top level without decoding its values.

For editing a few headers (dead-lettering's x-death, a removed BCC) while
every other byte stays as the publisher sent it: entries and array items are
byte ranges, nested containers are skipped by their length prefix and never
entered. Decoding and validation are in table.py, encoding in table_encode.py.
"""

from __future__ import annotations

import struct
from collections.abc import Collection, Mapping

from warren.core.codec_errors import DecodeError
from warren.core.table import FIXED_SIZES

__all__ = ["array_items", "edit_table", "skip_field_value", "table_entries"]

_U8 = struct.Struct(">B")
_U32 = struct.Struct(">I")

_Buffer = bytes | bytearray | memoryview

_PREFIXED = (ord("S"), ord("x"), ord("F"), ord("A"))
_SKIP_SIZES: dict[int, int] = {**FIXED_SIZES, ord("f"): 4, ord("d"): 8, ord("T"): 8}


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
