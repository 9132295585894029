"""Stream queue scenarios' machinery: a raw session per scenario, frames by
channel, what is kept out of the observations (see the comment below).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from pamqp import body as pbody
from pamqp import commands
from pamqp import header as pheader
from pamqp.base import Frame as PamqpMethod

from .common import TIMEOUT, Observation, ProbeError, jsonable
from .pika_helpers import attempt, connection
from .properties import FLAG_CONTENT_TYPE, FLAG_HEADERS
from .raw import RawClient, describe, props_dict, raw_client

# ======================================================================================
# Scenarios: stream queues
# ======================================================================================
#
# RabbitMQ 3.10 streams over AMQP 0-9-1. What is timing dependent there and kept out
# of the observations:
#
# * message_count in declare-ok is a figure RabbitMQ refreshes every 5 s
#   (stream_tick_interval), so right after publishing it may still be 0: scenarios
#   poll until it settles and record the settled value.
# * Messages are always published one at a time, each confirm awaited before the next
#   publish, so that every message is a chunk of its own ("last" and timestamps work
#   on chunks) and confirms never merge (multiple=true) by chance.
# * Frames of different channels race (each RabbitMQ channel has its own writer), so
#   frames are recorded per channel, in the order they came on that channel.
# * Deliveries are read until the broker has been silent for STREAM_QUIET seconds.

STREAM_ARGS: dict[str, Any] = {"x-queue-type": "stream"}
#: Seconds without a frame after which a stream consumer is taken to have got all it gets.
#: RabbitMQ's stream readers need the full second; tests/compat lowers it for the
#: embedded Warren, which answers within milliseconds.
STREAM_QUIET = 1.0
#: Seconds to wait for a stream's message_count to settle (RabbitMQ refreshes it every 5 s).
STREAM_COUNT_SETTLE = 12.0

_HEADER_VALUE_SIZES = {
    "t": 1, "b": 1, "B": 1, "s": 2, "u": 2, "I": 4, "i": 4, "l": 8, "L": 8,
    "f": 4, "d": 8, "D": 5, "T": 8, "V": 0,
}  # fmt: skip


def header_types(raw_properties: bytes | None) -> dict[str, str] | None:
    """The AMQP field type tag ('l', 'S', 't', ...) of each top-level header value, read
    from a content header's raw flag word and property list (pamqp decodes every integer
    type to int, so its decoding alone does not show them). None without headers."""
    try:
        return _header_types(raw_properties)
    except (IndexError, struct.error, UnicodeDecodeError):
        return {"<unparseable>": "?"}


def _header_types(raw_properties: bytes | None) -> dict[str, str] | None:
    if raw_properties is None or len(raw_properties) < 2:
        return None
    flags = struct.unpack(">H", raw_properties[:2])[0]
    if not flags & FLAG_HEADERS:
        return None
    pos = 2
    for bit in (FLAG_CONTENT_TYPE, 0x4000):  # content-type, content-encoding (shortstr)
        if flags & bit:
            pos += 1 + raw_properties[pos]
    (size,) = struct.unpack(">I", raw_properties[pos : pos + 4])
    pos += 4
    end = pos + size
    out: dict[str, str] = {}
    while pos < end:
        key_len = raw_properties[pos]
        key = raw_properties[pos + 1 : pos + 1 + key_len].decode(errors="replace")
        pos += 1 + key_len
        tag = chr(raw_properties[pos])
        pos += 1
        out[key] = tag
        if tag in _HEADER_VALUE_SIZES:
            pos += _HEADER_VALUE_SIZES[tag]
        else:  # S, x, F, A: a 32-bit length, then that many bytes
            (length,) = struct.unpack(">I", raw_properties[pos : pos + 4])
            pos += 4 + length
    return out


@dataclass
class StreamSession:
    """A raw client that reads frames as whole messages and keeps what it did not wait for.

    A basic.deliver/return/get-ok is recorded as one dict with its body, properties and
    header types; frames read while waiting for something else (a confirm, a consume-ok)
    are kept and returned by the next :meth:`settle`. Connection.close and channel.close
    from the server are answered with close-ok, as any client would.
    """

    client: RawClient
    backlog: list[dict[str, Any]] = field(default_factory=list)
    eof: bool = False
    _content: dict[int, dict[str, Any]] = field(default_factory=dict)

    def _next(self, timeout: float) -> dict[str, Any] | None:
        """The next complete frame (content merged into its method), or None on timeout/EOF."""
        while True:
            got = self.client.next_frame(timeout)
            if got.kind == "eof":
                self.eof = True
                return None
            if got.kind == "timeout":
                return None
            if got.kind == "raw":
                return describe(got.channel, got.frame)
            frame, channel = got.frame, got.channel
            pending = self._content.get(channel) if channel is not None else None
            if pending is not None and isinstance(frame, pheader.ContentHeader):
                pending["properties"] = props_dict(
                    frame.properties, getattr(frame, "present_flags", None)
                )
                pending["header_types"] = header_types(getattr(frame, "raw_properties", None))
                pending["_size"] = frame.body_size
                pending["_body"] = b""
                if frame.body_size == 0:
                    return self._complete(channel)
                continue
            if pending is not None and isinstance(frame, pbody.ContentBody):
                pending["_body"] += frame.value
                if len(pending["_body"]) >= pending["_size"]:
                    return self._complete(channel)
                continue
            out = describe(channel, frame)
            name = out.get("frame")
            if name in ("Basic.Deliver", "Basic.Return", "Basic.GetOk") and channel is not None:
                self._content[channel] = out
                continue
            if name == "Connection.Close":
                self.client.method(0, commands.Connection.CloseOk())
            elif name == "Channel.Close" and channel is not None:
                self.client.method(channel, commands.Channel.CloseOk())
            return out

    def _complete(self, channel: int) -> dict[str, Any]:
        out = self._content.pop(channel)
        out["body"] = jsonable(out.pop("_body"))
        del out["_size"]
        return out

    def wait_for(self, names: Sequence[str], channel: int) -> dict[str, Any]:
        """Read until a frame named in ``names`` comes on ``channel``; keep the others."""
        while True:
            frame = self._next(TIMEOUT)
            if frame is None:
                state = "EOF" if self.eof else "timeout"
                raise ProbeError(
                    f"waiting for {list(names)} on channel {channel}: {state}; got {self.backlog}"
                )
            if frame.get("frame") in names and frame.get("channel") == channel:
                return frame
            self.backlog.append(frame)

    def call(self, channel: int, method: PamqpMethod, reply: str) -> dict[str, Any]:
        self.client.method(channel, method)
        return self.wait_for((reply,), channel)

    def settle(self, quiet: float | None = None) -> list[dict[str, Any]]:
        """The kept frames plus every frame until ``quiet`` (STREAM_QUIET) seconds pass
        without one."""
        if quiet is None:
            quiet = STREAM_QUIET
        frames, self.backlog = self.backlog, []
        while not self.eof and (frame := self._next(quiet)) is not None:
            frames.append(frame)
        return frames

    def publish(
        self,
        bodies: Iterable[str],
        routing_key: str,
        exchange: str = "",
        *,
        channel: int = 1,
        mandatory: bool = False,
        properties: commands.Basic.Properties | None = None,
    ) -> list[dict[str, Any]]:
        """Publish each body on a confirm-mode ``channel``, awaiting its confirm before the
        next publish (so each message is a chunk of its own); the confirms received."""
        confirms = []
        for body in bodies:
            self.client.publish(
                channel,
                body.encode(),
                exchange,
                routing_key,
                mandatory=mandatory,
                properties=properties,
            )
            confirm = self.wait_for(("Basic.Ack", "Basic.Nack"), channel)
            confirm.pop("channel", None)
            confirms.append(confirm)
        return confirms

    def outcome(self, frames: list[dict[str, Any]], ping: int = 1) -> Observation:
        """``frames`` per channel and what became of the socket: after the frames, a
        basic.qos on ``ping`` shows whether the connection still works ("open")."""
        if not self.eof:
            self.client.method(ping, commands.Basic.Qos())
            while not self.eof:
                frame = self._next(TIMEOUT)
                if frame is None:
                    break
                if frame.get("frame") == "Basic.QosOk" and frame.get("channel") == ping:
                    break
                frames.append(frame)
        return {**by_channel(frames), "socket": "closed" if self.eof else "open"}


def by_channel(frames: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Frames grouped as ``channel_N`` lists, each in arrival order."""
    out: dict[str, list[dict[str, Any]]] = {}
    for frame in frames:
        rest = {k: v for k, v in frame.items() if k != "channel"}
        out.setdefault(f"channel_{frame.get('channel')}", []).append(rest)
    return out


def brief(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Deliveries cut down to consumer tag, delivery tag, redelivered, body and the
    x-stream-offset header (plus any other property, should one appear); other frames kept
    whole, the channel dropped (callers group frames per channel)."""
    out: list[dict[str, Any]] = []
    for frame in frames:
        frame = {k: v for k, v in frame.items() if k != "channel"}
        if frame.get("frame") != "Basic.Deliver":
            out.append(frame)
            continue
        props = dict(frame.get("properties", {}))
        headers = dict(props.pop("headers", {}) or {})
        short: dict[str, Any] = {
            "consumer_tag": frame["consumer_tag"],
            "delivery_tag": frame["delivery_tag"],
            "redelivered": frame["redelivered"],
            "body": frame.get("body"),
            "offset": headers.pop("x-stream-offset", None),
        }
        if headers:
            props["headers"] = headers
        if props:
            short["properties"] = props
        out.append(short)
    return out


def briefed(observation: Observation) -> Observation:
    """An :meth:`StreamSession.outcome` with each channel's frames in :func:`brief`."""
    return {k: brief(v) if k.startswith("channel_") else v for k, v in observation.items()}


@contextmanager
def stream_session(
    host: str,
    port: int,
    queue: str,
    bodies: Sequence[str] = (),
    *,
    channels: Sequence[int] = (1, 2),
) -> Iterator[StreamSession]:
    """A handshake with ``channels`` open; ``queue`` declared as a durable stream on
    channel 1, channel 1 put in confirm mode and ``bodies`` published to the stream."""
    with raw_client(host, port) as client:
        client.handshake(open_channels=channels)
        session = StreamSession(client)
        session.call(
            1,
            commands.Queue.Declare(queue=queue, durable=True, arguments=STREAM_ARGS),
            "Queue.DeclareOk",
        )
        session.call(1, commands.Confirm.Select(), "Confirm.SelectOk")
        session.publish(bodies, queue)
        yield session


def consume_stream(
    session: StreamSession,
    queue: str,
    arguments: dict[str, Any] | None = None,
    *,
    channel: int = 2,
    tag: str = "compat-ctag",
    prefetch: int | None = 10,
    **flags: Any,
) -> None:
    """basic.qos prefetch ``prefetch`` (unless None) and basic.consume on ``channel``
    (not waiting for consume-ok: it is part of what :meth:`StreamSession.settle` gets)."""
    if prefetch is not None:
        session.call(channel, commands.Basic.Qos(prefetch_count=prefetch), "Basic.QosOk")
    session.client.method(
        channel,
        commands.Basic.Consume(queue=queue, consumer_tag=tag, arguments=arguments or {}, **flags),
    )


def declare_stream(
    host: str,
    port: int,
    queue: str,
    arguments: dict[str, Any] | None = None,
    **flags: Any,
) -> Observation:
    """queue.declare (pika) of ``queue`` with x-queue-type=stream, durable unless
    ``flags`` say otherwise, plus ``arguments``: declare-ok or the broker's close."""
    with connection(host, port) as conn:
        ch = conn.channel()
        return attempt(
            lambda: ch.queue_declare(
                queue, arguments={**STREAM_ARGS, **(arguments or {})}, **{"durable": True, **flags}
            )
        )
