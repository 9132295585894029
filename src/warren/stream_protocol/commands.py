"""Every stream protocol command as a slotted dataclass, its wire layout
declared once as FIELDS (name, field type) in wire order.

A frame is ``Size(uint32) Key(uint16) Version(uint16) Body``; a response sets
the key's high bit (RESPONSE_BIT). Most requests and responses start their
body with a correlation id, which is then the first field here. The layouts
follow RabbitMQ's parser (rabbit_stream_core) where PROTOCOL.adoc is loose:
Tune's and Credit's responses carry no correlation id, Subscribe's and Open's
trailing property maps are left out when empty, PublishError carries a code
per publishing id. Publish and Deliver, the hot path, are in publish.py.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, Self

from warren.stream_protocol.constants import RESPONSE_BIT, Key, OffsetType, ResponseCode
from warren.stream_protocol.wire import (
    ANSWERED_OFFSET_SPEC,
    BOOL8,
    BROKERS,
    BYTES,
    COMMAND_VERSIONS,
    INT_MAP,
    MAP,
    OFFSET_SPEC,
    OPT_BYTES,
    OPT_MAP,
    PUBLISHING_ERRORS,
    STR,
    STREAM_METADATA,
    STRS,
    U8,
    U16,
    U32,
    U64,
    U64S,
    Broker,
    CommandVersion,
    FieldType,
    OffsetSpec,
    PublishingError,
    Reader,
    StreamMetadata,
)

__all__ = [
    "COMMANDS",
    "Close",
    "CloseResponse",
    "Command",
    "ConsumerUpdate",
    "ConsumerUpdateResponse",
    "Create",
    "CreateResponse",
    "CreateSuperStream",
    "CreateSuperStreamResponse",
    "Credit",
    "CreditResponse",
    "DeclarePublisher",
    "DeclarePublisherResponse",
    "Delete",
    "DeletePublisher",
    "DeletePublisherResponse",
    "DeleteResponse",
    "DeleteSuperStream",
    "DeleteSuperStreamResponse",
    "ExchangeCommandVersions",
    "ExchangeCommandVersionsResponse",
    "Heartbeat",
    "Metadata",
    "MetadataResponse",
    "MetadataUpdate",
    "Open",
    "OpenResponse",
    "Partitions",
    "PartitionsResponse",
    "PeerProperties",
    "PeerPropertiesResponse",
    "PublishConfirm",
    "PublishError",
    "QueryOffset",
    "QueryOffsetResponse",
    "QueryPublisherSequence",
    "QueryPublisherSequenceResponse",
    "ResolveOffsetSpec",
    "ResolveOffsetSpecResponse",
    "Route",
    "RouteResponse",
    "SaslAuthenticate",
    "SaslAuthenticateResponse",
    "SaslHandshake",
    "SaslHandshakeResponse",
    "StoreOffset",
    "StreamStats",
    "StreamStatsResponse",
    "Subscribe",
    "SubscribeResponse",
    "Tune",
    "TuneResponse",
    "Unsubscribe",
    "UnsubscribeResponse",
]

_HEAD: Final = struct.Struct(">IHH")
_SIZE: Final = struct.Struct(">I")
_OK: Final = int(ResponseCode.OK)

#: (key with the response bit, version) -> the command class decoding it.
COMMANDS: dict[tuple[int, int], type[Command]] = {}


class Command:
    """A frame's command. Subclasses declare KEY, RESPONSE, VERSIONS and FIELDS."""

    __slots__ = ()
    KEY: ClassVar[Key]
    RESPONSE: ClassVar[bool] = False
    VERSIONS: ClassVar[tuple[int, ...]] = (1,)
    FIELDS: ClassVar[tuple[tuple[str, FieldType], ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "KEY" in cls.__dict__:
            wire_key = cls.KEY | (RESPONSE_BIT if cls.RESPONSE else 0)
            for version in cls.VERSIONS:
                COMMANDS[(wire_key, version)] = cls

    @property
    def version(self) -> int:
        """The version this command is written with."""
        return self.VERSIONS[0]

    def encode(self) -> bytes:
        """The whole frame, size prefix included."""
        out = bytearray(8)
        key = self.KEY | (RESPONSE_BIT if self.RESPONSE else 0)
        _HEAD.pack_into(out, 0, 0, key, self.version)
        self.encode_body(out)
        _SIZE.pack_into(out, 0, len(out) - 4)
        return bytes(out)

    def encode_body(self, out: bytearray) -> None:
        for name, ftype in self.FIELDS:
            ftype.put(out, getattr(self, name))

    @classmethod
    def decode_body(cls, r: Reader, version: int) -> Self:
        """The command from the bytes after key and version (``r`` must then be
        at the frame's end: the caller checks)."""
        return cls(**{name: ftype.get(r) for name, ftype in cls.FIELDS})


_CORR: Final = ("correlation_id", U32)
_CODE: Final = ("code", U16)


# --- publishers ---------------------------------------------------------------


@dataclass(slots=True)
class DeclarePublisher(Command):
    KEY = Key.DECLARE_PUBLISHER
    FIELDS = (_CORR, ("publisher_id", U8), ("reference", STR), ("stream", STR))
    correlation_id: int
    publisher_id: int
    reference: str
    stream: str


@dataclass(slots=True)
class DeclarePublisherResponse(Command):
    KEY = Key.DECLARE_PUBLISHER
    RESPONSE = True
    FIELDS = (_CORR, _CODE)
    correlation_id: int
    code: int = _OK


@dataclass(slots=True)
class PublishConfirm(Command):
    KEY = Key.PUBLISH_CONFIRM
    FIELDS = (("publisher_id", U8), ("publishing_ids", U64S))
    publisher_id: int
    publishing_ids: list[int]


@dataclass(slots=True)
class PublishError(Command):
    KEY = Key.PUBLISH_ERROR
    FIELDS = (("publisher_id", U8), ("errors", PUBLISHING_ERRORS))
    publisher_id: int
    errors: list[PublishingError]


@dataclass(slots=True)
class QueryPublisherSequence(Command):
    KEY = Key.QUERY_PUBLISHER_SEQUENCE
    FIELDS = (_CORR, ("reference", STR), ("stream", STR))
    correlation_id: int
    reference: str
    stream: str


@dataclass(slots=True)
class QueryPublisherSequenceResponse(Command):
    KEY = Key.QUERY_PUBLISHER_SEQUENCE
    RESPONSE = True
    FIELDS = (_CORR, _CODE, ("sequence", U64))
    correlation_id: int
    code: int
    sequence: int


@dataclass(slots=True)
class DeletePublisher(Command):
    KEY = Key.DELETE_PUBLISHER
    FIELDS = (_CORR, ("publisher_id", U8))
    correlation_id: int
    publisher_id: int


@dataclass(slots=True)
class DeletePublisherResponse(Command):
    KEY = Key.DELETE_PUBLISHER
    RESPONSE = True
    FIELDS = (_CORR, _CODE)
    correlation_id: int
    code: int = _OK


# --- consumers ------------------------------------------------------------------


@dataclass(slots=True)
class Subscribe(Command):
    """Properties: single-active-consumer, super-stream, filter.N, match-unfiltered."""

    KEY = Key.SUBSCRIBE
    FIELDS = (
        _CORR,
        ("subscription_id", U8),
        ("stream", STR),
        ("offset", OFFSET_SPEC),
        ("credit", U16),
        ("properties", OPT_MAP),
    )
    correlation_id: int
    subscription_id: int
    stream: str
    offset: OffsetSpec
    credit: int
    properties: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class SubscribeResponse(Command):
    KEY = Key.SUBSCRIBE
    RESPONSE = True
    FIELDS = (_CORR, _CODE)
    correlation_id: int
    code: int = _OK


@dataclass(slots=True)
class Credit(Command):
    """More chunks for a subscription; answered only when it fails (CreditResponse)."""

    KEY = Key.CREDIT
    FIELDS = (("subscription_id", U8), ("credit", U16))
    subscription_id: int
    credit: int


@dataclass(slots=True)
class CreditResponse(Command):
    KEY = Key.CREDIT
    RESPONSE = True
    FIELDS = (_CODE, ("subscription_id", U8))
    code: int
    subscription_id: int


@dataclass(slots=True)
class StoreOffset(Command):
    KEY = Key.STORE_OFFSET
    FIELDS = (("reference", STR), ("stream", STR), ("offset", U64))
    reference: str
    stream: str
    offset: int


@dataclass(slots=True)
class QueryOffset(Command):
    KEY = Key.QUERY_OFFSET
    FIELDS = (_CORR, ("reference", STR), ("stream", STR))
    correlation_id: int
    reference: str
    stream: str


@dataclass(slots=True)
class QueryOffsetResponse(Command):
    KEY = Key.QUERY_OFFSET
    RESPONSE = True
    FIELDS = (_CORR, _CODE, ("offset", U64))
    correlation_id: int
    code: int
    offset: int


@dataclass(slots=True)
class Unsubscribe(Command):
    KEY = Key.UNSUBSCRIBE
    FIELDS = (_CORR, ("subscription_id", U8))
    correlation_id: int
    subscription_id: int


@dataclass(slots=True)
class UnsubscribeResponse(Command):
    KEY = Key.UNSUBSCRIBE
    RESPONSE = True
    FIELDS = (_CORR, _CODE)
    correlation_id: int
    code: int = _OK


@dataclass(slots=True)
class ConsumerUpdate(Command):
    """The broker to a single-active-consumer subscription: you are (in)active now."""

    KEY = Key.CONSUMER_UPDATE
    FIELDS = (_CORR, ("subscription_id", U8), ("active", BOOL8))
    correlation_id: int
    subscription_id: int
    active: bool


@dataclass(slots=True)
class ConsumerUpdateResponse(Command):
    """The client's answer: where the newly active consumer starts (NONE: as subscribed)."""

    KEY = Key.CONSUMER_UPDATE
    RESPONSE = True
    FIELDS = (_CORR, _CODE, ("offset", ANSWERED_OFFSET_SPEC))
    correlation_id: int
    code: int
    offset: OffsetSpec


@dataclass(slots=True)
class ResolveOffsetSpec(Command):
    KEY = Key.RESOLVE_OFFSET_SPEC
    FIELDS = (_CORR, ("stream", STR), ("offset", OFFSET_SPEC), ("properties", OPT_MAP))
    correlation_id: int
    stream: str
    offset: OffsetSpec
    properties: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class ResolveOffsetSpecResponse(Command):
    KEY = Key.RESOLVE_OFFSET_SPEC
    RESPONSE = True
    FIELDS = (_CORR, _CODE, ("offset_type", U16), ("offset", U64))
    correlation_id: int
    code: int
    offset_type: int = int(OffsetType.OFFSET)
    offset: int = 0


# --- streams and super streams ------------------------------------------------------


@dataclass(slots=True)
class Create(Command):
    KEY = Key.CREATE
    FIELDS = (_CORR, ("stream", STR), ("arguments", MAP))
    correlation_id: int
    stream: str
    arguments: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class CreateResponse(Command):
    KEY = Key.CREATE
    RESPONSE = True
    FIELDS = (_CORR, _CODE)
    correlation_id: int
    code: int = _OK


@dataclass(slots=True)
class Delete(Command):
    KEY = Key.DELETE
    FIELDS = (_CORR, ("stream", STR))
    correlation_id: int
    stream: str


@dataclass(slots=True)
class DeleteResponse(Command):
    KEY = Key.DELETE
    RESPONSE = True
    FIELDS = (_CORR, _CODE)
    correlation_id: int
    code: int = _OK


@dataclass(slots=True)
class Metadata(Command):
    KEY = Key.METADATA
    FIELDS = (_CORR, ("streams", STRS))
    correlation_id: int
    streams: list[str]


@dataclass(slots=True)
class MetadataResponse(Command):
    KEY = Key.METADATA
    RESPONSE = True
    FIELDS = (_CORR, ("brokers", BROKERS), ("streams", STREAM_METADATA))
    correlation_id: int
    brokers: list[Broker]
    streams: list[StreamMetadata]


@dataclass(slots=True)
class MetadataUpdate(Command):
    """The broker: this stream's topology changed (or it is gone), ask Metadata again."""

    KEY = Key.METADATA_UPDATE
    FIELDS = (_CODE, ("stream", STR))
    code: int
    stream: str


@dataclass(slots=True)
class StreamStats(Command):
    KEY = Key.STREAM_STATS
    FIELDS = (_CORR, ("stream", STR))
    correlation_id: int
    stream: str


@dataclass(slots=True)
class StreamStatsResponse(Command):
    """Stats such as first_chunk_id, committed_chunk_id (int64, -1 when unknown)."""

    KEY = Key.STREAM_STATS
    RESPONSE = True
    FIELDS = (_CORR, _CODE, ("stats", INT_MAP))
    correlation_id: int
    code: int
    stats: dict[str, int]


@dataclass(slots=True)
class Route(Command):
    KEY = Key.ROUTE
    FIELDS = (_CORR, ("routing_key", STR), ("super_stream", STR))
    correlation_id: int
    routing_key: str
    super_stream: str


@dataclass(slots=True)
class RouteResponse(Command):
    KEY = Key.ROUTE
    RESPONSE = True
    FIELDS = (_CORR, _CODE, ("streams", STRS))
    correlation_id: int
    code: int
    streams: list[str]


@dataclass(slots=True)
class Partitions(Command):
    KEY = Key.PARTITIONS
    FIELDS = (_CORR, ("super_stream", STR))
    correlation_id: int
    super_stream: str


@dataclass(slots=True)
class PartitionsResponse(Command):
    KEY = Key.PARTITIONS
    RESPONSE = True
    FIELDS = (_CORR, _CODE, ("streams", STRS))
    correlation_id: int
    code: int
    streams: list[str]


@dataclass(slots=True)
class CreateSuperStream(Command):
    KEY = Key.CREATE_SUPER_STREAM
    FIELDS = (
        _CORR,
        ("name", STR),
        ("partitions", STRS),
        ("binding_keys", STRS),
        ("arguments", MAP),
    )
    correlation_id: int
    name: str
    partitions: list[str]
    binding_keys: list[str]
    arguments: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class CreateSuperStreamResponse(Command):
    KEY = Key.CREATE_SUPER_STREAM
    RESPONSE = True
    FIELDS = (_CORR, _CODE)
    correlation_id: int
    code: int = _OK


@dataclass(slots=True)
class DeleteSuperStream(Command):
    KEY = Key.DELETE_SUPER_STREAM
    FIELDS = (_CORR, ("name", STR))
    correlation_id: int
    name: str


@dataclass(slots=True)
class DeleteSuperStreamResponse(Command):
    KEY = Key.DELETE_SUPER_STREAM
    RESPONSE = True
    FIELDS = (_CORR, _CODE)
    correlation_id: int
    code: int = _OK


# --- connection -----------------------------------------------------------------


@dataclass(slots=True)
class PeerProperties(Command):
    KEY = Key.PEER_PROPERTIES
    FIELDS = (_CORR, ("properties", MAP))
    correlation_id: int
    properties: dict[str, str]


@dataclass(slots=True)
class PeerPropertiesResponse(Command):
    KEY = Key.PEER_PROPERTIES
    RESPONSE = True
    FIELDS = (_CORR, _CODE, ("properties", MAP))
    correlation_id: int
    code: int
    properties: dict[str, str]


@dataclass(slots=True)
class SaslHandshake(Command):
    KEY = Key.SASL_HANDSHAKE
    FIELDS = (_CORR,)
    correlation_id: int


@dataclass(slots=True)
class SaslHandshakeResponse(Command):
    KEY = Key.SASL_HANDSHAKE
    RESPONSE = True
    FIELDS = (_CORR, _CODE, ("mechanisms", STRS))
    correlation_id: int
    code: int
    mechanisms: list[str]


@dataclass(slots=True)
class SaslAuthenticate(Command):
    KEY = Key.SASL_AUTHENTICATE
    FIELDS = (_CORR, ("mechanism", STR), ("data", BYTES))
    correlation_id: int
    mechanism: str
    data: bytes


@dataclass(slots=True)
class SaslAuthenticateResponse(Command):
    """A challenge only with SASL_CHALLENGE; left off the wire when empty. Its
    length is an int32, as PROTOCOL.adoc's bytes (RabbitMQ's writer uses an
    int16 there, for a demo mechanism; PLAIN, EXTERNAL and ANONYMOUS send none)."""

    KEY = Key.SASL_AUTHENTICATE
    RESPONSE = True
    FIELDS = (_CORR, _CODE, ("challenge", OPT_BYTES))
    correlation_id: int
    code: int = _OK
    challenge: bytes = b""


@dataclass(slots=True)
class Tune(Command):
    """The broker's proposal (frame_max bytes, heartbeat seconds; 0: none)."""

    KEY = Key.TUNE
    FIELDS = (("frame_max", U32), ("heartbeat", U32))
    frame_max: int
    heartbeat: int


@dataclass(slots=True)
class TuneResponse(Command):
    """The client's agreed values: the same body, the response bit set."""

    KEY = Key.TUNE
    RESPONSE = True
    FIELDS = (("frame_max", U32), ("heartbeat", U32))
    frame_max: int
    heartbeat: int


@dataclass(slots=True)
class Open(Command):
    KEY = Key.OPEN
    FIELDS = (_CORR, ("virtual_host", STR))
    correlation_id: int
    virtual_host: str


@dataclass(slots=True)
class OpenResponse(Command):
    """Connection properties such as advertised_host and advertised_port."""

    KEY = Key.OPEN
    RESPONSE = True
    FIELDS = (_CORR, _CODE, ("properties", OPT_MAP))
    correlation_id: int
    code: int = _OK
    properties: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class Close(Command):
    KEY = Key.CLOSE
    FIELDS = (_CORR, ("code", U16), ("reason", STR))
    correlation_id: int
    code: int
    reason: str


@dataclass(slots=True)
class CloseResponse(Command):
    KEY = Key.CLOSE
    RESPONSE = True
    FIELDS = (_CORR, _CODE)
    correlation_id: int
    code: int = _OK


@dataclass(slots=True)
class Heartbeat(Command):
    KEY = Key.HEARTBEAT


@dataclass(slots=True)
class ExchangeCommandVersions(Command):
    KEY = Key.EXCHANGE_COMMAND_VERSIONS
    FIELDS = (_CORR, ("versions", COMMAND_VERSIONS))
    correlation_id: int
    versions: list[CommandVersion]


@dataclass(slots=True)
class ExchangeCommandVersionsResponse(Command):
    KEY = Key.EXCHANGE_COMMAND_VERSIONS
    RESPONSE = True
    FIELDS = (_CORR, _CODE, ("versions", COMMAND_VERSIONS))
    correlation_id: int
    code: int
    versions: list[CommandVersion]
