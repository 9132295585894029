"""The raw-socket client: frames built and parsed by pamqp (or by hand, for
deliberately malformed ones), and what the server sent back, decoded.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

from pamqp import body as pbody
from pamqp import commands
from pamqp import exceptions as pexceptions
from pamqp import frame as pframe
from pamqp import header as pheader
from pamqp import heartbeat as pheartbeat
from pamqp.base import Frame as PamqpMethod

from .common import (
    CLIENT_CAPABILITIES,
    FRAME_END,
    FRAME_METHOD,
    GRACE,
    PROTOCOL_HEADER,
    TIMEOUT,
    Observation,
    ProbeError,
    escape_bytes,
    jsonable,
)

# --------------------------------------------------------------------------------------
# Raw socket client
# --------------------------------------------------------------------------------------


def raw_frame(frame_type: int, channel: int, payload: bytes, end: int = FRAME_END) -> bytes:
    """A frame built by hand, so it may be as wrong as a scenario needs."""
    return struct.pack(">BHI", frame_type, channel, len(payload)) + payload + bytes([end])


def raw_method(channel: int, class_id: int, method_id: int, args: bytes = b"") -> bytes:
    return raw_frame(FRAME_METHOD, channel, struct.pack(">HH", class_id, method_id) + args)


def shortstr(value: str) -> bytes:
    data = value.encode()
    return bytes([len(data)]) + data


def props_dict(props: Any, present_flags: int | None = None) -> dict[str, Any]:
    """Set properties of a pamqp Basic.Properties or pika BasicProperties.

    ``present_flags`` (the property-flags word of a received content header)
    restricts a pamqp object to the properties actually on the wire.
    """
    out: dict[str, Any] = {}
    names = getattr(props, "__slots__", None) or list(vars(props))
    flags = getattr(props, "flags", None)
    for name in names:
        if (
            present_flags is not None
            and isinstance(flags, dict)
            and not present_flags & flags.get(name, 0)
        ):
            continue
        value = getattr(props, name, None)
        if value is not None and name != "flags":
            out[name] = jsonable(value)
    return out


def describe(channel: int | None, frame: Any) -> dict[str, Any]:
    """One received frame as a JSON-serialisable dict."""
    if isinstance(frame, bytes):
        return {"raw": escape_bytes(frame)}
    name = getattr(frame, "name", type(frame).__name__)
    out: dict[str, Any] = {"frame": name, "channel": channel}
    if isinstance(frame, pheader.ContentHeader):
        out["body_size"] = frame.body_size
        out["properties"] = props_dict(frame.properties, getattr(frame, "present_flags", None))
    elif isinstance(frame, pbody.ContentBody):
        out["body"] = jsonable(frame.value)
    elif isinstance(frame, pheartbeat.Heartbeat):
        pass
    elif isinstance(frame, PamqpMethod):
        for slot in frame.__slots__:
            if slot in ("ticket",):
                continue
            value = getattr(frame, slot, None)
            if slot == "server_properties" and isinstance(value, dict):
                value = sorted(value)
            out[slot] = jsonable(value)
    return out


@dataclass
class Received:
    kind: str  # "frame", "raw", "eof" or "timeout"
    channel: int | None = None
    frame: Any = None


@dataclass
class RawClient:
    """A socket speaking hand-made AMQP frames."""

    host: str
    port: int
    timeout: float = TIMEOUT
    sock: socket.socket = field(init=False)
    buf: bytes = b""
    eof: bool = False

    def __post_init__(self) -> None:
        self.sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with suppress(OSError):
            self.sock.close()

    # -- sending -----------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        # The server may already have closed; what it sent before is still readable.
        with suppress(OSError):
            self.sock.sendall(data)

    def method(self, channel: int, method: PamqpMethod) -> None:
        self.send(pframe.marshal(method, channel))

    def content(
        self,
        channel: int,
        body: bytes,
        properties: commands.Basic.Properties | None = None,
        body_size: int | None = None,
    ) -> None:
        size = len(body) if body_size is None else body_size
        header = pheader.ContentHeader(0, size, properties or commands.Basic.Properties())
        data = pframe.marshal(header, channel)
        if body:
            data += pframe.marshal(pbody.ContentBody(body), channel)
        self.send(data)

    def publish(
        self,
        channel: int,
        body: bytes,
        exchange: str = "",
        routing_key: str = "",
        *,
        mandatory: bool = False,
        immediate: bool = False,
        properties: commands.Basic.Properties | None = None,
    ) -> None:
        self.method(
            channel,
            commands.Basic.Publish(
                exchange=exchange, routing_key=routing_key, mandatory=mandatory, immediate=immediate
            ),
        )
        self.content(channel, body, properties)

    # -- receiving ---------------------------------------------------------------------

    def _parse(self) -> Received | None:
        buf = self.buf
        if buf[:1] == b"A":  # a protocol header ('A' is no frame type)
            if len(buf) < 8:
                return None
            self.buf = buf[8:]
            return Received("raw", None, buf[:8])
        if len(buf) < 7:
            return None
        _ftype, channel, size = struct.unpack(">BHI", buf[:7])
        need = 7 + size + 1
        if len(buf) < need:
            return None
        chunk, self.buf = buf[:need], buf[need:]
        try:
            _, channel, decoded = pframe.unmarshal(chunk)
        except (pexceptions.UnmarshalingException, ValueError, struct.error):
            return Received("raw", channel, chunk)
        if isinstance(decoded, pheader.ContentHeader) and size >= 14:
            # pamqp fills in defaults for absent properties; remember which were sent.
            decoded.present_flags = struct.unpack(">H", chunk[19:21])[0]  # type: ignore[attr-defined]
            # The flag words and property list as sent, for what pamqp's decoding hides
            # (the field type of each header value).
            decoded.raw_properties = chunk[19:-1]  # type: ignore[attr-defined]
        return Received("frame", channel, decoded)

    def read(self, timeout: float | None = None) -> Received:
        """The next frame, or EOF, or timeout."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            parsed = self._parse()
            if parsed is not None:
                return parsed
            if self.eof:
                if self.buf:
                    leftover, self.buf = self.buf, b""
                    return Received("raw", None, leftover)
                return Received("eof")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return Received("timeout")
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                return Received("timeout")
            except OSError:
                data = b""
            if not data:
                self.eof = True
            self.buf += data

    def next_frame(self, timeout: float | None = None) -> Received:
        """Like :meth:`read`, skipping heartbeats on channel 0."""
        while True:
            got = self.read(timeout)
            if (
                got.kind == "frame"
                and isinstance(got.frame, pheartbeat.Heartbeat)
                and got.channel == 0
            ):
                continue
            return got

    def expect(self, name: str, channel: int | None = None) -> Any:
        got = self.next_frame()
        if got.kind != "frame" or getattr(got.frame, "name", None) != name:
            seen = describe(got.channel, got.frame) if got.kind in ("frame", "raw") else got.kind
            raise ProbeError(f"expected {name}, got {seen}")
        if channel is not None and got.channel != channel:
            raise ProbeError(f"expected {name} on channel {channel}, got it on {got.channel}")
        return got.frame

    def expect_any(self, names: Sequence[str], channel: int | None = None) -> Any:
        got = self.next_frame()
        if got.kind != "frame" or getattr(got.frame, "name", None) not in names:
            seen = describe(got.channel, got.frame) if got.kind in ("frame", "raw") else got.kind
            raise ProbeError(f"expected one of {list(names)}, got {seen}")
        if channel is not None and got.channel != channel:
            raise ProbeError(
                f"expected {list(names)} on channel {channel}, got it on {got.channel}"
            )
        return got.frame

    def expect_content(self, channel: int) -> dict[str, Any]:
        """Content header and body frames following a deliver/get-ok/return."""
        hdr = self.expect("ContentHeader", channel)
        body = b""
        while len(body) < hdr.body_size:
            body += self.expect("ContentBody", channel).value
        return {
            "body": jsonable(body),
            "properties": props_dict(hdr.properties, getattr(hdr, "present_flags", None)),
        }

    # -- conversations -----------------------------------------------------------------

    def start_ok(
        self,
        *,
        mechanism: str = "PLAIN",
        response: str = "\x00guest\x00guest",
        capabilities: dict[str, Any] | None = None,
        header: bytes = PROTOCOL_HEADER,
    ) -> Any:
        """Send the protocol header, wait for connection.start, answer start-ok."""
        self.send(header)
        start = self.expect("Connection.Start", 0)
        caps = CLIENT_CAPABILITIES if capabilities is None else capabilities
        props: dict[str, Any] = {"product": "compat-probe", "capabilities": caps}
        self.method(
            0,
            commands.Connection.StartOk(
                client_properties=props, mechanism=mechanism, response=response, locale="en_US"
            ),
        )
        return start

    def handshake(
        self,
        *,
        vhost: str = "/",
        channel_max: int | None = None,
        frame_max: int | None = None,
        heartbeat: int = 0,
        capabilities: dict[str, Any] | None = None,
        open_channels: Iterable[int] = (1,),
    ) -> Any:
        """A complete, successful handshake; returns the connection.tune received."""
        self.start_ok(capabilities=capabilities)
        tune = self.expect("Connection.Tune", 0)
        self.method(
            0,
            commands.Connection.TuneOk(
                channel_max=tune.channel_max if channel_max is None else channel_max,
                frame_max=tune.frame_max if frame_max is None else frame_max,
                heartbeat=heartbeat,
            ),
        )
        self.method(0, commands.Connection.Open(virtual_host=vhost))
        self.expect("Connection.OpenOk", 0)
        for ch in open_channels:
            self.method(ch, commands.Channel.Open())
            self.expect("Channel.OpenOk", ch)
        return tune

    def call(self, channel: int, method: PamqpMethod, reply: str) -> Any:
        """A synchronous method that must succeed."""
        self.method(channel, method)
        return self.expect(reply, channel)

    def observe(self, ping: int | None = None, timeout: float | None = None) -> Observation:
        """Collect what the server sends back, and what becomes of the socket.

        With ``ping`` (an open channel), a basic.qos is sent on that channel; its
        qos-ok proves the connection (and channel) still work. Frames caused on
        other channels may race the qos-ok, so after it the socket is read for
        :data:`GRACE` more seconds. If the server closes the ping channel,
        close-ok is sent and the channel re-opened and pinged again.
        A connection.close from the server is answered with close-ok (as any
        client would) and the socket is then read until EOF or timeout; an EOF
        that comes a second or more after the observation began is recorded as
        ``socket_closed_after_s`` (RabbitMQ delays some closes by 3 s).
        """
        began = time.monotonic()
        received: list[dict[str, Any]] = []
        reopening = answered = False
        if ping is not None:
            self.method(ping, commands.Basic.Qos())
        while True:
            got = self.next_frame(GRACE if answered else timeout)
            if got.kind == "eof":
                obs: Observation = {"received": received, "socket": "closed"}
                elapsed = time.monotonic() - began
                if elapsed >= 1.0:
                    obs["socket_closed_after_s"] = round(elapsed)
                return obs
            if got.kind == "timeout":
                state = "open" if ping is None or answered else "open (no reply)"
                return {"received": received, "socket": state}
            if got.kind == "raw":
                received.append(describe(got.channel, got.frame))
                continue
            name = getattr(got.frame, "name", "")
            if ping is not None and got.channel == ping and not answered:
                if name == "Basic.QosOk":
                    answered = True
                    continue
                if name == "Channel.OpenOk" and reopening:
                    reopening = False
                    self.method(ping, commands.Basic.Qos())
                    continue
            received.append(describe(got.channel, got.frame))
            if name == "Connection.Close":
                self.method(0, commands.Connection.CloseOk())
                ping, answered = None, False
            elif name == "Channel.Close":
                assert got.channel is not None
                self.method(got.channel, commands.Channel.CloseOk())
                if got.channel == ping and not answered:
                    reopening = True
                    self.method(ping, commands.Channel.Open())


@contextmanager
def raw_client(host: str, port: int, timeout: float = TIMEOUT) -> Iterator[RawClient]:
    client = RawClient(host, port, timeout)
    try:
        yield client
    finally:
        client.close()


def raw_get(client: RawClient, channel: int, queue: str, no_ack: bool = False) -> dict[str, Any]:
    """basic.get over a raw client: get-ok fields plus the body, or get-empty."""
    client.method(channel, commands.Basic.Get(queue=queue, no_ack=no_ack))
    got = client.next_frame()
    if got.kind != "frame":
        raise ProbeError(f"basic.get: {got.kind}")
    out = describe(got.channel, got.frame)
    if out["frame"] == "Basic.GetOk":
        out.update(client.expect_content(channel))
    return out
