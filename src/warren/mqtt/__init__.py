"""MQTT 3.1.1 and 5.0: the sans-IO packet codec (the broker side is not there yet)."""

from warren.mqtt.codec import Decoder, encode
from warren.mqtt.errors import (
    MalformedPacket,
    MQTTCodecError,
    PacketTooLarge,
    ProtocolError,
    UnsupportedProtocolVersion,
)

__all__ = [
    "Decoder",
    "MQTTCodecError",
    "MalformedPacket",
    "PacketTooLarge",
    "ProtocolError",
    "UnsupportedProtocolVersion",
    "encode",
]
