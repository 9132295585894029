"""The pre-encoded message perf's publishers send: built once, stamped per batch."""

from __future__ import annotations

from warren.amqp import spec
from warren.amqp.frames import content_frames, method_frame
from warren.client.blocking import DEFAULT_FRAME_MAX
from warren.core.properties import BasicProperties

__all__ = ["message_template"]


def message_template(
    channel: int,
    exchange: str,
    routing_key: str,
    size: int,
    persistent: bool,
    frame_max: int,
) -> tuple[bytes, bytes]:
    """One message (basic.publish + content header + body frames) split around its timestamp.

    Returns ``(head, tail)``: the message's bytes are ``head + ts + tail`` where
    ``ts`` is the 8-byte send timestamp at the start of the body. Bodies shorter
    than 8 bytes carry no timestamp: then ``head`` is the whole message and
    ``tail`` is empty, and callers must not insert anything.
    """
    props = BasicProperties(delivery_mode=2 if persistent else None).encode()
    method = method_frame(channel, spec.BasicPublish(exchange=exchange, routing_key=routing_key))
    body = bytes(size)
    frames = content_frames(channel, props, body, frame_max or DEFAULT_FRAME_MAX)
    message = method + b"".join(frames)
    if size < 8:
        return message, b""
    # The first body frame starts right after the header frame (3 parts) and
    # its 7-byte frame header; the timestamp is the first 8 bytes of the body.
    header_len = sum(len(p) for p in frames[:3])
    at = len(method) + header_len + 7
    return message[:at], message[at + 8 :]
