"""MQTT PUBLISH <-> the core's message (AMQP properties), as RabbitMQ's MQTT plugin maps them.

Every message an MQTT client publishes carries the headers RabbitMQ's plugin
sets, ``x-mqtt-publish-qos`` and ``x-mqtt-dup``, and delivery-mode 2 from QoS 1
up (1 for QoS 0), so AMQP consumers see what they would see from RabbitMQ.
Warren adds ``x-mqtt-retain`` when the retain flag was set (for MQTT 5's
retain-as-published). A PUBLISH without MQTT 5 properties gets one of a few
precomputed property encodings: the hot path builds nothing.

MQTT 5 properties map to AMQP properties and headers (docs/mqtt.md):

==========================  ==========================================
MQTT 5                      AMQP 0-9-1
==========================  ==========================================
Content Type                content_type
Correlation Data            correlation_id (UTF-8, <= 255 bytes), else
                            header ``x-correlation-id`` (bytes)
Response Topic              reply_to (as a routing key: ``/`` -> ``.``)
Message Expiry Interval     expiration (milliseconds)
Payload Format Indicator    header ``x-mqtt-payload-format-indicator``
User Property               headers (a repeated name: an array)
==========================  ==========================================

Going the other way, an AMQP message's QoS is its ``x-mqtt-publish-qos``
header, else 1 when it is persistent (delivery-mode 2), else 0.
"""

from __future__ import annotations

from typing import Any

from warren.core import properties as amqp_props
from warren.core.codec_errors import DecodeError
from warren.core.message import Message
from warren.mqtt import properties as P
from warren.mqtt.properties import Properties
from warren.mqtt.topics import amqp_to_mqtt, mqtt_to_amqp

__all__ = [
    "QOS_HEADER",
    "Outgoing",
    "from_message",
    "plain_properties",
    "to_properties",
]

QOS_HEADER = "x-mqtt-publish-qos"
DUP_HEADER = "x-mqtt-dup"
RETAIN_HEADER = "x-mqtt-retain"
CLIENT_HEADER = "x-mqtt-client-id"
PAYLOAD_FORMAT_HEADER = "x-mqtt-payload-format-indicator"
CORRELATION_HEADER = "x-correlation-id"
_OWN_HEADERS = frozenset({QOS_HEADER, DUP_HEADER, RETAIN_HEADER, CLIENT_HEADER})


def _encode(qos: int, dup: bool, retain: bool, **extra: Any) -> bytes:
    headers: dict[str, Any] = {QOS_HEADER: qos, DUP_HEADER: dup}
    if retain:
        headers[RETAIN_HEADER] = True
    return amqp_props.BasicProperties(
        headers=headers, delivery_mode=2 if qos else 1, **extra
    ).encode()


#: (qos, dup, retain) -> property bytes, for PUBLISHes without MQTT 5 properties.
_PLAIN: dict[tuple[int, bool, bool], bytes] = {
    (q, d, r): _encode(q, d, r) for q in (0, 1, 2) for d in (False, True) for r in (False, True)
}
#: The reverse: property bytes -> (qos, retain), so delivery needs no decoding.
_PLAIN_INFO: dict[bytes, tuple[int, bool]] = {v: (k[0], k[2]) for k, v in _PLAIN.items()}


def plain_properties(qos: int, dup: bool = False, retain: bool = False) -> bytes:
    """The AMQP properties of a PUBLISH that has no MQTT 5 properties."""
    return _PLAIN[(qos, dup, retain)]


def to_properties(
    qos: int,
    dup: bool,
    retain: bool,
    props: Properties,
    client_id: str | None = None,
) -> bytes:
    """The AMQP properties for a PUBLISH (``props``: its MQTT 5 properties, with any
    topic alias already resolved). ``client_id`` is recorded when the session has
    a No Local subscription that must recognise its own messages."""
    if not props and client_id is None:
        return _PLAIN[(qos, dup, retain)]
    headers: dict[str, Any] = {QOS_HEADER: qos, DUP_HEADER: dup}
    if retain:
        headers[RETAIN_HEADER] = True
    if client_id is not None:
        headers[CLIENT_HEADER] = client_id
    extra: dict[str, Any] = {}
    user_props = props.get(P.USER_PROPERTY)
    for name, value in user_props if isinstance(user_props, list) else ():  # type: ignore[misc]
        if name in _OWN_HEADERS:
            continue
        if len(name) > 63 and len(name.encode("utf-8", "surrogateescape")) > 255:
            continue  # an AMQP header name is a shortstr (as content_type, dropped)
        if name in headers:
            prev = headers[name]
            headers[name] = [*prev, value] if isinstance(prev, list) else [prev, value]
        else:
            headers[name] = value
    if P.PAYLOAD_FORMAT_INDICATOR in props:
        headers[PAYLOAD_FORMAT_HEADER] = props[P.PAYLOAD_FORMAT_INDICATOR]
    if P.CONTENT_TYPE in props:
        content_type = str(props[P.CONTENT_TYPE])
        if len(content_type.encode()) <= 255:
            extra["content_type"] = content_type
    if P.RESPONSE_TOPIC in props:
        reply_to = mqtt_to_amqp(str(props[P.RESPONSE_TOPIC]))
        if len(reply_to.encode()) <= 255:
            extra["reply_to"] = reply_to
    correlation = props.get(P.CORRELATION_DATA)
    if isinstance(correlation, bytes):
        try:
            text = correlation.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if text is not None and len(correlation) <= 255:
            extra["correlation_id"] = text
        else:
            headers[CORRELATION_HEADER] = correlation
    expiry = props.get(P.MESSAGE_EXPIRY_INTERVAL)
    if isinstance(expiry, int):
        extra["expiration"] = str(expiry * 1000)
    return amqp_props.BasicProperties(
        headers=headers, delivery_mode=2 if qos else 1, **extra
    ).encode()


class Outgoing:
    """What a delivery to an MQTT client needs to know about a message."""

    __slots__ = ("qos", "retain", "client_id", "properties", "expires_at")

    def __init__(
        self,
        qos: int,
        retain: bool,
        client_id: str | None = None,
        properties: Properties | None = None,
        expires_at: int | None = None,
    ) -> None:
        self.qos = qos
        self.retain = retain
        #: The publishing MQTT client, when it recorded itself (No Local).
        self.client_id = client_id
        #: MQTT 5 properties to send (without the expiry, computed per delivery).
        self.properties = properties
        #: Milliseconds since the epoch when the message expires, or None.
        self.expires_at = expires_at


_PLAIN_OUTGOING = {raw: Outgoing(q, r) for raw, (q, r) in _PLAIN_INFO.items()}


def from_message(msg: Message) -> Outgoing:
    """The QoS, retain flag and MQTT 5 properties of a message from the core: one
    dict lookup for messages MQTT clients published without properties."""
    hit = _PLAIN_OUTGOING.get(msg.properties)
    if hit is not None:
        return hit
    try:
        decoded = amqp_props.decode_properties(msg.properties)
    except DecodeError:
        return Outgoing(0, False)
    headers = decoded.headers or {}
    qos_value = headers.get(QOS_HEADER)
    if isinstance(qos_value, int) and not isinstance(qos_value, bool) and 0 <= qos_value <= 2:
        qos = qos_value
    else:
        qos = 1 if decoded.delivery_mode == 2 else 0
    retain = headers.get(RETAIN_HEADER) is True
    client = headers.get(CLIENT_HEADER)
    out: Properties = {}
    user: list[tuple[str, str]] = []
    for name, value in headers.items():
        if name in _OWN_HEADERS or name == CORRELATION_HEADER:
            continue
        if name == PAYLOAD_FORMAT_HEADER:
            if value in (0, 1):
                out[P.PAYLOAD_FORMAT_INDICATOR] = int(value)
            continue
        for item in value if isinstance(value, list) else (value,):
            user.append((str(name), _text(item)))
    if decoded.content_type is not None:
        out[P.CONTENT_TYPE] = decoded.content_type
    if decoded.reply_to is not None:
        out[P.RESPONSE_TOPIC] = amqp_to_mqtt(decoded.reply_to)
    correlation = headers.get(CORRELATION_HEADER)
    if isinstance(correlation, (bytes, bytearray)):
        out[P.CORRELATION_DATA] = bytes(correlation)
    elif decoded.correlation_id is not None:
        out[P.CORRELATION_DATA] = decoded.correlation_id.encode()
    if user:
        out[P.USER_PROPERTY] = user
    expires_at = None
    if decoded.expiration is not None:
        try:
            expires_at = msg.timestamp + int(decoded.expiration)
        except ValueError:
            expires_at = None
    return Outgoing(qos, retain, client if isinstance(client, str) else None, out, expires_at)


def _text(value: Any) -> str:
    """A header value as the string an MQTT 5 user property carries."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
