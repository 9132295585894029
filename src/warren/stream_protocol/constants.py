"""The RabbitMQ Stream protocol's numbers: command keys, response codes, offset
types, chunk types and sub-entry compression (RabbitMQ 3.13/4.x, PROTOCOL.adoc
in rabbitmq-server's deps/rabbitmq_stream/docs, and osiris's chunk format).

Kept apart from the codec so the broker's session can name a code without
importing the frame classes.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Final

__all__ = [
    "DEFAULT_FRAME_MAX",
    "INITIAL_FRAME_MAX",
    "RESPONSE_BIT",
    "SERVER_COMMAND_VERSIONS",
    "ChunkType",
    "Compression",
    "Key",
    "OffsetType",
    "ResponseCode",
]

#: The high bit of a command key: set on the response to a request.
RESPONSE_BIT: Final = 0x8000
#: RabbitMQ's default negotiated frame_max (Tune), and the ceiling it holds a
#: connection to until Open succeeds (large enough for a JWT as a password).
DEFAULT_FRAME_MAX: Final = 1 << 20
INITIAL_FRAME_MAX: Final = 8192


class Key(IntEnum):
    """A command's key (the low 15 bits of the frame's first uint16)."""

    DECLARE_PUBLISHER = 0x01
    PUBLISH = 0x02
    PUBLISH_CONFIRM = 0x03
    PUBLISH_ERROR = 0x04
    QUERY_PUBLISHER_SEQUENCE = 0x05
    DELETE_PUBLISHER = 0x06
    SUBSCRIBE = 0x07
    DELIVER = 0x08
    CREDIT = 0x09
    STORE_OFFSET = 0x0A
    QUERY_OFFSET = 0x0B
    UNSUBSCRIBE = 0x0C
    CREATE = 0x0D
    DELETE = 0x0E
    METADATA = 0x0F
    METADATA_UPDATE = 0x10
    PEER_PROPERTIES = 0x11
    SASL_HANDSHAKE = 0x12
    SASL_AUTHENTICATE = 0x13
    TUNE = 0x14
    OPEN = 0x15
    CLOSE = 0x16
    HEARTBEAT = 0x17
    ROUTE = 0x18
    PARTITIONS = 0x19
    CONSUMER_UPDATE = 0x1A
    EXCHANGE_COMMAND_VERSIONS = 0x1B
    STREAM_STATS = 0x1C
    CREATE_SUPER_STREAM = 0x1D
    DELETE_SUPER_STREAM = 0x1E
    RESOLVE_OFFSET_SPEC = 0x1F


class ResponseCode(IntEnum):
    """The protocol's response codes; every refusal of the codec carries one."""

    OK = 0x01
    STREAM_DOES_NOT_EXIST = 0x02
    SUBSCRIPTION_ID_ALREADY_EXISTS = 0x03
    SUBSCRIPTION_ID_DOES_NOT_EXIST = 0x04
    STREAM_ALREADY_EXISTS = 0x05
    STREAM_NOT_AVAILABLE = 0x06
    SASL_MECHANISM_NOT_SUPPORTED = 0x07
    AUTHENTICATION_FAILURE = 0x08
    SASL_ERROR = 0x09
    SASL_CHALLENGE = 0x0A
    SASL_AUTHENTICATION_FAILURE_LOOPBACK = 0x0B
    VIRTUAL_HOST_ACCESS_FAILURE = 0x0C
    UNKNOWN_FRAME = 0x0D
    FRAME_TOO_LARGE = 0x0E
    INTERNAL_ERROR = 0x0F
    ACCESS_REFUSED = 0x10
    PRECONDITION_FAILED = 0x11
    PUBLISHER_DOES_NOT_EXIST = 0x12
    NO_OFFSET = 0x13
    # Not in PROTOCOL.adoc's table, but sent by RabbitMQ 3.13+ (rabbit_stream.hrl)
    # when a client re-authenticates with another mechanism or user name.
    SASL_CANNOT_CHANGE_MECHANISM = 0x14
    SASL_CANNOT_CHANGE_USERNAME = 0x15


class OffsetType(IntEnum):
    """Where a subscription starts (Subscribe, ConsumerUpdate's answer,
    ResolveOffsetSpec). NONE only in a ConsumerUpdate response: "keep going"."""

    NONE = 0
    FIRST = 1
    LAST = 2
    NEXT = 3
    OFFSET = 4
    TIMESTAMP = 5


class ChunkType(IntEnum):
    """An osiris chunk's type: only USER chunks reach a stream protocol consumer."""

    USER = 0
    TRACKING_DELTA = 1
    TRACKING_SNAPSHOT = 2


class Compression(IntEnum):
    """A sub-entry batch's compression (3 bits of its first byte). The clients
    also define snappy, lz4 and zstd; the broker stores those as opaque bytes."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


#: What RabbitMQ 4.x answers ExchangeCommandVersions with: (key, min, max).
#: Publish v2 carries filter values; Deliver v2 (committed chunk id) is the
#: client's to ask for, so it is listed too.
SERVER_COMMAND_VERSIONS: Final[tuple[tuple[int, int, int], ...]] = (
    (Key.DECLARE_PUBLISHER, 1, 1),
    (Key.PUBLISH, 1, 2),
    (Key.QUERY_PUBLISHER_SEQUENCE, 1, 1),
    (Key.DELETE_PUBLISHER, 1, 1),
    (Key.SUBSCRIBE, 1, 1),
    (Key.DELIVER, 1, 2),
    (Key.CREDIT, 1, 1),
    (Key.STORE_OFFSET, 1, 1),
    (Key.QUERY_OFFSET, 1, 1),
    (Key.UNSUBSCRIBE, 1, 1),
    (Key.CREATE, 1, 1),
    (Key.DELETE, 1, 1),
    (Key.METADATA, 1, 1),
    (Key.CLOSE, 1, 1),
    (Key.HEARTBEAT, 1, 1),
    (Key.ROUTE, 1, 1),
    (Key.PARTITIONS, 1, 1),
    (Key.STREAM_STATS, 1, 1),
    (Key.CREATE_SUPER_STREAM, 1, 1),
    (Key.DELETE_SUPER_STREAM, 1, 1),
    (Key.RESOLVE_OFFSET_SPEC, 1, 1),
)
