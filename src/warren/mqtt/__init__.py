"""MQTT 3.1.1 and 5.0: the sans-IO packet codec (codec.py) and the broker side
(connection.py's MQTTConnection on the client session, server.py's listener)."""

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
