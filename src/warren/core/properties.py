"""Content-header properties of class basic.

The broker forwards the property bytes exactly as the publisher sent them
and decodes them only when routing or queueing needs a value (headers
exchange, persistence, TTL, priority).  The peek_* helpers answer those
questions by skipping over earlier properties without building objects.
"""

from __future__ import annotations

import struct
from collections.abc import Collection, Mapping
from typing import Any

from warren.core.codec_errors import DecodeError, UnsafeValue
from warren.core.table import MAX_TIMESTAMP, check_table, decode_table
from warren.core.table_edit import edit_table
from warren.core.table_encode import encode_field_value, encode_table

__all__ = [
    "EMPTY_PROPERTIES",
    "BasicProperties",
    "decode_properties",
    "edit_properties",
    "headers_offset",
    "peek_delivery_mode",
    "peek_expiration",
    "peek_headers",
    "peek_priority",
    "set_header",
    "validate_properties",
]

_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")

#: Raw properties with no flag set (a message without properties).
EMPTY_PROPERTIES = b"\x00\x00"

_Buffer = bytes | bytearray | memoryview

#: The properties of AMQP 0-9-1's basic class in flag-bit order, with their
#: types: the core's canonical property format, whatever protocol a message came
#: in by (tests hold amqp/spec.py, generated from the specification, to it).
BASIC_PROPERTIES: tuple[tuple[str, str], ...] = (
    ("content_type", "shortstr"),
    ("content_encoding", "shortstr"),
    ("headers", "table"),
    ("delivery_mode", "octet"),
    ("priority", "octet"),
    ("correlation_id", "shortstr"),
    ("reply_to", "shortstr"),
    ("expiration", "shortstr"),
    ("message_id", "shortstr"),
    ("timestamp", "timestamp"),
    ("type", "shortstr"),
    ("user_id", "shortstr"),
    ("app_id", "shortstr"),
    ("cluster_id", "shortstr"),
)

# Property i is flagged by bit 15 - i of the first flag word; bit 0 says another
# flag word follows.  Bit 1 would be a 15th property; basic has 14, and RabbitMQ
# ignores that bit, so we do too.
_LAYOUT: tuple[tuple[str, str, int], ...] = tuple(
    (name, amqp_type, 1 << (15 - i)) for i, (name, amqp_type) in enumerate(BASIC_PROPERTIES)
)
_KNOWN_FLAGS = sum(bit for _, _, bit in _LAYOUT)
# BasicProperties' attribute names, in AMQP order (its __slots__: a class compiled
# by mypyc has no __slots__ attribute to read).
_NAMES: tuple[str, ...] = tuple(name for name, _, _ in _LAYOUT)

_F_HEADERS = 1 << 13
_F_DELIVERY_MODE = 1 << 12
_F_PRIORITY = 1 << 11
_F_EXPIRATION = 1 << 8


class BasicProperties:
    """Decoded basic properties; None means the property is absent.

    ``timestamp`` is the raw AMQP value (seconds since the epoch) so that it
    round-trips exactly.
    """

    __slots__ = (
        "content_type",
        "content_encoding",
        "headers",
        "delivery_mode",
        "priority",
        "correlation_id",
        "reply_to",
        "expiration",
        "message_id",
        "timestamp",
        "type",
        "user_id",
        "app_id",
        "cluster_id",
    )

    def __init__(
        self,
        content_type: str | None = None,
        content_encoding: str | None = None,
        headers: dict[str, Any] | None = None,
        delivery_mode: int | None = None,
        priority: int | None = None,
        correlation_id: str | None = None,
        reply_to: str | None = None,
        expiration: str | None = None,
        message_id: str | None = None,
        timestamp: int | None = None,
        type: str | None = None,
        user_id: str | None = None,
        app_id: str | None = None,
        cluster_id: str | None = None,
    ) -> None:
        self.content_type = content_type
        self.content_encoding = content_encoding
        self.headers = headers
        self.delivery_mode = delivery_mode
        self.priority = priority
        self.correlation_id = correlation_id
        self.reply_to = reply_to
        self.expiration = expiration
        self.message_id = message_id
        self.timestamp = timestamp
        self.type = type
        self.user_id = user_id
        self.app_id = app_id
        self.cluster_id = cluster_id

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BasicProperties):
            return NotImplemented
        return all(getattr(self, name) == getattr(other, name) for name in _NAMES)

    def __repr__(self) -> str:
        present = (
            f"{name}={getattr(self, name)!r}" for name in _NAMES if getattr(self, name) is not None
        )
        return f"BasicProperties({', '.join(present)})"

    def encode(self) -> bytes:
        """Return the property flags followed by the present properties."""
        flags = 0
        parts = [b""]
        try:
            for name, amqp_type, bit in _LAYOUT:
                value = getattr(self, name)
                if value is None:
                    continue
                flags |= bit
                if amqp_type == "shortstr":
                    raw = value.encode("utf-8", "surrogateescape")
                    parts.append(_U8.pack(len(raw)))
                    parts.append(raw)
                elif amqp_type == "octet":
                    parts.append(_U8.pack(value))
                elif amqp_type == "table":
                    parts.append(encode_table(value))
                else:  # timestamp
                    parts.append(_U64.pack(value))
        except struct.error as exc:
            raise ValueError(f"cannot encode basic property {name}: {exc}") from exc
        parts[0] = _U16.pack(flags)
        return b"".join(parts)


def _read_flags(raw: _Buffer) -> tuple[int, int]:
    """Return (known property flags, offset of the first property)."""
    flags = raw[0] << 8 | raw[1]
    offset = 2
    word = flags
    while word & 1:
        word = raw[offset] << 8 | raw[offset + 1]
        offset += 2
        if word & 0xFFFE:
            raise DecodeError("basic properties use flags beyond the 14 defined ones")
    return flags & _KNOWN_FLAGS, offset


def decode_properties(raw: _Buffer) -> BasicProperties:
    """Decode property flags + property list (content header after body-size)."""
    props = BasicProperties()
    try:
        flags, offset = _read_flags(raw)
        for name, amqp_type, bit in _LAYOUT:
            if not flags & bit:
                continue
            if amqp_type == "shortstr":
                end = offset + 1 + raw[offset]
                value: Any = str(raw[offset + 1 : end], "utf-8", "surrogateescape")
                offset = end
            elif amqp_type == "octet":
                value = raw[offset]
                offset += 1
            elif amqp_type == "table":
                value, offset = decode_table(raw, offset)
            else:  # timestamp
                (value,) = _U64.unpack_from(raw, offset)
                offset += 8
            setattr(props, name, value)
    except (struct.error, IndexError) as exc:
        raise DecodeError(f"malformed basic properties: {exc}") from exc
    if offset > len(raw):
        raise DecodeError("truncated basic properties")
    return props


# Properties of variable size; without any of them the property list is one
# octet per flag set (delivery-mode, priority).
_VARIABLE_FLAGS = sum(bit for _, amqp_type, bit in _LAYOUT if amqp_type != "octet")


def validate_properties(raw: bytes) -> None:
    """Check a publisher's property list once, before the message is accepted.

    Raises DecodeError where RabbitMQ could not parse it either (an unknown
    field type, a length that overruns, bytes after the last property, a
    continued flag word: its channel crashes with 541), and UnsafeValue for a
    well-formed list that a consumer's client library could not decode (see
    table.validate_table; also non-UTF-8 short strings, which pamqp refuses,
    and a timestamp after the year 9999). Every later path that decodes the
    properties (routing, dead-lettering, delivery, recovery) can then rely on
    them. No recursion, no values built. A list that is both is malformed: the
    whole list is read before an unsafe value is reported.
    """
    n = len(raw)
    if n < 2:
        raise DecodeError("content header has no property flags")
    flags = raw[0] << 8 | raw[1]
    if flags & 1:
        # RabbitMQ reads no second flag word (basic has 14 properties); pika
        # and py-amqp would read one that is not there.
        raise DecodeError("property flags continue into a second flag word")
    if not flags & _VARIABLE_FLAGS:
        if n != 2 + (flags & _KNOWN_FLAGS).bit_count():
            raise DecodeError("property list does not match its flags")
        return
    offset = 2
    unsafe: str | None = None
    try:
        for name, amqp_type, bit in _LAYOUT:
            if not flags & bit:
                continue
            if amqp_type == "shortstr":
                end = offset + 1 + raw[offset]
                if end > n:
                    raise DecodeError(f"property {name} runs past the end of the content header")
                value = raw[offset + 1 : end]
                if not value.isascii() and unsafe is None:
                    try:
                        value.decode()
                    except UnicodeDecodeError:
                        unsafe = f"property {name} is not UTF-8"
                offset = end
            elif amqp_type == "octet":
                offset += 1
            elif amqp_type == "table":
                offset, table_unsafe = check_table(raw, offset, n)
                unsafe = unsafe or table_unsafe
            else:  # timestamp
                if _U64.unpack_from(raw, offset)[0] > MAX_TIMESTAMP and unsafe is None:
                    unsafe = f"property {name} is after the year 9999"
                offset += 8
    except (struct.error, IndexError) as exc:
        raise DecodeError(f"truncated property list: {exc}") from None
    if offset != n:
        if offset > n:
            raise DecodeError("truncated property list")
        raise DecodeError(f"{n - offset} bytes after the last property")
    if unsafe is not None:
        raise UnsafeValue(unsafe)


def _seek(raw: _Buffer, flag: int) -> int | None:
    """Offset of the property flagged by ``flag``, or None when it is absent.

    Earlier properties are skipped by their length prefixes; tables are not parsed.
    """
    flags, offset = _read_flags(raw)
    if not flags & flag:
        return None
    for _, amqp_type, bit in _LAYOUT:
        if bit == flag:
            return offset
        if flags & bit:
            offset = _skip_property(raw, offset, amqp_type)
    raise AssertionError("unreachable: flag not in layout")  # pragma: no cover


def _skip_property(raw: _Buffer, offset: int, amqp_type: str) -> int:
    """The offset after the property of ``amqp_type`` at ``offset``."""
    if amqp_type == "shortstr":
        return offset + 1 + raw[offset]
    if amqp_type == "octet":
        return offset + 1
    if amqp_type == "table":
        return offset + 4 + _U32.unpack_from(raw, offset)[0]
    return offset + 8


def headers_offset(raw: _Buffer) -> int | None:
    """Where the headers table starts (its length prefix), or None without headers."""
    try:
        return _seek(raw, _F_HEADERS)
    except (struct.error, IndexError) as exc:
        raise DecodeError(f"malformed basic properties: {exc}") from exc


def peek_headers(raw: _Buffer) -> dict[str, Any] | None:
    """Return the headers table without decoding the other properties."""
    try:
        offset = _seek(raw, _F_HEADERS)
    except (struct.error, IndexError) as exc:
        raise DecodeError(f"malformed basic properties: {exc}") from exc
    if offset is None:
        return None
    return decode_table(raw, offset)[0]


def _peek_octet(raw: _Buffer, flag: int) -> int | None:
    try:
        offset = _seek(raw, flag)
        return None if offset is None else raw[offset]
    except (struct.error, IndexError) as exc:
        raise DecodeError(f"malformed basic properties: {exc}") from exc


def peek_delivery_mode(raw: _Buffer) -> int | None:
    """Return delivery-mode (2 = persistent) without decoding the headers table."""
    return _peek_octet(raw, _F_DELIVERY_MODE)


#: The commonest persistent property list: delivery-mode 2 and nothing else.
PERSISTENT_PROPERTIES = b"\x10\x00\x02"


def is_persistent(raw: bytes) -> bool:
    """Whether properties say delivery-mode 2, as the stores take them:
    unreadable ones count as persistent (recovery keeps such a message rather
    than lose it, and the transient counts agree)."""
    # Fast path: one flags word and delivery-mode is the first property present
    # (no content-type, content-encoding or headers): it follows the flags word.
    if len(raw) >= 3 and raw[0] & 0xF0 == 0x10 and not raw[1] & 1:
        return raw[2] == 2
    try:
        return peek_delivery_mode(raw) == 2
    except Exception:  # unreadable properties: keep the message rather than lose it
        return True


def is_transient(raw: bytes) -> bool:
    """not is_persistent, the commonest persistent properties first."""
    return raw != PERSISTENT_PROPERTIES and not is_persistent(raw)


def peek_priority(raw: _Buffer) -> int | None:
    """Return the priority property without decoding the headers table."""
    return _peek_octet(raw, _F_PRIORITY)


def peek_expiration(raw: _Buffer) -> str | None:
    """Return the per-message TTL string (expiration) without decoding the headers table."""
    try:
        offset = _seek(raw, _F_EXPIRATION)
        if offset is None:
            return None
        end = offset + 1 + raw[offset]
    except (struct.error, IndexError) as exc:
        raise DecodeError(f"malformed basic properties: {exc}") from exc
    if end > len(raw):
        raise DecodeError("truncated basic properties")
    return str(raw[offset + 1 : end], "utf-8", "surrogateescape")


def set_header(raw: bytes, key: str, value: Any) -> bytes:
    """``raw`` with header ``key`` set to ``value``, every other byte as it was."""
    return edit_properties(raw, set_headers={key: encode_field_value(value)})


def edit_properties(
    raw: bytes,
    *,
    set_headers: Mapping[str, bytes] | None = None,
    remove_headers: Collection[str] = (),
    set_properties: Mapping[str, Any] | None = None,
) -> bytes:
    """``raw`` with some headers and properties changed, every other byte as it was.

    Re-encoding decoded properties would change the wire types of the headers
    it does not touch (a short becomes a long) and walk all of their nesting;
    this copies them as bytes. ``set_headers`` maps keys to tagged, encoded
    values (replaced where the key is, else appended); ``set_properties`` maps
    property names to new values, None removing the property.
    """
    set_headers = set_headers or {}
    set_properties = set_properties or {}
    try:
        flags, offset = _read_flags(raw)
        parts: list[bytes] = []
        for name, amqp_type, bit in _LAYOUT:
            present = bool(flags & bit)
            start = offset
            if present:
                offset = _skip_property(raw, offset, amqp_type)
            if name in set_properties:
                value = set_properties[name]
                flags &= ~bit
                if value is not None:
                    flags |= bit
                    parts.append(_encode_property(amqp_type, value))
            elif amqp_type == "table" and (set_headers or remove_headers):
                table = _edited_table(raw, start if present else None, set_headers, remove_headers)
                if table is None:
                    flags &= ~bit
                else:
                    flags |= bit
                    parts.append(table)
            elif present:
                parts.append(raw[start:offset])
    except (struct.error, IndexError) as exc:
        raise DecodeError(f"malformed basic properties: {exc}") from exc
    if offset > len(raw):
        raise DecodeError("truncated basic properties")
    return _U16.pack(flags & 0xFFFE) + b"".join(parts)


def _edited_table(
    raw: bytes,
    offset: int | None,
    set_entries: Mapping[str, bytes],
    remove: Collection[str],
) -> bytes | None:
    """The headers table at ``offset`` (None: no headers yet) with entries set and
    removed; None when the result would be an absent table that was absent."""
    if offset is None and not set_entries:
        return None
    return edit_table(raw, offset, set_entries, remove)


def _encode_property(amqp_type: str, value: Any) -> bytes:
    if amqp_type == "shortstr":
        raw = value.encode("utf-8", "surrogateescape")
        return _U8.pack(len(raw)) + raw
    if amqp_type == "octet":
        return _U8.pack(value)
    if amqp_type == "table":
        return encode_table(value)
    return _U64.pack(value)
