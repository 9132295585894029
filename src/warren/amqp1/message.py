"""The AMQP 1.0 message format (part 3, "Messaging", 3.2): its sections, decoded and encoded.

A message is a sequence of described sections: header, delivery-annotations,
message-annotations (the annotated message's head), properties,
application-properties, the body (data sections, amqp-sequence sections or
one amqp-value; the bare message) and a footer. `decode_message` keeps the
payload's bytes beside the decoded sections: the bare message is immutable
(its bytes may be hashed or signed, 3.2), so a broker passes it on as
received and re-encodes only the head it changes (RabbitMQ 4 keeps the
original bare message the same way; a stream stores it as is).

The hot path is a message with one data section and a few properties: the
walk over the sections reads the descriptors and the data section's binary
itself and asks the codec only for the properties list, so nothing else is
built.
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass, field
from typing import Any

from warren.amqp1 import codec
from warren.amqp1.codec import DecodeError
from warren.amqp1.types import Symbol, Timestamp, UInt, ULong

__all__ = [
    "AMQP_VALUE",
    "APPLICATION_PROPERTIES",
    "DATA",
    "AmqpMessage",
    "AmqpSequence",
    "AmqpValue",
    "ApplicationProperties",
    "Data",
    "DeliveryAnnotations",
    "Footer",
    "Header",
    "MessageAnnotations",
    "Properties",
    "decode_message",
    "decode_sections",
    "encode_message",
    "encode_sections",
    "keep_encoded",
]

# Descriptor codes (amqp:<name>:list and so on, domain 0x00000000).
HEADER = 0x70
DELIVERY_ANNOTATIONS = 0x71
MESSAGE_ANNOTATIONS = 0x72
PROPERTIES = 0x73
APPLICATION_PROPERTIES = 0x74
DATA = 0x75
AMQP_SEQUENCE = 0x76
AMQP_VALUE = 0x77
FOOTER = 0x78

_SYMBOLIC: dict[str, int] = {
    "amqp:header:list": HEADER,
    "amqp:delivery-annotations:map": DELIVERY_ANNOTATIONS,
    "amqp:message-annotations:map": MESSAGE_ANNOTATIONS,
    "amqp:properties:list": PROPERTIES,
    "amqp:application-properties:map": APPLICATION_PROPERTIES,
    "amqp:data:binary": DATA,
    "amqp:amqp-sequence:list": AMQP_SEQUENCE,
    "amqp:amqp-value:*": AMQP_VALUE,
    "amqp:footer:map": FOOTER,
}

_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")


@dataclass(slots=True)
class Header:
    """Transport headers (3.2.1). None: the field was absent (the spec's default
    applies: not durable, priority 4, no TTL, not first acquirer, count 0)."""

    durable: bool | None = None
    priority: int | None = None
    ttl: int | None = None  # milliseconds
    first_acquirer: bool | None = None
    delivery_count: int | None = None


@dataclass(slots=True)
class DeliveryAnnotations:
    """Annotations for the next hop only (3.2.2)."""

    content: dict[Any, Any] = field(default_factory=dict)


@dataclass(slots=True)
class MessageAnnotations:
    """Annotations that travel with the message (3.2.3); keys are symbols."""

    content: dict[Any, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Properties:
    """The immutable properties of the bare message (3.2.4). message_id and
    correlation_id are a str, ULong, uuid.UUID or bytes; times are
    milliseconds since the epoch."""

    message_id: str | int | uuid.UUID | bytes | None = None
    user_id: bytes | None = None
    to: str | None = None
    subject: str | None = None
    reply_to: str | None = None
    correlation_id: str | int | uuid.UUID | bytes | None = None
    content_type: str | None = None
    content_encoding: str | None = None
    absolute_expiry_time: int | None = None
    creation_time: int | None = None
    group_id: str | None = None
    group_sequence: int | None = None
    reply_to_group_id: str | None = None


@dataclass(slots=True)
class ApplicationProperties:
    """Application-defined properties (3.2.5): string keys, simple values."""

    content: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Data:
    """An opaque binary body section (3.2.6)."""

    content: bytes = b""


@dataclass(slots=True)
class AmqpSequence:
    """A body section holding a list of AMQP values (3.2.7)."""

    content: list[Any] = field(default_factory=list)


@dataclass(slots=True)
class AmqpValue:
    """A body of one AMQP value (3.2.8)."""

    value: Any = None


@dataclass(slots=True)
class Footer:
    """Annotations computed over the bare message: hashes, signatures (3.2.9)."""

    content: dict[Any, Any] = field(default_factory=dict)


Body = Data | AmqpSequence | AmqpValue
Section = (
    Header
    | DeliveryAnnotations
    | MessageAnnotations
    | Properties
    | ApplicationProperties
    | Data
    | AmqpSequence
    | AmqpValue
    | Footer
)


@dataclass(slots=True)
class AmqpMessage:
    """A message's sections, and, once decoded, the bytes it came in.

    ``raw`` is the whole payload and ``bare_at``/``body_at``/``footer_at`` the
    offsets where the bare message, its body and the footer start (the
    footer's at the end when there is none). `encode_message` sends
    ``raw[bare_at:]`` as is: whoever changes a bare section or the footer of
    a decoded message sets ``raw`` to None.
    """

    header: Header | None = None
    delivery_annotations: DeliveryAnnotations | None = None
    message_annotations: MessageAnnotations | None = None
    properties: Properties | None = None
    application_properties: ApplicationProperties | None = None
    body: list[Body] = field(default_factory=list)
    footer: Footer | None = None
    raw: bytes | None = field(default=None, repr=False, compare=False)
    bare_at: int = field(default=0, repr=False, compare=False)
    body_at: int = field(default=0, repr=False, compare=False)
    footer_at: int = field(default=0, repr=False, compare=False)

    @property
    def bare(self) -> bytes:
        """The bare message's bytes (properties, application-properties, body)."""
        if self.raw is not None:
            return self.raw[self.bare_at : self.footer_at]
        return encode_sections(self._bare_sections())

    @property
    def body_and_footer(self) -> bytes:
        """The body sections and the footer, encoded (RabbitMQ 4's 0-9-1 body for
        a message whose body is not data sections)."""
        if self.raw is not None:
            return self.raw[self.body_at :]
        tail: list[Section] = list(self.body)
        if self.footer is not None:
            tail.append(self.footer)
        return encode_sections(tail)

    def data(self) -> bytes | None:
        """The body's bytes when it is data sections (joined), else None."""
        body = self.body
        if len(body) == 1:
            only = body[0]
            return only.content if isinstance(only, Data) else None
        parts = [s.content for s in body if isinstance(s, Data)]
        return b"".join(parts) if body and len(parts) == len(body) else None

    def _bare_sections(self) -> list[Section]:
        sections: list[Section] = []
        if self.properties is not None:
            sections.append(self.properties)
        if self.application_properties is not None:
            sections.append(self.application_properties)
        sections.extend(self.body)
        return sections


# --------------------------------------------------------------------------
# Decoding.
# --------------------------------------------------------------------------


def _descriptor(buf: bytes, pos: int) -> tuple[int, int]:
    """The section code of the described value at ``pos`` and where its value starts."""
    if buf[pos] != 0x00:
        raise DecodeError(f"a message section must be a described type, at byte {pos}")
    code = buf[pos + 1]
    if code == 0x53:  # smallulong
        return buf[pos + 2], pos + 3
    if code == 0x80:  # ulong
        return _U64.unpack_from(buf, pos + 2)[0], pos + 10
    value, after = codec.decode(buf, pos + 1)
    if isinstance(value, str):
        return _SYMBOLIC.get(value, -1), after
    if isinstance(value, int):
        return value, after
    raise DecodeError(f"a section descriptor that is neither a ulong nor a symbol: {value!r}")


def _binary(buf: bytes, pos: int) -> tuple[bytes, int]:
    code = buf[pos]
    if code == 0xA0:
        end = pos + 2 + buf[pos + 1]
        start = pos + 2
    elif code == 0xB0:
        start = pos + 5
        end = start + _U32.unpack_from(buf, pos + 1)[0]
    else:
        raise DecodeError(f"a data section holds a binary, not format code 0x{code:02x}")
    if end > len(buf):
        raise DecodeError("a data section runs past the end of the message")
    return buf[start:end], end


def _fields(value: Any, what: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise DecodeError(f"the {what} section is not a list")
    return value


def _map(value: Any, what: str) -> dict[Any, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise DecodeError(f"the {what} section is not a map")
    return value


# The types each field may have (None: absent); a value of another type is a
# malformed message, refused before anything acts on it.
_BOOL = (bool,)
_INT = (int,)
_TEXT = (str,)
_ID = (str, int, uuid.UUID, bytes)
_HEADER_TYPES = (_BOOL, _INT, _INT, _BOOL, _INT)
_PROPERTY_TYPES = (
    _ID,
    (bytes,),
    _TEXT,
    _TEXT,
    _TEXT,
    _ID,
    _TEXT,
    _TEXT,
    _INT,
    _INT,
    _TEXT,
    _INT,
    _TEXT,
)


def _checked(items: list[Any], types: tuple[tuple[type, ...], ...], what: str) -> list[Any]:
    n = len(types)
    if len(items) > n:
        items = items[:n]  # fields a later version may add
    for i, value in enumerate(items):
        if value is not None and (
            not isinstance(value, types[i]) or (type(value) is bool and types[i] is not _BOOL)
        ):
            raise DecodeError(f"{what} field {i} has the wrong type ({type(value).__name__})")
    return items + [None] * (n - len(items))


def _header(items: list[Any]) -> Header:
    header = Header(*_checked(items, _HEADER_TYPES, "header"))
    # A ubyte and two uints (a peer may send them as wider types): re-encoded
    # for every delivery, so they must fit.
    if header.priority is not None and not 0 <= header.priority <= 255:
        raise DecodeError(f"header priority {header.priority} is not a ubyte")
    for value in (header.ttl, header.delivery_count):
        if value is not None and not 0 <= value <= 0xFFFFFFFF:
            raise DecodeError(f"header value {value} is not a uint")
    return header


def _properties(items: list[Any]) -> Properties:
    return Properties(*_checked(items, _PROPERTY_TYPES, "properties"))


# Where a section may come: the sections must appear in this order (3.2), the
# body's sections (data or amqp-sequence, repeated, or one amqp-value) after
# application-properties, and the footer last.
_ORDER = {
    HEADER: 0,
    DELIVERY_ANNOTATIONS: 1,
    MESSAGE_ANNOTATIONS: 2,
    PROPERTIES: 3,
    APPLICATION_PROPERTIES: 4,
    DATA: 5,
    AMQP_SEQUENCE: 5,
    AMQP_VALUE: 5,
    FOOTER: 6,
}


def decode_message(payload: bytes | bytearray | memoryview) -> AmqpMessage:
    """The sections of a transfer's payload (one message, possibly several
    transfers' bytes joined). Raises codec.DecodeError for anything that is not a
    message: an unknown or misplaced section, no body, a malformed value."""
    buf = bytes(payload)
    end = len(buf)
    if end >= 5 and buf[:4] == b"\x00\x53\x75\xa0" and buf[4] == end - 5:
        # The whole message is one short data section (a body and nothing else).
        return AmqpMessage(body=[Data(buf[5:])], raw=buf, footer_at=end)
    msg = AmqpMessage(raw=buf)
    pos = 0
    last = -1
    bare_at = body_at = footer_at = -1
    body_code = -1
    try:
        while pos < end:
            start = pos
            code, pos = _descriptor(buf, pos)
            rank = _ORDER.get(code)
            if rank is None:
                raise DecodeError(f"unknown message section (descriptor {code:#x})")
            if rank < last or (rank == last and rank != 5):
                raise DecodeError(f"message section 0x{code:x} out of order")
            if rank >= 3 and bare_at < 0:
                bare_at = start
            if code == DATA:
                if body_code not in (-1, DATA):
                    raise DecodeError("a body mixes data with other sections")
                content, pos = _binary(buf, pos)
                if body_at < 0:
                    body_at = start
                body_code = DATA
                msg.body.append(Data(content))
                last = rank
                continue
            value, pos = codec.decode(buf, pos)
            if code == PROPERTIES:
                msg.properties = _properties(_fields(value, "properties"))
            elif code == HEADER:
                msg.header = _header(_fields(value, "header"))
            elif code == MESSAGE_ANNOTATIONS:
                msg.message_annotations = MessageAnnotations(_map(value, "message-annotations"))
            elif code == APPLICATION_PROPERTIES:
                msg.application_properties = ApplicationProperties(
                    _map(value, "application-properties")
                )
            elif code == DELIVERY_ANNOTATIONS:
                msg.delivery_annotations = DeliveryAnnotations(_map(value, "delivery-annotations"))
            elif code == FOOTER:
                msg.footer = Footer(_map(value, "footer"))
                footer_at = start
            elif code == AMQP_SEQUENCE:
                if body_code not in (-1, AMQP_SEQUENCE):
                    raise DecodeError("a body mixes amqp-sequence with other sections")
                if body_at < 0:
                    body_at = start
                body_code = code
                msg.body.append(AmqpSequence(_fields(value, "amqp-sequence")))
            else:  # AMQP_VALUE
                if body_code != -1:
                    raise DecodeError("an amqp-value body is one section")
                body_at = start
                body_code = code
                msg.body.append(AmqpValue(value))
            last = rank
    except (IndexError, struct.error) as exc:
        raise DecodeError(f"truncated message section: {exc}") from None
    if pos != end:
        raise DecodeError("a message section runs past the end of the payload")
    if body_at < 0:
        raise DecodeError("a message without a body section")
    msg.bare_at = bare_at
    msg.body_at = body_at
    msg.footer_at = end if footer_at < 0 else footer_at
    return msg


def decode_sections(payload: bytes | bytearray | memoryview) -> list[Section]:
    """The sections of encoded bytes that need not be a whole message (a body and
    footer kept as one, as RabbitMQ 4's 0-9-1 view of such a body has it)."""
    buf = bytes(payload)
    sections: list[Section] = []
    pos = 0
    try:
        while pos < len(buf):
            code, pos = _descriptor(buf, pos)
            if code == DATA:
                content, pos = _binary(buf, pos)
                sections.append(Data(content))
                continue
            value, pos = codec.decode(buf, pos)
            if code == HEADER:
                sections.append(_header(_fields(value, "header")))
            elif code == DELIVERY_ANNOTATIONS:
                sections.append(DeliveryAnnotations(_map(value, "delivery-annotations")))
            elif code == MESSAGE_ANNOTATIONS:
                sections.append(MessageAnnotations(_map(value, "message-annotations")))
            elif code == PROPERTIES:
                sections.append(_properties(_fields(value, "properties")))
            elif code == APPLICATION_PROPERTIES:
                sections.append(ApplicationProperties(_map(value, "application-properties")))
            elif code == AMQP_SEQUENCE:
                sections.append(AmqpSequence(_fields(value, "amqp-sequence")))
            elif code == AMQP_VALUE:
                sections.append(AmqpValue(value))
            elif code == FOOTER:
                sections.append(Footer(_map(value, "footer")))
            else:
                raise DecodeError(f"unknown message section 0x{code:x}")
    except (IndexError, struct.error) as exc:
        raise DecodeError(f"truncated message section: {exc}") from None
    if pos != len(buf):
        raise DecodeError("a message section runs past the end of its bytes")
    return sections


# --------------------------------------------------------------------------
# Encoding.
# --------------------------------------------------------------------------


def _opt(kind: type, value: Any) -> Any:
    """``value`` as the AMQP type the field has (a plain int passed for a uint...)."""
    if value is None or type(value) is kind:
        return value
    return kind(value)


def _trimmed(items: list[Any]) -> list[Any]:
    """A section's list without its trailing nulls (absent fields, 1.6.2)."""
    n = len(items)
    while n and items[n - 1] is None:
        n -= 1
    del items[n:]
    return items


def _id(value: Any) -> Any:
    """A message-id or correlation-id: a plain int is a ulong."""
    if isinstance(value, int) and not isinstance(value, ULong | bool):
        return ULong(value)
    return value


def _encode_section(section: Section, out: bytearray) -> None:
    if isinstance(section, Data):
        content = section.content
        n = len(content)
        if n < 256:
            out += b"\x00\x53\x75\xa0"
            out.append(n)
        else:
            out += b"\x00\x53\x75\xb0"
            out += _U32.pack(n)
        out += content
        return
    value: Any
    if isinstance(section, Properties):
        code = PROPERTIES
        p = section
        value = _trimmed(
            [
                _id(p.message_id),
                p.user_id,
                p.to,
                p.subject,
                p.reply_to,
                _id(p.correlation_id),
                _opt(Symbol, p.content_type),
                _opt(Symbol, p.content_encoding),
                _opt(Timestamp, p.absolute_expiry_time),
                _opt(Timestamp, p.creation_time),
                p.group_id,
                _opt(UInt, p.group_sequence),
                p.reply_to_group_id,
            ]
        )
    elif isinstance(section, Header):
        _encode_header(section, out)
        return
    elif isinstance(section, MessageAnnotations):
        code, value = MESSAGE_ANNOTATIONS, _symbol_keys(section.content)
    elif isinstance(section, ApplicationProperties):
        code, value = APPLICATION_PROPERTIES, section.content
    elif isinstance(section, DeliveryAnnotations):
        code, value = DELIVERY_ANNOTATIONS, _symbol_keys(section.content)
    elif isinstance(section, AmqpValue):
        code, value = AMQP_VALUE, section.value
    elif isinstance(section, AmqpSequence):
        code, value = AMQP_SEQUENCE, section.content
    else:  # Footer
        code, value = FOOTER, _symbol_keys(section.content)
    out += b"\x00\x53"
    out.append(code)
    codec.encode(value, out)


def _bool(value: bool | None) -> bytes:
    return b"\x40" if value is None else b"\x41" if value else b"\x42"


def _uint(value: int | None) -> bytes:
    if value is None:
        return b"\x40"
    if value == 0:
        return b"\x43"
    if value < 256:
        return bytes((0x52, value))
    return b"\x70" + _U32.pack(value)


def _encode_header(h: Header, out: bytearray) -> None:
    """The header, written directly: every delivery to a 1.0 client carries one."""
    if h.priority is not None and not 0 <= h.priority <= 255:
        raise ValueError(f"header priority {h.priority} is not a ubyte")
    for name, value in (("ttl", h.ttl), ("delivery-count", h.delivery_count)):
        if value is not None and not 0 <= value <= 0xFFFFFFFF:
            raise ValueError(f"header {name} {value} is not a uint")
    fields = [
        _bool(h.durable),
        b"\x40" if h.priority is None else bytes((0x50, h.priority)),
        _uint(h.ttl),
        _bool(h.first_acquirer),
        _uint(h.delivery_count),
    ]
    while fields and fields[-1] == b"\x40":
        fields.pop()
    if not fields:
        out += b"\x00\x53\x70\x45"  # list0
        return
    body = b"".join(fields)
    out += b"\x00\x53\x70\xc0"
    out.append(len(body) + 1)
    out.append(len(fields))
    out += body


def _symbol_keys(content: dict[Any, Any]) -> dict[Any, Any]:
    """Annotation keys are symbols (or ulongs): a plain str key becomes a symbol."""
    if all(type(k) is not str for k in content):
        return content
    return {Symbol(k) if type(k) is str else k: v for k, v in content.items()}


def encode_sections(sections: list[Section]) -> bytes:
    out = bytearray()
    for section in sections:
        _encode_section(section, out)
    return bytes(out)


def keep_encoded(msg: AmqpMessage) -> bytes:
    """The bare message and footer's bytes, encoded once: a message built rather
    than decoded (mapping.from_core's) keeps them in ``raw``, as a decoded one
    does, for every delivery of it to come."""
    if msg.raw is None:
        if not msg.body:
            raise ValueError("an AMQP 1.0 message needs a body section")
        out = bytearray()
        head = msg._bare_sections()[: -len(msg.body)]
        for section in head:
            _encode_section(section, out)
        body_at = len(out)
        for section in msg.body:
            _encode_section(section, out)
        footer_at = len(out)
        if msg.footer is not None:
            _encode_section(msg.footer, out)
        msg.raw, msg.bare_at, msg.body_at, msg.footer_at = bytes(out), 0, body_at, footer_at
    return msg.raw[msg.bare_at :]


def encode_message(msg: AmqpMessage) -> bytes:
    """The message's bytes: its head encoded, its bare message and footer as they
    came when it was decoded (``raw``), else encoded from the sections."""
    out = bytearray()
    if msg.header is not None:
        _encode_section(msg.header, out)
    if msg.delivery_annotations is not None:
        _encode_section(msg.delivery_annotations, out)
    if msg.message_annotations is not None:
        _encode_section(msg.message_annotations, out)
    if msg.raw is not None:
        out += msg.raw[msg.bare_at :]
        return bytes(out)
    if not msg.body:
        raise ValueError("an AMQP 1.0 message needs a body section")
    for section in msg._bare_sections():
        _encode_section(section, out)
    if msg.footer is not None:
        _encode_section(msg.footer, out)
    return bytes(out)
