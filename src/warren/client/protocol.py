"""The client side of an AMQP 0-9-1 connection, sans-IO.

:class:`ClientProtocol` takes the bytes the server sent (``receive_data``) and
gives back events (``next_event``) and the bytes to send (``data_to_send``); it
never touches a socket or a clock, so it is tested by passing bytes (see
tests/protocol/amqp/test_client_protocol.py) and driven by any transport: the blocking one in
client/blocking.py, or a test that feeds it a server's output.

What it does by itself, as every client must: the opening handshake (start-ok
with PLAIN or EXTERNAL, tune-ok within both sides' limits, open), answers to
heartbeats, connection.close-ok and channel.close-ok, and the blocked flag.
Everything else is an event for the caller. Frames are decoded with Warren's
generated codec (warren.amqp.spec), which the server shares: the tests check
the bytes with pamqp, an independent decoder.

The hot loops (perf's publishers and consumers, Spark's reader and sink) do not
go through events: once the connection is open they take the unread bytes
(``unread``) and scan frames in bulk themselves, some of it in C.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from warren.amqp import spec
from warren.amqp.frames import (
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    HEARTBEAT_FRAME,
    PROTOCOL_HEADER,
    method_frame,
)

__all__ = [
    "AMQPError",
    "ChannelClosed",
    "ClientProtocol",
    "ConnectionClosed",
    "ContentFrame",
    "Event",
    "MethodReceived",
    "Opened",
    "negotiate",
]

_FRAME_HEADER = struct.Struct(">BHI")


class AMQPError(Exception):
    """The server closed the channel or the connection, or broke the protocol."""

    def __init__(self, message: str, reply_code: int = 0) -> None:
        super().__init__(message)
        self.reply_code = reply_code


@dataclass(frozen=True)
class Opened:
    """connection.open-ok: the connection may be used."""


@dataclass(frozen=True)
class MethodReceived:
    channel: int
    method: spec.Method


@dataclass(frozen=True)
class ContentFrame:
    """A content header or body frame (of a delivery, a get-ok or a return)."""

    type: int
    channel: int
    payload: bytes


@dataclass(frozen=True)
class ChannelClosed:
    """The server closed a channel (channel.close-ok is already queued)."""

    channel: int
    reply_code: int
    reply_text: str

    def error(self) -> AMQPError:
        return AMQPError(
            f"channel {self.channel} closed by server: {self.reply_code} {self.reply_text}",
            self.reply_code,
        )


@dataclass(frozen=True)
class ConnectionClosed:
    """The server closed the connection (connection.close-ok is already queued)."""

    reply_code: int
    reply_text: str

    def error(self) -> AMQPError:
        return AMQPError(
            f"connection closed by server: {self.reply_code} {self.reply_text}", self.reply_code
        )


Event = Opened | MethodReceived | ContentFrame | ChannelClosed | ConnectionClosed


def negotiate(server: int, client: int) -> int:
    """The smaller non-zero value (0 means 'no limit' on either side)."""
    if not server:
        return client
    if not client:
        return server
    return min(server, client)


class ClientProtocol:
    """One AMQP 0-9-1 client connection's state: bytes in, events and bytes out.

    States: ``new`` (call ``connect``), ``start``, ``tune``, ``open-ok`` (the
    handshake, answered without the caller), ``open``, ``closed`` (the server
    closed the connection)."""

    def __init__(
        self,
        *,
        user: str = "guest",
        password: str = "guest",
        vhost: str = "/",
        mechanism: str = "PLAIN",
        frame_max: int = 131072,
        heartbeat: int = 0,
        properties: dict[str, Any] | None = None,
    ) -> None:
        self.user = user
        self.password = password
        self.vhost = vhost
        self.mechanism = mechanism
        self.want_frame_max = frame_max
        self.want_heartbeat = heartbeat
        self.properties = properties or {}
        self.state = "new"
        #: Negotiated in connection.tune: until then what this side asks for.
        self.frame_max = frame_max
        self.channel_max = 0
        self.heartbeat = 0
        self.server_properties: dict[str, Any] = {}
        #: connection.blocked received and no connection.unblocked since.
        self.blocked = False
        self._buf = b""
        self._pos = 0
        self._out: list[bytes] = []

    # -- bytes in and out ----------------------------------------------------------------
    def connect(self) -> None:
        """Begin: the protocol header goes out; connection.start is awaited."""
        if self.state == "new":
            self._out.append(PROTOCOL_HEADER)
            self.state = "start"

    def receive_data(self, data: bytes) -> None:
        # Only the unread tail (at most one partial frame) is copied.
        buf, pos = self._buf, self._pos
        self._buf = buf[pos:] + data if pos < len(buf) else data
        self._pos = 0

    def data_to_send(self) -> bytes:
        out, self._out = self._out, []
        return b"".join(out)

    def send(self, data: bytes) -> None:
        """Queue bytes built elsewhere (pre-encoded frames)."""
        self._out.append(data)

    def send_method(self, channel: int, method: spec.Method) -> None:
        self._out.append(method_frame(channel, method))

    def unread(self) -> bytes:
        """Bytes received but not returned yet (handed to a hot loop that scans them)."""
        rest = self._buf[self._pos :]
        self._buf = b""
        self._pos = 0
        return rest

    def push_back(self, data: bytes) -> None:
        """Give back bytes a hot loop took with ``unread`` and did not use: they come
        before anything received later."""
        if data:
            self._buf = data + self._buf[self._pos :]
            self._pos = 0

    # -- frames and events ---------------------------------------------------------------
    def next_frame(self) -> tuple[int, int, bytes] | None:
        """The next complete frame (type, channel, payload), None when more bytes are
        needed. Heartbeats are answered and skipped; a bad frame end raises AMQPError."""
        while True:
            buf, pos = self._buf, self._pos
            if len(buf) - pos < 7:
                return None
            ftype, channel, size = _FRAME_HEADER.unpack_from(buf, pos)
            end = pos + 7 + size
            if len(buf) <= end:
                return None
            if buf[end] != 0xCE:
                raise AMQPError(f"bad frame end octet {buf[end]:#x}", spec.FRAME_ERROR)
            self._pos = end + 1
            if ftype == FRAME_HEARTBEAT:
                self._out.append(HEARTBEAT_FRAME)
                continue
            return ftype, channel, buf[pos + 7 : end]

    def next_event(self) -> Event | None:
        """The next event, None when more bytes are needed. The handshake's methods,
        connection.blocked and unblocked are handled here and give no event."""
        while True:
            frame = self.next_frame()
            if frame is None:
                return None
            ftype, channel, payload = frame
            if ftype != FRAME_METHOD:
                return ContentFrame(ftype, channel, payload)
            event = self.handle_method(channel, spec.decode_method(payload))
            if event is not None:
                return event

    def handle_method(self, channel: int, method: spec.Method) -> Event | None:
        """What a method means for the connection; None: handled, nothing to report."""
        if isinstance(method, spec.ConnectionClose):
            self._out.append(method_frame(0, spec.ConnectionCloseOk()))
            self.state = "closed"
            return ConnectionClosed(method.reply_code, method.reply_text)
        if isinstance(method, spec.ChannelClose):
            self._out.append(method_frame(channel, spec.ChannelCloseOk()))
            return ChannelClosed(channel, method.reply_code, method.reply_text)
        if isinstance(method, spec.ConnectionBlocked):
            self.blocked = True
            return None
        if isinstance(method, spec.ConnectionUnblocked):
            self.blocked = False
            return None
        state = self.state
        if state == "start" and isinstance(method, spec.ConnectionStart):
            self._start_ok(method)
            return None
        if state == "tune" and isinstance(method, spec.ConnectionTune):
            self._tune_ok(method)
            return None
        if state == "open-ok" and isinstance(method, spec.ConnectionOpenOk):
            self.state = "open"
            return Opened()
        if state != "open":
            raise AMQPError(
                f"unexpected {method.NAME} during the handshake (state {state})",
                spec.COMMAND_INVALID,
            )
        return MethodReceived(channel, method)

    # -- the handshake -------------------------------------------------------------------
    def _start_ok(self, start: spec.ConnectionStart) -> None:
        mechanism = self.mechanism
        if mechanism.encode() not in start.mechanisms.split():
            offered = start.mechanisms.decode(errors="replace")
            raise AMQPError(
                f"server offers no {mechanism} mechanism ({offered})", spec.ACCESS_REFUSED
            )
        self.server_properties = start.server_properties
        response = b"" if mechanism == "EXTERNAL" else f"\0{self.user}\0{self.password}".encode()
        self.send_method(
            0,
            spec.ConnectionStartOk(
                client_properties=self.properties, mechanism=mechanism, response=response
            ),
        )
        self.state = "tune"

    def _tune_ok(self, tune: spec.ConnectionTune) -> None:
        self.channel_max = tune.channel_max
        self.frame_max = negotiate(tune.frame_max, self.want_frame_max)
        # 0 from the client switches heartbeats off, whatever the server proposed.
        want = self.want_heartbeat
        self.heartbeat = min(tune.heartbeat, want) if tune.heartbeat and want else want
        self.send_method(
            0,
            spec.ConnectionTuneOk(
                channel_max=tune.channel_max, frame_max=self.frame_max, heartbeat=self.heartbeat
            ),
        )
        self.send_method(0, spec.ConnectionOpen(virtual_host=self.vhost))
        self.state = "open-ok"
