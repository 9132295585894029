"""The MQTT control packets of 3.1.1 and 5.0 as small dataclasses.

Fields that only exist in MQTT 5 (properties, reason codes of the acks) are
simply left at their defaults when a 3.1.1 packet is decoded, and ignored when
one is encoded at level 4.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from warren.mqtt.properties import Properties

__all__ = [
    "Auth",
    "ConnAck",
    "Connect",
    "Disconnect",
    "Packet",
    "PingReq",
    "PingResp",
    "PubAck",
    "PubComp",
    "PubRec",
    "PubRel",
    "Publish",
    "SubAck",
    "Subscribe",
    "Subscription",
    "UnsubAck",
    "Unsubscribe",
    "Will",
]

MQTT_3_1_1 = 4
MQTT_5 = 5


@dataclass(slots=True)
class Will:
    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Connect:
    client_id: str = ""
    protocol_level: int = MQTT_3_1_1
    clean_start: bool = True
    keep_alive: int = 60
    username: str | None = None
    password: bytes | None = None
    will: Will | None = None
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class ConnAck:
    session_present: bool = False
    #: MQTT 5 reason code, or the 3.1.1 return code (0-5).
    reason_code: int = 0
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Publish:
    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    dup: bool = False
    #: None for QoS 0, 1-65535 otherwise.
    packet_id: int | None = None
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class PubAck:
    packet_id: int
    reason_code: int = 0
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class PubRec:
    packet_id: int
    reason_code: int = 0
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class PubRel:
    packet_id: int
    reason_code: int = 0
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class PubComp:
    packet_id: int
    reason_code: int = 0
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Subscription:
    topic_filter: str
    qos: int = 0
    # MQTT 5 subscription options (zero at level 4).
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0


@dataclass(slots=True)
class Subscribe:
    packet_id: int
    subscriptions: list[Subscription]
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class SubAck:
    packet_id: int
    #: Granted QoS 0-2 or a failure code (>= 0x80), one per subscription.
    reason_codes: list[int]
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Unsubscribe:
    packet_id: int
    topic_filters: list[str]
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class UnsubAck:
    packet_id: int
    #: One per topic filter in MQTT 5; always empty in 3.1.1.
    reason_codes: list[int] = field(default_factory=list)
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class PingReq:
    pass


@dataclass(slots=True)
class PingResp:
    pass


@dataclass(slots=True)
class Disconnect:
    reason_code: int = 0
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Auth:
    """MQTT 5 only."""

    reason_code: int = 0
    properties: Properties = field(default_factory=dict)


Packet = (
    Connect
    | ConnAck
    | Publish
    | PubAck
    | PubRec
    | PubRel
    | PubComp
    | Subscribe
    | SubAck
    | Unsubscribe
    | UnsubAck
    | PingReq
    | PingResp
    | Disconnect
    | Auth
)
