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
the value is left out. Header values keep their AMQP types both ways
(field_values.py).

What the 0-9-1 form cannot carry (``to``, ``subject``, typed ids and
application properties, amqp-value and amqp-sequence bodies, a footer,
creation-time's milliseconds...) is not lost: `keep_native` gives the bare
message as received when mapping it to the core and back does not give the
same bytes, the core message keeps it (Message.native), and `from_core`
delivers it verbatim after the header and annotations the broker made, as
RabbitMQ 4 keeps a message in its native format.
"""

from __future__ import annotations

import contextlib
import re
import struct
import uuid
from typing import Any
from urllib.parse import quote, unquote_to_bytes

from warren.amqp1.field_values import (
    deaths_to_amqp1,
    deaths_to_core,
    key_bytes,
    longstr,
    read_headers,
    to_field,
)
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
    decode_message,
    decode_sections,
    encode_sections,
    keep_encoded,
)
from warren.amqp1.types import Symbol, Timestamp
from warren.core.codec_errors import DecodeError
from warren.core.table import MAX_TIMESTAMP

__all__ = [
    "AMQP10_TYPE",
    "for_delivery",
    "from_core",
    "keep_native",
    "to_core",
    "unmapped_annotations",
]

#: The 0-9-1 ``type`` of a message whose 1.0 body is not data sections: its
#: body is then the encoded body sections and footer.
AMQP10_TYPE = "amqp-1.0"

_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_U64 = struct.Struct(">Q")

_UINT32_MAX = (1 << 32) - 1
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
        headers.append((header, longstr(raw)))
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
    try:
        # Not UTF-8: no queue could have that name (Warren refuses such a shortstr).
        return unquote_to_bytes(encoded).decode("utf-8")
    except UnicodeDecodeError:
        return None


def _reply_to_amqp1(reply_to: str) -> str:
    return "/queues/" + quote(reply_to, safe="", errors="surrogateescape")


# --------------------------------------------------------------------------
# AMQP 1.0 -> core.
# --------------------------------------------------------------------------


def _shortstr_field(text: str) -> bytes:
    raw = text.encode("utf-8", "surrogateescape")
    return _U8.pack(len(raw)) + raw


def _annotation_to_core(key: str, value: Any, headers: list[tuple[str, bytes]]) -> None:
    if key == "x-cc":
        encoded = to_field(value)
        if encoded is not None:
            headers.append(("CC", encoded))
    elif key == "x-opt-rabbitmq-received-time":
        if isinstance(value, int) and not isinstance(value, bool):
            with contextlib.suppress(struct.error):
                headers.append(("timestamp_in_ms", b"l" + _I64.pack(value)))
    elif key == "x-opt-deaths":
        encoded = deaths_to_core(value)
        if encoded is not None:
            headers.append(("x-death", encoded))
    elif key.startswith("x-") and key not in _INTERNAL and not key.startswith("x-basic-"):
        encoded = to_field(value)
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


def keep_native(msg: AmqpMessage, properties: bytes, body: bytes) -> bytes | None:
    """The bare message and footer ``msg`` was published with, when its core
    form (``properties`` and ``body``, to_core's) does not map back to the same
    message; None when it does (the common message: nothing more to store).

    Definitive: from_core's bare message and footer against the received
    ones, both encoded by this codec's encoder, which writes a value's AMQP
    type and nothing else of how it was received: clients encode the same
    values in different widths (proton sends an empty properties list and
    32-bit maps), which is no loss; a type, a field or a section that does
    not come back is. Data sections are compared as bytes, not copied into
    an encoding. A bare message of one data section and no properties, with
    no annotations that to_core would turn into application properties,
    always maps back: that one, the hot path, is not mapped back, nor is
    one whose properties and application properties are all of the kinds
    that come back unchanged (`_simple_properties`: string ids, a content
    type...; tests/protocol/amqp1/test_native_messages.py checks the
    shortcuts against mapping back), nor one with what to_core never
    converts (``to``, ``subject``..., several data sections, a footer after
    data)."""
    raw = msg.raw
    if raw is None:  # built, not received: nothing to keep verbatim
        return None
    props = msg.properties
    if props is not None and props == _NO_PROPERTIES:
        props = None
    ap = msg.application_properties
    if ap is not None and not ap.content:
        ap = None
    sent = msg.body
    if (
        msg.message_annotations is None
        and msg.footer is None
        and len(sent) == 1
        and isinstance(sent[0], Data)
        and (props is None or _simple_properties(props))
        and (ap is None or _simple_application_properties(ap.content))
    ):
        return None
    if (props is not None and _unmapped(props)) or (
        isinstance(sent[0], Data) and (len(sent) > 1 or msg.footer is not None)
    ):
        return raw[msg.bare_at :]  # what to_core never converts: no need to map back
    back = from_core(properties, body)
    if _canonical(props, ap, sent, msg.footer) == _canonical(
        back.properties, back.application_properties, back.body, back.footer
    ):
        return None
    return raw[msg.bare_at :]


def _unmapped(p: Properties) -> bool:
    """Whether ``p`` has a field to_core does not convert (docs/amqp1.md)."""
    return (
        p.to is not None
        or p.subject is not None
        or p.absolute_expiry_time is not None
        or p.group_sequence is not None
        or p.reply_to_group_id is not None
    )


def _simple_properties(p: Properties) -> bool:
    """Whether to_core and from_core carry every field of ``p`` both ways as
    it is (keep_native's shortcut; when in doubt, False: mapping back
    decides)."""
    if _unmapped(p):
        return False
    for value in (p.message_id, p.correlation_id):
        if value is None or type(value) is uuid.UUID:
            continue
        # 45 characters may be a urn:uuid, which comes back as a uuid.
        if type(value) is not str or len(value) == 45 or _shortstr(value) is None:
            return False
    for value in (p.content_type, p.content_encoding):
        if value is not None and not (
            type(value) is Symbol and value.isascii() and len(value) < 256
        ):
            return False
    user_id = p.user_id
    if user_id is not None and (type(user_id) is not bytes or _valid_shortstr(user_id) is None):
        return False
    reply_to = p.reply_to
    if reply_to is not None:
        if type(reply_to) is not str or not reply_to.startswith("/queues/"):
            return False
        queue = _reply_to_core(reply_to)
        if queue is None or _reply_to_amqp1(queue) != reply_to:
            return False
    created = p.creation_time
    if created is not None and not (
        type(created) is Timestamp and created >= 0 and created % 1000 == 0
        and created // 1000 <= MAX_TIMESTAMP
    ):  # fmt: skip
        return False
    group_id = p.group_id
    return group_id is None or (type(group_id) is str and _shortstr(group_id) is not None)


#: The longest string header value from_core gives back as a string.
_LONGEST_STRING = 4096


def _simple_application_properties(content: dict[Any, Any]) -> bool:
    """Whether to_core and from_core carry these application properties both
    ways as they are: shortstr keys that are not annotations' (``x-``),
    values that are strings (short, no NUL), booleans or longs."""
    for key, value in content.items():
        if type(key) is not str or key.startswith("x-") or key_bytes(key) is None:
            return False
        kind = type(value)
        if kind is str:
            raw = value.encode("utf-8", "surrogateescape")
            if len(raw) > _LONGEST_STRING or b"\x00" in raw:
                return False
        elif kind is not bool and kind is not int:
            return False
    return True


def _canonical(
    props: Properties | None,
    ap: ApplicationProperties | None,
    body: list[Any],
    footer: Footer | None,
) -> tuple[bytes, list[bytes] | bytes]:
    """Sections as keep_native compares them: all but the body encoded, and
    the body's data sections' bytes (other body sections encoded)."""
    sections: list[Any] = [s for s in (props, ap, footer) if s is not None]
    if all(isinstance(s, Data) for s in body):
        return encode_sections(sections), [s.content for s in body]
    return encode_sections(sections), encode_sections(body)


def _is_octet(value: Any) -> bool:
    return type(value) is not bool and isinstance(value, int) and 0 <= value <= 255


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
            raw_key = key_bytes(key) if type(key) is str else None
            if raw_key is None:
                continue
            encoded = to_field(value)
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
        delivery_mode = mode if _is_octet(mode) else None
    else:
        delivery_mode = 2 if durable else 1
    if delivery_mode is not None:
        flags |= _F_DELIVERY_MODE
        parts.append(_U8.pack(delivery_mode))
    priority = header.priority if header is not None else None
    if priority is None:
        priority = _annotation(ma, "x-basic-priority")
    if _is_octet(priority):
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
    if ttl is not None:
        expiration: str | None = str(ttl)
    else:  # 0-9-1's expiration as RabbitMQ 4 kept it, if it is one (digits)
        expiration = _shortstr(_annotation(ma, "x-basic-expiration"))
        if expiration is not None and not (expiration.isascii() and expiration.isdigit()):
            expiration = None
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


def _symbol(text: str | None) -> Symbol | None:
    """A 0-9-1 content type or encoding as the 1.0 symbol, which must be ASCII."""
    return Symbol(text) if text is not None and text.isascii() else None


def _read_shortstr(raw: bytes, pos: int) -> tuple[str, int]:
    end = pos + 1 + raw[pos]
    return str(raw[pos + 1 : end], "utf-8", "surrogateescape"), end


def from_core(properties: bytes, body: bytes, native: bytes | None = None) -> AmqpMessage:
    """The AMQP 1.0 message RabbitMQ 4 makes of a 0-9-1 content (properties and
    body): header, message-annotations, properties, application-properties, and
    the body as one data section (or, for a message of type ``amqp-1.0``, the
    body sections and footer its bytes encode). With the message's ``native``
    bare message (Message.native), the header and annotations are the 0-9-1
    properties' (what the broker changes) and the bare message is ``native``."""
    if native is not None:
        return _with_native(from_core(properties, b""), native)
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
                headers = read_headers(raw, pos)
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
                deaths = deaths_to_amqp1(value)
                if deaths is not None:
                    ma[Symbol("x-opt-deaths")] = deaths
                continue
            if key.isascii():  # an annotation's key is a symbol
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
        content_type=_symbol(content_type),
        content_encoding=_symbol(content_encoding),
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
#: How a message-annotations section starts (its descriptor, a smallulong), as
#: unmapped_annotations encodes it.
_ANNOTATIONS_AT = b"\x00\x53\x72"


def unmapped_annotations(msg: AmqpMessage) -> bytes:
    """The message annotations of ``msg`` that the core's properties do not
    carry (to_core makes headers of ``x-`` keys only), as a section to keep
    before the bare message in Message.native, where from_core finds them
    again; b"" when there are none. The stream protocol's codec keeps them so
    (RabbitMQ keeps a stream message's annotations whole); AMQP 0-9-1
    consumers do not see them, as in RabbitMQ."""
    annotations = msg.message_annotations
    if annotations is None:
        return b""
    kept = {
        key: value
        for key, value in annotations.content.items()
        if not (isinstance(key, str) and key.startswith("x-"))
    }
    return encode_sections([MessageAnnotations(kept)]) if kept else b""


#: Headers to_core makes of a bare message's ids (not annotations).
_ID_HEADERS = ("x-message-id", "x-correlation-id")


def _with_native(msg: AmqpMessage, native: bytes) -> AmqpMessage:
    """``msg`` (from_core's) with ``native`` as its bare message and footer, and
    without the annotations to_core made of that bare message (its long or
    binary ids, its ``x-`` application properties): those are in ``native``.
    A message-annotations section before the bare message (unmapped_annotations')
    adds its annotations to the core's."""
    bare_at = 0
    unmapped: dict[Any, Any] = {}
    if native.startswith(_ANNOTATIONS_AT):
        with contextlib.suppress(DecodeError):
            kept = decode_message(native)
            if kept.message_annotations is not None and kept.bare_at > 0:
                unmapped, bare_at = kept.message_annotations.content, kept.bare_at
    annotations = msg.message_annotations
    if annotations is not None:
        bare: list[Any] = []
        with contextlib.suppress(DecodeError):
            bare = decode_sections(native)
        content = annotations.content
        for section in bare:
            if isinstance(section, Properties):
                for key, value in zip(
                    _ID_HEADERS, (section.message_id, section.correlation_id), strict=True
                ):
                    if value is not None:
                        content.pop(key, None)
            elif isinstance(section, ApplicationProperties):
                for key in section.content:
                    content.pop(key, None)
        if content.get("x-basic-type") == AMQP10_TYPE:  # the core's mark of a non-data body
            del content["x-basic-type"]
        if not content:
            msg.message_annotations = None
    if unmapped:
        if msg.message_annotations is None:
            msg.message_annotations = MessageAnnotations({})
        content = msg.message_annotations.content
        for key, value in unmapped.items():
            content.setdefault(key, value)
    msg.raw, msg.bare_at = native, bare_at
    return msg


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
    annotations = msg.message_annotations
    header = Header(
        # A message published without a header is not durable (3.2.1).
        durable=False if old is None else old.durable,
        priority=None if old is None else old.priority,
        ttl=None if old is None else old.ttl,
        first_acquirer=not redelivered
        and delivery_count == 0
        and not (annotations is not None and "x-opt-deaths" in annotations.content),
        delivery_count=delivery_count,
    )
    content: dict[Any, Any] = {_X_EXCHANGE: exchange, _X_ROUTING_KEY: routing_key}
    if annotations is not None:
        for key, value in annotations.content.items():
            if key != "x-exchange" and key != "x-routing-key":
                content[key] = value
    return encode_sections([header, MessageAnnotations(content)]) + keep_encoded(msg)


_X_EXCHANGE = Symbol("x-exchange")
_X_ROUTING_KEY = Symbol("x-routing-key")
