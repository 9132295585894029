"""RabbitMQ's stream protocol (port 5552): the sans-IO wire layer.

constants (keys, response codes), wire (primitive types and the one error,
StreamProtocolError, whose ``code`` is the response code to answer with),
commands (every command's frame as a dataclass), publish (Publish and Deliver,
the hot path, without an object per message), chunk (osiris's chunk format),
frames (FrameReader and decode_frame). No listener or broker wiring yet.
This package imports no other protocol package (tests/core/test_layering.py).
"""

from __future__ import annotations

from warren.stream_protocol.commands import COMMANDS, Command
from warren.stream_protocol.constants import Key, OffsetType, ResponseCode
from warren.stream_protocol.frames import FrameReader, decode_frame
from warren.stream_protocol.publish import Deliver, Publish, PublishedMessage
from warren.stream_protocol.wire import OffsetSpec, StreamProtocolError

__all__ = [
    "COMMANDS",
    "Command",
    "Deliver",
    "FrameReader",
    "Key",
    "OffsetSpec",
    "OffsetType",
    "Publish",
    "PublishedMessage",
    "ResponseCode",
    "StreamProtocolError",
    "decode_frame",
]
