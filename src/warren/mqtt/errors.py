"""Errors the MQTT codec raises, each carrying the MQTT 5 reason code to answer with.

The connection layer catches `MQTTCodecError` (a `DecodeError`, like the AMQP
codec's errors) and sends CONNACK/DISCONNECT with `reason_code` (MQTT 5) or
simply closes the connection (3.1.1), closing only that connection.
"""

from __future__ import annotations

from warren.core.codec_errors import DecodeError

__all__ = [
    "MQTTCodecError",
    "ProtocolViolation",
    "MalformedPacket",
    "PacketTooLarge",
    "ProtocolError",
    "UnsupportedProtocolVersion",
]


class MQTTCodecError(DecodeError):
    """Peer bytes that are not valid MQTT; `reason_code` is the MQTT 5 code to report."""

    reason_code = 0x81

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __reduce__(self) -> tuple[type[MQTTCodecError], tuple[str]]:
        return (type(self), (self.message,))


class MalformedPacket(MQTTCodecError):
    """0x81: the bytes cannot be parsed according to the specification."""

    reason_code = 0x81


class ProtocolError(MQTTCodecError):
    """0x82: parsed, but breaks a rule of the protocol (duplicate property, ...)."""

    reason_code = 0x82


class UnsupportedProtocolVersion(MQTTCodecError):
    """0x84: CONNECT with a protocol level other than 4 (3.1.1) or 5."""

    reason_code = 0x84


class PacketTooLarge(MQTTCodecError):
    """0x95: the packet is larger than the decoder's maximum packet size."""

    reason_code = 0x95


class ProtocolViolation(Exception):
    """The client broke a rule: DISCONNECT with ``reason_code`` (MQTT 5) and close."""

    def __init__(self, reason_code: int, message: str) -> None:
        super().__init__(message)
        self.reason_code = reason_code
