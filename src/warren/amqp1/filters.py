"""A stream consumer's source filters, as RabbitMQ 4.1 reads an attach's filter-set.

A link consuming from a stream may ask, in its source's filter map, where to
start (``rabbitmq:stream-offset-spec``), for the messages carrying some
``x-stream-filter-value`` (``rabbitmq:stream-filter``, with
``rabbitmq:stream-match-unfiltered`` for those carrying none) and for those
whose properties or application properties match (the AMQP Filter
Expressions draft's ``amqp:properties-filter`` and
``amqp:application-properties-filter``, §4). The first three become the
consumer arguments 0-9-1 has for them (core/stream_queue.py reads them); the
property filters become the consumer's ``message_filter``, a test of the core
message that core/stream_delivery.py applies before a delivery, so a message
that fails it is never sent and never waits for a settlement.

As RabbitMQ 4.1 does, a filter it does not know or cannot read is left out
rather than refused, the attach's answer carries the filters applied (the
client compares), an undescribed ``rabbitmq:stream-*`` value is read as
described by its key (4.1's deprecated ``amqp_filter_set_bug``), and a
second filter of the same section is left out (the later one in the map
wins, RabbitMQ's fold goes from the end).

Matching (the draft's §4.1.1, as RabbitMQ 4.1 evaluates it): a field the
message lacks does not match, except against a null reference value (only an
application property can have one: the key must be there); numbers compare
by value whatever their AMQP types; strings, symbols and binaries by their
bytes; a string reference ``&p:x`` matches a value starting with ``x``,
``&s:x`` one ending with it, ``&&x`` the value ``&x``, and any other string
starting with ``&`` makes the filter unreadable.

The message is read through message_view, the one place that knows how the
core message holds a 1.0 message's properties.
"""

from __future__ import annotations

import datetime
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from warren.amqp1.errors import PRECONDITION_FAILED, LinkError
from warren.amqp1.mapping import from_core
from warren.amqp1.message import Properties
from warren.amqp1.types import Described, Symbol, Timestamp, UInt, ULong
from warren.core.codec_errors import DecodeError

if TYPE_CHECKING:
    from warren.core.message import Message

__all__ = [
    "APPLICATION_PROPERTIES_FILTER",
    "PROPERTIES_FILTER",
    "STREAM_FILTER",
    "STREAM_MATCH_UNFILTERED",
    "STREAM_OFFSET_SPEC",
    "PropertyFilter",
    "StreamFilters",
    "message_view",
    "stream_filters",
]

STREAM_OFFSET_SPEC: Final = Symbol("rabbitmq:stream-offset-spec")
STREAM_FILTER: Final = Symbol("rabbitmq:stream-filter")
STREAM_MATCH_UNFILTERED: Final = Symbol("rabbitmq:stream-match-unfiltered")
PROPERTIES_FILTER: Final = Symbol("amqp:properties-filter")
APPLICATION_PROPERTIES_FILTER: Final = Symbol("amqp:application-properties-filter")
_PROPERTIES_CODE: Final = 0x173
_APPLICATION_PROPERTIES_CODE: Final = 0x174
#: Fields in one filter at most ("a limit on the complexity", the draft's §7.1).
MAX_FIELDS: Final = 16


# -- the attach's filter-set ------------------------------------------------------------
@dataclass(slots=True)
class StreamFilters:
    """What a stream consumer's source filters ask for."""

    #: Consumer arguments: x-stream-offset, x-stream-filter, x-stream-match-unfiltered.
    arguments: dict[str, Any]
    #: The property filters, None when there are none.
    predicate: PropertyFilter | None
    #: The filter-set applied, for the attach's answer.
    applied: dict[Any, Any]


def stream_filters(filters: dict[Any, Any] | None) -> StreamFilters:
    """Read a source's filter-set for a stream (LinkError: an offset spec of no
    offset's type)."""
    arguments: dict[str, Any] = {}
    sections: dict[str, tuple[tuple[str, Any], ...]] = {}
    applied: list[tuple[Any, Any]] = []
    # RabbitMQ 4.1 folds from the end: of two arguments the first in the map
    # counts (its list keeps both, lookups find the first); of two filters of
    # one section the last.
    for key, value in reversed(list((filters or {}).items())):
        if not isinstance(key, Symbol):
            continue
        if not isinstance(value, Described) and key.startswith("rabbitmq:stream-"):
            value = Described(key, value)
        if not isinstance(value, Described):
            continue
        descriptor, inner = value.descriptor, value.value
        if descriptor == STREAM_OFFSET_SPEC and isinstance(descriptor, Symbol):
            offset = _stream_offset(inner)
            if offset is None:
                continue
            arguments["x-stream-offset"] = offset
        elif descriptor == STREAM_FILTER and isinstance(descriptor, Symbol):
            if type(inner) is str:
                arguments["x-stream-filter"] = inner
            elif isinstance(inner, list):
                arguments["x-stream-filter"] = [v for v in inner if type(v) is str]
            else:
                continue
        elif descriptor == STREAM_MATCH_UNFILTERED and isinstance(descriptor, Symbol):
            if not isinstance(inner, bool):
                continue
            arguments["x-stream-match-unfiltered"] = inner
        else:
            parsed = _parse_property_filter(descriptor, inner)
            if parsed is None or parsed[0] in sections:
                continue
            sections[parsed[0]] = parsed[1]
        applied.append((key, value))
    predicate = None
    if sections:
        predicate = PropertyFilter(sections.get("properties", ()), sections.get("application", ()))
    return StreamFilters(arguments, predicate, dict(reversed(applied)))


def _stream_offset(value: Any) -> Any:
    """The ``x-stream-offset`` of an offset spec (None: none), as core/stream.py's
    parse_start reads it."""
    if value is None:
        return None
    if isinstance(value, Timestamp):
        return datetime.datetime.fromtimestamp(value / 1000, tz=datetime.UTC)
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        return value
    raise LinkError(PRECONDITION_FAILED, f"bad {STREAM_OFFSET_SPEC} {value!r:.60}")


# -- the property filters ---------------------------------------------------------------
class _Affix:
    """A ``&p:`` or ``&s:`` reference value: the value's bytes start or end with these."""

    __slots__ = ("raw", "suffix")

    def __init__(self, raw: bytes, suffix: bool) -> None:
        self.raw = raw
        self.suffix = suffix

    def matches(self, value: Any) -> bool:
        raw = _binary(value)
        if raw is None:
            return False
        return raw.endswith(self.raw) if self.suffix else raw.startswith(self.raw)


class _Unreadable(Exception):
    """A filter RabbitMQ 4.1 would leave out."""


def _string_reference(value: str) -> str | _Affix:
    """A string reference value with the draft's modifiers read (§4.1.1)."""
    if not value.startswith("&"):
        return value
    if value.startswith("&s:") or value.startswith("&p:"):
        return _Affix(value[3:].encode("utf-8", "surrogateescape"), value[1] == "s")
    if value.startswith("&&"):
        return value[1:]
    raise _Unreadable(value)


def _id_reference(value: Any) -> Any:
    if isinstance(value, (ULong, uuid.UUID)) or type(value) is bytes:
        return value
    if type(value) is str:
        return _string_reference(value)
    raise _Unreadable(value)


def _string(value: Any) -> Any:
    if type(value) is str:
        return _string_reference(value)
    raise _Unreadable(value)


def _of(kind: type) -> Any:
    """A reader of reference values of one AMQP type (a binary: bytes exactly,
    which no decimal, also bytes here, is)."""

    def check(value: Any) -> Any:
        if type(value) is kind if kind is bytes else isinstance(value, kind):
            return value
        raise _Unreadable(value)

    return check


#: The properties a properties filter may name: their Properties field and how
#: their reference value reads (the type each must have, as RabbitMQ 4.1 takes it).
_PROPERTY_FIELDS: Final[dict[str, tuple[str, Any]]] = {
    "message-id": ("message_id", _id_reference),
    "user-id": ("user_id", _of(bytes)),
    "to": ("to", _string),
    "subject": ("subject", _string),
    "reply-to": ("reply_to", _string),
    "correlation-id": ("correlation_id", _id_reference),
    "content-type": ("content_type", _of(Symbol)),
    "content-encoding": ("content_encoding", _of(Symbol)),
    "absolute-expiry-time": ("absolute_expiry_time", _of(Timestamp)),
    "creation-time": ("creation_time", _of(Timestamp)),
    "group-id": ("group_id", _string),
    "group-sequence": ("group_sequence", _of(UInt)),
    "reply-to-group-id": ("reply_to_group_id", _string),
}


_SECTIONS: Final[dict[str, str]] = {
    PROPERTIES_FILTER: "properties",
    APPLICATION_PROPERTIES_FILTER: "application",
}
_SECTION_CODES: Final[dict[int, str]] = {
    _PROPERTIES_CODE: "properties",
    _APPLICATION_PROPERTIES_CODE: "application",
}


def _parse_property_filter(
    descriptor: Any, value: Any
) -> tuple[str, tuple[tuple[str, Any], ...]] | None:
    """A properties or application-properties filter's section and (field,
    reference) pairs; None: not one, or unreadable."""
    if isinstance(descriptor, Symbol):
        section = _SECTIONS.get(str(descriptor))
    elif isinstance(descriptor, ULong):
        section = _SECTION_CODES.get(int(descriptor))
    else:
        section = None
    if section is None:
        return None
    if not isinstance(value, dict) or not 0 < len(value) <= MAX_FIELDS:
        return None
    pairs: list[tuple[str, Any]] = []
    try:
        for key, reference in value.items():
            if section == "properties":
                known = _PROPERTY_FIELDS.get(key) if isinstance(key, Symbol) else None
                if known is None:
                    return None
                name, read = known
                pairs.append((name, read(reference)))
            else:
                if type(key) is not str:  # a string, not a symbol
                    return None
                pairs.append((key, _string(reference) if type(reference) is str else reference))
    except _Unreadable:
        return None
    return section, tuple(pairs)


class PropertyFilter:
    """A consumer's properties and application-properties filters: a message passes
    when every field named matches (core/consumer.py's MessageFilter)."""

    __slots__ = ("properties", "application")

    def __init__(
        self,
        properties: tuple[tuple[str, Any], ...],
        application: tuple[tuple[str, Any], ...],
    ) -> None:
        self.properties = properties
        self.application = application

    def __call__(self, msg: Message) -> bool:
        try:
            props, application = message_view(msg)
        except DecodeError:
            return False  # properties no client could have sent: no match
        for name, reference in self.properties:
            value = None if props is None else getattr(props, name)
            if value is None or not _matches(reference, value):
                return False
        for key, reference in self.application:
            if key not in application:
                return False
            if reference is not None and not _matches(reference, application[key]):
                return False
        return True


def _binary(value: Any) -> bytes | None:
    """A value as the bytes RabbitMQ compares (strings, symbols, binaries and
    uuids are binaries there); None: not one."""
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape")
    if isinstance(value, bytes):
        return bytes(value)
    if isinstance(value, uuid.UUID):
        return value.bytes
    return None


def _matches(reference: Any, value: Any) -> bool:
    if isinstance(reference, _Affix):
        return reference.matches(value)
    if isinstance(reference, bool) or isinstance(value, bool):
        return isinstance(reference, bool) and isinstance(value, bool) and reference is value
    if isinstance(reference, (int, float)) and isinstance(value, (int, float)):
        return reference == value
    ref_raw = _binary(reference)
    if ref_raw is not None:
        return ref_raw == _binary(value)
    return bool(reference == value)


# -- the message's side -----------------------------------------------------------------
def message_view(msg: Message) -> tuple[Properties | None, dict[str, Any]]:
    """The 1.0 properties and application properties a filter sees in a core
    message: RabbitMQ 4's view of it (mapping.py's from_core), with a binary
    or long message-id or correlation-id that 0-9-1 could not carry (kept in
    its ``x-message-id`` or ``x-correlation-id`` header) put back."""
    amqp = from_core(msg.properties, b"")
    props = amqp.properties
    annotations = amqp.message_annotations
    if annotations is not None:
        content = annotations.content
        message_id = content.get("x-message-id")
        correlation_id = content.get("x-correlation-id")
        if message_id is not None or correlation_id is not None:
            props = props if props is not None else Properties()
            if props.message_id is None and isinstance(message_id, (str, bytes)):
                props.message_id = message_id
            if props.correlation_id is None and isinstance(correlation_id, (str, bytes)):
                props.correlation_id = correlation_id
    application = amqp.application_properties
    return props, application.content if application is not None else {}
