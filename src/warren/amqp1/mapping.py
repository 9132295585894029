"""AMQP 1.0 message <-> the core's message (AMQP 0-9-1 properties and body), as RabbitMQ 4 maps them.

The core's message format is AMQP 0-9-1's content header (core/message.py),
so AMQP 1.0 converts at its edge, as MQTT does (mqtt/mapping.py): `to_core`
when a 1.0 client publishes, `from_core` for a message a 1.0 client
consumes, `for_delivery` for the head RabbitMQ 4 gives every delivery to a
1.0 client. The rules are RabbitMQ 4's (its inter-protocol conversion
rules), so that a 0-9-1 or MQTT consumer sees what RabbitMQ 4 shows it for
a message published over AMQP 1.0, and a 1.0 consumer what RabbitMQ 4 shows
for one published over 0-9-1 or MQTT; docs/amqp1.md, "Message mapping", has
the table. Where RabbitMQ 4 would fail (a value it has no conversion for:
uuid, char, decimal or described application properties; a 0-9-1 decimal)
the value is left out.

Header values keep their AMQP types both ways: a 1.0 uint becomes a 0-9-1
``unsignedint`` ('i') and back, so the headers table is encoded and read
here with its type tags rather than through core/table.py's Python values.
"""

from __future__ import annotations

import contextlib
import math
import re
import struct
import uuid
from typing import Any
from urllib.parse import quote, unquote_to_bytes

from warren.amqp1.formats import MAP8, STR8
from warren.amqp1.formats import MAX_DEPTH as AMQP1_MAX_DEPTH
from warren.amqp1.message import (
    AmqpMessage,
    AmqpSequence,
    AmqpValue,
    ApplicationProperties,
    Data,
    Footer,
    Header,
    MessageAnnotations,
    Properties,
    decode_sections,
    encode_message,
)
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
    "AMQP10_TYPE",
    "for_delivery",
    "from_core",
    "to_core",
]

#: The 0-9-1 ``type`` of a message whose 1.0 body is not data sections: its
#: body is then the encoded body sections and footer.
AMQP10_TYPE = "amqp-1.0"

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

_INT64_MAX = (1 << 63) - 1
_UINT32_MAX = (1 << 32) - 1
#: How long a 0-9-1 longstr may be to be tried as UTF-8 (RabbitMQ 4 takes a
#: longer one as binary rather than scan it).
_UTF8_SCAN_LIMIT = 4096
_URN = re.compile(
    r"urn:uuid:[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
)
_BAD_PERCENT = re.compile(r"%(?![0-9a-fA-F]{2})")

#: Message annotations RabbitMQ 4 sets or reads itself: not copied to headers.
_INTERNAL = frozenset({"x-routing-key", "x-exchange", "x-death"})

# The 0-9-1 basic properties' flag bits (core/properties.py's order).
_F_CONTENT_TYPE = 1 << 15
_F_CONTENT_ENCODING = 1 << 14
_F_HEADERS = 1 << 13
_F_DELIVERY_MODE = 1 << 12
_F_PRIORITY = 1 << 11
_F_CORRELATION_ID = 1 << 10
_F_REPLY_TO = 1 << 9
_F_EXPIRATION = 1 << 8
_F_MESSAGE_ID = 1 << 7
_F_TIMESTAMP = 1 << 6
_F_TYPE = 1 << 5
_F_USER_ID = 1 << 4
_F_APP_ID = 1 << 3


# --------------------------------------------------------------------------
# AMQP 1.0 values -> 0-9-1 field values (type tag and bytes).
# --------------------------------------------------------------------------


def _longstr(raw: bytes) -> bytes:
    return b"S" + _U32.pack(len(raw)) + raw


def _field(value: Any, depth: int = 1) -> bytes | None:
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
        return _longstr(value.encode("utf-8", "surrogateescape"))
    if isinstance(value, bytes):
        if kind is not bytes:
            return None  # decimal32/64/128
        return _longstr(value)  # RabbitMQ 4 sends a 1.0 binary as a longstr
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
        parts = [p for p in (_field(item, depth + 1) for item in items) if p is not None]
        body = b"".join(parts)
        return b"A" + _U32.pack(len(body)) + body
    if isinstance(value, dict):
        return b"F" + _table(value.items(), depth + 1)
    return None  # uuid, described


def _key(key: Any) -> bytes | None:
    if not isinstance(key, str):
        return None
    raw = key.encode("utf-8", "surrogateescape")
    return raw if len(raw) < 256 else None


def _table(entries: Any, depth: int = 1) -> bytes:
    parts = []
    for key, value in entries:
        raw_key = _key(key)
        if raw_key is None:
            continue
        encoded = _field(value, depth)
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

_SKIP = object()  # a value with no 1.0 conversion (a decimal)


def _value(data: bytes, pos: int, depth: int) -> tuple[Any, int]:
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
        return _SKIP, pos + 5
    if tag == 0x41 or tag == 0x46:  # A, F
        end = pos + 4 + _U32.unpack_from(data, pos)[0]
        pos += 4
        if depth >= _FROM_CORE_DEPTH:
            return _SKIP, end
        if tag == 0x41:
            items = []
            while pos < end:
                item, pos = _value(data, pos, depth + 1)
                if item is not _SKIP:
                    items.append(item)
            return items, end
        table: dict[Any, Any] = {}
        while pos < end:
            key, pos = _table_key(data, pos)
            item, pos = _value(data, pos, depth + 1)
            if item is not _SKIP:
                table[Symbol(key)] = item
        return table, end
    raise DecodeError(f"unknown field type {chr(tag)!r} in the headers")


def _table_key(data: bytes, pos: int) -> tuple[str, int]:
    end = pos + 1 + data[pos]
    return str(data[pos + 1 : end], "utf-8", "surrogateescape"), end


def _headers(raw: bytes, offset: int) -> list[tuple[str, int, Any]]:
    """The top-level headers as (key, type tag, 1.0 value)."""
    (length,) = _U32.unpack_from(raw, offset)
    pos = offset + 4
    end = pos + length
    out = []
    while pos < end:
        key, pos = _table_key(raw, pos)
        tag = raw[pos]
        value, pos = _value(raw, pos, 1)
        if value is not _SKIP:
            out.append((key, tag, value))
    return out


# --------------------------------------------------------------------------
# Ids, addresses.
# --------------------------------------------------------------------------


def _urn(value: uuid.UUID) -> str:
    return f"urn:uuid:{value}"


def _id_to_core(value: Any, header: str, headers: list[tuple[str, bytes]]) -> str | None:
    """A 1.0 message-id or correlation-id as the 0-9-1 property, or in ``header``."""
    if value is None:
        return None
    if isinstance(value, uuid.UUID):
        return _urn(value)
    if isinstance(value, bytes):
        headers.append((header, b"x" + _U32.pack(len(value)) + value))
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        raw = value.encode("utf-8", "surrogateescape")
        if len(raw) < 256:
            return value
        headers.append((header, _longstr(raw)))
    return None


def _id_from_core(value: str | None) -> str | uuid.UUID | None:
    if value is not None and len(value) == 45 and _URN.fullmatch(value):
        return uuid.UUID(value[9:])
    return value


def _shortstr(value: Any) -> str | None:
    if isinstance(value, str) and len(value.encode("utf-8", "surrogateescape")) < 256:
        return value
    return None


def _valid_shortstr(value: bytes) -> str | None:
    """Bytes a 0-9-1 shortstr can carry as is: under 256, UTF-8, no NUL."""
    if len(value) >= 256 or b"\x00" in value:
        return None
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _reply_to_core(address: Any) -> str | None:
    """A 1.0 reply-to as the 0-9-1 reply_to: a v2 queue address becomes the queue's
    name (a 0-9-1 reply_to names a queue); any other address passes as is."""
    text = _shortstr(address)
    if text is None or not text.startswith("/queues/"):
        return text
    encoded = text[8:]
    if _BAD_PERCENT.search(encoded):
        return None
    return unquote_to_bytes(encoded).decode("utf-8", "surrogateescape")


def _reply_to_amqp1(reply_to: str) -> str:
    return "/queues/" + quote(reply_to, safe="", errors="surrogateescape")


# --------------------------------------------------------------------------
# AMQP 1.0 -> core.
# --------------------------------------------------------------------------


def _shortstr_field(text: str) -> bytes:
    raw = text.encode("utf-8", "surrogateescape")
    return _U8.pack(len(raw)) + raw


def _deaths_to_core(value: Any) -> bytes | None:
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
    return _field(tables)


def _annotation_to_core(key: str, value: Any, headers: list[tuple[str, bytes]]) -> None:
    if key == "x-cc":
        encoded = _field(value)
        if encoded is not None:
            headers.append(("CC", encoded))
    elif key == "x-opt-rabbitmq-received-time":
        if isinstance(value, int) and not isinstance(value, bool):
            with contextlib.suppress(struct.error):
                headers.append(("timestamp_in_ms", b"l" + _I64.pack(value)))
    elif key == "x-opt-deaths":
        encoded = _deaths_to_core(value)
        if encoded is not None:
            headers.append(("x-death", encoded))
    elif key.startswith("x-") and key not in _INTERNAL and not key.startswith("x-basic-"):
        encoded = _field(value)
        if encoded is not None:
            headers.append((key, encoded))


#: to_core's properties for messages with neither properties nor annotations,
#: by (durable, priority): the hot path builds nothing for them.
_PLAIN: dict[tuple[bool | None, int | None], bytes] = {}


def to_core(msg: AmqpMessage) -> tuple[bytes, bytes]:
    """The 0-9-1 properties (a content header's property list) and body of a
    message an AMQP 1.0 client published."""
    header = msg.header
    props = msg.properties
    body = msg.data()
    ma = msg.message_annotations.content if msg.message_annotations is not None else None
    ap = msg.application_properties.content if msg.application_properties is not None else None
    if (
        body is not None
        and props is None
        and not ma
        and not ap
        and (header is None or header.ttl is None)
    ):
        key = (None, None) if header is None else (header.durable, header.priority)
        plain = _PLAIN.get(key)
        if plain is None:
            plain = _PLAIN[key] = _properties_to_core(header, None, None, None, False)
        return plain, body
    return _properties_to_core(header, props, ma, ap, body is None), (
        body if body is not None else msg.body_and_footer
    )


def _annotation(ma: dict[Any, Any] | None, key: str) -> Any:
    return None if not ma else ma.get(key)


def _properties_to_core(
    header: Header | None,
    props: Properties | None,
    ma: dict[Any, Any] | None,
    ap: dict[Any, Any] | None,
    encoded_body: bool,
) -> bytes:
    flags = 0
    parts: list[bytes] = []
    # Headers in RabbitMQ 4's order: the annotations', the ids', the application
    # properties'; a key given twice keeps its first value.
    headers: list[tuple[str, bytes]] = []
    if ma:
        for key, value in ma.items():
            if isinstance(key, str):
                _annotation_to_core(str(key), value, headers)
    if props is None:
        props = Properties()
    correlation_id = _id_to_core(props.correlation_id, "x-correlation-id", headers)
    message_id = _id_to_core(props.message_id, "x-message-id", headers)
    if ap:
        for key, value in ap.items():
            raw_key = _key(key) if type(key) is str else None
            if raw_key is None:
                continue
            encoded = _field(value)
            if encoded is not None:
                headers.append((key, encoded))
    # content-type, content-encoding
    for flag, value in (
        (_F_CONTENT_TYPE, _shortstr(props.content_type)),
        (_F_CONTENT_ENCODING, _shortstr(props.content_encoding)),
    ):
        if value is not None:
            flags |= flag
            parts.append(_shortstr_field(value))
    if headers:
        flags |= _F_HEADERS
        seen: set[str] = set()
        entries = []
        for key, encoded in headers:
            if key in seen:
                continue  # the first one, as RabbitMQ 4's table lookups find it
            seen.add(key)
            raw_key = key.encode("utf-8", "surrogateescape")
            entries.append(bytes((len(raw_key),)) + raw_key + encoded)
        table = b"".join(entries)
        parts.append(_U32.pack(len(table)) + table)
    # delivery-mode, priority
    durable = header.durable if header is not None else None
    if durable is None:
        mode = _annotation(ma, "x-basic-delivery-mode")
        delivery_mode = mode if isinstance(mode, int) and 0 <= mode <= 255 else None
    else:
        delivery_mode = 2 if durable else 1
    if delivery_mode is not None:
        flags |= _F_DELIVERY_MODE
        parts.append(_U8.pack(delivery_mode))
    priority = header.priority if header is not None else None
    if priority is None:
        priority = _annotation(ma, "x-basic-priority")
    if isinstance(priority, int) and 0 <= priority <= 255:
        flags |= _F_PRIORITY
        parts.append(_U8.pack(priority))
    if correlation_id is not None:
        flags |= _F_CORRELATION_ID
        parts.append(_shortstr_field(correlation_id))
    reply_to = _reply_to_core(props.reply_to)
    if reply_to is not None:
        flags |= _F_REPLY_TO
        parts.append(_shortstr_field(reply_to))
    ttl = header.ttl if header is not None else None
    expiration = str(ttl) if ttl is not None else _shortstr(_annotation(ma, "x-basic-expiration"))
    if expiration is not None:
        flags |= _F_EXPIRATION
        parts.append(_shortstr_field(expiration))
    if message_id is not None:
        flags |= _F_MESSAGE_ID
        parts.append(_shortstr_field(message_id))
    if props.creation_time is not None:
        seconds = props.creation_time // 1000
        if props.creation_time >= 0 and seconds <= MAX_TIMESTAMP:
            flags |= _F_TIMESTAMP
            parts.append(_U64.pack(seconds))
    basic_type = AMQP10_TYPE if encoded_body else _shortstr(_annotation(ma, "x-basic-type"))
    if basic_type is not None:
        flags |= _F_TYPE
        parts.append(_shortstr_field(basic_type))
    user_id = _valid_shortstr(props.user_id) if isinstance(props.user_id, bytes) else None
    if user_id is not None:
        flags |= _F_USER_ID
        parts.append(_shortstr_field(user_id))
    app_id = _shortstr(props.group_id)
    if app_id is not None:
        flags |= _F_APP_ID
        parts.append(_shortstr_field(app_id))
    return _U16.pack(flags) + b"".join(parts)


# --------------------------------------------------------------------------
# Core -> AMQP 1.0.
# --------------------------------------------------------------------------


def _deaths_to_amqp1(value: Any) -> Array | None:
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


def _read_shortstr(raw: bytes, pos: int) -> tuple[str, int]:
    end = pos + 1 + raw[pos]
    return str(raw[pos + 1 : end], "utf-8", "surrogateescape"), end


def from_core(properties: bytes, body: bytes) -> AmqpMessage:
    """The AMQP 1.0 message RabbitMQ 4 makes of a 0-9-1 content (properties and
    body): header, message-annotations, properties, application-properties, and
    the body as one data section (or, for a message of type ``amqp-1.0``, the
    body sections and footer its bytes encode)."""
    raw = properties
    try:
        flags = raw[0] << 8 | raw[1]
        pos = 2
        values: dict[int, Any] = {}
        headers: list[tuple[str, int, Any]] = []
        for bit in range(15, 2, -1):
            flag = 1 << bit
            if not flags & flag:
                continue
            if flag == _F_HEADERS:
                headers = _headers(raw, pos)
                pos += 4 + _U32.unpack_from(raw, pos)[0]
            elif flag in (_F_DELIVERY_MODE, _F_PRIORITY):
                values[flag] = raw[pos]
                pos += 1
            elif flag == _F_TIMESTAMP:
                values[flag] = _U64.unpack_from(raw, pos)[0]
                pos += 8
            else:
                values[flag], pos = _read_shortstr(raw, pos)
    except (IndexError, struct.error) as exc:
        raise DecodeError(f"malformed basic properties: {exc}") from None
    ttl = None
    expiration = values.get(_F_EXPIRATION)
    if expiration is not None:
        try:
            ttl = int(expiration)
        except ValueError:
            ttl = None
        if ttl is not None and not 0 <= ttl <= _UINT32_MAX:
            ttl = None
    header = Header(
        durable=values.get(_F_DELIVERY_MODE) == 2,
        priority=values.get(_F_PRIORITY),
        ttl=ttl,
    )
    ma: dict[Any, Any] = {}
    ap: dict[str, Any] = {}
    for key, tag, value in headers:
        if key.startswith("x-"):
            if key == "x-death":
                deaths = _deaths_to_amqp1(value)
                if deaths is not None:
                    ma[Symbol("x-opt-deaths")] = deaths
                continue
            ma[Symbol(key)] = value
        elif key == "CC" and tag == 0x41:
            ma[Symbol("x-cc")] = value
        elif tag not in (0x41, 0x46):
            ap[key] = value
    user_id = values.get(_F_USER_ID)
    reply_to = values.get(_F_REPLY_TO)
    timestamp = values.get(_F_TIMESTAMP)
    content_type = values.get(_F_CONTENT_TYPE)
    content_encoding = values.get(_F_CONTENT_ENCODING)
    props = Properties(
        message_id=_id_from_core(values.get(_F_MESSAGE_ID)),
        user_id=user_id.encode("utf-8", "surrogateescape") if user_id is not None else None,
        reply_to=_reply_to_amqp1(reply_to) if reply_to is not None else None,
        correlation_id=_id_from_core(values.get(_F_CORRELATION_ID)),
        content_type=Symbol(content_type) if content_type is not None else None,
        content_encoding=Symbol(content_encoding) if content_encoding is not None else None,
        creation_time=Timestamp(timestamp * 1000) if timestamp is not None else None,
        group_id=values.get(_F_APP_ID),
    )
    basic_type = values.get(_F_TYPE)
    msg = AmqpMessage(header=header, properties=props)
    if basic_type == AMQP10_TYPE:
        try:
            sections = decode_sections(body)
        except DecodeError:
            sections = []
        tail = [s for s in sections if isinstance(s, Data | AmqpSequence | AmqpValue)]
        footer = [s for s in sections if isinstance(s, Footer)]
        if tail and len(tail) + len(footer) == len(sections):
            msg.body = tail
            msg.footer = footer[0] if footer else None
            basic_type = None  # the marker, not the publisher's type
    if not msg.body:
        msg.body = [Data(body)]
    if basic_type is not None:
        ma[Symbol("x-basic-type")] = basic_type
    if ma:
        msg.message_annotations = MessageAnnotations(ma)
    if ap:
        msg.application_properties = ApplicationProperties(ap)
    if props == _NO_PROPERTIES:
        msg.properties = None
    return msg


_NO_PROPERTIES = Properties()


def for_delivery(
    msg: AmqpMessage,
    exchange: str,
    routing_key: str,
    delivery_count: int = 0,
    redelivered: bool = False,
) -> bytes:
    """The payload of a transfer to an AMQP 1.0 consumer: the message's header
    with RabbitMQ 4's first-acquirer and delivery-count, its message annotations
    with ``x-exchange`` and ``x-routing-key`` (where it was published), no
    delivery annotations, and its bare message as it was received."""
    old = msg.header
    header = Header(
        # A message published without a header is not durable (3.2.1).
        durable=False if old is None else old.durable,
        priority=None if old is None else old.priority,
        ttl=None if old is None else old.ttl,
        first_acquirer=not redelivered
        and delivery_count == 0
        and not (msg.message_annotations and "x-opt-deaths" in msg.message_annotations.content),
        delivery_count=delivery_count,
    )
    annotations: dict[Any, Any] = {
        Symbol("x-exchange"): exchange,
        Symbol("x-routing-key"): routing_key,
    }
    if msg.message_annotations is not None:
        for key, value in msg.message_annotations.content.items():
            if key not in ("x-exchange", "x-routing-key"):
                annotations[key] = value
    out = AmqpMessage(
        header=header,
        message_annotations=MessageAnnotations(annotations),
        properties=msg.properties,
        application_properties=msg.application_properties,
        body=msg.body,
        footer=msg.footer,
        raw=msg.raw,
        bare_at=msg.bare_at,
        body_at=msg.body_at,
        footer_at=msg.footer_at,
    )
    return encode_message(out)
