"""CoAP payloads <-> the core's messages, as MQTT's are mapped.

A CoAP publish becomes the message an MQTT PUBLISH of the same QoS would
(RabbitMQ's MQTT plugin's headers ``x-mqtt-publish-qos`` and ``x-mqtt-dup``,
delivery mode 2 from QoS 1 up), so MQTT and AMQP subscribers see nothing
new; its Content-Format is kept as the AMQP ``content_type`` (the media type
of the CoAP registry's number, ``application/coap-content-format;n=<n>``
for a number this table does not name), and a content type becomes the
Content-Format of a notification again.
"""

from __future__ import annotations

from warren.core import properties as amqp_props
from warren.core.codec_errors import DecodeError

__all__ = ["content_format", "message_qos", "publish_properties"]

#: RabbitMQ's MQTT plugin's headers (mqtt/mapping.py uses the same names).
QOS_HEADER = "x-mqtt-publish-qos"
DUP_HEADER = "x-mqtt-dup"
RETAIN_HEADER = "x-mqtt-retain"

#: The CoAP Content-Formats registry's common entries (RFC 7252 12.3 and later).
FORMATS: dict[int, str] = {
    0: "text/plain;charset=utf-8",
    40: "application/link-format",
    41: "application/xml",
    42: "application/octet-stream",
    47: "application/exi",
    50: "application/json",
    60: "application/cbor",
    110: "application/senml+json",
    112: "application/senml+cbor",
}
_NUMBERS = {media: number for number, media in FORMATS.items()}
_OTHER = "application/coap-content-format;n="


def content_type(number: int | None) -> str | None:
    """The AMQP content type of a Content-Format (None: none given)."""
    if number is None:
        return None
    return FORMATS.get(number) or f"{_OTHER}{number}"


def content_format(media: str | None) -> int | None:
    """The Content-Format of an AMQP content type (None: none that CoAP numbers)."""
    if not media:
        return None
    number = _NUMBERS.get(media)
    if number is None and media.startswith(_OTHER) and media[len(_OTHER) :].isdigit():
        number = int(media[len(_OTHER) :])
        if number > 0xFFFF:
            return None
    return number


def publish_properties(qos: int, fmt: int | None, retain: bool = False) -> bytes:
    """The AMQP properties of a CoAP publish at ``qos`` with Content-Format ``fmt``."""
    headers: dict[str, object] = {QOS_HEADER: qos, DUP_HEADER: False}
    if retain:
        headers[RETAIN_HEADER] = True
    return amqp_props.BasicProperties(
        headers=headers, delivery_mode=2 if qos else 1, content_type=content_type(fmt)
    ).encode()


def message_qos(properties: bytes) -> tuple[int, str | None]:
    """(QoS, content type) of a core message: its ``x-mqtt-publish-qos`` header,
    else 1 when persistent, else 0 (as MQTT delivers it)."""
    try:
        decoded = amqp_props.decode_properties(properties)
    except DecodeError:
        return 0, None
    qos = (decoded.headers or {}).get(QOS_HEADER)
    if not isinstance(qos, int) or isinstance(qos, bool) or not 0 <= qos <= 2:
        qos = 1 if decoded.delivery_mode == 2 else 0
    return qos, decoded.content_type
