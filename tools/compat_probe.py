#!/usr/bin/env python3
"""Record what an AMQP 0-9-1 client observes from a broker for many edge cases.

Every scenario is a function ``(host, port) -> dict`` that talks to a broker
over real sockets and returns a JSON-serialisable observation. Running the
scenarios against RabbitMQ gives the reference observations stored in
``tests/compat/rabbitmq_expected.json``; ``tests/compat/test_rabbitmq_compat.py``
runs the same scenarios against Warren and compares.

Two kinds of scenarios:

* pika (BlockingConnection) scenarios for what a normal client can express.
  Broker-initiated closes are recorded as ``{"closed": "channel" | "connection",
  "reply_code": ..., "reply_text": ...}``.
* raw-socket scenarios, with frames built and parsed by pamqp (or by hand for
  deliberately malformed ones), for protocol-level misbehaviour. They record
  every frame the server sent back (decoded), and what became of the socket:
  ``"closed"`` (EOF), ``"open"`` (a basic.qos ping on a channel was answered,
  or nothing at all happened within the timeout when no ping was possible) or
  ``"open (no reply)"`` (a ping was sent but neither answered nor the socket
  closed within the timeout).

Names are fixed (``compat-...``) and deleted before and after each scenario;
server-generated names in texts are replaced by placeholders (see
:func:`normalise`), so observations compare across runs and brokers.

Usage::

    python tools/compat_probe.py --host 127.0.0.1 --port 5672 [--only NAME ...] [--json OUT]
"""

from __future__ import annotations

import argparse
import datetime
import decimal
import json
import math
import re
import socket
import struct
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

import pika
import pika.exceptions
import pika.spec
from pamqp import body as pbody
from pamqp import commands
from pamqp import encode as pencode
from pamqp import exceptions as pexceptions
from pamqp import frame as pframe
from pamqp import header as pheader
from pamqp import heartbeat as pheartbeat
from pamqp.base import Frame as PamqpMethod

Observation = dict[str, Any]
ScenarioFn = Callable[[str, int], Observation]

#: Seconds to wait for a reply (or for the socket to close) before giving up. RabbitMQ
#: closes some sockets 3 s after an error, so this must be comfortably longer.
TIMEOUT = 5.0
#: Seconds to keep reading after a ping was answered, for frames racing it.
GRACE = 0.75
#: Seconds a whole scenario may take before it is recorded as timed out.
SCENARIO_TIMEOUT = 60.0

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT = 1, 2, 3, 8
FRAME_END = 0xCE

#: Capabilities a modern client (pika, aio-pika, the Java client) advertises.
CLIENT_CAPABILITIES: dict[str, Any] = {
    "authentication_failure_close": True,
    "basic.nack": True,
    "connection.blocked": True,
    "consumer_cancel_notify": True,
    "exchange_exchange_bindings": True,
    "per_consumer_qos": True,
    "publisher_confirms": True,
}


class ProbeError(Exception):
    """The broker did something the scenario cannot continue from."""


@dataclass
class Scenario:
    name: str
    fn: ScenarioFn
    queues: tuple[str, ...] = ()
    exchanges: tuple[str, ...] = ()
    doc: str = ""


SCENARIOS: dict[str, Scenario] = {}


def scenario(
    name: str | None = None, *, queues: Sequence[str] = (), exchanges: Sequence[str] = ()
) -> Callable[[ScenarioFn], ScenarioFn]:
    """Register a scenario; ``queues``/``exchanges`` are deleted before and after it."""

    def register(fn: ScenarioFn) -> ScenarioFn:
        key = name or fn.__name__.removeprefix("s_")
        if key in SCENARIOS:
            raise ValueError(f"duplicate scenario {key}")
        SCENARIOS[key] = Scenario(
            key, fn, tuple(queues), tuple(exchanges), (fn.__doc__ or "").strip()
        )
        return fn

    return register


# --------------------------------------------------------------------------------------
# Normalisation / JSON
# --------------------------------------------------------------------------------------

_NORMALISERS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"amq\.gen-[A-Za-z0-9_\-]+"), "amq.gen-*"),
    (re.compile(r"amq\.ctag-[A-Za-z0-9_\-]+"), "amq.ctag-*"),
    (re.compile(r"amq\.rabbitmq\.reply-to\.[A-Za-z0-9_\-+/=.]+"), "amq.rabbitmq.reply-to.*"),
    (re.compile(r"<\d+\.\d+\.\d+>"), "<pid>"),
]


def normalise(value: Any) -> Any:
    """Replace server-generated parts of strings with placeholders, recursively."""
    if isinstance(value, str):
        for pattern, repl in _NORMALISERS:
            value = pattern.sub(repl, value)
        return value
    if isinstance(value, dict):
        return {k: normalise(v) for k, v in value.items()}
    if isinstance(value, list):
        return [normalise(v) for v in value]
    return value


def escape_bytes(data: bytes) -> str:
    """Printable ASCII kept, everything else as ``\\xNN``: 'AMQP\\x00\\x00\\x09\\x01'."""
    return "".join(chr(b) if 0x20 <= b < 0x7F and b != 0x5C else f"\\x{b:02x}" for b in data)


def jsonable(value: Any) -> Any:
    """Convert decoded AMQP values (tables, bytes, decimals, timestamps) to JSON types."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return escape_bytes(raw)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    return repr(value)


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


# --------------------------------------------------------------------------------------
# pika helpers
# --------------------------------------------------------------------------------------


def pika_params(host: str, port: int, **overrides: Any) -> pika.ConnectionParameters:
    settings: dict[str, Any] = {
        "host": host,
        "port": port,
        "credentials": pika.PlainCredentials("guest", "guest"),
        "heartbeat": 0,
        "blocked_connection_timeout": 5,
        "socket_timeout": TIMEOUT,
        "stack_timeout": 10,
        "connection_attempts": 1,
        "client_properties": {"product": "compat-probe"},
    }
    settings.update(overrides)
    return pika.ConnectionParameters(**settings)


@contextmanager
def connection(host: str, port: int, **overrides: Any) -> Iterator[pika.BlockingConnection]:
    conn = pika.BlockingConnection(pika_params(host, port, **overrides))
    try:
        yield conn
    finally:
        with suppress(Exception):
            if conn.is_open:
                conn.close()


def method_dict(result: Any) -> dict[str, Any]:
    """A pika method frame (or frame.Method wrapper) as a dict of its fields."""
    method = getattr(result, "method", result)
    out: dict[str, Any] = {"method": method.NAME}
    for key, value in vars(method).items():
        if key in ("ticket", "nowait"):
            continue
        out[key] = jsonable(value)
    return out


def attempt(fn: Callable[[], Any]) -> Observation:
    """Run one client operation; record its result or the broker's close."""
    try:
        value = fn()
    except pika.exceptions.ChannelClosedByBroker as exc:
        return {"closed": "channel", "reply_code": exc.reply_code, "reply_text": exc.reply_text}
    except pika.exceptions.ConnectionClosedByBroker as exc:
        return {"closed": "connection", "reply_code": exc.reply_code, "reply_text": exc.reply_text}
    if value is None:
        return {"ok": None}
    if hasattr(value, "method") or hasattr(value, "NAME"):
        return {"ok": method_dict(value)}
    return {"ok": jsonable(value)}


def sync(channel: Any) -> None:
    """A round trip on ``channel``, so errors caused by earlier async methods surface."""
    channel.exchange_declare("amq.direct", passive=True)


def drain(conn: Any, seconds: float) -> None:
    """Dispatch deliveries for a full ``seconds`` (pika may return early from one call)."""
    deadline = time.monotonic() + seconds
    while (remaining := deadline - time.monotonic()) > 0:
        conn.process_data_events(remaining)


def get_all(channel: Any, queue: str, limit: int = 50) -> list[dict[str, Any]]:
    """basic.get until get-empty; body, redelivered and delivery_tag of each message."""
    out: list[dict[str, Any]] = []
    for _ in range(limit):
        method, _props, body = channel.basic_get(queue, auto_ack=False)
        if method is None:
            break
        out.append(
            {
                "body": body.decode(),
                "redelivered": method.redelivered,
                "delivery_tag": method.delivery_tag,
                "message_count": method.message_count,
            }
        )
    return out


def get_one(channel: Any, queue: str, auto_ack: bool = False) -> dict[str, Any] | None:
    method, props, body = channel.basic_get(queue, auto_ack=auto_ack)
    if method is None:
        return None
    return {
        **method_dict(method),
        "body": body.decode(errors="replace"),
        "properties": props_dict(props),
    }


def publish_bodies(channel: Any, queue: str, bodies: Iterable[str], exchange: str = "") -> None:
    for body in bodies:
        channel.basic_publish(exchange, queue, body.encode())


def cleanup(host: str, port: int, queues: Sequence[str], exchanges: Sequence[str]) -> None:
    """Delete what a scenario may have declared (best effort, errors ignored)."""
    if not queues and not exchanges:
        return
    with suppress(Exception), connection(host, port) as conn:
        for queue in queues:
            with suppress(
                pika.exceptions.ChannelClosedByBroker, pika.exceptions.ChannelWrongStateError
            ):
                conn.channel().queue_delete(queue)
        for exchange in exchanges:
            with suppress(
                pika.exceptions.ChannelClosedByBroker, pika.exceptions.ChannelWrongStateError
            ):
                conn.channel().exchange_delete(exchange)


# ======================================================================================
# Scenarios: protocol header and connection.start
# ======================================================================================


def _header_probe(host: str, port: int, data: bytes) -> Observation:
    with raw_client(host, port) as client:
        client.send(data)
        return client.observe()


@scenario()
def s_header_amqp_0_9_0(host: str, port: int) -> Observation:
    """Protocol header with revision 0 (AMQP 0-9-0)."""
    return _header_probe(host, port, b"AMQP\x00\x00\x09\x00")


@scenario()
def s_header_http(host: str, port: int) -> Observation:
    """Eight bytes of HTTP instead of a protocol header."""
    return _header_probe(host, port, b"HTTP/1.1")


@scenario()
def s_header_amqp_0_9_old_style(host: str, port: int) -> Observation:
    """The pre-0-9-1 header layout 'AMQP' 1 1 0 9 (AMQP 0-9)."""
    return _header_probe(host, port, b"AMQP\x01\x01\x00\x09")


@scenario()
def s_header_amqp_1_0(host: str, port: int) -> Observation:
    """An AMQP 1.0 protocol header."""
    return _header_probe(host, port, b"AMQP\x00\x01\x00\x00")


@scenario()
def s_header_amqp_0_10(host: str, port: int) -> Observation:
    """An AMQP 0-10 protocol header."""
    return _header_probe(host, port, b"AMQP\x01\x01\x00\x0a")


@scenario()
def s_header_then_frame_without_waiting(host: str, port: int) -> Observation:
    """Protocol header immediately followed by a start-ok in the same write."""
    with raw_client(host, port) as client:
        props: dict[str, Any] = {"product": "compat-probe", "capabilities": CLIENT_CAPABILITIES}
        start_ok = pframe.marshal(
            commands.Connection.StartOk(client_properties=props, response="\x00guest\x00guest"), 0
        )
        client.send(PROTOCOL_HEADER + start_ok)
        obs = client.observe()
    return obs


@scenario()
def s_server_properties(host: str, port: int) -> Observation:
    """connection.start contents and the connection.tune proposal."""
    with raw_client(host, port) as client:
        start = client.start_ok()
        tune = client.expect("Connection.Tune", 0)
        props = start.server_properties
        return {
            "version": [start.version_major, start.version_minor],
            "server_properties_keys": sorted(props),
            "capabilities": jsonable(props.get("capabilities")),
            "mechanisms": jsonable(start.mechanisms),
            "locales": jsonable(start.locales),
            "tune": {
                "channel_max": tune.channel_max,
                "frame_max": tune.frame_max,
                "heartbeat": tune.heartbeat,
            },
        }


# ======================================================================================
# Scenarios: authentication, vhost, tuning
# ======================================================================================


def _auth_probe(
    host: str,
    port: int,
    *,
    mechanism: str = "PLAIN",
    response: str,
    capabilities: dict[str, Any] | None = None,
) -> Observation:
    """Start-ok with the given credentials; a successful login is carried on to
    connection.open-ok and a channel ping, a failed one observed until EOF."""
    with raw_client(host, port) as client:
        client.start_ok(mechanism=mechanism, response=response, capabilities=capabilities)
        began = time.monotonic()
        got = client.next_frame()
        if got.kind == "frame" and getattr(got.frame, "name", "") == "Connection.Tune":
            tune = got.frame
            client.method(
                0,
                commands.Connection.TuneOk(
                    channel_max=tune.channel_max, frame_max=tune.frame_max, heartbeat=0
                ),
            )
            client.method(0, commands.Connection.Open(virtual_host="/"))
            client.expect("Connection.OpenOk", 0)
            client.method(1, commands.Channel.Open())
            client.expect("Channel.OpenOk", 1)
            return {"logged_in": True, **client.observe(ping=1)}
        if got.kind == "eof":
            return {"logged_in": False, **_eof_observation([], began)}
        if got.kind == "timeout":
            return {"logged_in": False, "received": [], "socket": "open"}
        first = describe(got.channel, got.frame)
        if first.get("frame") == "Connection.Close":
            client.method(0, commands.Connection.CloseOk())
        obs = client.observe()
        return {"logged_in": False, **obs, "received": [first, *obs["received"]]}


def _eof_observation(received: list[dict[str, Any]], began: float) -> Observation:
    obs: Observation = {"received": received, "socket": "closed"}
    elapsed = time.monotonic() - began
    if elapsed >= 1.0:
        obs["socket_closed_after_s"] = round(elapsed)
    return obs


def _amqplain(login: str, password: str) -> str:
    """An AMQPLAIN response: a field table without its length prefix (ASCII only)."""
    table = pencode.field_table({"LOGIN": login, "PASSWORD": password})[4:]
    return table.decode("ascii")


NO_CLOSE_CAPABILITIES = {
    k: v for k, v in CLIENT_CAPABILITIES.items() if k != "authentication_failure_close"
}


@scenario()
def s_auth_plain_wrong_password(host: str, port: int) -> Observation:
    """PLAIN, wrong password, client advertises authentication_failure_close."""
    return _auth_probe(host, port, response="\x00guest\x00wrong")


@scenario()
def s_auth_plain_wrong_password_no_capability(host: str, port: int) -> Observation:
    """PLAIN, wrong password, client does not advertise authentication_failure_close."""
    return _auth_probe(
        host, port, response="\x00guest\x00wrong", capabilities=NO_CLOSE_CAPABILITIES
    )


@scenario()
def s_auth_plain_wrong_password_no_client_properties_capabilities(
    host: str, port: int
) -> Observation:
    """PLAIN, wrong password, client properties without any capabilities table."""
    return _auth_probe(host, port, response="\x00guest\x00wrong", capabilities={})


@scenario()
def s_auth_plain_unknown_user(host: str, port: int) -> Observation:
    """PLAIN, user that does not exist (with authentication_failure_close)."""
    return _auth_probe(host, port, response="\x00compat-nobody\x00guest")


@scenario()
def s_auth_plain_authzid(host: str, port: int) -> Observation:
    """PLAIN with an authorisation identity before the first NUL."""
    return _auth_probe(host, port, response="guest\x00guest\x00guest")


@scenario()
def s_auth_plain_malformed(host: str, port: int) -> Observation:
    """PLAIN response without NUL separators."""
    return _auth_probe(host, port, response="guestguest")


@scenario()
def s_auth_plain_empty_response(host: str, port: int) -> Observation:
    """PLAIN with an empty response."""
    return _auth_probe(host, port, response="")


@scenario()
def s_auth_amqplain_success(host: str, port: int) -> Observation:
    """AMQPLAIN with the right credentials."""
    return _auth_probe(host, port, mechanism="AMQPLAIN", response=_amqplain("guest", "guest"))


@scenario()
def s_auth_amqplain_wrong_password(host: str, port: int) -> Observation:
    """AMQPLAIN with a wrong password."""
    return _auth_probe(host, port, mechanism="AMQPLAIN", response=_amqplain("guest", "wrong"))


@scenario()
def s_auth_unknown_mechanism(host: str, port: int) -> Observation:
    """A mechanism the server did not offer."""
    return _auth_probe(host, port, mechanism="COMPAT-BOGUS", response="\x00guest\x00guest")


@scenario()
def s_auth_external_mechanism(host: str, port: int) -> Observation:
    """EXTERNAL (not offered without the auth-mechanism-ssl plugin)."""
    return _auth_probe(host, port, mechanism="EXTERNAL", response="")


@scenario()
def s_open_missing_vhost(host: str, port: int) -> Observation:
    """connection.open to a vhost that does not exist."""
    with raw_client(host, port) as client:
        client.start_ok()
        tune = client.expect("Connection.Tune", 0)
        client.method(0, commands.Connection.TuneOk(tune.channel_max, tune.frame_max, 0))
        client.method(0, commands.Connection.Open(virtual_host="compat-missing-vhost"))
        return client.observe()


def _tune_probe(
    host: str,
    port: int,
    *,
    channel_max: int | None = None,
    frame_max: int | None = None,
    heartbeat: int = 0,
) -> Observation:
    """Tune-ok with the given values, then connection.open and a channel ping."""
    with raw_client(host, port) as client:
        client.start_ok()
        tune = client.expect("Connection.Tune", 0)
        client.method(
            0,
            commands.Connection.TuneOk(
                channel_max=tune.channel_max if channel_max is None else channel_max,
                frame_max=tune.frame_max if frame_max is None else frame_max,
                heartbeat=heartbeat,
            ),
        )
        client.method(0, commands.Connection.Open(virtual_host="/"))
        client.method(1, commands.Channel.Open())
        return client.observe(ping=1)


@scenario()
def s_tune_frame_max_below_minimum(host: str, port: int) -> Observation:
    """tune-ok frame_max=1024 (< 4096, the protocol's frame-min-size)."""
    return _tune_probe(host, port, frame_max=1024)


@scenario()
def s_tune_frame_max_minimum(host: str, port: int) -> Observation:
    """tune-ok frame_max=4096 exactly."""
    return _tune_probe(host, port, frame_max=4096)


@scenario()
def s_tune_frame_max_zero(host: str, port: int) -> Observation:
    """tune-ok frame_max=0 ('no limit') while the server proposed a limit."""
    return _tune_probe(host, port, frame_max=0)


@scenario()
def s_tune_frame_max_above_server(host: str, port: int) -> Observation:
    """tune-ok frame_max larger than the server proposed."""
    return _tune_probe(host, port, frame_max=1048576)


@scenario()
def s_tune_channel_max_above_server(host: str, port: int) -> Observation:
    """tune-ok channel_max=65535, above the server's proposal."""
    return _tune_probe(host, port, channel_max=65535)


@scenario()
def s_tune_channel_max_zero(host: str, port: int) -> Observation:
    """tune-ok channel_max=0 ('no limit')."""
    return _tune_probe(host, port, channel_max=0)


@scenario()
def s_tune_channel_max_small(host: str, port: int) -> Observation:
    """tune-ok channel_max=10 (fine)."""
    return _tune_probe(host, port, channel_max=10)


@scenario()
def s_tune_heartbeat_above_server(host: str, port: int) -> Observation:
    """tune-ok heartbeat=600, above the server's proposal."""
    return _tune_probe(host, port, heartbeat=600)


@scenario()
def s_tune_heartbeat_zero_no_heartbeats(host: str, port: int) -> Observation:
    """Heartbeat 0: no heartbeat frame arrives during 2.5 s of silence."""
    with raw_client(host, port) as client:
        client.handshake(heartbeat=0)
        got = client.read(2.5)
        return {
            "first_event": got.kind if got.kind != "frame" else describe(got.channel, got.frame)
        }


@scenario()
def s_tune_heartbeat_1_silent_client(host: str, port: int) -> Observation:
    """Heartbeat 1 s and a client that never sends anything: frames seen, then the socket's fate."""
    with raw_client(host, port) as client:
        client.handshake(heartbeat=1)
        kinds: set[str] = set()
        deadline = time.monotonic() + 10.0
        fate = "open"
        while time.monotonic() < deadline:
            got = client.read(max(0.1, deadline - time.monotonic()))
            if got.kind == "eof":
                fate = "closed"
                break
            if got.kind == "timeout":
                break
            desc = describe(got.channel, got.frame)
            kinds.add(f"{desc.get('frame', 'raw')}@{got.channel}")
            if desc.get("frame") == "Connection.Close":
                kinds.add(f"Connection.Close {desc['reply_code']} {desc['reply_text']}")
        return {"frames_seen": sorted(kinds), "socket_within_10s": fate}


@scenario()
def s_tune_heartbeat_1_client_heartbeats(host: str, port: int) -> Observation:
    """Heartbeat 1 s and a client that heartbeats every 0.4 s: still open after 4 s."""
    with raw_client(host, port) as client:
        client.handshake(heartbeat=1)
        deadline = time.monotonic() + 4.0
        while time.monotonic() < deadline:
            client.send(raw_frame(FRAME_HEARTBEAT, 0, b""))
            got = client.read(0.4)
            if got.kind == "eof":
                return {"socket": "closed"}
        return client.observe(ping=1)


# ======================================================================================
# Scenarios: framing and protocol misbehaviour after the handshake
# ======================================================================================


def _after_handshake(
    host: str,
    port: int,
    data: bytes | Callable[[RawClient], None],
    *,
    ping: int | None = 1,
    **handshake: Any,
) -> Observation:
    """Handshake (channel 1 open), send ``data`` (or run it), observe with a ping on ch 1."""
    with raw_client(host, port) as client:
        client.handshake(**handshake)
        if callable(data):
            data(client)
        else:
            client.send(data)
        return client.observe(ping=ping)


@scenario()
def s_frame_larger_than_frame_max(host: str, port: int) -> Observation:
    """frame_max negotiated to 4096; a body frame of 5000 payload bytes."""

    def send(client: RawClient) -> None:
        client.method(
            1, commands.Basic.Publish(exchange="amq.direct", routing_key="compat-nowhere")
        )
        client.send(pframe.marshal(pheader.ContentHeader(0, 5000, commands.Basic.Properties()), 1))
        client.send(raw_frame(FRAME_BODY, 1, b"x" * 5000))

    return _after_handshake(host, port, send, frame_max=4096)


def _body_frame_probe(host: str, port: int, payload_size: int) -> Observation:
    """frame_max negotiated to 4096; publish with one body frame of ``payload_size`` bytes."""

    def send(client: RawClient) -> None:
        client.method(
            1, commands.Basic.Publish(exchange="amq.direct", routing_key="compat-nowhere")
        )
        client.send(
            pframe.marshal(pheader.ContentHeader(0, payload_size, commands.Basic.Properties()), 1)
        )
        client.send(raw_frame(FRAME_BODY, 1, b"x" * payload_size))

    return _after_handshake(host, port, send, frame_max=4096)


@scenario()
def s_frame_exactly_frame_max(host: str, port: int) -> Observation:
    """frame_max 4096; a body frame of exactly 4096 bytes in total (payload 4088)."""
    return _body_frame_probe(host, port, 4088)


@scenario()
def s_frame_one_over_frame_max(host: str, port: int) -> Observation:
    """frame_max 4096; a body frame of 4097 bytes in total (payload 4089)."""
    return _body_frame_probe(host, port, 4089)


@scenario()
def s_frame_payload_equals_frame_max(host: str, port: int) -> Observation:
    """frame_max 4096; a body frame whose payload alone is 4096 bytes (4104 in total)."""
    return _body_frame_probe(host, port, 4096)


@scenario()
def s_frame_payload_exceeds_frame_max(host: str, port: int) -> Observation:
    """frame_max 4096; a body frame whose payload is 4097 bytes (4105 in total)."""
    return _body_frame_probe(host, port, 4097)


@scenario()
def s_frame_unknown_type(host: str, port: int) -> Observation:
    """A frame of type 9 on channel 0."""
    return _after_handshake(host, port, raw_frame(9, 0, b"\x00\x00\x00\x00"))


@scenario()
def s_frame_unknown_type_on_channel(host: str, port: int) -> Observation:
    """A frame of type 9 on channel 1."""
    return _after_handshake(host, port, raw_frame(9, 1, b"\x00\x00\x00\x00"))


@scenario()
def s_frame_bad_end_octet(host: str, port: int) -> Observation:
    """A channel.open frame (channel 2) whose frame-end octet is 0x00."""
    return _after_handshake(host, port, raw_method(2, 20, 10, shortstr(""))[:-1] + b"\x00")


@scenario()
def s_frame_heartbeat_on_channel_1(host: str, port: int) -> Observation:
    """A heartbeat frame on channel 1."""
    return _after_handshake(host, port, raw_frame(FRAME_HEARTBEAT, 1, b""))


@scenario()
def s_frame_heartbeat_with_payload(host: str, port: int) -> Observation:
    """A heartbeat frame on channel 0 with a 2-byte payload."""
    return _after_handshake(host, port, raw_frame(FRAME_HEARTBEAT, 0, b"hi"))


@scenario()
def s_frame_heartbeat_ok(host: str, port: int) -> Observation:
    """A well-formed heartbeat frame on channel 0 (nothing should happen)."""
    return _after_handshake(host, port, raw_frame(FRAME_HEARTBEAT, 0, b""))


@scenario()
def s_method_unknown_class(host: str, port: int) -> Observation:
    """Method 99/10 on open channel 1."""
    return _after_handshake(host, port, raw_method(1, 99, 10))


@scenario()
def s_method_unknown_class_on_channel_0(host: str, port: int) -> Observation:
    """Method 99/10 on channel 0."""
    return _after_handshake(host, port, raw_method(0, 99, 10))


@scenario()
def s_method_unknown_method(host: str, port: int) -> Observation:
    """Method 60/99 (unknown method in class basic) on open channel 1."""
    return _after_handshake(host, port, raw_method(1, 60, 99))


@scenario()
def s_method_server_only_method_from_client(host: str, port: int) -> Observation:
    """basic.deliver (60/60) with content, sent by the client on channel 1."""

    def send(client: RawClient) -> None:
        args = shortstr("ctag") + struct.pack(">QB", 1, 0) + shortstr("") + shortstr("rk")
        client.send(raw_method(1, 60, 60, args))
        client.content(1, b"abc")

    return _after_handshake(host, port, send)


@scenario()
def s_method_server_only_sync_method_from_client(host: str, port: int) -> Observation:
    """queue.declare-ok (50/11) sent by the client on channel 1."""
    args = shortstr("compat-q") + struct.pack(">II", 0, 0)
    return _after_handshake(host, port, raw_method(1, 50, 11, args))


@scenario()
def s_method_on_unopened_channel(host: str, port: int) -> Observation:
    """basic.qos on channel 5, which was never opened."""
    return _after_handshake(host, port, pframe.marshal(commands.Basic.Qos(prefetch_count=1), 5))


@scenario()
def s_method_on_closed_channel(host: str, port: int) -> Observation:
    """basic.qos on channel 2 after it was opened and closed again."""

    def send(client: RawClient) -> None:
        client.call(2, commands.Channel.Open(), "Channel.OpenOk")
        client.call(2, commands.Channel.Close(200, "bye", 0, 0), "Channel.CloseOk")
        client.method(2, commands.Basic.Qos(prefetch_count=1))

    return _after_handshake(host, port, send)


@scenario()
def s_channel_open_twice(host: str, port: int) -> Observation:
    """channel.open on channel 1, which is already open."""
    return _after_handshake(host, port, pframe.marshal(commands.Channel.Open(), 1))


@scenario()
def s_channel_open_above_channel_max(host: str, port: int) -> Observation:
    """channel.open on channel_max + 1 (channel_max as proposed by the server)."""

    def send(client: RawClient) -> None:
        client.method(2048, commands.Channel.Open())

    return _after_handshake(host, port, send)


@scenario()
def s_channel_open_at_channel_max(host: str, port: int) -> Observation:
    """channel.open on the negotiated channel_max itself (10) works."""

    def send(client: RawClient) -> None:
        client.method(10, commands.Channel.Open())

    return _after_handshake(host, port, send, channel_max=10)


@scenario()
def s_channel_open_above_negotiated_channel_max(host: str, port: int) -> Observation:
    """channel_max negotiated to 10; channel.open on channel 11."""

    def send(client: RawClient) -> None:
        client.method(11, commands.Channel.Open())

    return _after_handshake(host, port, send, channel_max=10)


@scenario()
def s_channel_open_count_above_negotiated_channel_max(host: str, port: int) -> Observation:
    """channel_max negotiated to 2; channels 1 and 2 open; channel.open on channel 3."""

    def send(client: RawClient) -> None:
        client.call(2, commands.Channel.Open(), "Channel.OpenOk")
        client.method(3, commands.Channel.Open())

    return _after_handshake(host, port, send, channel_max=2)


@scenario()
def s_channel_open_on_channel_0(host: str, port: int) -> Observation:
    """channel.open on channel 0."""
    return _after_handshake(host, port, pframe.marshal(commands.Channel.Open(), 0))


@scenario()
def s_channel_method_on_channel_0(host: str, port: int) -> Observation:
    """basic.qos on channel 0."""
    return _after_handshake(host, port, pframe.marshal(commands.Basic.Qos(prefetch_count=1), 0))


@scenario()
def s_connection_method_on_channel_1(host: str, port: int) -> Observation:
    """connection.tune-ok sent on channel 1."""
    return _after_handshake(
        host, port, pframe.marshal(commands.Connection.TuneOk(2047, 131072, 0), 1)
    )


@scenario()
def s_content_header_without_publish(host: str, port: int) -> Observation:
    """A content header frame on channel 1 with no basic.publish before it."""
    return _after_handshake(
        host, port, pframe.marshal(pheader.ContentHeader(0, 3, commands.Basic.Properties()), 1)
    )


@scenario()
def s_content_body_without_publish(host: str, port: int) -> Observation:
    """A content body frame on channel 1 with no basic.publish before it."""
    return _after_handshake(host, port, raw_frame(FRAME_BODY, 1, b"abc"))


@scenario()
def s_content_body_without_header(host: str, port: int) -> Observation:
    """basic.publish followed directly by a body frame."""

    def send(client: RawClient) -> None:
        client.method(
            1, commands.Basic.Publish(exchange="amq.direct", routing_key="compat-nowhere")
        )
        client.send(raw_frame(FRAME_BODY, 1, b"abc"))

    return _after_handshake(host, port, send)


@scenario()
def s_content_body_longer_than_header(host: str, port: int) -> Observation:
    """Header announces 5 bytes, the body frame carries 10."""

    def send(client: RawClient) -> None:
        client.method(
            1, commands.Basic.Publish(exchange="amq.direct", routing_key="compat-nowhere")
        )
        client.send(pframe.marshal(pheader.ContentHeader(0, 5, commands.Basic.Properties()), 1))
        client.send(raw_frame(FRAME_BODY, 1, b"0123456789"))

    return _after_handshake(host, port, send)


@scenario()
def s_content_extra_body_frame(host: str, port: int) -> Observation:
    """Header announces 3 bytes, then a 3-byte body frame and another 3-byte body frame."""

    def send(client: RawClient) -> None:
        client.method(
            1, commands.Basic.Publish(exchange="amq.direct", routing_key="compat-nowhere")
        )
        client.send(pframe.marshal(pheader.ContentHeader(0, 3, commands.Basic.Properties()), 1))
        client.send(raw_frame(FRAME_BODY, 1, b"abc") + raw_frame(FRAME_BODY, 1, b"def"))

    return _after_handshake(host, port, send)


@scenario()
def s_content_method_while_body_expected(host: str, port: int) -> Observation:
    """Header announces 10 bytes, 4 arrive, then a basic.qos method frame."""

    def send(client: RawClient) -> None:
        client.method(
            1, commands.Basic.Publish(exchange="amq.direct", routing_key="compat-nowhere")
        )
        client.send(pframe.marshal(pheader.ContentHeader(0, 10, commands.Basic.Properties()), 1))
        client.send(raw_frame(FRAME_BODY, 1, b"0123"))
        client.method(1, commands.Basic.Qos(prefetch_count=1))

    return _after_handshake(host, port, send)


@scenario()
def s_content_method_while_header_expected(host: str, port: int) -> Observation:
    """basic.publish then a basic.qos method frame instead of the content header."""

    def send(client: RawClient) -> None:
        client.method(
            1, commands.Basic.Publish(exchange="amq.direct", routing_key="compat-nowhere")
        )
        client.method(1, commands.Basic.Qos(prefetch_count=1))

    return _after_handshake(host, port, send)


@scenario()
def s_content_header_wrong_class(host: str, port: int) -> Observation:
    """basic.publish then a content header whose class id is 50 (queue)."""

    def send(client: RawClient) -> None:
        client.method(
            1, commands.Basic.Publish(exchange="amq.direct", routing_key="compat-nowhere")
        )
        client.send(raw_frame(FRAME_HEADER, 1, struct.pack(">HHQH", 50, 0, 0, 0)))

    return _after_handshake(host, port, send)


@scenario()
def s_content_header_on_other_channel(host: str, port: int) -> Observation:
    """basic.publish on channel 1, its content header on (open) channel 2."""

    def send(client: RawClient) -> None:
        client.call(2, commands.Channel.Open(), "Channel.OpenOk")
        client.method(
            1, commands.Basic.Publish(exchange="amq.direct", routing_key="compat-nowhere")
        )
        client.send(pframe.marshal(pheader.ContentHeader(0, 0, commands.Basic.Properties()), 2))

    return _after_handshake(host, port, send, ping=2)


@scenario()
def s_content_zero_body_size(host: str, port: int) -> Observation:
    """A message with body_size 0 and no body frame is accepted and can be fetched."""

    def send(client: RawClient) -> None:
        client.call(1, commands.Queue.Declare(queue="compat-empty-body"), "Queue.DeclareOk")
        client.method(1, commands.Basic.Publish(exchange="", routing_key="compat-empty-body"))
        client.send(pframe.marshal(pheader.ContentHeader(0, 0, commands.Basic.Properties()), 1))

    with raw_client(host, port) as client:
        client.handshake()
        send(client)
        got = raw_get(client, 1, "compat-empty-body", no_ack=True)
        client.call(1, commands.Queue.Delete(queue="compat-empty-body"), "Queue.DeleteOk")
        return {"get": got, **client.observe(ping=1)}


@scenario()
def s_content_multi_frame_body(host: str, port: int) -> Observation:
    """frame_max 4096; a 10000-byte body split over three body frames round-trips."""
    with raw_client(host, port) as client:
        client.handshake(frame_max=4096)
        client.call(1, commands.Queue.Declare(queue="compat-multi-frame"), "Queue.DeclareOk")
        client.method(1, commands.Basic.Publish(exchange="", routing_key="compat-multi-frame"))
        body = bytes(i % 251 for i in range(10000))
        client.send(
            pframe.marshal(pheader.ContentHeader(0, len(body), commands.Basic.Properties()), 1)
        )
        for i in range(0, len(body), 4088):
            client.send(raw_frame(FRAME_BODY, 1, body[i : i + 4088]))
        client.method(1, commands.Basic.Get(queue="compat-multi-frame", no_ack=True))
        client.expect("Basic.GetOk", 1)
        hdr = client.expect("ContentHeader", 1)
        sizes = []
        received = b""
        while len(received) < hdr.body_size:
            chunk = client.expect("ContentBody", 1).value
            sizes.append(len(chunk))
            received += chunk
        client.call(1, commands.Queue.Delete(queue="compat-multi-frame"), "Queue.DeleteOk")
        return {"body_size": hdr.body_size, "body_frame_sizes": sizes, "intact": received == body}


@scenario()
def s_garbage_after_handshake(host: str, port: int) -> Observation:
    """Fifteen bytes of text after a completed handshake."""
    return _after_handshake(host, port, b"hello, world!\r\n", ping=None)


@scenario()
def s_method_truncated_payload(host: str, port: int) -> Observation:
    """queue.declare whose queue-name shortstr claims 10 bytes but the frame ends after 3."""
    args = struct.pack(">H", 0) + b"\x0aabc"
    return _after_handshake(host, port, raw_method(1, 50, 10, args))


@scenario()
def s_method_payload_too_short_for_ids(host: str, port: int) -> Observation:
    """A method frame with a 2-byte payload (no method id)."""
    return _after_handshake(host, port, raw_frame(FRAME_METHOD, 1, b"\x00\x3c"))


@scenario()
def s_method_trailing_garbage(host: str, port: int) -> Observation:
    """basic.qos with 4 extra bytes after its arguments."""
    args = struct.pack(">IHB", 0, 1, 0) + b"junk"
    return _after_handshake(host, port, raw_method(1, 60, 10, args))


@scenario()
def s_method_invalid_table(host: str, port: int) -> Observation:
    """queue.declare whose arguments table contains an unknown field type 'Z'."""
    table = shortstr("x-compat") + b"Z" + b"\x00"
    args = (
        struct.pack(">H", 0)
        + shortstr("compat-bad-table")
        + b"\x00"
        + struct.pack(">I", len(table))
        + table
    )
    return _after_handshake(host, port, raw_method(1, 50, 10, args))


@scenario()
def s_publish_immediate(host: str, port: int) -> Observation:
    """basic.publish with immediate=true."""

    def send(client: RawClient) -> None:
        client.publish(1, b"imm", "amq.direct", "compat-nowhere", immediate=True)

    return _after_handshake(host, port, send)


@scenario()
def s_publish_mandatory_unroutable_confirm(host: str, port: int) -> Observation:
    """Confirm mode; mandatory publish with no route: frames received, in order."""

    def send(client: RawClient) -> None:
        client.call(1, commands.Confirm.Select(), "Confirm.SelectOk")
        client.publish(1, b"m1", "amq.direct", "compat-nowhere", mandatory=True)

    return _after_handshake(host, port, send)


@scenario()
def s_publish_mandatory_routable_confirm(host: str, port: int) -> Observation:
    """Confirm mode; mandatory publish to a queue via the default exchange."""

    def send(client: RawClient) -> None:
        client.call(
            1,
            commands.Queue.Declare(queue="compat-mandatory-ok", exclusive=True),
            "Queue.DeclareOk",
        )
        client.call(1, commands.Confirm.Select(), "Confirm.SelectOk")
        client.publish(1, b"m1", "", "compat-mandatory-ok", mandatory=True)

    return _after_handshake(host, port, send)


@scenario()
def s_channel_flow_inactive(host: str, port: int) -> Observation:
    """channel.flow active=false from the client."""
    return _after_handshake(host, port, pframe.marshal(commands.Channel.Flow(active=False), 1))


@scenario()
def s_channel_flow_active(host: str, port: int) -> Observation:
    """channel.flow active=true from the client."""
    return _after_handshake(host, port, pframe.marshal(commands.Channel.Flow(active=True), 1))


@scenario()
def s_client_connection_close_with_open_channel(host: str, port: int) -> Observation:
    """connection.close from the client while channel 1 is open."""
    return _after_handshake(
        host, port, pframe.marshal(commands.Connection.Close(200, "Goodbye", 0, 0), 0), ping=None
    )


@scenario()
def s_client_channel_close(host: str, port: int) -> Observation:
    """channel.close from the client, then channel.open on the same number again."""
    with raw_client(host, port) as client:
        client.handshake()
        client.method(1, commands.Channel.Close(200, "bye", 0, 0))
        first = client.next_frame()
        client.method(1, commands.Channel.Open())
        second = client.next_frame()
        return {
            "after_close": describe(first.channel, first.frame)
            if first.kind == "frame"
            else first.kind,
            "after_reopen": describe(second.channel, second.frame)
            if second.kind == "frame"
            else second.kind,
            **client.observe(ping=1),
        }


@scenario()
def s_client_close_ok_without_close(host: str, port: int) -> Observation:
    """connection.close-ok from the client without any connection.close."""
    return _after_handshake(host, port, pframe.marshal(commands.Connection.CloseOk(), 0))


@scenario()
def s_client_channel_close_ok_without_close(host: str, port: int) -> Observation:
    """channel.close-ok on open channel 1 without any channel.close."""
    return _after_handshake(host, port, pframe.marshal(commands.Channel.CloseOk(), 1))


@scenario()
def s_client_connection_close_then_method(host: str, port: int) -> Observation:
    """connection.close from the client, then (before close-ok arrives) a basic.qos on channel 1."""

    def send(client: RawClient) -> None:
        client.method(0, commands.Connection.Close(200, "Goodbye", 0, 0))
        client.method(1, commands.Basic.Qos(prefetch_count=1))

    return _after_handshake(host, port, send, ping=None)


@scenario()
def s_connection_open_twice(host: str, port: int) -> Observation:
    """A second connection.open after the handshake completed."""
    return _after_handshake(
        host, port, pframe.marshal(commands.Connection.Open(virtual_host="/"), 0)
    )


@scenario()
def s_method_before_open(host: str, port: int) -> Observation:
    """channel.open sent after tune-ok but before connection.open."""
    with raw_client(host, port) as client:
        client.start_ok()
        tune = client.expect("Connection.Tune", 0)
        client.method(0, commands.Connection.TuneOk(tune.channel_max, tune.frame_max, 0))
        client.method(1, commands.Channel.Open())
        return client.observe()


@scenario()
def s_basic_recover_async(host: str, port: int) -> Observation:
    """Two unacked basic.get messages, then basic.recover-async requeue=true; get again."""
    with raw_client(host, port) as client:
        client.handshake()
        client.call(
            1,
            commands.Queue.Declare(queue="compat-recover-async", exclusive=True),
            "Queue.DeclareOk",
        )
        client.publish(1, b"m1", "", "compat-recover-async")
        client.publish(1, b"m2", "", "compat-recover-async")
        first = [raw_get(client, 1, "compat-recover-async") for _ in range(2)]
        with warnings.catch_warnings():  # pamqp warns that the method is deprecated
            warnings.simplefilter("ignore", DeprecationWarning)
            recover_async = commands.Basic.RecoverAsync(requeue=True)
        client.method(1, recover_async)
        obs = client.observe(ping=1)
        second = [raw_get(client, 1, "compat-recover-async") for _ in range(3)]
        return {"first": first, "after_recover_async": obs, "second": second}


# ======================================================================================
# Scenarios: exchanges
# ======================================================================================


def _declare_then(
    host: str, port: int, first: dict[str, Any], second: dict[str, Any], name: str
) -> Observation:
    """exchange.declare ``name`` with ``first`` kwargs, then again with ``second``."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.exchange_declare(name, **first)
        return attempt(lambda: ch.exchange_declare(name, **second))


@scenario(exchanges=["compat-x-badtype"])
def s_exchange_declare_unknown_type(host: str, port: int) -> Observation:
    """exchange.declare with type 'compat-bogus'."""
    with connection(host, port) as conn:
        ch = conn.channel()
        return attempt(lambda: ch.exchange_declare("compat-x-badtype", "compat-bogus"))


@scenario(exchanges=["compat-x-badtype"])
def s_exchange_declare_unknown_type_passive(host: str, port: int) -> Observation:
    """Passive exchange.declare of a missing exchange with type 'compat-bogus'."""
    with connection(host, port) as conn:
        ch = conn.channel()
        return attempt(
            lambda: ch.exchange_declare("compat-x-badtype", "compat-bogus", passive=True)
        )


@scenario(exchanges=["compat-x-redeclare"])
def s_exchange_redeclare_same(host: str, port: int) -> Observation:
    """Redeclare an exchange with identical properties."""
    return _declare_then(
        host, port, {"exchange_type": "direct"}, {"exchange_type": "direct"}, "compat-x-redeclare"
    )


@scenario(exchanges=["compat-x-redeclare"])
def s_exchange_redeclare_different_type(host: str, port: int) -> Observation:
    """Declared direct, redeclared fanout."""
    return _declare_then(
        host, port, {"exchange_type": "direct"}, {"exchange_type": "fanout"}, "compat-x-redeclare"
    )


@scenario(exchanges=["compat-x-redeclare"])
def s_exchange_redeclare_different_durable(host: str, port: int) -> Observation:
    """Declared non-durable, redeclared durable."""
    return _declare_then(host, port, {"durable": False}, {"durable": True}, "compat-x-redeclare")


@scenario(exchanges=["compat-x-redeclare"])
def s_exchange_redeclare_different_auto_delete(host: str, port: int) -> Observation:
    """Declared auto_delete=false, redeclared auto_delete=true."""
    return _declare_then(
        host, port, {"auto_delete": False}, {"auto_delete": True}, "compat-x-redeclare"
    )


@scenario(exchanges=["compat-x-redeclare"])
def s_exchange_redeclare_different_internal(host: str, port: int) -> Observation:
    """Declared internal=false, redeclared internal=true."""
    return _declare_then(host, port, {"internal": False}, {"internal": True}, "compat-x-redeclare")


@scenario(exchanges=["compat-x-redeclare"])
def s_exchange_redeclare_different_arguments(host: str, port: int) -> Observation:
    """Declared with alternate-exchange 'amq.fanout', redeclared with 'amq.topic'."""
    return _declare_then(
        host,
        port,
        {"arguments": {"alternate-exchange": "amq.fanout"}},
        {"arguments": {"alternate-exchange": "amq.topic"}},
        "compat-x-redeclare",
    )


@scenario(exchanges=["compat-x-redeclare"])
def s_exchange_redeclare_passive_different_type(host: str, port: int) -> Observation:
    """Declared direct; passive redeclare saying fanout."""
    return _declare_then(
        host,
        port,
        {"exchange_type": "direct"},
        {"exchange_type": "fanout", "passive": True},
        "compat-x-redeclare",
    )


@scenario()
def s_exchange_declare_amq_prefix(host: str, port: int) -> Observation:
    """Non-passive exchange.declare of 'amq.compat'."""
    with connection(host, port) as conn:
        ch = conn.channel()
        return attempt(lambda: ch.exchange_declare("amq.compat", "direct"))


@scenario()
def s_exchange_declare_amq_prefix_passive(host: str, port: int) -> Observation:
    """Passive exchange.declare of 'amq.compat' (does not exist)."""
    with connection(host, port) as conn:
        ch = conn.channel()
        return attempt(lambda: ch.exchange_declare("amq.compat", "direct", passive=True))


@scenario()
def s_exchange_declare_amq_direct(host: str, port: int) -> Observation:
    """Non-passive exchange.declare of 'amq.direct' with its own properties (durable direct)."""
    with connection(host, port) as conn:
        ch = conn.channel()
        return attempt(lambda: ch.exchange_declare("amq.direct", "direct", durable=True))


@scenario()
def s_exchange_declare_amq_direct_mismatch(host: str, port: int) -> Observation:
    """Non-passive exchange.declare of 'amq.direct' as a non-durable fanout."""
    with connection(host, port) as conn:
        ch = conn.channel()
        return attempt(lambda: ch.exchange_declare("amq.direct", "fanout"))


@scenario()
def s_exchange_declare_amq_direct_passive(host: str, port: int) -> Observation:
    """Passive exchange.declare of 'amq.direct'."""
    with connection(host, port) as conn:
        ch = conn.channel()
        return attempt(lambda: ch.exchange_declare("amq.direct", passive=True))


@scenario()
def s_exchange_declare_builtin_passive_all(host: str, port: int) -> Observation:
    """Passive exchange.declare of every built-in exchange name."""
    names = [
        "amq.direct", "amq.fanout", "amq.topic", "amq.headers", "amq.match",
        "amq.rabbitmq.trace", "amq.rabbitmq.log", "amq.default",
    ]  # fmt: skip
    out: Observation = {}
    with connection(host, port) as conn:
        for name in names:
            ch = conn.channel()

            def declare(ch: Any = ch, name: str = name) -> Any:
                return ch.exchange_declare(name, passive=True)

            out[name] = attempt(declare)
            with suppress(Exception):
                ch.close()
    return out


@scenario()
def s_exchange_declare_default_exchange(host: str, port: int) -> Observation:
    """Non-passive exchange.declare of '' (the default exchange)."""
    with connection(host, port) as conn:
        ch = conn.channel()
        return attempt(lambda: ch.exchange_declare("", "direct", durable=True))


@scenario()
def s_exchange_declare_default_exchange_passive(host: str, port: int) -> Observation:
    """Passive exchange.declare of '' (the default exchange)."""
    with connection(host, port) as conn:
        ch = conn.channel()
        return attempt(lambda: ch.exchange_declare("", passive=True))


@scenario()
def s_exchange_declare_passive_missing(host: str, port: int) -> Observation:
    """Passive exchange.declare of a missing exchange."""
    with connection(host, port) as conn:
        ch = conn.channel()
        return attempt(lambda: ch.exchange_declare("compat-x-missing", passive=True))


@scenario()
def s_exchange_declare_name_with_space(host: str, port: int) -> Observation:
    """exchange.declare of a name containing a space and a slash (allowed by RabbitMQ)."""
    with connection(host, port) as conn:
        ch = conn.channel()
        result = attempt(lambda: ch.exchange_declare("compat x/space", "fanout"))
        with suppress(Exception):
            ch.exchange_delete("compat x/space")
        return result


@scenario()
def s_exchange_delete_default(host: str, port: int) -> Observation:
    """exchange.delete of '' (the default exchange)."""
    with connection(host, port) as conn:
        ch = conn.channel()
        return attempt(lambda: ch.exchange_delete(""))


@scenario()
def s_exchange_delete_amq_direct(host: str, port: int) -> Observation:
    """exchange.delete of 'amq.direct'."""
    with connection(host, port) as conn:
        ch = conn.channel()
        return attempt(lambda: ch.exchange_delete("amq.direct"))


@scenario()
def s_exchange_delete_missing(host: str, port: int) -> Observation:
    """exchange.delete of an exchange that does not exist."""
    with connection(host, port) as conn:
        ch = conn.channel()
        return attempt(lambda: ch.exchange_delete("compat-x-missing"))


@scenario(queues=["compat-q-xdel"], exchanges=["compat-x-xdel"])
def s_exchange_delete_if_unused_bound(host: str, port: int) -> Observation:
    """exchange.delete if-unused of an exchange with a queue bound to it."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.exchange_declare("compat-x-xdel", "direct")
        ch.queue_declare("compat-q-xdel")
        ch.queue_bind("compat-q-xdel", "compat-x-xdel", "k")
        return attempt(lambda: ch.exchange_delete("compat-x-xdel", if_unused=True))


@scenario(exchanges=["compat-x-xdel"])
def s_exchange_delete_if_unused_unbound(host: str, port: int) -> Observation:
    """exchange.delete if-unused of an exchange without bindings."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.exchange_declare("compat-x-xdel", "direct")
        return attempt(lambda: ch.exchange_delete("compat-x-xdel", if_unused=True))


@scenario(exchanges=["compat-x-xdel", "compat-x-xdel-src"])
def s_exchange_delete_if_unused_destination_only(host: str, port: int) -> Observation:
    """exchange.delete if-unused of an exchange that is only the destination of an e2e binding."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.exchange_declare("compat-x-xdel", "fanout")
        ch.exchange_declare("compat-x-xdel-src", "fanout")
        ch.exchange_bind("compat-x-xdel", "compat-x-xdel-src")
        return attempt(lambda: ch.exchange_delete("compat-x-xdel", if_unused=True))


@scenario(queues=["compat-q-xdel"], exchanges=["compat-x-xdel"])
def s_exchange_delete_removes_bindings(host: str, port: int) -> Observation:
    """Delete an exchange with a bound queue, redeclare it: the old binding is gone."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.exchange_declare("compat-x-xdel", "fanout")
        ch.queue_declare("compat-q-xdel")
        ch.queue_bind("compat-q-xdel", "compat-x-xdel")
        ch.exchange_delete("compat-x-xdel")
        ch.exchange_declare("compat-x-xdel", "fanout")
        ch.confirm_delivery()
        ch.basic_publish("compat-x-xdel", "", b"m")
        return {"queue_after": method_dict(ch.queue_declare("compat-q-xdel", passive=True))}


@scenario(queues=["compat-q-bind"])
def s_queue_bind_default_exchange(host: str, port: int) -> Observation:
    """queue.bind to the default exchange."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-bind")
        return attempt(lambda: ch.queue_bind("compat-q-bind", "", "compat-q-bind"))


@scenario(queues=["compat-q-bind"])
def s_queue_unbind_default_exchange(host: str, port: int) -> Observation:
    """queue.unbind from the default exchange."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-bind")
        return attempt(lambda: ch.queue_unbind("compat-q-bind", "", "compat-q-bind"))


@scenario()
def s_exchange_bind_default_destination(host: str, port: int) -> Observation:
    """exchange.bind with destination '' (the default exchange), source amq.direct."""
    with connection(host, port) as conn:
        ch = conn.channel()
        return attempt(lambda: ch.exchange_bind("", "amq.direct", "k"))


@scenario()
def s_exchange_bind_default_source(host: str, port: int) -> Observation:
    """exchange.bind with source '' (the default exchange), destination amq.fanout."""
    with connection(host, port) as conn:
        ch = conn.channel()
        return attempt(lambda: ch.exchange_bind("amq.fanout", "", "k"))


@scenario()
def s_exchange_bind_missing_source(host: str, port: int) -> Observation:
    """exchange.bind from a missing source exchange."""
    with connection(host, port) as conn:
        ch = conn.channel()
        return attempt(lambda: ch.exchange_bind("amq.fanout", "compat-x-missing", "k"))


@scenario()
def s_exchange_bind_missing_destination(host: str, port: int) -> Observation:
    """exchange.bind to a missing destination exchange."""
    with connection(host, port) as conn:
        ch = conn.channel()
        return attempt(lambda: ch.exchange_bind("compat-x-missing", "amq.fanout", "k"))


@scenario()
def s_exchange_bind_both_missing(host: str, port: int) -> Observation:
    """exchange.bind where both source and destination are missing."""
    with connection(host, port) as conn:
        ch = conn.channel()
        return attempt(lambda: ch.exchange_bind("compat-x-missing-d", "compat-x-missing-s", "k"))


@scenario()
def s_exchange_unbind_missing_binding(host: str, port: int) -> Observation:
    """exchange.unbind of a binding that does not exist (both exchanges exist)."""
    with connection(host, port) as conn:
        ch = conn.channel()
        return attempt(lambda: ch.exchange_unbind("amq.fanout", "amq.direct", "compat-nothing"))


@scenario(queues=["compat-q-e2e"], exchanges=["compat-x-e2e-src", "compat-x-e2e-dst"])
def s_exchange_to_exchange_routing(host: str, port: int) -> Observation:
    """topic source bound to fanout destination bound to a queue; which keys arrive."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.exchange_declare("compat-x-e2e-src", "topic")
        ch.exchange_declare("compat-x-e2e-dst", "fanout")
        ch.exchange_bind("compat-x-e2e-dst", "compat-x-e2e-src", "a.*")
        ch.queue_declare("compat-q-e2e")
        ch.queue_bind("compat-q-e2e", "compat-x-e2e-dst")
        ch.confirm_delivery()
        for key in ("a.b", "a.b.c", "b.a", "a.x"):
            ch.basic_publish("compat-x-e2e-src", key, key.encode())
        return {"received": [m["body"] for m in get_all(ch, "compat-q-e2e")]}


@scenario(queues=["compat-q-hdr"])
def s_headers_bind_invalid_x_match(host: str, port: int) -> Observation:
    """queue.bind to amq.headers with x-match 'compat-bogus'."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-hdr")
        return attempt(
            lambda: ch.queue_bind(
                "compat-q-hdr", "amq.headers", "", arguments={"x-match": "compat-bogus"}
            )
        )


@scenario(queues=["compat-q-hdr"])
def s_headers_bind_x_match_not_string(host: str, port: int) -> Observation:
    """queue.bind to amq.headers with x-match given as an integer."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-hdr")
        return attempt(
            lambda: ch.queue_bind("compat-q-hdr", "amq.headers", "", arguments={"x-match": 1})
        )


@scenario(queues=["compat-q-hdr-all", "compat-q-hdr-any", "compat-q-hdr-none"])
def s_headers_exchange_routing(host: str, port: int) -> Observation:
    """amq.headers with all / any / no-x-match bindings; which messages each queue gets."""
    with connection(host, port) as conn:
        ch = conn.channel()
        for q in ("compat-q-hdr-all", "compat-q-hdr-any", "compat-q-hdr-none"):
            ch.queue_declare(q)
        ch.queue_bind(
            "compat-q-hdr-all", "amq.headers", arguments={"x-match": "all", "a": "1", "b": "2"}
        )
        ch.queue_bind(
            "compat-q-hdr-any", "amq.headers", arguments={"x-match": "any", "a": "1", "b": "2"}
        )
        ch.queue_bind("compat-q-hdr-none", "amq.headers", arguments={"a": "1", "b": "2"})
        ch.confirm_delivery()
        cases = {
            "ab": {"a": "1", "b": "2"},
            "a": {"a": "1"},
            "ab-extra": {"a": "1", "b": "2", "c": "3"},
            "a-wrong-b": {"a": "1", "b": "x"},
            "none": {},
            "a-int": {"a": 1, "b": "2"},
            "x-only": {"x-a": "1"},
        }
        for body, headers in cases.items():
            props = pika.BasicProperties(headers=headers or None)
            ch.basic_publish("amq.headers", "", body.encode(), props)
        return {
            q: [m["body"] for m in get_all(ch, q)]
            for q in ("compat-q-hdr-all", "compat-q-hdr-any", "compat-q-hdr-none")
        }


@scenario(queues=["compat-q-topic-1", "compat-q-topic-2", "compat-q-topic-3", "compat-q-topic-4"])
def s_topic_exchange_routing(host: str, port: int) -> Observation:
    """amq.topic with patterns '#', 'a.*', 'a.#', '*.b.#'; which keys each queue gets."""
    patterns = {
        "compat-q-topic-1": "#",
        "compat-q-topic-2": "a.*",
        "compat-q-topic-3": "a.#",
        "compat-q-topic-4": "*.b.#",
    }
    with connection(host, port) as conn:
        ch = conn.channel()
        for q, pattern in patterns.items():
            ch.queue_declare(q)
            ch.queue_bind(q, "amq.topic", pattern)
        ch.confirm_delivery()
        for key in ("a", "a.b", "a.b.c", "b.b", "x.b", "a..b", "", "A.b"):
            ch.basic_publish("amq.topic", key, (key or "<empty>").encode())
        return {f"{q} ({patterns[q]})": [m["body"] for m in get_all(ch, q)] for q in patterns}


@scenario(queues=["compat-q-direct-1", "compat-q-direct-2"])
def s_direct_exchange_multiple_bindings(host: str, port: int) -> Observation:
    """A queue bound twice (keys k1, k2) and another bound with k1: one copy per queue."""
    with connection(host, port) as conn:
        ch = conn.channel()
        for q in ("compat-q-direct-1", "compat-q-direct-2"):
            ch.queue_declare(q)
        ch.queue_bind("compat-q-direct-1", "amq.direct", "k1")
        ch.queue_bind("compat-q-direct-1", "amq.direct", "k2")
        ch.queue_bind("compat-q-direct-1", "amq.direct", "k1")
        ch.queue_bind("compat-q-direct-2", "amq.direct", "k1")
        ch.confirm_delivery()
        for key in ("k1", "k2", "k3"):
            ch.basic_publish("amq.direct", key, key.encode())
        return {
            q: [m["body"] for m in get_all(ch, q)]
            for q in ("compat-q-direct-1", "compat-q-direct-2")
        }


@scenario(queues=["compat-q-fanout"])
def s_fanout_exchange_ignores_key(host: str, port: int) -> Observation:
    """amq.fanout delivers regardless of binding and routing keys."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-fanout")
        ch.queue_bind("compat-q-fanout", "amq.fanout", "some-key")
        ch.confirm_delivery()
        for key in ("some-key", "other", ""):
            ch.basic_publish("amq.fanout", key, (key or "<empty>").encode())
        return {"received": [m["body"] for m in get_all(ch, "compat-q-fanout")]}


@scenario(queues=["compat-q-ae"], exchanges=["compat-x-ae", "compat-x-ae-main"])
def s_alternate_exchange_routing(host: str, port: int) -> Observation:
    """Unroutable messages go to the alternate exchange; mandatory is then satisfied."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.exchange_declare("compat-x-ae", "fanout")
        ch.exchange_declare(
            "compat-x-ae-main", "direct", arguments={"alternate-exchange": "compat-x-ae"}
        )
        ch.queue_declare("compat-q-ae")
        ch.queue_bind("compat-q-ae", "compat-x-ae")
        returns: list[Any] = []
        ch.add_on_return_callback(
            lambda _c, m, _p, b: returns.append([m.reply_code, m.reply_text, b.decode()])
        )
        ch.confirm_delivery()
        ch.basic_publish("compat-x-ae-main", "nowhere", b"m1", mandatory=True)
        msg = get_one(ch, "compat-q-ae", auto_ack=True)
        return {"returns": returns, "ae_queue_got": msg}


@scenario(queues=["compat-q-ae"], exchanges=["compat-x-ae-main"])
def s_alternate_exchange_missing(host: str, port: int) -> Observation:
    """alternate-exchange names a missing exchange: mandatory publish returns 312."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.exchange_declare(
            "compat-x-ae-main", "direct", arguments={"alternate-exchange": "compat-x-nope"}
        )
        returns: list[Any] = []
        ch.add_on_return_callback(
            lambda _c, m, _p, b: returns.append([m.reply_code, m.reply_text, b.decode()])
        )
        ch.basic_publish("compat-x-ae-main", "nowhere", b"m1", mandatory=True)
        sync(ch)
        conn.process_data_events(0)
        return {"returns": returns}


@scenario(queues=["compat-q-autodel-x"], exchanges=["compat-x-autodel"])
def s_exchange_auto_delete_after_unbind(host: str, port: int) -> Observation:
    """An auto-delete exchange disappears when its last binding is removed."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.exchange_declare("compat-x-autodel", "direct", auto_delete=True)
        before = attempt(lambda: ch.exchange_declare("compat-x-autodel", passive=True))
        ch.queue_declare("compat-q-autodel-x")
        ch.queue_bind("compat-q-autodel-x", "compat-x-autodel", "k")
        ch.queue_unbind("compat-q-autodel-x", "compat-x-autodel", "k")
        after = attempt(lambda: ch.exchange_declare("compat-x-autodel", passive=True))
        return {"before_any_binding": before, "after_last_unbind": after}


@scenario(exchanges=["compat-x-internal"])
def s_publish_internal_exchange(host: str, port: int) -> Observation:
    """basic.publish to an internal exchange."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.exchange_declare("compat-x-internal", "fanout", internal=True)

        def go() -> None:
            ch.basic_publish("compat-x-internal", "", b"m")
            sync(ch)

        return attempt(go)


@scenario()
def s_publish_missing_exchange(host: str, port: int) -> Observation:
    """basic.publish to an exchange that does not exist."""
    with connection(host, port) as conn:
        ch = conn.channel()

        def go() -> None:
            ch.basic_publish("compat-x-missing", "", b"m")
            sync(ch)

        return attempt(go)


@scenario()
def s_publish_missing_exchange_confirm(host: str, port: int) -> Observation:
    """basic.publish to a missing exchange in confirm mode (close vs nack)."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        return attempt(lambda: ch.basic_publish("compat-x-missing", "", b"m"))


@scenario(queues=["compat-q-amqdefault"])
def s_publish_amq_default(host: str, port: int) -> Observation:
    """basic.publish to exchange 'amq.default' with a queue's name as key."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-amqdefault")

        def go() -> Any:
            ch.basic_publish("amq.default", "compat-q-amqdefault", b"m")
            sync(ch)
            return get_one(ch, "compat-q-amqdefault", auto_ack=True)

        return attempt(go)


# ======================================================================================
# Scenarios: queues
# ======================================================================================


@scenario()
def s_queue_declare_server_named(host: str, port: int) -> Observation:
    """queue.declare with an empty name: the generated name's shape and the counts."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ok = ch.queue_declare("", exclusive=True).method
        name = ok.queue
        return {
            "prefix": name[:8],
            "length": len(name),
            "charset_ok": bool(re.fullmatch(r"amq\.gen-[A-Za-z0-9_\-]+", name)),
            "message_count": ok.message_count,
            "consumer_count": ok.consumer_count,
        }


@scenario()
def s_queue_declare_server_named_not_exclusive(host: str, port: int) -> Observation:
    """A server-named, non-exclusive queue is reachable from a second connection."""
    with connection(host, port) as conn, connection(host, port) as other:
        ch = conn.channel()
        name = ch.queue_declare("").method.queue
        try:
            return attempt(lambda: other.channel().queue_declare(name, passive=True))
        finally:
            ch.queue_delete(name)


def _queue_redeclare(
    host: str,
    port: int,
    first: dict[str, Any],
    second: dict[str, Any],
    name: str = "compat-q-redeclare",
) -> Observation:
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare(name, **first)
        return attempt(lambda: ch.queue_declare(name, **second))


@scenario(queues=["compat-q-redeclare"])
def s_queue_redeclare_same(host: str, port: int) -> Observation:
    """Redeclare a queue with identical properties."""
    return _queue_redeclare(host, port, {"durable": True}, {"durable": True})


@scenario(queues=["compat-q-redeclare"])
def s_queue_redeclare_different_durable(host: str, port: int) -> Observation:
    """Declared non-durable, redeclared durable."""
    return _queue_redeclare(host, port, {"durable": False}, {"durable": True})


@scenario(queues=["compat-q-redeclare"])
def s_queue_redeclare_different_exclusive(host: str, port: int) -> Observation:
    """Declared non-exclusive, redeclared exclusive (same connection)."""
    return _queue_redeclare(host, port, {"exclusive": False}, {"exclusive": True})


@scenario(queues=["compat-q-redeclare"])
def s_queue_redeclare_exclusive_as_non_exclusive(host: str, port: int) -> Observation:
    """Declared exclusive, redeclared non-exclusive on the owning connection."""
    return _queue_redeclare(host, port, {"exclusive": True}, {"exclusive": False})


@scenario(queues=["compat-q-redeclare"])
def s_queue_redeclare_different_auto_delete(host: str, port: int) -> Observation:
    """Declared auto_delete=false, redeclared auto_delete=true."""
    return _queue_redeclare(host, port, {"auto_delete": False}, {"auto_delete": True})


@scenario(queues=["compat-q-redeclare"])
def s_queue_redeclare_different_max_length(host: str, port: int) -> Observation:
    """Declared x-max-length=10, redeclared x-max-length=20."""
    return _queue_redeclare(
        host, port, {"arguments": {"x-max-length": 10}}, {"arguments": {"x-max-length": 20}}
    )


@scenario(queues=["compat-q-redeclare"])
def s_queue_redeclare_missing_max_length(host: str, port: int) -> Observation:
    """Declared x-max-length=10, redeclared without arguments."""
    return _queue_redeclare(host, port, {"arguments": {"x-max-length": 10}}, {})


@scenario(queues=["compat-q-redeclare"])
def s_queue_redeclare_added_max_length(host: str, port: int) -> Observation:
    """Declared without arguments, redeclared with x-max-length=10."""
    return _queue_redeclare(host, port, {}, {"arguments": {"x-max-length": 10}})


@scenario(queues=["compat-q-redeclare"])
def s_queue_redeclare_max_length_other_int_type(host: str, port: int) -> Observation:
    """Declared x-max-length=10 (signed 32-bit), redeclared 10 as a 64-bit integer (raw)."""
    with connection(host, port) as conn:
        conn.channel().queue_declare("compat-q-redeclare", arguments={"x-max-length": 10})
    table = shortstr("x-max-length") + b"l" + struct.pack(">q", 10)
    args = (
        struct.pack(">H", 0)
        + shortstr("compat-q-redeclare")
        + b"\x00"
        + struct.pack(">I", len(table))
        + table
    )
    return _after_handshake(host, port, raw_method(1, 50, 10, args))


@scenario(queues=["compat-q-redeclare"])
def s_queue_redeclare_different_unknown_argument(host: str, port: int) -> Observation:
    """Declared x-compat=1, redeclared x-compat=2 (argument the broker does not know)."""
    return _queue_redeclare(
        host, port, {"arguments": {"x-compat": 1}}, {"arguments": {"x-compat": 2}}
    )


@scenario(queues=["compat-q-redeclare"])
def s_queue_redeclare_passive_different_durable(host: str, port: int) -> Observation:
    """Declared non-durable; passive redeclare saying durable."""
    return _queue_redeclare(host, port, {"durable": False}, {"durable": True, "passive": True})


@scenario()
def s_queue_declare_amq_prefix(host: str, port: int) -> Observation:
    """Non-passive queue.declare of 'amq.compat'."""
    with connection(host, port) as conn:
        return attempt(lambda: conn.channel().queue_declare("amq.compat"))


@scenario()
def s_queue_declare_amq_prefix_passive(host: str, port: int) -> Observation:
    """Passive queue.declare of 'amq.compat' (does not exist)."""
    with connection(host, port) as conn:
        return attempt(lambda: conn.channel().queue_declare("amq.compat", passive=True))


@scenario()
def s_queue_declare_passive_missing(host: str, port: int) -> Observation:
    """Passive queue.declare of a missing queue."""
    with connection(host, port) as conn:
        return attempt(lambda: conn.channel().queue_declare("compat-q-missing", passive=True))


@scenario()
def s_queue_declare_passive_empty_name_fresh_channel(host: str, port: int) -> Observation:
    """Passive queue.declare with an empty name on a fresh channel."""
    with connection(host, port) as conn:
        return attempt(lambda: conn.channel().queue_declare("", passive=True))


@scenario(queues=["compat-q-counts"])
def s_queue_declare_counts(host: str, port: int) -> Observation:
    """message_count / consumer_count in declare-ok before and after a prefetch-1 consumer."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-counts")
        ch.confirm_delivery()
        publish_bodies(ch, "compat-q-counts", ["m1", "m2", "m3"])
        before = method_dict(ch.queue_declare("compat-q-counts"))
        consumer_ch = conn.channel()
        consumer_ch.basic_qos(prefetch_count=1)
        consumer_ch.basic_consume("compat-q-counts", lambda *_: None)
        after = method_dict(ch.queue_declare("compat-q-counts", passive=True))
        return {"before": before, "after_consumer": after}


def _exclusive_other(op: Callable[[Any], Any]) -> ScenarioFn:
    def run(host: str, port: int) -> Observation:
        with connection(host, port) as owner, connection(host, port) as other:
            owner.channel().queue_declare("compat-q-excl", exclusive=True)
            ch = other.channel()
            return attempt(lambda: op(ch))

    return run


_EXCLUSIVE_OPS: dict[str, Callable[[Any], Any]] = {
    "declare": lambda ch: ch.queue_declare("compat-q-excl", exclusive=True),
    "declare_non_exclusive": lambda ch: ch.queue_declare("compat-q-excl"),
    "declare_passive": lambda ch: ch.queue_declare("compat-q-excl", passive=True),
    "consume": lambda ch: ch.basic_consume("compat-q-excl", lambda *_: None),
    "delete": lambda ch: ch.queue_delete("compat-q-excl"),
    "bind": lambda ch: ch.queue_bind("compat-q-excl", "amq.fanout"),
    "unbind": lambda ch: ch.queue_unbind("compat-q-excl", "amq.fanout"),
    "purge": lambda ch: ch.queue_purge("compat-q-excl"),
    "get": lambda ch: get_one(ch, "compat-q-excl"),
    "publish": lambda ch: (
        ch.confirm_delivery(),
        ch.basic_publish("", "compat-q-excl", b"m"),
        "published",
    )[-1],
}

for _op_name, _op in _EXCLUSIVE_OPS.items():
    _fn = _exclusive_other(_op)
    _fn.__doc__ = f"Exclusive queue of another connection: {_op_name}."
    scenario(f"queue_exclusive_other_connection_{_op_name}", queues=["compat-q-excl"])(_fn)


@scenario(queues=["compat-q-excl"])
def s_queue_exclusive_same_connection_other_channel(host: str, port: int) -> Observation:
    """Exclusive queue used from another channel of the owning connection."""
    with connection(host, port) as conn:
        conn.channel().queue_declare("compat-q-excl", exclusive=True)
        ch = conn.channel()
        return {
            "declare_passive": attempt(lambda: ch.queue_declare("compat-q-excl", passive=True)),
            "get": attempt(lambda: get_one(ch, "compat-q-excl")),
        }


@scenario(queues=["compat-q-excl"])
def s_queue_exclusive_deleted_with_connection(host: str, port: int) -> Observation:
    """An exclusive queue is gone once its connection closed."""
    with connection(host, port) as owner:
        owner.channel().queue_declare("compat-q-excl", exclusive=True)
    with connection(host, port) as other:
        return attempt(lambda: other.channel().queue_declare("compat-q-excl", passive=True))


@scenario(queues=["compat-q-quorum"])
def s_queue_declare_quorum_durable(host: str, port: int) -> Observation:
    """queue.declare x-queue-type=quorum, durable."""
    with connection(host, port) as conn:
        ch = conn.channel()
        return attempt(
            lambda: ch.queue_declare(
                "compat-q-quorum", durable=True, arguments={"x-queue-type": "quorum"}
            )
        )


@scenario(queues=["compat-q-quorum"])
def s_queue_declare_quorum_non_durable(host: str, port: int) -> Observation:
    """queue.declare x-queue-type=quorum, non-durable."""
    with connection(host, port) as conn:
        ch = conn.channel()
        return attempt(
            lambda: ch.queue_declare("compat-q-quorum", arguments={"x-queue-type": "quorum"})
        )


@scenario(queues=["compat-q-quorum"])
def s_queue_declare_quorum_exclusive(host: str, port: int) -> Observation:
    """queue.declare x-queue-type=quorum, durable and exclusive."""
    with connection(host, port) as conn:
        ch = conn.channel()
        return attempt(
            lambda: ch.queue_declare(
                "compat-q-quorum",
                durable=True,
                exclusive=True,
                arguments={"x-queue-type": "quorum"},
            )
        )


@scenario(queues=["compat-q-qtype"])
def s_queue_declare_unknown_queue_type(host: str, port: int) -> Observation:
    """queue.declare x-queue-type='compat-bogus'."""
    with connection(host, port) as conn:
        ch = conn.channel()
        return attempt(
            lambda: ch.queue_declare("compat-q-qtype", arguments={"x-queue-type": "compat-bogus"})
        )


@scenario(queues=["compat-q-qtype"])
def s_queue_declare_classic_queue_type(host: str, port: int) -> Observation:
    """queue.declare x-queue-type='classic', then redeclare without the argument."""
    with connection(host, port) as conn:
        ch = conn.channel()
        first = attempt(
            lambda: ch.queue_declare("compat-q-qtype", arguments={"x-queue-type": "classic"})
        )
        second = attempt(lambda: ch.queue_declare("compat-q-qtype"))
        return {"declare": first, "redeclare_without_type": second}


@scenario(queues=["compat-q-badarg"])
def s_queue_declare_max_length_string(host: str, port: int) -> Observation:
    """queue.declare x-max-length='ten'."""
    with connection(host, port) as conn:
        return attempt(
            lambda: conn.channel().queue_declare(
                "compat-q-badarg", arguments={"x-max-length": "ten"}
            )
        )


@scenario(queues=["compat-q-badarg"])
def s_queue_declare_max_length_negative(host: str, port: int) -> Observation:
    """queue.declare x-max-length=-1."""
    with connection(host, port) as conn:
        return attempt(
            lambda: conn.channel().queue_declare("compat-q-badarg", arguments={"x-max-length": -1})
        )


@scenario(queues=["compat-q-badarg"])
def s_queue_declare_message_ttl_negative(host: str, port: int) -> Observation:
    """queue.declare x-message-ttl=-5."""
    with connection(host, port) as conn:
        return attempt(
            lambda: conn.channel().queue_declare("compat-q-badarg", arguments={"x-message-ttl": -5})
        )


@scenario(queues=["compat-q-badarg"])
def s_queue_declare_expires_zero(host: str, port: int) -> Observation:
    """queue.declare x-expires=0."""
    with connection(host, port) as conn:
        return attempt(
            lambda: conn.channel().queue_declare("compat-q-badarg", arguments={"x-expires": 0})
        )


@scenario(queues=["compat-q-badarg"])
def s_queue_declare_overflow_invalid(host: str, port: int) -> Observation:
    """queue.declare x-overflow='compat-bogus'."""
    with connection(host, port) as conn:
        return attempt(
            lambda: conn.channel().queue_declare(
                "compat-q-badarg", arguments={"x-overflow": "compat-bogus"}
            )
        )


@scenario(queues=["compat-q-badarg"])
def s_queue_declare_max_priority_too_big(host: str, port: int) -> Observation:
    """queue.declare x-max-priority=256."""
    with connection(host, port) as conn:
        return attempt(
            lambda: conn.channel().queue_declare(
                "compat-q-badarg", arguments={"x-max-priority": 256}
            )
        )


@scenario(queues=["compat-q-badarg"])
def s_queue_declare_dead_letter_routing_key_without_exchange(host: str, port: int) -> Observation:
    """queue.declare x-dead-letter-routing-key without x-dead-letter-exchange."""
    with connection(host, port) as conn:
        return attempt(
            lambda: conn.channel().queue_declare(
                "compat-q-badarg", arguments={"x-dead-letter-routing-key": "k"}
            )
        )


@scenario(queues=["compat-q-del"])
def s_queue_delete_if_unused_with_consumer(host: str, port: int) -> Observation:
    """queue.delete if-unused on a queue with a consumer (on another channel)."""
    with connection(host, port) as conn:
        consumer_ch = conn.channel()
        consumer_ch.queue_declare("compat-q-del")
        consumer_ch.basic_consume("compat-q-del", lambda *_: None)
        return attempt(lambda: conn.channel().queue_delete("compat-q-del", if_unused=True))


@scenario(queues=["compat-q-del"])
def s_queue_delete_if_empty_with_messages(host: str, port: int) -> Observation:
    """queue.delete if-empty on a queue holding two messages."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-del")
        ch.confirm_delivery()
        publish_bodies(ch, "compat-q-del", ["m1", "m2"])
        return attempt(lambda: ch.queue_delete("compat-q-del", if_empty=True))


@scenario(queues=["compat-q-del"])
def s_queue_delete_if_empty_with_unacked_only(host: str, port: int) -> Observation:
    """queue.delete if-empty on a queue whose only message is unacked."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-del")
        ch.confirm_delivery()
        publish_bodies(ch, "compat-q-del", ["m1"])
        get_one(ch, "compat-q-del")
        return attempt(lambda: conn.channel().queue_delete("compat-q-del", if_empty=True))


@scenario()
def s_queue_delete_missing(host: str, port: int) -> Observation:
    """queue.delete of a queue that does not exist."""
    with connection(host, port) as conn:
        return attempt(lambda: conn.channel().queue_delete("compat-q-missing"))


@scenario(queues=["compat-q-del"])
def s_queue_delete_message_count(host: str, port: int) -> Observation:
    """queue.delete-ok message_count with 3 ready and 1 unacked message."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-del")
        ch.confirm_delivery()
        publish_bodies(ch, "compat-q-del", ["m1", "m2", "m3", "m4"])
        get_one(ch, "compat-q-del")
        return attempt(lambda: conn.channel().queue_delete("compat-q-del"))


@scenario(queues=["compat-q-purge"])
def s_queue_purge_count(host: str, port: int) -> Observation:
    """purge-ok message_count with 3 ready + 1 unacked; then the unacked one is requeued."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-purge")
        ch.confirm_delivery()
        publish_bodies(ch, "compat-q-purge", ["m1", "m2", "m3", "m4"])
        got = get_one(ch, "compat-q-purge")
        assert got is not None
        purge = method_dict(ch.queue_purge("compat-q-purge"))
        ch.basic_nack(got["delivery_tag"], requeue=True)
        return {"purge": purge, "after_nack": get_all(ch, "compat-q-purge")}


@scenario()
def s_queue_purge_missing(host: str, port: int) -> Observation:
    """queue.purge of a missing queue."""
    with connection(host, port) as conn:
        return attempt(lambda: conn.channel().queue_purge("compat-q-missing"))


@scenario()
def s_queue_bind_empty_name_after_declare(host: str, port: int) -> Observation:
    """queue.bind with queue '' right after declaring a server-named queue on the channel."""
    with connection(host, port) as conn:
        ch = conn.channel()
        name = ch.queue_declare("", exclusive=True).method.queue
        bind = attempt(lambda: ch.queue_bind("", "amq.direct", "compat-empty-bind"))
        ch.confirm_delivery()
        ch.basic_publish("amq.direct", "compat-empty-bind", b"m")
        count = ch.queue_declare(name, passive=True).method.message_count
        return {"bind": bind, "message_count_of_declared_queue": count}


@scenario()
def s_queue_bind_empty_name_fresh_channel(host: str, port: int) -> Observation:
    """queue.bind with queue '' on a channel that never declared a queue."""
    with connection(host, port) as conn:
        return attempt(lambda: conn.channel().queue_bind("", "amq.direct", "k"))


@scenario()
def s_queue_purge_empty_name_fresh_channel(host: str, port: int) -> Observation:
    """queue.purge with queue '' on a channel that never declared a queue."""
    with connection(host, port) as conn:
        return attempt(lambda: conn.channel().queue_purge(""))


@scenario()
def s_queue_delete_empty_name_fresh_channel(host: str, port: int) -> Observation:
    """queue.delete with queue '' on a channel that never declared a queue."""
    with connection(host, port) as conn:
        return attempt(lambda: conn.channel().queue_delete(""))


@scenario()
def s_basic_get_empty_name_fresh_channel(host: str, port: int) -> Observation:
    """basic.get with queue '' on a channel that never declared a queue."""
    with connection(host, port) as conn:
        return attempt(lambda: get_one(conn.channel(), ""))


@scenario()
def s_basic_consume_empty_name_fresh_channel(host: str, port: int) -> Observation:
    """basic.consume with queue '' on a channel that never declared a queue."""
    with connection(host, port) as conn:
        return attempt(
            lambda: conn.channel().basic_consume("", lambda *_: None, consumer_tag="compat-tag")
        )


@scenario()
def s_queue_empty_name_uses_last_declared(host: str, port: int) -> Observation:
    """After declaring a server-named queue, purge/get/delete with '' act on it."""
    with connection(host, port) as conn:
        ch = conn.channel()
        name = ch.queue_declare("", exclusive=True).method.queue
        ch.confirm_delivery()
        ch.basic_publish("", name, b"m1")
        ch.basic_publish("", name, b"m2")
        out: Observation = {}
        out["get"] = attempt(lambda: get_one(ch, "", auto_ack=True))
        out["purge"] = attempt(lambda: ch.queue_purge(""))
        out["delete"] = attempt(lambda: ch.queue_delete(""))
        out["declare_passive_after_delete"] = attempt(lambda: ch.queue_declare("", passive=True))
        return out


@scenario(queues=["compat-q-bind"])
def s_queue_bind_missing_exchange(host: str, port: int) -> Observation:
    """queue.bind to a missing exchange."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-bind")
        return attempt(lambda: ch.queue_bind("compat-q-bind", "compat-x-missing", "k"))


@scenario()
def s_queue_bind_missing_queue(host: str, port: int) -> Observation:
    """queue.bind of a missing queue to amq.direct."""
    with connection(host, port) as conn:
        return attempt(lambda: conn.channel().queue_bind("compat-q-missing", "amq.direct", "k"))


@scenario()
def s_queue_bind_missing_queue_and_exchange(host: str, port: int) -> Observation:
    """queue.bind where both queue and exchange are missing."""
    with connection(host, port) as conn:
        return attempt(
            lambda: conn.channel().queue_bind("compat-q-missing", "compat-x-missing", "k")
        )


@scenario(queues=["compat-q-bind"])
def s_queue_unbind_missing_binding(host: str, port: int) -> Observation:
    """queue.unbind of a binding that does not exist (queue and exchange exist)."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-bind")
        return attempt(lambda: ch.queue_unbind("compat-q-bind", "amq.direct", "compat-nothing"))


@scenario()
def s_queue_unbind_missing_queue(host: str, port: int) -> Observation:
    """queue.unbind of a missing queue."""
    with connection(host, port) as conn:
        return attempt(lambda: conn.channel().queue_unbind("compat-q-missing", "amq.direct", "k"))


@scenario(queues=["compat-q-bind"])
def s_queue_unbind_missing_exchange(host: str, port: int) -> Observation:
    """queue.unbind from a missing exchange."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-bind")
        return attempt(lambda: ch.queue_unbind("compat-q-bind", "compat-x-missing", "k"))


@scenario(queues=["compat-q-maxlen"])
def s_queue_max_length_drop_head(host: str, port: int) -> Observation:
    """x-max-length=2; publish m1..m4: which remain."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-maxlen", arguments={"x-max-length": 2})
        ch.confirm_delivery()
        publish_bodies(ch, "compat-q-maxlen", ["m1", "m2", "m3", "m4"])
        return {"remaining": [m["body"] for m in get_all(ch, "compat-q-maxlen")]}


@scenario(queues=["compat-q-maxlen"])
def s_queue_max_length_reject_publish(host: str, port: int) -> Observation:
    """x-max-length=1, x-overflow=reject-publish, confirm mode: acks/nacks per publish."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare(
            "compat-q-maxlen", arguments={"x-max-length": 1, "x-overflow": "reject-publish"}
        )
        ch.confirm_delivery()
        outcomes = []
        for body in ("m1", "m2"):
            try:
                ch.basic_publish("", "compat-q-maxlen", body.encode())
                outcomes.append("ack")
            except pika.exceptions.NackError:
                outcomes.append("nack")
        return {
            "outcomes": outcomes,
            "remaining": [m["body"] for m in get_all(ch, "compat-q-maxlen")],
        }


@scenario(queues=["compat-q-ttl"])
def s_queue_message_ttl_zero(host: str, port: int) -> Observation:
    """x-message-ttl=0 and no consumer: the message is gone at once."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-ttl", arguments={"x-message-ttl": 0})
        ch.confirm_delivery()
        publish_bodies(ch, "compat-q-ttl", ["m1"])
        return {"get": get_one(ch, "compat-q-ttl", auto_ack=True)}


@scenario(queues=["compat-q-ttl"])
def s_message_expiration_zero(host: str, port: int) -> Observation:
    """Per-message expiration '0' and no consumer: the message is gone at once."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-ttl")
        ch.confirm_delivery()
        ch.basic_publish("", "compat-q-ttl", b"m1", pika.BasicProperties(expiration="0"))
        ch.basic_publish("", "compat-q-ttl", b"m2", pika.BasicProperties(expiration="60000"))
        return {"remaining": [m["body"] for m in get_all(ch, "compat-q-ttl")]}


@scenario(queues=["compat-q-ttl"])
def s_message_expiration_invalid(host: str, port: int) -> Observation:
    """Per-message expiration 'soon' (not a number)."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-ttl")

        def go() -> None:
            ch.basic_publish("", "compat-q-ttl", b"m1", pika.BasicProperties(expiration="soon"))
            sync(ch)

        return attempt(go)


@scenario(queues=["compat-q-dlx", "compat-q-dlq"])
def s_dead_letter_on_reject(host: str, port: int) -> Observation:
    """Rejected (requeue=false) message dead-lettered via the default exchange: x-death contents."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-dlq")
        ch.queue_declare(
            "compat-q-dlx",
            arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "compat-q-dlq"},
        )
        ch.confirm_delivery()
        ch.basic_publish("", "compat-q-dlx", b"m1", pika.BasicProperties(headers={"h": "v"}))
        got = get_one(ch, "compat-q-dlx")
        assert got is not None
        ch.basic_reject(got["delivery_tag"], requeue=False)
        sync(ch)
        dead = get_one(ch, "compat-q-dlq", auto_ack=True)
        if dead is not None:
            for death in dead["properties"].get("headers", {}).get("x-death", []):
                death.pop("time", None)
        return {"dead_lettered": dead}


@scenario(queues=["compat-q-prio"])
def s_queue_priority_order(host: str, port: int) -> Observation:
    """x-max-priority=10; messages with priorities 1, 5, none, 3, 5 come out in priority order."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-prio", arguments={"x-max-priority": 10})
        ch.confirm_delivery()
        for body, prio in (("p1", 1), ("p5a", 5), ("none", None), ("p3", 3), ("p5b", 5)):
            ch.basic_publish(
                "", "compat-q-prio", body.encode(), pika.BasicProperties(priority=prio)
            )
        return {"order": [m["body"] for m in get_all(ch, "compat-q-prio")]}


@scenario(queues=["compat-q-autodel"])
def s_queue_auto_delete_after_cancel(host: str, port: int) -> Observation:
    """An auto-delete queue: exists before any consumer, gone after its only consumer cancels."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-autodel", auto_delete=True)
        before = attempt(lambda: conn.channel().queue_declare("compat-q-autodel", passive=True))
        tag = ch.basic_consume("compat-q-autodel", lambda *_: None)
        ch.basic_cancel(tag)
        after = attempt(lambda: conn.channel().queue_declare("compat-q-autodel", passive=True))
        return {"before_consumers": before, "after_cancel": after}


# ======================================================================================
# Scenarios: basic (consume, ack, qos, get, return, recover)
# ======================================================================================


def _raw_with_queues(client: RawClient, *queues: str) -> None:
    for q in queues:
        client.call(1, commands.Queue.Declare(queue=q, exclusive=True), "Queue.DeclareOk")


@scenario()
def s_consume_duplicate_tag(host: str, port: int) -> Observation:
    """Two basic.consume with consumer tag 'compat-tag' (two queues) on one channel."""
    with raw_client(host, port) as client:
        client.handshake()
        _raw_with_queues(client, "compat-q-c1", "compat-q-c2")
        client.call(
            1,
            commands.Basic.Consume(queue="compat-q-c1", consumer_tag="compat-tag"),
            "Basic.ConsumeOk",
        )
        client.method(1, commands.Basic.Consume(queue="compat-q-c2", consumer_tag="compat-tag"))
        return client.observe(ping=1)


@scenario()
def s_consume_duplicate_tag_other_channel(host: str, port: int) -> Observation:
    """The same consumer tag on two different channels is fine."""
    with raw_client(host, port) as client:
        client.handshake(open_channels=(1, 2))
        _raw_with_queues(client, "compat-q-c1")
        client.call(
            1,
            commands.Basic.Consume(queue="compat-q-c1", consumer_tag="compat-tag"),
            "Basic.ConsumeOk",
        )
        client.method(2, commands.Basic.Consume(queue="compat-q-c1", consumer_tag="compat-tag"))
        return client.observe(ping=2)


@scenario()
def s_consume_server_generated_tag(host: str, port: int) -> Observation:
    """basic.consume with an empty consumer tag: the generated tag's shape."""
    with raw_client(host, port) as client:
        client.handshake()
        _raw_with_queues(client, "compat-q-c1")
        ok = client.call(1, commands.Basic.Consume(queue="compat-q-c1"), "Basic.ConsumeOk")
        tag = ok.consumer_tag
        return {
            "prefix": tag[:9],
            "length": len(tag),
            "charset_ok": bool(re.fullmatch(r"amq\.ctag-[A-Za-z0-9_\-]+", tag)),
        }


@scenario()
def s_consume_nowait(host: str, port: int) -> Observation:
    """basic.consume with nowait=true: no consume-ok; a message is still delivered."""
    with raw_client(host, port) as client:
        client.handshake()
        _raw_with_queues(client, "compat-q-c1")
        client.method(
            1, commands.Basic.Consume(queue="compat-q-c1", consumer_tag="compat-tag", nowait=True)
        )
        client.publish(1, b"m1", "", "compat-q-c1")
        return client.observe(ping=1)


@scenario()
def s_cancel_unknown_tag(host: str, port: int) -> Observation:
    """basic.cancel of a consumer tag that does not exist."""
    with raw_client(host, port) as client:
        client.handshake()
        client.method(1, commands.Basic.Cancel(consumer_tag="compat-unknown"))
        return client.observe(ping=1)


def _cancel_on_delete(host: str, port: int, capabilities: dict[str, Any] | None) -> Observation:
    """A consumer on channel 1; its queue deleted from channel 2. Frames per channel."""
    with raw_client(host, port) as client:
        client.handshake(open_channels=(1, 2), capabilities=capabilities)
        client.call(
            1, commands.Queue.Declare(queue="compat-q-cancel", exclusive=True), "Queue.DeclareOk"
        )
        client.call(
            1,
            commands.Basic.Consume(queue="compat-q-cancel", consumer_tag="compat-tag"),
            "Basic.ConsumeOk",
        )
        client.method(2, commands.Queue.Delete(queue="compat-q-cancel"))
        frames: list[dict[str, Any]] = []
        while not any(f.get("frame") == "Queue.DeleteOk" for f in frames):
            got = client.next_frame()
            if got.kind != "frame":
                raise ProbeError(f"waiting for queue.delete-ok: {got.kind}")
            frames.append(describe(got.channel, got.frame))
        obs = client.observe(ping=1)
        frames += obs["received"]
        return {
            "channel_1": [f for f in frames if f.get("channel") == 1],
            "channel_2": [f for f in frames if f.get("channel") == 2],
            "other": [f for f in frames if f.get("channel") not in (1, 2)],
            "socket": obs["socket"],
        }


@scenario()
def s_consumer_cancel_notify_on_queue_delete(host: str, port: int) -> Observation:
    """Client with consumer_cancel_notify; its consumed queue is deleted from channel 2."""
    return _cancel_on_delete(host, port, None)


@scenario()
def s_consumer_cancel_no_capability(host: str, port: int) -> Observation:
    """Client without consumer_cancel_notify; its consumed queue is deleted from channel 2."""
    caps = {k: v for k, v in CLIENT_CAPABILITIES.items() if k != "consumer_cancel_notify"}
    return _cancel_on_delete(host, port, caps)


@scenario(queues=["compat-q-delcons"])
def s_queue_delete_while_consuming(host: str, port: int) -> Observation:
    """queue.delete on the channel that consumes the queue (consumer_cancel_notify on)."""
    with raw_client(host, port) as client:
        client.handshake()
        client.call(1, commands.Queue.Declare(queue="compat-q-delcons"), "Queue.DeclareOk")
        client.call(
            1,
            commands.Basic.Consume(queue="compat-q-delcons", consumer_tag="compat-ctag"),
            "Basic.ConsumeOk",
        )
        client.method(1, commands.Queue.Delete(queue="compat-q-delcons"))
        return client.observe(ping=1)


@scenario(queues=["compat-q-delcons"])
def s_queue_delete_consumed_by_other_channel(host: str, port: int) -> Observation:
    """A consumer on channel 2; queue.delete on channel 1. Frames per channel.

    Whether channel 2's basic.cancel or channel 1's delete-ok comes first varies
    from run to run on RabbitMQ (each channel has its own writer), so only the
    order within each channel is recorded.
    """
    with raw_client(host, port) as client:
        client.handshake(open_channels=(1, 2))
        client.call(1, commands.Queue.Declare(queue="compat-q-delcons"), "Queue.DeclareOk")
        client.call(
            2,
            commands.Basic.Consume(queue="compat-q-delcons", consumer_tag="compat-ctag"),
            "Basic.ConsumeOk",
        )
        client.method(1, commands.Queue.Delete(queue="compat-q-delcons"))
        obs = client.observe(ping=1)
        frames = obs["received"]
        return {
            "channel_1": [f for f in frames if f.get("channel") == 1],
            "channel_2": [f for f in frames if f.get("channel") == 2],
            "other": [f for f in frames if f.get("channel") not in (1, 2)],
            "socket": obs["socket"],
        }


@scenario(queues=["compat-q-cons"])
def s_consume_exclusive_when_consumer_exists(host: str, port: int) -> Observation:
    """Exclusive basic.consume on a queue that already has a consumer."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-cons")
        ch.basic_consume("compat-q-cons", lambda *_: None)
        return attempt(
            lambda: conn.channel().basic_consume("compat-q-cons", lambda *_: None, exclusive=True)
        )


@scenario(queues=["compat-q-cons"])
def s_consume_when_exclusive_consumer_exists(host: str, port: int) -> Observation:
    """basic.consume on a queue that has an exclusive consumer."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-cons")
        ch.basic_consume("compat-q-cons", lambda *_: None, exclusive=True)
        return attempt(lambda: conn.channel().basic_consume("compat-q-cons", lambda *_: None))


@scenario(queues=["compat-q-cons"])
def s_get_when_exclusive_consumer_exists(host: str, port: int) -> Observation:
    """basic.get on a queue that has an exclusive consumer (another channel)."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-cons")
        ch.basic_consume("compat-q-cons", lambda *_: None, exclusive=True)
        return attempt(lambda: get_one(conn.channel(), "compat-q-cons"))


@scenario()
def s_consume_missing_queue(host: str, port: int) -> Observation:
    """basic.consume from a missing queue."""
    with connection(host, port) as conn:
        return attempt(lambda: conn.channel().basic_consume("compat-q-missing", lambda *_: None))


def _unacked(
    conn: Any, queue: str, bodies: Sequence[str], take: int | None = None
) -> tuple[Any, list[int]]:
    """Declare ``queue``, publish ``bodies``, basic.get ``take`` of them unacked on a new channel."""
    ch = conn.channel()
    ch.queue_declare(queue)
    ch.confirm_delivery()
    publish_bodies(ch, queue, bodies)
    getter = conn.channel()
    tags = []
    for _ in range(len(bodies) if take is None else take):
        method, _props, _body = getter.basic_get(queue)
        tags.append(method.delivery_tag)
    return getter, tags


def _remaining(conn: Any, queue: str) -> list[dict[str, Any]]:
    """Messages left in ``queue``, fetched (and acked on close) from a fresh channel."""
    ch = conn.channel()
    out = get_all(ch, queue)
    ch.close()
    return out


@scenario(queues=["compat-q-ack"])
def s_ack_unknown_delivery_tag(host: str, port: int) -> Observation:
    """basic.ack of delivery tag 99 on a channel with one unacked message."""
    with connection(host, port) as conn:
        ch, _ = _unacked(conn, "compat-q-ack", ["m1"])

        def go() -> None:
            ch.basic_ack(99)
            sync(ch)

        return attempt(go)


@scenario(queues=["compat-q-ack"])
def s_ack_double(host: str, port: int) -> Observation:
    """basic.ack of the same delivery tag twice."""
    with connection(host, port) as conn:
        ch, tags = _unacked(conn, "compat-q-ack", ["m1"])

        def go() -> None:
            ch.basic_ack(tags[0])
            ch.basic_ack(tags[0])
            sync(ch)

        return attempt(go)


@scenario(queues=["compat-q-ack"])
def s_ack_tag_zero_single(host: str, port: int) -> Observation:
    """basic.ack delivery_tag=0 multiple=false with one unacked message."""
    with connection(host, port) as conn:
        ch, _ = _unacked(conn, "compat-q-ack", ["m1"])

        def go() -> None:
            ch.basic_ack(0, multiple=False)
            sync(ch)

        return attempt(go)


@scenario(queues=["compat-q-ack"])
def s_ack_multiple_zero(host: str, port: int) -> Observation:
    """basic.ack delivery_tag=0 multiple=true with 3 unacked: all acked?"""
    with connection(host, port) as conn:
        ch, _ = _unacked(conn, "compat-q-ack", ["m1", "m2", "m3"])

        def go() -> None:
            ch.basic_ack(0, multiple=True)
            sync(ch)
            ch.close()

        result = attempt(go)
        return {"ack": result, "remaining": _remaining(conn, "compat-q-ack")}


@scenario()
def s_ack_multiple_zero_nothing_outstanding(host: str, port: int) -> Observation:
    """basic.ack delivery_tag=0 multiple=true with nothing unacked."""
    with connection(host, port) as conn:
        ch = conn.channel()

        def go() -> None:
            ch.basic_ack(0, multiple=True)
            sync(ch)

        return attempt(go)


@scenario(queues=["compat-q-ack"])
def s_ack_multiple_partial(host: str, port: int) -> Observation:
    """basic.ack tag 2 multiple=true with tags 1..3 unacked; which remain after channel close."""
    with connection(host, port) as conn:
        ch, tags = _unacked(conn, "compat-q-ack", ["m1", "m2", "m3"])

        def go() -> None:
            ch.basic_ack(tags[1], multiple=True)
            sync(ch)
            ch.close()

        result = attempt(go)
        return {"ack": result, "remaining": _remaining(conn, "compat-q-ack")}


@scenario(queues=["compat-q-ack"])
def s_ack_after_auto_ack_get(host: str, port: int) -> Observation:
    """basic.ack of the delivery tag of a no-ack basic.get."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-ack")
        ch.confirm_delivery()
        publish_bodies(ch, "compat-q-ack", ["m1"])
        got = get_one(ch, "compat-q-ack", auto_ack=True)
        assert got is not None

        def go() -> None:
            ch.basic_ack(got["delivery_tag"])
            sync(ch)

        return attempt(go)


@scenario(queues=["compat-q-ack"])
def s_ack_on_other_channel(host: str, port: int) -> Observation:
    """basic.ack on channel B of a delivery tag received on channel A."""
    with connection(host, port) as conn:
        _ch, tags = _unacked(conn, "compat-q-ack", ["m1"])
        other = conn.channel()

        def go() -> None:
            other.basic_ack(tags[0])
            sync(other)

        return attempt(go)


@scenario(queues=["compat-q-ack"])
def s_nack_unknown_delivery_tag(host: str, port: int) -> Observation:
    """basic.nack of an unknown delivery tag."""
    with connection(host, port) as conn:
        ch, _ = _unacked(conn, "compat-q-ack", ["m1"])

        def go() -> None:
            ch.basic_nack(42)
            sync(ch)

        return attempt(go)


@scenario(queues=["compat-q-ack"])
def s_reject_unknown_delivery_tag(host: str, port: int) -> Observation:
    """basic.reject of an unknown delivery tag."""
    with connection(host, port) as conn:
        ch, _ = _unacked(conn, "compat-q-ack", ["m1"])

        def go() -> None:
            ch.basic_reject(42)
            sync(ch)

        return attempt(go)


@scenario(queues=["compat-q-order"])
def s_nack_requeue_order(host: str, port: int) -> Observation:
    """m1..m5 all fetched unacked; nack m4 then m2 with requeue; fetch again (same channel)."""
    with connection(host, port) as conn:
        ch, tags = _unacked(conn, "compat-q-order", ["m1", "m2", "m3", "m4", "m5"])
        ch.basic_nack(tags[3], requeue=True)
        ch.basic_nack(tags[1], requeue=True)
        return {"after_requeue": get_all(ch, "compat-q-order")}


@scenario(queues=["compat-q-order"])
def s_reject_requeue_order_partial(host: str, port: int) -> Observation:
    """m1..m5 published, m1..m3 fetched; reject m3 then m1 with requeue; fetch the rest."""
    with connection(host, port) as conn:
        ch, tags = _unacked(conn, "compat-q-order", ["m1", "m2", "m3", "m4", "m5"], take=3)
        ch.basic_reject(tags[2], requeue=True)
        ch.basic_reject(tags[0], requeue=True)
        return {"after_requeue": get_all(ch, "compat-q-order")}


@scenario(queues=["compat-q-order"])
def s_nack_multiple_requeue(host: str, port: int) -> Observation:
    """m1..m4 fetched unacked; nack tag 0 multiple=true requeue=true; fetch again."""
    with connection(host, port) as conn:
        ch, _ = _unacked(conn, "compat-q-order", ["m1", "m2", "m3", "m4"])
        ch.basic_nack(0, multiple=True, requeue=True)
        return {"after_requeue": get_all(ch, "compat-q-order")}


@scenario(queues=["compat-q-order"])
def s_reject_no_requeue_discards(host: str, port: int) -> Observation:
    """m1, m2 fetched; reject m1 requeue=false (no DLX): it is gone."""
    with connection(host, port) as conn:
        ch, tags = _unacked(conn, "compat-q-order", ["m1", "m2"])
        ch.basic_reject(tags[0], requeue=False)
        ch.close()
        return {"remaining": _remaining(conn, "compat-q-order")}


@scenario(queues=["compat-q-order"])
def s_close_channel_with_unacked(host: str, port: int) -> Observation:
    """m1..m5 published; m1..m3 fetched on channel A, m2 acked, A closed; fetch all on B."""
    with connection(host, port) as conn:
        ch, tags = _unacked(conn, "compat-q-order", ["m1", "m2", "m3", "m4", "m5"], take=3)
        ch.basic_ack(tags[1])
        ch.close()
        return {"after_close": _remaining(conn, "compat-q-order")}


@scenario(queues=["compat-q-order"])
def s_close_connection_with_unacked_consumer(host: str, port: int) -> Observation:
    """A consumer (prefetch 2) gets m1, m2 of m1..m4, its connection closes; fetch all."""
    with connection(host, port) as setup:
        ch = setup.channel()
        ch.queue_declare("compat-q-order")
        ch.confirm_delivery()
        publish_bodies(ch, "compat-q-order", ["m1", "m2", "m3", "m4"])
    with connection(host, port) as consumer_conn:
        cch = consumer_conn.channel()
        cch.basic_qos(prefetch_count=2)
        got: list[str] = []
        cch.basic_consume("compat-q-order", lambda _c, _m, _p, body: got.append(body.decode()))
        deadline = time.monotonic() + TIMEOUT
        while len(got) < 2 and time.monotonic() < deadline:
            consumer_conn.process_data_events(0.1)
    with connection(host, port) as conn:
        return {"consumer_got": got, "after_close": _remaining(conn, "compat-q-order")}


@scenario()
def s_qos_prefetch_size_nonzero(host: str, port: int) -> Observation:
    """basic.qos prefetch_size=1."""
    with connection(host, port) as conn:
        return attempt(lambda: conn.channel().basic_qos(prefetch_size=1))


def _qos_counts(host: str, port: int, settings: Sequence[tuple[int, bool]]) -> Observation:
    """Two queues with 5 messages each, one channel with the given basic.qos calls and
    one consumer per queue: how many (unacked) deliveries each consumer gets in 1 s."""
    queues = ("compat-q-qos1", "compat-q-qos2")
    with connection(host, port) as conn:
        setup = conn.channel()
        setup.confirm_delivery()
        for q in queues:
            setup.queue_declare(q)
            publish_bodies(setup, q, [f"m{i}" for i in range(5)])
        ch = conn.channel()
        for count, global_qos in settings:
            ch.basic_qos(prefetch_count=count, global_qos=global_qos)
        counts = dict.fromkeys(queues, 0)
        for q in queues:
            ch.basic_consume(q, lambda _c, _m, _p, _b, q=q: counts.__setitem__(q, counts[q] + 1))
        drain(conn, 1.0)
        return {"deliveries": counts, "total": sum(counts.values())}


@scenario(queues=["compat-q-qos1", "compat-q-qos2"])
def s_qos_prefetch_per_consumer(host: str, port: int) -> Observation:
    """prefetch_count=2 global=false, two consumers on one channel."""
    return _qos_counts(host, port, [(2, False)])


@scenario(queues=["compat-q-qos1", "compat-q-qos2"])
def s_qos_prefetch_global(host: str, port: int) -> Observation:
    """prefetch_count=3 global=true, two consumers on one channel."""
    return _qos_counts(host, port, [(3, True)])


@scenario(queues=["compat-q-qos1", "compat-q-qos2"])
def s_qos_prefetch_global_and_per_consumer(host: str, port: int) -> Observation:
    """prefetch_count=3 global=true then prefetch_count=2 global=false, two consumers."""
    return _qos_counts(host, port, [(3, True), (2, False)])


@scenario(queues=["compat-q-qos1", "compat-q-qos2"])
def s_qos_prefetch_per_consumer_then_global(host: str, port: int) -> Observation:
    """prefetch_count=2 global=false then prefetch_count=3 global=true, two consumers."""
    return _qos_counts(host, port, [(2, False), (3, True)])


@scenario(queues=["compat-q-qos1", "compat-q-qos2"])
def s_qos_after_consume_not_applied(host: str, port: int) -> Observation:
    """basic.qos prefetch_count=1 issued after the consumers started: consumers unaffected?"""
    queues = ("compat-q-qos1", "compat-q-qos2")
    with connection(host, port) as conn:
        setup = conn.channel()
        setup.confirm_delivery()
        ch = conn.channel()
        counts = dict.fromkeys(queues, 0)
        for q in queues:
            setup.queue_declare(q)
            ch.basic_consume(q, lambda _c, _m, _p, _b, q=q: counts.__setitem__(q, counts[q] + 1))
        ch.basic_qos(prefetch_count=1)
        for q in queues:
            publish_bodies(setup, q, [f"m{i}" for i in range(3)])
        drain(conn, 1.0)
        return {"deliveries": counts}


@scenario()
def s_basic_get_empty(host: str, port: int) -> Observation:
    """basic.get on an empty queue (raw: the get-empty frame itself)."""
    with raw_client(host, port) as client:
        client.handshake()
        _raw_with_queues(client, "compat-q-get")
        return raw_get(client, 1, "compat-q-get")


@scenario()
def s_basic_get_ok_fields(host: str, port: int) -> Observation:
    """basic.get with 3 messages queued (raw: get-ok fields, header, body)."""
    with raw_client(host, port) as client:
        client.handshake()
        _raw_with_queues(client, "compat-q-get")
        for body in (b"m1", b"m2", b"m3"):
            client.publish(1, body, "", "compat-q-get")
        return raw_get(client, 1, "compat-q-get")


@scenario()
def s_basic_get_missing_queue(host: str, port: int) -> Observation:
    """basic.get from a missing queue."""
    with connection(host, port) as conn:
        return attempt(lambda: get_one(conn.channel(), "compat-q-missing"))


@scenario()
def s_basic_deliver_fields(host: str, port: int) -> Observation:
    """A consumer's basic.deliver, content header and body (raw)."""
    with raw_client(host, port) as client:
        client.handshake()
        _raw_with_queues(client, "compat-q-deliver")
        client.call(
            1,
            commands.Basic.Consume(queue="compat-q-deliver", consumer_tag="compat-tag"),
            "Basic.ConsumeOk",
        )
        props = commands.Basic.Properties(
            content_type="text/plain", delivery_mode=2, headers={"k": "v"}
        )
        client.publish(1, b"hello", "", "compat-q-deliver", properties=props)
        return client.observe(ping=1)


@scenario()
def s_publish_mandatory_unroutable(host: str, port: int) -> Observation:
    """Mandatory publish to amq.direct with no matching binding (no confirms)."""
    with connection(host, port) as conn:
        ch = conn.channel()
        returns: list[Any] = []
        ch.add_on_return_callback(
            lambda _c, m, _p, b: returns.append(
                {"reply_code": m.reply_code, "reply_text": m.reply_text, "exchange": m.exchange,
                 "routing_key": m.routing_key, "body": b.decode()}
            )
        )  # fmt: skip
        ch.basic_publish("amq.direct", "compat-nowhere", b"m1", mandatory=True)
        sync(ch)
        conn.process_data_events(0)
        return {"returns": returns}


@scenario()
def s_publish_mandatory_default_exchange_missing_queue(host: str, port: int) -> Observation:
    """Mandatory publish to the default exchange naming a missing queue."""
    with connection(host, port) as conn:
        ch = conn.channel()
        returns: list[Any] = []
        ch.add_on_return_callback(
            lambda _c, m, _p, b: returns.append(
                [m.reply_code, m.reply_text, m.exchange, m.routing_key]
            )
        )
        ch.basic_publish("", "compat-q-missing", b"m1", mandatory=True)
        sync(ch)
        conn.process_data_events(0)
        return {"returns": returns}


@scenario()
def s_publish_unroutable_confirm(host: str, port: int) -> Observation:
    """Confirm mode, non-mandatory publish with no route: acked?"""

    def send(client: RawClient) -> None:
        client.call(1, commands.Confirm.Select(), "Confirm.SelectOk")
        client.publish(1, b"m1", "amq.direct", "compat-nowhere")

    return _after_handshake(host, port, send)


@scenario(queues=["compat-q-recover"])
def s_basic_recover_requeue_true(host: str, port: int) -> Observation:
    """m1, m2 fetched unacked; basic.recover requeue=true; fetch again."""
    with connection(host, port) as conn:
        ch, _ = _unacked(conn, "compat-q-recover", ["m1", "m2"])
        result = attempt(lambda: ch.basic_recover(requeue=True))
        return {"recover": result, "after": get_all(ch, "compat-q-recover")}


@scenario(queues=["compat-q-recover"])
def s_basic_recover_requeue_false(host: str, port: int) -> Observation:
    """m1, m2 fetched unacked; basic.recover requeue=false."""
    with connection(host, port) as conn:
        ch, _ = _unacked(conn, "compat-q-recover", ["m1", "m2"])
        result = attempt(lambda: ch.basic_recover(requeue=False))
        return {"recover": result}


@scenario(queues=["compat-q-recover"])
def s_basic_recover_consumer_redelivery(host: str, port: int) -> Observation:
    """A consumer holds m1, m2 unacked; basic.recover requeue=true redelivers them to it."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-recover")
        ch.confirm_delivery()
        publish_bodies(ch, "compat-q-recover", ["m1", "m2"])
        deliveries: list[dict[str, Any]] = []
        ch.basic_consume(
            "compat-q-recover",
            lambda _c, m, _p, b: deliveries.append(
                {"body": b.decode(), "redelivered": m.redelivered, "delivery_tag": m.delivery_tag}
            ),
        )
        deadline = time.monotonic() + TIMEOUT
        while len(deliveries) < 2 and time.monotonic() < deadline:
            conn.process_data_events(0.1)
        ch.basic_recover(requeue=True)
        while len(deliveries) < 4 and time.monotonic() < deadline + TIMEOUT:
            conn.process_data_events(0.1)
        return {"deliveries": deliveries}


# ======================================================================================
# Scenarios: publisher confirms and transactions
# ======================================================================================


@scenario()
def s_confirm_then_tx_select(host: str, port: int) -> Observation:
    """confirm.select then tx.select on the same channel."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        return attempt(ch.tx_select)


@scenario()
def s_tx_then_confirm_select(host: str, port: int) -> Observation:
    """tx.select then confirm.select on the same channel."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.tx_select()
        return attempt(ch.confirm_delivery)


@scenario()
def s_confirm_select_twice(host: str, port: int) -> Observation:
    """confirm.select twice on the same channel (raw)."""

    def send(client: RawClient) -> None:
        client.call(1, commands.Confirm.Select(), "Confirm.SelectOk")
        client.method(1, commands.Confirm.Select())

    return _after_handshake(host, port, send)


@scenario()
def s_confirm_delivery_tags_sequential(host: str, port: int) -> Observation:
    """Confirm mode; three publishes, each awaited: the acks' tags and multiple flags."""
    with raw_client(host, port) as client:
        client.handshake()
        _raw_with_queues(client, "compat-q-confirm")
        client.call(1, commands.Confirm.Select(), "Confirm.SelectOk")
        acks = []
        for body in (b"m1", b"m2", b"m3"):
            client.publish(1, body, "", "compat-q-confirm")
            ack = client.expect("Basic.Ack", 1)
            acks.append({"delivery_tag": ack.delivery_tag, "multiple": ack.multiple})
        return {"acks": acks}


@scenario()
def s_confirm_delivery_tags_batch(host: str, port: int) -> Observation:
    """Confirm mode; ten publishes in one write: every tag 1..10 confirmed (multiple may merge)."""
    with raw_client(host, port) as client:
        client.handshake()
        _raw_with_queues(client, "compat-q-confirm")
        client.call(1, commands.Confirm.Select(), "Confirm.SelectOk")
        data = b""
        for i in range(10):
            data += pframe.marshal(
                commands.Basic.Publish(exchange="", routing_key="compat-q-confirm"), 1
            )
            data += pframe.marshal(pheader.ContentHeader(0, 2, commands.Basic.Properties()), 1)
            data += pframe.marshal(pbody.ContentBody(f"m{i}".encode()[:2]), 1)
        client.send(data)
        acked: set[int] = set()
        nacked: set[int] = set()
        while max(acked | nacked, default=0) < 10:
            frame = client.expect_any(("Basic.Ack", "Basic.Nack"), 1)
            tags = set(range(1, frame.delivery_tag + 1)) if frame.multiple else {frame.delivery_tag}
            (acked if frame.name == "Basic.Ack" else nacked).update(tags)
        return {"acked": sorted(acked), "nacked": sorted(nacked)}


def expand_acks(received: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Replace each basic.ack/nack by one entry per delivery tag it confirms.

    A broker may merge confirms with ``multiple`` as it likes; what a client can
    rely on is which tags are confirmed and in what order relative to other frames.
    """
    out: list[dict[str, Any]] = []
    confirmed = 0
    for frame in received:
        if frame.get("frame") in ("Basic.Ack", "Basic.Nack"):
            tag = frame["delivery_tag"]
            tags = range(confirmed + 1, tag + 1) if frame.get("multiple") else [tag]
            for one in tags:
                out.append(
                    {"frame": frame["frame"], "channel": frame["channel"], "delivery_tag": one}
                )
            confirmed = max(confirmed, tag)
        else:
            out.append(frame)
    return out


@scenario()
def s_confirm_tags_with_return(host: str, port: int) -> Observation:
    """Confirm mode; routable (awaited), unroutable-mandatory, routable: frames in order,
    acks expanded to one entry per confirmed tag."""
    with raw_client(host, port) as client:
        client.handshake()
        _raw_with_queues(client, "compat-q-confirm")
        client.call(1, commands.Confirm.Select(), "Confirm.SelectOk")
        client.publish(1, b"m1", "", "compat-q-confirm")
        first = client.expect("Basic.Ack", 1)
        client.publish(1, b"m2", "amq.direct", "compat-nowhere", mandatory=True)
        client.publish(1, b"m3", "", "compat-q-confirm", mandatory=True)
        obs = client.observe(ping=1)
        received = [describe(1, first), *obs["received"]]
        return {**obs, "received": expand_acks(received)}


@scenario()
def s_tx_commit_without_select(host: str, port: int) -> Observation:
    """tx.commit on a channel that is not transactional."""
    with connection(host, port) as conn:
        return attempt(conn.channel().tx_commit)


@scenario()
def s_tx_rollback_without_select(host: str, port: int) -> Observation:
    """tx.rollback on a channel that is not transactional."""
    with connection(host, port) as conn:
        return attempt(conn.channel().tx_rollback)


@scenario()
def s_tx_select_twice(host: str, port: int) -> Observation:
    """tx.select twice on the same channel."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.tx_select()
        return attempt(ch.tx_select)


@scenario(queues=["compat-q-tx"])
def s_tx_publish_rollback(host: str, port: int) -> Observation:
    """tx: publish m1, rollback, get (empty?); publish m2, commit, get."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-tx")
        ch.tx_select()
        ch.basic_publish("", "compat-q-tx", b"m1")
        before_rollback = ch.queue_declare("compat-q-tx", passive=True).method.message_count
        ch.tx_rollback()
        after_rollback = get_one(ch, "compat-q-tx", auto_ack=True)
        ch.basic_publish("", "compat-q-tx", b"m2")
        ch.tx_commit()
        after_commit = get_one(ch, "compat-q-tx", auto_ack=True)
        return {
            "message_count_before_rollback": before_rollback,
            "get_after_rollback": after_rollback,
            "get_after_commit": after_commit,
        }


@scenario(queues=["compat-q-tx"])
def s_tx_ack_rollback_recover(host: str, port: int) -> Observation:
    """tx: get m1, ack it, rollback (ack discarded?), basic.recover requeue, get again."""
    with connection(host, port) as conn:
        setup = conn.channel()
        setup.queue_declare("compat-q-tx")
        setup.confirm_delivery()
        publish_bodies(setup, "compat-q-tx", ["m1"])
        ch = conn.channel()
        ch.tx_select()
        got = get_one(ch, "compat-q-tx")
        assert got is not None
        ch.basic_ack(got["delivery_tag"])
        ch.tx_rollback()
        ready_after_rollback = setup.queue_declare("compat-q-tx", passive=True).method.message_count
        ch.basic_recover(requeue=True)
        again = get_one(ch, "compat-q-tx")
        ch.tx_commit()
        return {"ready_after_rollback": ready_after_rollback, "get_after_recover": again}


@scenario(queues=["compat-q-tx"])
def s_tx_ack_commit(host: str, port: int) -> Observation:
    """tx: get m1, ack, commit, close channel: m1 is gone."""
    with connection(host, port) as conn:
        setup = conn.channel()
        setup.queue_declare("compat-q-tx")
        setup.confirm_delivery()
        publish_bodies(setup, "compat-q-tx", ["m1"])
        ch = conn.channel()
        ch.tx_select()
        got = get_one(ch, "compat-q-tx")
        assert got is not None
        ch.basic_ack(got["delivery_tag"])
        ch.tx_commit()
        ch.close()
        return {"remaining": _remaining(conn, "compat-q-tx")}


@scenario(queues=["compat-q-tx"])
def s_tx_uncommitted_publish_on_close(host: str, port: int) -> Observation:
    """tx: publish m1 and close the channel without commit: nothing delivered."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-tx")
        ch.tx_select()
        ch.basic_publish("", "compat-q-tx", b"m1")
        ch.close()
        return {"remaining": _remaining(conn, "compat-q-tx")}


@scenario()
def s_tx_mandatory_unroutable(host: str, port: int) -> Observation:
    """tx: mandatory unroutable publish, then tx.commit: frames in order (raw)."""

    def send(client: RawClient) -> None:
        client.call(1, commands.Tx.Select(), "Tx.SelectOk")
        client.publish(1, b"m1", "amq.direct", "compat-nowhere", mandatory=True)
        client.method(1, commands.Tx.Commit())

    return _after_handshake(host, port, send)


# ======================================================================================
# Scenarios: direct reply-to
# ======================================================================================

REPLY_TO = "amq.rabbitmq.reply-to"


@scenario()
def s_reply_to_consume_without_no_ack(host: str, port: int) -> Observation:
    """basic.consume on amq.rabbitmq.reply-to with no_ack=false."""
    with connection(host, port) as conn:
        return attempt(
            lambda: conn.channel().basic_consume(REPLY_TO, lambda *_: None, auto_ack=False)
        )


@scenario()
def s_reply_to_consume_twice(host: str, port: int) -> Observation:
    """Two no-ack consumers on amq.rabbitmq.reply-to on one channel."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.basic_consume(REPLY_TO, lambda *_: None, auto_ack=True)
        return attempt(lambda: ch.basic_consume(REPLY_TO, lambda *_: None, auto_ack=True))


@scenario()
def s_reply_to_publish_without_consumer(host: str, port: int) -> Observation:
    """basic.publish with reply_to=amq.rabbitmq.reply-to and no reply consumer."""
    with connection(host, port) as conn:
        ch = conn.channel()

        def go() -> None:
            ch.basic_publish(
                "amq.direct", "compat-nowhere", b"q", pika.BasicProperties(reply_to=REPLY_TO)
            )
            sync(ch)

        return attempt(go)


@scenario()
def s_reply_to_passive_declare(host: str, port: int) -> Observation:
    """Passive queue.declare of amq.rabbitmq.reply-to."""
    with connection(host, port) as conn:
        return attempt(lambda: conn.channel().queue_declare(REPLY_TO, passive=True))


@scenario()
def s_reply_to_non_passive_declare(host: str, port: int) -> Observation:
    """Non-passive queue.declare of amq.rabbitmq.reply-to."""
    with connection(host, port) as conn:
        return attempt(lambda: conn.channel().queue_declare(REPLY_TO))


@scenario(queues=["compat-q-rpc"])
def s_reply_to_rpc_round_trip(host: str, port: int) -> Observation:
    """A full direct reply-to RPC: the reply_to the server sees and the reply delivery."""
    with connection(host, port) as client_conn, connection(host, port) as server_conn:
        server = server_conn.channel()
        server.queue_declare("compat-q-rpc")
        client = client_conn.channel()
        replies: list[dict[str, Any]] = []
        tag = client.basic_consume(
            REPLY_TO,
            lambda _c, m, p, b: replies.append(
                {"body": b.decode(), "exchange": m.exchange, "routing_key": m.routing_key,
                 "redelivered": m.redelivered, "delivery_tag": m.delivery_tag,
                 "properties": props_dict(p)}
            ),
            auto_ack=True,
        )  # fmt: skip
        client.confirm_delivery()
        client.basic_publish(
            "",
            "compat-q-rpc",
            b"ping",
            pika.BasicProperties(reply_to=REPLY_TO, correlation_id="c1"),
        )
        method, props, _body = server.basic_get("compat-q-rpc", auto_ack=True)
        if method is None:
            raise ProbeError("request not queued")
        reply_to = props.reply_to
        server.basic_publish(
            "", reply_to, b"pong", pika.BasicProperties(correlation_id=props.correlation_id)
        )
        deadline = time.monotonic() + TIMEOUT
        while not replies and time.monotonic() < deadline:
            client_conn.process_data_events(0.1)

        def reply(body: bytes) -> str:
            server.basic_publish("", reply_to, body)
            sync(server)
            return "ok"

        second_reply = attempt(lambda: reply(b"pong2"))
        deadline = time.monotonic() + TIMEOUT
        while len(replies) < 2 and time.monotonic() < deadline:
            client_conn.process_data_events(0.1)
        client.basic_cancel(tag)
        stale = attempt(lambda: reply(b"pong3"))
        return {
            "reply_to_seen_by_server": reply_to,
            "reply_to_prefix_ok": reply_to.startswith(REPLY_TO + "."),
            "replies": replies,
            "second_reply_publish": second_reply,
            "publish_after_cancel": stale,
        }


# ======================================================================================
# Scenarios: message properties
# ======================================================================================


@scenario(queues=["compat-q-props"])
def s_properties_round_trip(host: str, port: int) -> Observation:
    """Every basic property (and assorted header value types) survives publish/get."""
    props = pika.BasicProperties(
        content_type="application/json",
        content_encoding="utf-8",
        headers={
            "str": "v", "int8": 7, "int32": 100000, "int64": 2**40, "neg": -3, "bool": True,
            "list": [1, "a", False], "table": {"k": "v"}, "void": None, "bytes": b"\x00\x01",
        },
        delivery_mode=2,
        priority=3,
        correlation_id="corr",
        reply_to="reply",
        expiration="60000",
        message_id="mid",
        timestamp=1700000000,
        type="kind",
        user_id="guest",
        app_id="compat",
    )  # fmt: skip
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-props")
        ch.confirm_delivery()
        ch.basic_publish("", "compat-q-props", b"body", props)
        return {"get": get_one(ch, "compat-q-props", auto_ack=True)}


@scenario(queues=["compat-q-props"])
def s_properties_user_id_mismatch(host: str, port: int) -> Observation:
    """basic.publish with user_id 'compat-other' while logged in as guest."""
    with connection(host, port) as conn:
        ch = conn.channel()
        ch.queue_declare("compat-q-props")

        def go() -> None:
            ch.basic_publish(
                "", "compat-q-props", b"m", pika.BasicProperties(user_id="compat-other")
            )
            sync(ch)

        return attempt(go)


@scenario(queues=["compat-q-props"])
def s_properties_delivery_mode_invalid(host: str, port: int) -> Observation:
    """basic.publish with delivery_mode=3 (raw header), then get it back."""
    with raw_client(host, port) as client:
        client.handshake()
        client.call(1, commands.Queue.Declare(queue="compat-q-props"), "Queue.DeclareOk")
        client.method(1, commands.Basic.Publish(exchange="", routing_key="compat-q-props"))
        # property flags: delivery-mode only (bit 12); value 3
        client.send(raw_frame(FRAME_HEADER, 1, struct.pack(">HHQHB", 60, 0, 1, 0x1000, 3)))
        client.send(raw_frame(FRAME_BODY, 1, b"m"))
        obs = client.observe(ping=1)
        if obs["socket"] == "open":
            obs["get"] = raw_get(client, 1, "compat-q-props", no_ack=True)
        return obs


# ======================================================================================
# Scenarios: hostile message properties
# ======================================================================================

#: Recorded instead of a get's properties when pamqp cannot decode its content header
#: (its exception texts may hold memory addresses or vary between versions).
UNPARSEABLE = "<content header not decodable by pamqp>"

BADPROPS_QUEUE = "compat-q-badprops"
FLAG_CONTENT_TYPE, FLAG_HEADERS, FLAG_DELIVERY_MODE, FLAG_TIMESTAMP = (
    0x8000,
    0x2000,
    0x1000,
    0x0040,
)


def _tbl(body: bytes) -> bytes:
    """A field table (or field array) from its encoded contents: length-prefixed."""
    return struct.pack(">I", len(body)) + body


def _longstr(value: bytes) -> bytes:
    return b"S" + struct.pack(">I", len(value)) + value


def _headers_props(table_body: bytes) -> bytes:
    """Property list with headers (the given table contents) and delivery-mode 2."""
    return struct.pack(">H", FLAG_HEADERS | FLAG_DELIVERY_MODE) + _tbl(table_body) + b"\x02"


def _finite(value: Any) -> Any:
    """NaN and infinities as strings: JSON has no such numbers, and NaN != NaN."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _get_properties(client: RawClient, queue: str) -> Observation:
    """basic.get (no_ack) on channel 1: the reply's frame name and, for get-ok, the
    properties of its content header as pamqp decodes them (or :data:`UNPARSEABLE`)."""
    client.method(1, commands.Basic.Get(queue=queue, no_ack=True))
    got = client.next_frame()
    if got.kind != "frame":
        raise ProbeError(f"basic.get: {got.kind}")
    out: Observation = {"frame": getattr(got.frame, "name", type(got.frame).__name__)}
    if out["frame"] != "Basic.GetOk":
        return out
    try:
        # pamqp may raise more than _parse expects (RecursionError, OverflowError).
        got = client.next_frame()
        if got.kind == "frame" and isinstance(got.frame, pheader.ContentHeader):
            out["properties"] = _finite(
                props_dict(got.frame.properties, getattr(got.frame, "present_flags", None))
            )
            return out
    except Exception:
        out["properties"] = UNPARSEABLE
        return out
    if got.kind == "raw" and got.channel == 1:
        out["properties"] = UNPARSEABLE
        return out
    raise ProbeError(f"basic.get: expected a content header, got {got.kind}")


def _badprops(host: str, port: int, props: bytes, routing_key: str = BADPROPS_QUEUE) -> Observation:
    """Confirm mode; publish a 1-byte message whose content header carries ``props``
    (flag words and property list, built by hand) via the default exchange; observe,
    then, if the connection survived, basic.get the queue."""
    with raw_client(host, port) as client:
        client.handshake()
        client.call(
            1, commands.Queue.Declare(queue=BADPROPS_QUEUE, durable=True), "Queue.DeclareOk"
        )
        client.call(1, commands.Queue.Purge(queue=BADPROPS_QUEUE), "Queue.PurgeOk")
        client.call(1, commands.Confirm.Select(), "Confirm.SelectOk")
        client.method(1, commands.Basic.Publish(exchange="", routing_key=routing_key))
        client.send(raw_frame(FRAME_HEADER, 1, struct.pack(">HHQ", 60, 0, 1) + props))
        client.send(raw_frame(FRAME_BODY, 1, b"m"))
        obs = client.observe(ping=1)
        if obs["socket"] == "open":
            obs["get"] = _get_properties(client, BADPROPS_QUEUE)
        return obs


def _nested_tables(depth: int) -> bytes:
    """Headers {"a": {"a": ... {}}} with ``depth`` tables below the headers table."""
    value = b"F" + _tbl(b"")
    for _ in range(depth - 1):
        value = b"F" + _tbl(b"\x01a" + value)
    return b"\x01a" + value


def _nested_arrays(depth: int) -> bytes:
    """Headers {"k": [[ ... [] ... ]]} with ``depth`` arrays."""
    value = b"A" + _tbl(b"")
    for _ in range(depth - 1):
        value = b"A" + _tbl(value)
    return b"\x01k" + value


@scenario(queues=[BADPROPS_QUEUE])
def s_badprops_unknown_tag(host: str, port: int) -> Observation:
    """Headers {k: <field type 'Z'>}."""
    return _badprops(host, port, _headers_props(b"\x01kZ\x00"))


@scenario(queues=[BADPROPS_QUEUE])
def s_badprops_unknown_tag_nested(host: str, port: int) -> Observation:
    """Headers {k: {k: <field type 'Z'>}}."""
    return _badprops(host, port, _headers_props(b"\x01kF" + _tbl(b"\x01kZ\x00")))


@scenario(queues=[BADPROPS_QUEUE])
def s_badprops_unknown_tag_in_array(host: str, port: int) -> Observation:
    """Headers {k: [<field type 'Z'>]}."""
    return _badprops(host, port, _headers_props(b"\x01kA" + _tbl(b"Z\x00")))


@scenario(queues=[BADPROPS_QUEUE])
def s_badprops_tag_U(host: str, port: int) -> Observation:
    """Headers {k: 'U' 0x0007} (a signed 16-bit int to pika and py-amqp, unknown to RabbitMQ)."""
    return _badprops(host, port, _headers_props(b"\x01kU\x00\x07"))


@scenario(queues=[BADPROPS_QUEUE])
def s_badprops_tag_L(host: str, port: int) -> Observation:
    """Headers {k: 'L' 0xffffffffffffffff} (RabbitMQ reads 'L' as signed: -1)."""
    return _badprops(host, port, _headers_props(b"\x01kL" + b"\xff" * 8))


@scenario(queues=[BADPROPS_QUEUE])
def s_badprops_table_past_end(host: str, port: int) -> Observation:
    """Headers table whose length claims 50 bytes; 4 follow before the frame ends."""
    props = struct.pack(">HI", FLAG_HEADERS, 50) + b"\x01kt\x01"
    return _badprops(host, port, props)


@scenario(queues=[BADPROPS_QUEUE])
def s_badprops_array_overrun(host: str, port: int) -> Observation:
    """Headers {k: array} of two 'I' ints (10 bytes) whose length says 7: the second
    int is cut in half; the headers table's length covers all 10 bytes."""
    elements = b"I" + struct.pack(">i", 1) + b"I" + struct.pack(">i", 2)
    table = b"\x01kA" + struct.pack(">I", 7) + elements
    return _badprops(host, port, _headers_props(table))


@scenario(queues=[BADPROPS_QUEUE])
def s_badprops_shortstr_past_end(host: str, port: int) -> Observation:
    """content-type whose length octet says 200; 3 bytes follow before the frame ends."""
    return _badprops(host, port, struct.pack(">HB", FLAG_CONTENT_TYPE, 200) + b"abc")


@scenario(queues=[BADPROPS_QUEUE])
def s_badprops_trailing_bytes(host: str, port: int) -> Observation:
    """content-type "abc" followed by 3 bytes no property flag accounts for."""
    return _badprops(host, port, struct.pack(">H", FLAG_CONTENT_TYPE) + b"\x03abc" + b"xyz")


@scenario(queues=[BADPROPS_QUEUE])
def s_badprops_flags_continuation(host: str, port: int) -> Observation:
    """Flags 0x8001 (content-type, continuation bit), a second flag word 0x0000, then
    content-type "abc"."""
    props = struct.pack(">HH", FLAG_CONTENT_TYPE | 1, 0) + b"\x03abc"
    return _badprops(host, port, props)


@scenario(queues=[BADPROPS_QUEUE])
def s_badprops_flags_continuation_only(host: str, port: int) -> Observation:
    """Flags 0x0001 (continuation bit) and no second flag word."""
    return _badprops(host, port, struct.pack(">H", 0x0001))


@scenario(queues=[BADPROPS_QUEUE])
def s_badprops_flag_bit_1(host: str, port: int) -> Observation:
    """Flags 0x0002 (bit 1, no property of basic) and nothing else."""
    return _badprops(host, port, struct.pack(">H", 0x0002))


@scenario(queues=[BADPROPS_QUEUE])
def s_badprops_deep_tables_200(host: str, port: int) -> Observation:
    """Headers {"a": {"a": ... {}}}: tables nested 200 deep (a get records the depth
    of the headers that came back, not the headers)."""
    obs = _badprops(host, port, _headers_props(_nested_tables(200)))
    props = obs.get("get", {}).get("properties")
    if isinstance(props, dict) and isinstance(props.get("headers"), dict):
        depth, value = 0, props["headers"]
        while isinstance(value, dict) and value:
            depth, value = depth + 1, value.get("a")
        props["headers"] = {"depth": depth}
    return obs


@scenario(queues=[BADPROPS_QUEUE])
def s_badprops_deep_tables_2000(host: str, port: int) -> Observation:
    """Headers {"a": {"a": ... {}}}: tables nested 2000 deep."""
    return _badprops(host, port, _headers_props(_nested_tables(2000)))


@scenario(queues=[BADPROPS_QUEUE])
def s_badprops_deep_arrays_2000(host: str, port: int) -> Observation:
    """Headers {k: [[ ... [] ... ]]}: arrays nested 2000 deep."""
    return _badprops(host, port, _headers_props(_nested_arrays(2000)))


@scenario(queues=[BADPROPS_QUEUE])
def s_badprops_timestamp_header_year_10000(host: str, port: int) -> Observation:
    """Headers {k: 'T' 253402300800} (10000-01-01: pika and py-amqp cannot represent it)."""
    return _badprops(host, port, _headers_props(b"\x01kT" + struct.pack(">Q", 253402300800)))


@scenario(queues=[BADPROPS_QUEUE])
def s_badprops_timestamp_property_huge(host: str, port: int) -> Observation:
    """timestamp property 2**64-1."""
    return _badprops(host, port, struct.pack(">HQ", FLAG_TIMESTAMP, 2**64 - 1))


@scenario(queues=[BADPROPS_QUEUE])
def s_badprops_float_nan(host: str, port: int) -> Observation:
    """Headers {n: 'f' NaN, i: 'd' +infinity}."""
    nan, inf = struct.pack(">f", float("nan")), struct.pack(">d", float("inf"))
    table = b"\x01nf" + nan + b"\x01id" + inf
    return _badprops(host, port, _headers_props(table))


@scenario(queues=[BADPROPS_QUEUE])
def s_badprops_key_not_utf8(host: str, port: int) -> Observation:
    """Headers whose only key is the bytes ff fe (not UTF-8), value longstr "v"."""
    return _badprops(host, port, _headers_props(b"\x02\xff\xfe" + _longstr(b"v")))


@scenario(queues=[BADPROPS_QUEUE])
def s_badprops_content_type_not_utf8(host: str, port: int) -> Observation:
    """content-type is the bytes ff fe (not UTF-8)."""
    return _badprops(host, port, struct.pack(">H", FLAG_CONTENT_TYPE) + b"\x02\xff\xfe")


@scenario(queues=[BADPROPS_QUEUE])
def s_badprops_cc_not_array(host: str, port: int) -> Observation:
    """Headers {CC: longstr "abc"} (CC must be an array of strings)."""
    return _badprops(host, port, _headers_props(b"\x02CC" + _longstr(b"abc")))


@scenario(queues=[BADPROPS_QUEUE])
def s_badprops_bcc_not_array(host: str, port: int) -> Observation:
    """Headers {BCC: 'I' 1} (BCC must be an array of strings)."""
    return _badprops(host, port, _headers_props(b"\x03BCCI" + struct.pack(">i", 1)))


@scenario(queues=[BADPROPS_QUEUE])
def s_badprops_cc_mixed_array(host: str, port: int) -> Observation:
    """Headers {CC: ["compat-q-badprops", 'I' 1]}, routing key compat-nowhere: only the
    CC string routes it (non-strings in CC are ignored)."""
    array = _longstr(BADPROPS_QUEUE.encode()) + b"I" + struct.pack(">i", 1)
    props = _headers_props(b"\x02CCA" + _tbl(array))
    return _badprops(host, port, props, routing_key="compat-nowhere")


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


def _briefed(observation: Observation) -> Observation:
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


def _stream_consume(
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


def _stream_declare(
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


# -- declare ---------------------------------------------------------------------------

STREAM_DECLARE_QUEUE = "compat-stream-declare"


@scenario(queues=[STREAM_DECLARE_QUEUE])
def s_stream_declare_durable(host: str, port: int) -> Observation:
    """queue.declare durable, x-queue-type=stream; then the same declare again, and a
    passive declare."""
    with connection(host, port) as conn:
        ch = conn.channel()

        def declare(**kw: Any) -> Any:
            return ch.queue_declare(STREAM_DECLARE_QUEUE, arguments=STREAM_ARGS, **kw)

        return {
            "declare": attempt(lambda: declare(durable=True)),
            "redeclare": attempt(lambda: declare(durable=True)),
            "passive": attempt(lambda: ch.queue_declare(STREAM_DECLARE_QUEUE, passive=True)),
        }


@scenario(queues=[STREAM_DECLARE_QUEUE])
def s_stream_declare_non_durable(host: str, port: int) -> Observation:
    """queue.declare of a stream with durable=false."""
    return _stream_declare(host, port, STREAM_DECLARE_QUEUE, durable=False)


@scenario(queues=[STREAM_DECLARE_QUEUE])
def s_stream_declare_exclusive(host: str, port: int) -> Observation:
    """queue.declare of a durable, exclusive stream."""
    return _stream_declare(host, port, STREAM_DECLARE_QUEUE, exclusive=True)


@scenario(queues=[STREAM_DECLARE_QUEUE])
def s_stream_declare_auto_delete(host: str, port: int) -> Observation:
    """queue.declare of a durable, auto-delete stream."""
    return _stream_declare(host, port, STREAM_DECLARE_QUEUE, auto_delete=True)


@scenario(queues=[STREAM_DECLARE_QUEUE])
def s_stream_declare_every_flag_wrong(host: str, port: int) -> Observation:
    """queue.declare of a stream non-durable, exclusive and auto-delete: which is named."""
    return _stream_declare(
        host, port, STREAM_DECLARE_QUEUE, durable=False, exclusive=True, auto_delete=True
    )


@scenario(queues=[STREAM_DECLARE_QUEUE])
def s_stream_declare_non_durable_and_bad_argument(host: str, port: int) -> Observation:
    """queue.declare of a non-durable stream with x-max-age '1X' and, separately, with
    x-max-length 1: are arguments checked before the durable flag?"""
    return {
        "max_age_1X": _stream_declare(
            host, port, STREAM_DECLARE_QUEUE, {"x-max-age": "1X"}, durable=False
        ),
        "max_length": _stream_declare(
            host, port, STREAM_DECLARE_QUEUE, {"x-max-length": 1}, durable=False
        ),
    }


@scenario(queues=[STREAM_DECLARE_QUEUE])
def s_stream_declare_server_named(host: str, port: int) -> Observation:
    """queue.declare with an empty name and x-queue-type=stream (durable)."""
    return _stream_declare(host, port, "")


def _stream_redeclare(
    host: str, port: int, first: dict[str, Any], second: dict[str, Any]
) -> Observation:
    with connection(host, port) as conn:
        conn.channel().queue_declare(STREAM_DECLARE_QUEUE, **first)
        return attempt(lambda: conn.channel().queue_declare(STREAM_DECLARE_QUEUE, **second))


_DURABLE_STREAM = {"durable": True, "arguments": STREAM_ARGS}


@scenario(queues=[STREAM_DECLARE_QUEUE])
def s_stream_redeclare_as_classic(host: str, port: int) -> Observation:
    """A stream redeclared durable with x-queue-type=classic."""
    return _stream_redeclare(
        host, port, _DURABLE_STREAM, {"durable": True, "arguments": {"x-queue-type": "classic"}}
    )


@scenario(queues=[STREAM_DECLARE_QUEUE])
def s_stream_redeclare_as_quorum(host: str, port: int) -> Observation:
    """A stream redeclared durable with x-queue-type=quorum."""
    return _stream_redeclare(
        host, port, _DURABLE_STREAM, {"durable": True, "arguments": {"x-queue-type": "quorum"}}
    )


@scenario(queues=[STREAM_DECLARE_QUEUE])
def s_stream_redeclare_without_queue_type(host: str, port: int) -> Observation:
    """A stream redeclared durable without any x-queue-type argument."""
    return _stream_redeclare(host, port, _DURABLE_STREAM, {"durable": True})


@scenario(queues=[STREAM_DECLARE_QUEUE])
def s_stream_redeclare_non_durable(host: str, port: int) -> Observation:
    """A stream redeclared with x-queue-type=stream but durable=false."""
    return _stream_redeclare(
        host, port, _DURABLE_STREAM, {"durable": False, "arguments": STREAM_ARGS}
    )


@scenario(queues=[STREAM_DECLARE_QUEUE])
def s_stream_redeclare_added_max_age(host: str, port: int) -> Observation:
    """A stream declared without x-max-age, redeclared with x-max-age '1D'."""
    return _stream_redeclare(
        host,
        port,
        _DURABLE_STREAM,
        {"durable": True, "arguments": {**STREAM_ARGS, "x-max-age": "1D"}},
    )


@scenario(queues=[STREAM_DECLARE_QUEUE])
def s_stream_redeclare_passive_other_type(host: str, port: int) -> Observation:
    """A stream passively redeclared with x-queue-type=classic and durable=false."""
    return _stream_redeclare(
        host,
        port,
        _DURABLE_STREAM,
        {"passive": True, "durable": False, "arguments": {"x-queue-type": "classic"}},
    )


@scenario(queues=[STREAM_DECLARE_QUEUE])
def s_stream_declare_over_classic(host: str, port: int) -> Observation:
    """A durable classic queue (no x-queue-type) redeclared as a stream."""
    return _stream_redeclare(host, port, {"durable": True}, _DURABLE_STREAM)


@scenario(queues=[STREAM_DECLARE_QUEUE])
def s_stream_declare_queue_type_case(host: str, port: int) -> Observation:
    """queue.declare with x-queue-type 'STREAM' (upper case)."""
    with connection(host, port) as conn:
        return attempt(
            lambda: conn.channel().queue_declare(
                STREAM_DECLARE_QUEUE, durable=True, arguments={"x-queue-type": "STREAM"}
            )
        )


@scenario(queues=[STREAM_DECLARE_QUEUE])
def s_stream_declare_max_age_invalid_unit(host: str, port: int) -> Observation:
    """Stream declared with x-max-age '1X' (unknown unit)."""
    return _stream_declare(host, port, STREAM_DECLARE_QUEUE, {"x-max-age": "1X"})


@scenario(queues=[STREAM_DECLARE_QUEUE])
def s_stream_declare_max_age_number(host: str, port: int) -> Observation:
    """Stream declared with x-max-age 5 (a number, which pika sends as 'I' signed 32-bit)."""
    return _stream_declare(host, port, STREAM_DECLARE_QUEUE, {"x-max-age": 5})


@scenario(queues=[STREAM_DECLARE_QUEUE])
def s_stream_declare_max_age_forms(host: str, port: int) -> Observation:
    """Stream declared with each x-max-age string form in turn (each on a fresh queue):
    the accepted units are Y M D h m s after a positive integer; '-1s', ' 1s', 's' and ''
    crash RabbitMQ's connection (541)."""
    forms = ["1Y", "1M", "7D", "1h", "30m", "10s", "007s", "0s", "1d", "1H", "1S", "1h1m",
             "1.5h", "-1s", " 1s", "s", ""]  # fmt: skip
    out: dict[str, Observation] = {}
    for form in forms:
        out[form] = _stream_declare(host, port, STREAM_DECLARE_QUEUE, {"x-max-age": form})
        cleanup(host, port, [STREAM_DECLARE_QUEUE], [])
    return out


@scenario(queues=[STREAM_DECLARE_QUEUE])
def s_stream_declare_max_length_bytes_invalid(host: str, port: int) -> Observation:
    """Stream declared with x-max-length-bytes 'big', then -1, then 0 (fresh queue each)."""
    out: dict[str, Observation] = {}
    for value in ("big", -1, 0):
        out[repr(value)] = _stream_declare(
            host, port, STREAM_DECLARE_QUEUE, {"x-max-length-bytes": value}
        )
        cleanup(host, port, [STREAM_DECLARE_QUEUE], [])
    return out


@scenario(queues=[STREAM_DECLARE_QUEUE])
def s_stream_declare_max_segment_size_invalid(host: str, port: int) -> Observation:
    """Stream declared with x-stream-max-segment-size-bytes 'x', -5, 0, 3000000000 and
    3000000001 (fresh queue each; pika sends the last two as 'l' 64-bit)."""
    out: dict[str, Observation] = {}
    for value in ("x", -5, 0, 3_000_000_000, 3_000_000_001):
        out[repr(value)] = _stream_declare(
            host, port, STREAM_DECLARE_QUEUE, {"x-stream-max-segment-size-bytes": value}
        )
        cleanup(host, port, [STREAM_DECLARE_QUEUE], [])
    return out


@scenario(queues=[STREAM_DECLARE_QUEUE])
def s_stream_declare_unknown_argument(host: str, port: int) -> Observation:
    """Stream declared with x-compat=1 (an argument no broker knows)."""
    return _stream_declare(host, port, STREAM_DECLARE_QUEUE, {"x-compat": 1})


@scenario(queues=[STREAM_DECLARE_QUEUE])
def s_stream_declare_valid_arguments(host: str, port: int) -> Observation:
    """Stream declared with x-max-age '7D', x-max-length-bytes 1000000,
    x-stream-max-segment-size-bytes 500000, x-initial-cluster-size 1 and
    x-queue-leader-locator 'balanced', all at once."""
    arguments = {
        "x-max-age": "7D",
        "x-max-length-bytes": 1_000_000,
        "x-stream-max-segment-size-bytes": 500_000,
        "x-initial-cluster-size": 1,
        "x-queue-leader-locator": "balanced",
    }
    return _stream_declare(host, port, STREAM_DECLARE_QUEUE, arguments)


@scenario(queues=[STREAM_DECLARE_QUEUE])
def s_stream_declare_cluster_arguments_invalid(host: str, port: int) -> Observation:
    """Stream declared with x-initial-cluster-size 0, then x-queue-leader-locator 'bogus'."""
    out: dict[str, Observation] = {}
    for key, value in (("x-initial-cluster-size", 0), ("x-queue-leader-locator", "bogus")):
        out[key] = _stream_declare(host, port, STREAM_DECLARE_QUEUE, {key: value})
        cleanup(host, port, [STREAM_DECLARE_QUEUE], [])
    return out


@scenario(queues=[STREAM_DECLARE_QUEUE])
def s_stream_declare_classic_arguments(host: str, port: int) -> Observation:
    """Stream declared with each argument of classic queues that streams refuse
    (valid values, fresh queue each)."""
    arguments: list[tuple[str, Any]] = [
        ("x-max-length", 5),
        ("x-message-ttl", 1000),
        ("x-expires", 10000),
        ("x-max-priority", 5),
        ("x-dead-letter-exchange", "amq.direct"),
        ("x-overflow", "reject-publish"),
        ("x-queue-mode", "lazy"),
    ]
    out: dict[str, Observation] = {}
    for key, value in arguments:
        out[key] = _stream_declare(host, port, STREAM_DECLARE_QUEUE, {key: value})
        cleanup(host, port, [STREAM_DECLARE_QUEUE], [])
    return out


@scenario(queues=[STREAM_DECLARE_QUEUE])
def s_stream_declare_single_active_consumer(host: str, port: int) -> Observation:
    """Stream declared with x-single-active-consumer=true."""
    return _stream_declare(host, port, STREAM_DECLARE_QUEUE, {"x-single-active-consumer": True})


@scenario(queues=[STREAM_DECLARE_QUEUE])
def s_stream_declare_filter_size(host: str, port: int) -> Observation:
    """Stream declared with x-stream-filter-size-bytes 16 (a RabbitMQ 3.13 argument)."""
    return _stream_declare(host, port, STREAM_DECLARE_QUEUE, {"x-stream-filter-size-bytes": 16})


STREAM_COUNTS_QUEUE = "compat-stream-counts"


def _settled_counts(session: StreamSession, queue: str, expect: int) -> dict[str, Any]:
    """Passive declares until message_count is ``expect`` (or STREAM_COUNT_SETTLE passed):
    the settled message_count and every consumer_count seen meanwhile."""
    deadline = time.monotonic() + STREAM_COUNT_SETTLE
    consumer_counts: set[int] = set()
    while True:
        ok = session.call(1, commands.Queue.Declare(queue=queue, passive=True), "Queue.DeclareOk")
        consumer_counts.add(ok["consumer_count"])
        if ok["message_count"] == expect or time.monotonic() > deadline:
            return {
                "message_count": ok["message_count"],
                "consumer_counts": sorted(consumer_counts),
            }
        time.sleep(0.25)


@scenario(queues=[STREAM_COUNTS_QUEUE])
def s_stream_declare_counts(host: str, port: int) -> Observation:
    """message_count / consumer_count of a stream: declare-ok of the fresh stream; after 3
    confirmed publishes (settled: RabbitMQ refreshes the figure every 5 s and reports 0
    until then); with a consumer (prefetch 10) that got and acked all 3; after it is
    cancelled. RabbitMQ counts every message in the stream, read or not, and never
    counts consumers."""
    with stream_session(host, port, STREAM_COUNTS_QUEUE) as session:
        fresh = session.call(
            1,
            commands.Queue.Declare(queue=STREAM_COUNTS_QUEUE, durable=True, arguments=STREAM_ARGS),
            "Queue.DeclareOk",
        )
        session.publish(["m1", "m2", "m3"], STREAM_COUNTS_QUEUE)
        published = _settled_counts(session, STREAM_COUNTS_QUEUE, 3)
        _stream_consume(session, STREAM_COUNTS_QUEUE, {"x-stream-offset": "first"})
        got = [f["body"] for f in session.settle() if f.get("frame") == "Basic.Deliver"]
        session.client.method(2, commands.Basic.Ack(delivery_tag=3, multiple=True))
        consumed = _settled_counts(session, STREAM_COUNTS_QUEUE, 3)
        session.call(2, commands.Basic.Cancel(consumer_tag="compat-ctag"), "Basic.CancelOk")
        cancelled = _settled_counts(session, STREAM_COUNTS_QUEUE, 3)
        return {
            "fresh": {k: fresh[k] for k in ("message_count", "consumer_count")},
            "after_publish": published,
            "consumer_got": got,
            "with_consumer_after_ack": consumed,
            "after_cancel": cancelled,
        }


# -- publish ---------------------------------------------------------------------------

STREAM_PUBLISH_QUEUE = "compat-stream-publish"
STREAM_EXCHANGE = "compat-stream-direct"


@scenario(queues=[STREAM_PUBLISH_QUEUE])
def s_stream_publish_confirms_default_exchange(host: str, port: int) -> Observation:
    """Confirm mode; m1..m3 published to a stream via the default exchange, each confirm
    awaited; then consumed from 'first' (full deliveries)."""
    with stream_session(host, port, STREAM_PUBLISH_QUEUE) as session:
        confirms = session.publish(["m1", "m2", "m3"], STREAM_PUBLISH_QUEUE)
        _stream_consume(session, STREAM_PUBLISH_QUEUE, {"x-stream-offset": "first"})
        return {"confirms": confirms, **session.outcome(session.settle())}


@scenario(queues=[STREAM_PUBLISH_QUEUE], exchanges=[STREAM_EXCHANGE])
def s_stream_publish_confirms_direct_exchange(host: str, port: int) -> Observation:
    """A stream bound to direct exchange compat-stream-direct with key 'rk'; confirm mode;
    m1, m2 published there, m3 via the default exchange; consumed from 'first': the
    exchange and routing key each delivery carries."""
    with stream_session(host, port, STREAM_PUBLISH_QUEUE) as session:
        session.call(
            1,
            commands.Exchange.Declare(exchange=STREAM_EXCHANGE, exchange_type="direct"),
            "Exchange.DeclareOk",
        )
        session.call(
            1,
            commands.Queue.Bind(
                queue=STREAM_PUBLISH_QUEUE, exchange=STREAM_EXCHANGE, routing_key="rk"
            ),
            "Queue.BindOk",
        )
        confirms = session.publish(["m1", "m2"], "rk", STREAM_EXCHANGE)
        confirms += session.publish(["m3"], STREAM_PUBLISH_QUEUE)
        _stream_consume(session, STREAM_PUBLISH_QUEUE, {"x-stream-offset": "first"})
        return {"confirms": confirms, **session.outcome(session.settle())}


@scenario(queues=[STREAM_PUBLISH_QUEUE])
def s_stream_publish_batch_confirms(host: str, port: int) -> Observation:
    """Confirm mode; ten publishes to a stream in one write: which tags are confirmed (acks
    expanded, as a broker may merge them), then every message read from 'first'."""
    with stream_session(host, port, STREAM_PUBLISH_QUEUE) as session:
        data = b""
        for i in range(10):
            data += pframe.marshal(
                commands.Basic.Publish(exchange="", routing_key=STREAM_PUBLISH_QUEUE), 1
            )
            data += pframe.marshal(pheader.ContentHeader(0, 3, commands.Basic.Properties()), 1)
            data += pframe.marshal(pbody.ContentBody(f"m{i:02}".encode()), 1)
        session.client.send(data)
        acked: set[int] = set()
        nacked: set[int] = set()
        while max(acked | nacked, default=0) < 10:
            frame = session.wait_for(("Basic.Ack", "Basic.Nack"), 1)
            tag = frame["delivery_tag"]
            tags = set(range(1, tag + 1)) if frame["multiple"] else {tag}
            (acked if frame["frame"] == "Basic.Ack" else nacked).update(tags)
        _stream_consume(session, STREAM_PUBLISH_QUEUE, {"x-stream-offset": "first"})
        frames = session.settle()
        consumed = [
            [f["body"], f.get("properties", {}).get("headers", {}).get("x-stream-offset")]
            for f in frames
            if f.get("frame") == "Basic.Deliver"
        ]
        return {"acked": sorted(acked), "nacked": sorted(nacked), "consumed": consumed}


@scenario(queues=[STREAM_PUBLISH_QUEUE])
def s_stream_publish_mandatory(host: str, port: int) -> Observation:
    """Confirm mode; mandatory publish to the stream (routable), then mandatory publish to
    amq.direct with no binding (unroutable), each confirm awaited: frames on channel 1."""
    with stream_session(host, port, STREAM_PUBLISH_QUEUE) as session:
        routed = session.publish(["m1"], STREAM_PUBLISH_QUEUE, mandatory=True)
        routed_frames = session.settle()
        unrouted = session.publish(["m2"], "compat-nowhere", "amq.direct", mandatory=True)
        return {
            "routable": {"confirms": routed, "other_frames": routed_frames},
            "unroutable": {"confirms": unrouted, "other_frames": session.settle()},
        }


@scenario(queues=[STREAM_PUBLISH_QUEUE])
def s_stream_publish_tx(host: str, port: int) -> Observation:
    """A tx channel publishes m1 and commits, m2 and rolls back, m3 and commits; the
    stream read from 'first'."""
    with stream_session(host, port, STREAM_PUBLISH_QUEUE, channels=(1, 2, 3)) as session:
        session.call(3, commands.Tx.Select(), "Tx.SelectOk")
        for body, end in (("m1", "Commit"), ("m2", "Rollback"), ("m3", "Commit")):
            session.client.publish(3, body.encode(), "", STREAM_PUBLISH_QUEUE)
            if end == "Commit":
                session.call(3, commands.Tx.Commit(), "Tx.CommitOk")
            else:
                session.call(3, commands.Tx.Rollback(), "Tx.RollbackOk")
        _stream_consume(session, STREAM_PUBLISH_QUEUE, {"x-stream-offset": "first"})
        obs = session.outcome(session.settle())
        return _briefed(obs)


@scenario(queues=[STREAM_PUBLISH_QUEUE])
def s_stream_publish_decimal_header(host: str, port: int) -> Observation:
    """Confirm mode; a message with a decimal header value (D 1.5) published to a stream
    (RabbitMQ 3.10 cannot convert it for the stream and its connection crashes: 541)."""
    with stream_session(host, port, STREAM_PUBLISH_QUEUE) as session:
        props = commands.Basic.Properties(headers={"dec": decimal.Decimal("1.5")})
        session.client.publish(1, b"m1", "", STREAM_PUBLISH_QUEUE, properties=props)
        return session.outcome(session.settle())


# -- consume ---------------------------------------------------------------------------

STREAM_CONSUME_QUEUE = "compat-stream-consume"
FIVE = ("m1", "m2", "m3", "m4", "m5")


def _stream_consume_probe(
    host: str,
    port: int,
    arguments: dict[str, Any] | None,
    *,
    prefetch: int | None = 10,
    late: Sequence[str] = ("late1", "late2"),
    **flags: Any,
) -> Observation:
    """m1..m5 published one at a time (each its own chunk); channel 2 consumes with
    ``arguments``; what it gets; then, if the connection survived, ``late`` published
    (one at a time) and what it gets of those. Deliveries in brief."""
    with stream_session(host, port, STREAM_CONSUME_QUEUE, FIVE) as session:
        _stream_consume(session, STREAM_CONSUME_QUEUE, arguments, prefetch=prefetch, **flags)
        first = session.settle()
        obs: Observation = {"consume": {k: brief(v) for k, v in by_channel(first).items()}}
        if not session.eof and late:
            session.publish(late, STREAM_CONSUME_QUEUE)
            obs["after_late_publish"] = {
                k: brief(v) for k, v in by_channel(session.settle()).items()
            }
        final = session.outcome([])
        obs.update(_briefed(final))
        return obs


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_consume_without_qos(host: str, port: int) -> Observation:
    """basic.consume on a stream from a channel that never sent basic.qos (prefetch 0)."""
    return _stream_consume_probe(host, port, {"x-stream-offset": "first"}, prefetch=None)


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_consume_global_qos(host: str, port: int) -> Observation:
    """basic.consume on a stream from a channel with only a global basic.qos (prefetch 10,
    global=true)."""
    with stream_session(host, port, STREAM_CONSUME_QUEUE, FIVE) as session:
        session.call(2, commands.Basic.Qos(prefetch_count=10, global_=True), "Basic.QosOk")
        _stream_consume(session, STREAM_CONSUME_QUEUE, {"x-stream-offset": "first"}, prefetch=None)
        obs = session.outcome(session.settle())
        return _briefed(obs)


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_consume_no_ack(host: str, port: int) -> Observation:
    """basic.consume no_ack=true on a stream (prefetch 10)."""
    return _stream_consume_probe(host, port, {"x-stream-offset": "first"}, no_ack=True)


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_consume_deliveries(host: str, port: int) -> Observation:
    """Prefetch 10, manual ack; m1..m3 (no properties) read from 'first': every field of
    each basic.deliver, its properties and the field type of each header."""
    with stream_session(host, port, STREAM_CONSUME_QUEUE, FIVE[:3]) as session:
        _stream_consume(session, STREAM_CONSUME_QUEUE, {"x-stream-offset": "first"})
        return session.outcome(session.settle())


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_consume_properties_round_trip(host: str, port: int) -> Observation:
    """A message with every basic property set and scalar headers of each field type
    (b s u I i l t f T S x V) published to a stream, read from 'first': what comes back."""
    with stream_session(host, port, STREAM_CONSUME_QUEUE) as session:
        headers = {
            "b": 1, "neg": -5, "s": 1000, "u": 40000, "I": 100000, "i": 3_000_000_000,
            "l": 2**40, "bool": True, "f": 1.5, "T": datetime.datetime(2020, 1, 2, 3, 4, 5),
            "str": "v", "bytes": bytearray(b"\x01\x02"), "void": None,
        }  # fmt: skip
        props = commands.Basic.Properties(
            content_type="text/plain",
            content_encoding="gzip",
            headers=headers,
            delivery_mode=2,
            priority=3,
            correlation_id="c1",
            reply_to="r1",
            expiration="60000",
            message_id="id1",
            timestamp=datetime.datetime(2021, 5, 6, 7, 8, 9),
            message_type="t1",
            user_id="guest",
            app_id="a1",
        )
        session.publish(["full"], STREAM_CONSUME_QUEUE, properties=props)
        _stream_consume(session, STREAM_CONSUME_QUEUE, {"x-stream-offset": "first"})
        return session.outcome(session.settle())


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_consume_nested_headers(host: str, port: int) -> Observation:
    """Messages with a table header {tbl: {k: 1}}, an array header {arr: [1, 'a']}, and
    both beside a string header, published to a stream and read from 'first'."""
    with stream_session(host, port, STREAM_CONSUME_QUEUE) as session:
        for headers in (
            {"tbl": {"k": 1}},
            {"arr": [1, "a"]},
            {"tbl": {"k": 1}, "arr": [1, "a"], "str": "v"},
        ):
            props = commands.Basic.Properties(headers=headers)
            session.publish(["m"], STREAM_CONSUME_QUEUE, properties=props)
        _stream_consume(session, STREAM_CONSUME_QUEUE, {"x-stream-offset": "first"})
        return session.outcome(session.settle())


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_consume_publisher_offset_header(host: str, port: int) -> Observation:
    """A message published with its own header x-stream-offset=99 (and x-stream-timestamp
    'x'), read from 'first': which values the consumer sees."""
    with stream_session(host, port, STREAM_CONSUME_QUEUE, ["m1"]) as session:
        props = commands.Basic.Properties(
            headers={"x-stream-offset": 99, "x-stream-timestamp": "x"}
        )
        session.publish(["m2"], STREAM_CONSUME_QUEUE, properties=props)
        _stream_consume(session, STREAM_CONSUME_QUEUE, {"x-stream-offset": "first"})
        return session.outcome(session.settle())


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_consume_prefetch_credit(host: str, port: int) -> Observation:
    """Prefetch 2 and m1..m6 in the stream, read from 'first': what comes at once; after
    acking tag 1; after acking up to tag 3 with multiple=true; after acking everything."""
    with stream_session(host, port, STREAM_CONSUME_QUEUE, [*FIVE, "m6"]) as session:
        _stream_consume(session, STREAM_CONSUME_QUEUE, {"x-stream-offset": "first"}, prefetch=2)
        steps = {"initial": brief(session.settle())}
        for name, tag, multiple in (
            ("after_ack_1", 1, False),
            ("after_ack_multiple_3", 3, True),
            ("after_ack_multiple_5", 5, True),
        ):
            session.client.method(2, commands.Basic.Ack(delivery_tag=tag, multiple=multiple))
            steps[name] = brief(session.settle())
        return {**steps, "socket": session.outcome([])["socket"]}


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_consume_two_channels(host: str, port: int) -> Observation:
    """Two consumers on channels 2 and 3, both from 'first' (prefetch 10): each reads all
    of m1..m3 independently (delivery tags are per channel)."""
    with stream_session(host, port, STREAM_CONSUME_QUEUE, FIVE[:3], channels=(1, 2, 3)) as s:
        _stream_consume(s, STREAM_CONSUME_QUEUE, {"x-stream-offset": "first"}, tag="a")
        _stream_consume(s, STREAM_CONSUME_QUEUE, {"x-stream-offset": "first"}, channel=3, tag="b")
        obs = s.outcome(s.settle())
        return _briefed(obs)


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_consume_two_on_one_channel(host: str, port: int) -> Observation:
    """Consumer 'a' from 'first' on channel 2 reads m1..m3; then consumer 'b' from offset 1
    on the same channel; then m4 is published: who gets what, with which tags. Which of
    the two gets m4 first varies on RabbitMQ, so for m4 only the deliveries (by consumer
    tag, without their tags) and the set of delivery tags used are recorded."""
    with stream_session(host, port, STREAM_CONSUME_QUEUE, FIVE[:3]) as session:
        _stream_consume(session, STREAM_CONSUME_QUEUE, {"x-stream-offset": "first"}, tag="a")
        a = brief(session.settle())
        session.client.method(
            2,
            commands.Basic.Consume(
                queue=STREAM_CONSUME_QUEUE, consumer_tag="b", arguments={"x-stream-offset": 1}
            ),
        )
        b = brief(session.settle())
        session.publish(["m4"], STREAM_CONSUME_QUEUE)
        late = brief(session.settle())
        return {
            "consumer_a": a,
            "consumer_b": b,
            "after_publish_m4": sorted(
                ({k: v for k, v in f.items() if k != "delivery_tag"} for f in late),
                key=lambda f: str(f.get("consumer_tag")),
            ),
            "after_publish_m4_delivery_tags": sorted(f.get("delivery_tag", 0) for f in late),
            "socket": session.outcome([])["socket"],
        }


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_consume_ack_cancel_next(host: str, port: int) -> Observation:
    """Read m1..m3 from 'first', ack all, cancel, consume again from 'next' on the same
    channel (nothing: there is no server-side position), then m4 is published."""
    with stream_session(host, port, STREAM_CONSUME_QUEUE, FIVE[:3]) as session:
        _stream_consume(session, STREAM_CONSUME_QUEUE, {"x-stream-offset": "first"})
        first = brief(session.settle())
        session.client.method(2, commands.Basic.Ack(delivery_tag=3, multiple=True))
        cancel = session.call(
            2, commands.Basic.Cancel(consumer_tag="compat-ctag"), "Basic.CancelOk"
        )
        session.client.method(
            2,
            commands.Basic.Consume(
                queue=STREAM_CONSUME_QUEUE,
                consumer_tag="compat-ctag-2",
                arguments={"x-stream-offset": "next"},
            ),
        )
        again = brief(session.settle())
        session.publish(["m4"], STREAM_CONSUME_QUEUE)
        return {
            "first": first,
            "cancel": brief([cancel]),
            "consume_next": again,
            "after_publish_m4": brief(session.settle()),
            "socket": session.outcome([])["socket"],
        }


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_consume_cancel_unacked_then_first(host: str, port: int) -> Observation:
    """Read m1..m3 from 'first' without acking; cancel; ack tag 3 multiple=true (after the
    cancel); consume again from 'first' on the same channel."""
    with stream_session(host, port, STREAM_CONSUME_QUEUE, FIVE[:3]) as session:
        _stream_consume(session, STREAM_CONSUME_QUEUE, {"x-stream-offset": "first"})
        first = brief(session.settle())
        session.call(2, commands.Basic.Cancel(consumer_tag="compat-ctag"), "Basic.CancelOk")
        session.client.method(2, commands.Basic.Ack(delivery_tag=3, multiple=True))
        session.client.method(
            2,
            commands.Basic.Consume(
                queue=STREAM_CONSUME_QUEUE,
                consumer_tag="compat-ctag-2",
                arguments={"x-stream-offset": "first"},
            ),
        )
        return {
            "first": first,
            "after_ack_and_consume": brief(session.settle()),
            "socket": session.outcome([])["socket"],
        }


def _stream_settle_probe(
    host: str, port: int, method: PamqpMethod, queue: str = STREAM_CONSUME_QUEUE
) -> Observation:
    """m1..m3 read from 'first' on channel 2 (not acked); then ``method`` on channel 2."""
    with stream_session(host, port, queue, FIVE[:3]) as session:
        _stream_consume(session, queue, {"x-stream-offset": "first"})
        got = brief(session.settle())
        session.client.method(2, method)
        obs = session.outcome(session.settle())
        return {"got": got, **_briefed(obs)}


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_nack_requeue(host: str, port: int) -> Observation:
    """basic.nack requeue=true of a stream delivery (tag 1)."""
    return _stream_settle_probe(host, port, commands.Basic.Nack(delivery_tag=1, requeue=True))


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_nack_no_requeue(host: str, port: int) -> Observation:
    """basic.nack requeue=false of a stream delivery (tag 1)."""
    return _stream_settle_probe(host, port, commands.Basic.Nack(delivery_tag=1, requeue=False))


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_reject_requeue(host: str, port: int) -> Observation:
    """basic.reject requeue=true of a stream delivery (tag 2)."""
    return _stream_settle_probe(host, port, commands.Basic.Reject(delivery_tag=2, requeue=True))


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_reject_no_requeue(host: str, port: int) -> Observation:
    """basic.reject requeue=false of a stream delivery (tag 2)."""
    return _stream_settle_probe(host, port, commands.Basic.Reject(delivery_tag=2, requeue=False))


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_ack_unknown_tag(host: str, port: int) -> Observation:
    """basic.ack of delivery tag 9 on a channel holding stream deliveries 1..3."""
    return _stream_settle_probe(host, port, commands.Basic.Ack(delivery_tag=9))


# -- x-stream-offset -------------------------------------------------------------------


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_offset_absent(host: str, port: int) -> Observation:
    """m1..m5 in the stream; basic.consume without x-stream-offset; then late1, late2."""
    return _stream_consume_probe(host, port, None)


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_offset_first(host: str, port: int) -> Observation:
    """m1..m5 in the stream; x-stream-offset 'first'; then late1, late2."""
    return _stream_consume_probe(host, port, {"x-stream-offset": "first"})


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_offset_last(host: str, port: int) -> Observation:
    """m1..m5 each published alone (confirm awaited, so each is its own chunk);
    x-stream-offset 'last' (RabbitMQ: from the start of the last chunk); then late1,
    late2. (Messages published in one burst may share a chunk, and 'last' then delivers
    that whole chunk: timing dependent, not recorded.)"""
    return _stream_consume_probe(host, port, {"x-stream-offset": "last"})


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_offset_next(host: str, port: int) -> Observation:
    """m1..m5 in the stream; x-stream-offset 'next'; then late1, late2."""
    return _stream_consume_probe(host, port, {"x-stream-offset": "next"})


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_offset_integer(host: str, port: int) -> Observation:
    """m1..m5 (offsets 0..4); x-stream-offset 3 (pamqp sends it as 'b', a signed 8-bit
    integer); then late1, late2."""
    return _stream_consume_probe(host, port, {"x-stream-offset": 3})


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_offset_integer_long(host: str, port: int) -> Observation:
    """m1..m5; x-stream-offset 2 sent as 'l' (signed 64-bit, by hand); then late1, late2."""
    table = shortstr("x-stream-offset") + b"l" + struct.pack(">q", 2)
    with stream_session(host, port, STREAM_CONSUME_QUEUE, FIVE) as session:
        session.call(2, commands.Basic.Qos(prefetch_count=10), "Basic.QosOk")
        args = (
            struct.pack(">H", 0)
            + shortstr(STREAM_CONSUME_QUEUE)
            + shortstr("compat-ctag")
            + b"\x00"
            + struct.pack(">I", len(table))
            + table
        )
        session.client.send(raw_method(2, 60, 20, args))
        first = brief(session.settle())
        session.publish(["late1", "late2"], STREAM_CONSUME_QUEUE)
        return {
            "consume": first,
            "after_late_publish": brief(session.settle()),
            "socket": session.outcome([])["socket"],
        }


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_offset_at_end(host: str, port: int) -> Observation:
    """m1..m5 (offsets 0..4); x-stream-offset 5 (the next offset); then late1, late2."""
    return _stream_consume_probe(host, port, {"x-stream-offset": 5})


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_offset_past_end(host: str, port: int) -> Observation:
    """m1..m5 (offsets 0..4); x-stream-offset 6; then late1, late2 (offsets 5, 6)."""
    return _stream_consume_probe(host, port, {"x-stream-offset": 6})


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_offset_far_past_end(host: str, port: int) -> Observation:
    """m1..m5 (offsets 0..4); x-stream-offset 100 (pamqp: 'b'); then late1, late2."""
    return _stream_consume_probe(host, port, {"x-stream-offset": 100})


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_offset_negative(host: str, port: int) -> Observation:
    """m1..m5; x-stream-offset -1 (pamqp: 'b'); then late1, late2."""
    return _stream_consume_probe(host, port, {"x-stream-offset": -1})


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_offset_float(host: str, port: int) -> Observation:
    """m1..m5; x-stream-offset 1.5 (pamqp: 'f', a 32-bit float)."""
    return _stream_consume_probe(host, port, {"x-stream-offset": 1.5})


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_offset_boolean(host: str, port: int) -> Observation:
    """m1..m5; x-stream-offset true (pamqp: 't')."""
    return _stream_consume_probe(host, port, {"x-stream-offset": True})


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_offset_timestamp_past(host: str, port: int) -> Observation:
    """m1..m5; x-stream-offset the timestamp 2000-01-01T00:00:00Z ('T'); then late1, late2."""
    return _stream_consume_probe(host, port, {"x-stream-offset": datetime.datetime(2000, 1, 1)})


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_offset_timestamp_future(host: str, port: int) -> Observation:
    """m1..m5; x-stream-offset the timestamp 2100-01-01T00:00:00Z ('T'); then late1, late2."""
    return _stream_consume_probe(host, port, {"x-stream-offset": datetime.datetime(2100, 1, 1)})


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_offset_interval_minute(host: str, port: int) -> Observation:
    """m1..m5 published within the last seconds; x-stream-offset '1m'; then late1, late2."""
    return _stream_consume_probe(host, port, {"x-stream-offset": "1m"})


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_offset_interval_hour(host: str, port: int) -> Observation:
    """m1..m5 published within the last seconds; x-stream-offset '1h'; then late1, late2."""
    return _stream_consume_probe(host, port, {"x-stream-offset": "1h"})


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_offset_interval_day(host: str, port: int) -> Observation:
    """m1..m5 published within the last seconds; x-stream-offset '1D'; then late1, late2."""
    return _stream_consume_probe(host, port, {"x-stream-offset": "1D"})


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_offset_invalid_string(host: str, port: int) -> Observation:
    """m1..m5; x-stream-offset 'nonsense' (no leading digits: RabbitMQ's interval parser
    crashes, 541)."""
    return _stream_consume_probe(host, port, {"x-stream-offset": "nonsense"})


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_offset_uppercase_first(host: str, port: int) -> Observation:
    """m1..m5; x-stream-offset 'FIRST' (only lower case names are offset specs)."""
    return _stream_consume_probe(host, port, {"x-stream-offset": "FIRST"})


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_offset_invalid_unit(host: str, port: int) -> Observation:
    """m1..m5; x-stream-offset '5X' (digits, then an unknown unit)."""
    return _stream_consume_probe(host, port, {"x-stream-offset": "5X"})


@scenario(queues=[STREAM_CONSUME_QUEUE])
def s_stream_offset_zero_interval(host: str, port: int) -> Observation:
    """m1..m5; x-stream-offset '0s'."""
    return _stream_consume_probe(host, port, {"x-stream-offset": "0s"})


@scenario(queues=["compat-stream-classic"])
def s_stream_offset_on_classic_queue(host: str, port: int) -> Observation:
    """basic.consume with x-stream-offset on a classic queue, for 'first', 3, 'nonsense'
    and 1.5 (each on a fresh channel)."""
    out: dict[str, Observation] = {}
    with raw_client(host, port) as client:
        client.handshake()
        session = StreamSession(client)
        session.call(
            1,
            commands.Queue.Declare(queue="compat-stream-classic", exclusive=True),
            "Queue.DeclareOk",
        )
        for channel, value in enumerate(("first", 3, "nonsense", 1.5), start=2):
            session.call(channel, commands.Channel.Open(), "Channel.OpenOk")
            session.client.method(
                channel,
                commands.Basic.Consume(
                    queue="compat-stream-classic",
                    consumer_tag="compat-ctag",
                    arguments={"x-stream-offset": value},
                ),
            )
            out[repr(value)] = brief(session.settle())
        out["socket"] = session.outcome([])["socket"]
        return out


# -- refusals and other queue operations -----------------------------------------------

STREAM_OPS_QUEUE = "compat-stream-ops"


def _stream_op(host: str, port: int, method: PamqpMethod, consume: bool = False) -> Observation:
    """m1..m3 in the stream (and, with ``consume``, read unacked by a consumer on channel
    3); ``method`` sent on channel 2: frames per channel and the socket."""
    with stream_session(host, port, STREAM_OPS_QUEUE, FIVE[:3], channels=(1, 2, 3)) as s:
        if consume:
            _stream_consume(s, STREAM_OPS_QUEUE, {"x-stream-offset": "first"}, channel=3)
            s.settle()
        s.client.method(2, method)
        obs = s.outcome(s.settle())
        return _briefed(obs)


@scenario(queues=[STREAM_OPS_QUEUE])
def s_stream_basic_get(host: str, port: int) -> Observation:
    """basic.get (no_ack=false) on a stream holding m1..m3."""
    return _stream_op(host, port, commands.Basic.Get(queue=STREAM_OPS_QUEUE))


@scenario(queues=[STREAM_OPS_QUEUE])
def s_stream_basic_get_no_ack(host: str, port: int) -> Observation:
    """basic.get no_ack=true on a stream holding m1..m3."""
    return _stream_op(host, port, commands.Basic.Get(queue=STREAM_OPS_QUEUE, no_ack=True))


@scenario(queues=[STREAM_OPS_QUEUE])
def s_stream_queue_purge(host: str, port: int) -> Observation:
    """queue.purge of a stream holding m1..m3."""
    return _stream_op(host, port, commands.Queue.Purge(queue=STREAM_OPS_QUEUE))


@scenario(queues=[STREAM_OPS_QUEUE])
def s_stream_queue_delete(host: str, port: int) -> Observation:
    """queue.delete of a stream holding m1..m3 (its message_count has settled at 3)."""
    with stream_session(host, port, STREAM_OPS_QUEUE, FIVE[:3]) as session:
        settled = _settled_counts(session, STREAM_OPS_QUEUE, 3)
        session.client.method(2, commands.Queue.Delete(queue=STREAM_OPS_QUEUE))
        obs = session.outcome(session.settle())
        session.client.method(2, commands.Queue.Declare(queue=STREAM_OPS_QUEUE, passive=True))
        after = session.outcome(session.settle())
        return {"settled_before": settled, "delete": obs, "passive_declare_after": after}


@scenario(queues=[STREAM_OPS_QUEUE])
def s_stream_queue_delete_if_empty(host: str, port: int) -> Observation:
    """queue.delete if_empty=true of a stream holding m1..m3."""
    return _stream_op(host, port, commands.Queue.Delete(queue=STREAM_OPS_QUEUE, if_empty=True))


@scenario(queues=[STREAM_OPS_QUEUE])
def s_stream_queue_delete_if_unused(host: str, port: int) -> Observation:
    """queue.delete if_unused=true (channel 2) of a stream a consumer on channel 3 reads."""
    return _stream_op(
        host, port, commands.Queue.Delete(queue=STREAM_OPS_QUEUE, if_unused=True), consume=True
    )


@scenario(queues=[STREAM_OPS_QUEUE])
def s_stream_basic_recover_requeue(host: str, port: int) -> Observation:
    """basic.recover requeue=true on a channel holding unacked stream deliveries."""
    return _stream_settle_probe(host, port, commands.Basic.Recover(requeue=True), STREAM_OPS_QUEUE)


@scenario(queues=[STREAM_OPS_QUEUE])
def s_stream_basic_recover_no_requeue(host: str, port: int) -> Observation:
    """basic.recover requeue=false on a channel holding unacked stream deliveries."""
    return _stream_settle_probe(host, port, commands.Basic.Recover(requeue=False), STREAM_OPS_QUEUE)


@scenario(queues=[STREAM_OPS_QUEUE])
def s_stream_basic_recover_all_acked(host: str, port: int) -> Observation:
    """basic.recover requeue=true on a channel whose stream consumer acked all it got."""
    with stream_session(host, port, STREAM_OPS_QUEUE, FIVE[:3]) as session:
        _stream_consume(session, STREAM_OPS_QUEUE, {"x-stream-offset": "first"})
        session.settle()
        session.client.method(2, commands.Basic.Ack(delivery_tag=3, multiple=True))
        session.client.method(2, commands.Basic.Recover(requeue=True))
        obs = session.outcome(session.settle())
        return _briefed(obs)


@scenario(queues=[STREAM_OPS_QUEUE])
def s_stream_basic_recover_after_cancel(host: str, port: int) -> Observation:
    """basic.recover requeue=true after a stream consumer was cancelled with m1..m3 unacked."""
    with stream_session(host, port, STREAM_OPS_QUEUE, FIVE[:3]) as session:
        _stream_consume(session, STREAM_OPS_QUEUE, {"x-stream-offset": "first"})
        session.settle()
        session.call(2, commands.Basic.Cancel(consumer_tag="compat-ctag"), "Basic.CancelOk")
        session.client.method(2, commands.Basic.Recover(requeue=True))
        obs = session.outcome(session.settle())
        return _briefed(obs)


@scenario(queues=[STREAM_OPS_QUEUE], exchanges=[STREAM_EXCHANGE])
def s_stream_bind_unbind(host: str, port: int) -> Observation:
    """A stream bound to direct exchange compat-stream-direct (key 'rk'); mandatory
    publishes there before and after queue.unbind; the stream read from 'first'."""
    with stream_session(host, port, STREAM_OPS_QUEUE) as session:
        session.call(
            1,
            commands.Exchange.Declare(exchange=STREAM_EXCHANGE, exchange_type="direct"),
            "Exchange.DeclareOk",
        )
        bind = session.call(
            2,
            commands.Queue.Bind(queue=STREAM_OPS_QUEUE, exchange=STREAM_EXCHANGE, routing_key="rk"),
            "Queue.BindOk",
        )
        bound = session.publish(["bound"], "rk", STREAM_EXCHANGE, mandatory=True)
        bound_returns = session.settle()
        unbind = session.call(
            2,
            commands.Queue.Unbind(
                queue=STREAM_OPS_QUEUE, exchange=STREAM_EXCHANGE, routing_key="rk"
            ),
            "Queue.UnbindOk",
        )
        unbound = session.publish(["unbound"], "rk", STREAM_EXCHANGE, mandatory=True)
        unbound_returns = session.settle()
        _stream_consume(session, STREAM_OPS_QUEUE, {"x-stream-offset": "first"}, channel=2)
        return {
            "bind": bind["frame"],
            "publish_bound": {"confirms": bound, "other_frames": bound_returns},
            "unbind": unbind["frame"],
            "publish_unbound": {"confirms": unbound, "other_frames": unbound_returns},
            "consume": brief(session.settle()),
        }


@scenario(queues=[STREAM_OPS_QUEUE])
def s_stream_consume_exclusive(host: str, port: int) -> Observation:
    """An exclusive consumer (channel 2) on a stream, then a second, non-exclusive one
    (channel 3); both from 'first'."""
    with stream_session(host, port, STREAM_OPS_QUEUE, FIVE[:3], channels=(1, 2, 3)) as s:
        _stream_consume(s, STREAM_OPS_QUEUE, {"x-stream-offset": "first"}, tag="a", exclusive=True)
        s.settle()
        _stream_consume(s, STREAM_OPS_QUEUE, {"x-stream-offset": "first"}, channel=3, tag="b")
        obs = s.outcome(s.settle())
        return _briefed(obs)


@scenario(queues=[STREAM_OPS_QUEUE])
def s_stream_consume_exclusive_when_consumer_exists(host: str, port: int) -> Observation:
    """A consumer (channel 2) on a stream, then an exclusive one (channel 3); both from
    'first'."""
    with stream_session(host, port, STREAM_OPS_QUEUE, FIVE[:3], channels=(1, 2, 3)) as s:
        _stream_consume(s, STREAM_OPS_QUEUE, {"x-stream-offset": "first"}, tag="a")
        s.settle()
        _stream_consume(
            s, STREAM_OPS_QUEUE, {"x-stream-offset": "first"}, channel=3, tag="b", exclusive=True
        )
        obs = s.outcome(s.settle())
        return _briefed(obs)


@scenario(queues=[STREAM_OPS_QUEUE])
def s_stream_consume_priority(host: str, port: int) -> Observation:
    """basic.consume on a stream with x-priority 5 (and x-stream-offset 'first')."""
    with stream_session(host, port, STREAM_OPS_QUEUE, FIVE[:3]) as session:
        _stream_consume(session, STREAM_OPS_QUEUE, {"x-stream-offset": "first", "x-priority": 5})
        obs = session.outcome(session.settle())
        return _briefed(obs)


@scenario(queues=[STREAM_OPS_QUEUE])
def s_stream_consume_filter(host: str, port: int) -> Observation:
    """Stream filtering (a RabbitMQ 3.13 feature): m1 published with header
    x-stream-filter-value 'f1', m2 with 'f2', m3 without; consumed from 'first' with
    x-stream-filter 'f1' and x-stream-match-unfiltered false."""
    with stream_session(host, port, STREAM_OPS_QUEUE) as session:
        for body, value in (("m1", "f1"), ("m2", "f2"), ("m3", None)):
            headers = {"x-stream-filter-value": value} if value else None
            session.publish(
                [body], STREAM_OPS_QUEUE, properties=commands.Basic.Properties(headers=headers)
            )
        _stream_consume(
            session,
            STREAM_OPS_QUEUE,
            {
                "x-stream-offset": "first",
                "x-stream-filter": "f1",
                "x-stream-match-unfiltered": False,
            },
        )
        obs = session.outcome(session.settle())
        return _briefed(obs)


# ======================================================================================
# Runner and CLI
# ======================================================================================


def run_scenario(name: str, host: str, port: int, timeout: float = SCENARIO_TIMEOUT) -> Observation:
    """Run one scenario (with cleanup before and after) in a watchdog thread.

    Never raises: an unexpected failure is recorded as ``{"error": ...}`` and a
    scenario that does not finish within ``timeout`` as ``{"error": "timeout"}``.
    """
    spec = SCENARIOS[name]
    outcome: dict[str, Observation] = {}

    def body() -> None:
        try:
            cleanup(host, port, spec.queues, spec.exchanges)
            try:
                outcome["obs"] = spec.fn(host, port)
            finally:
                cleanup(host, port, spec.queues, spec.exchanges)
        except Exception as exc:  # recorded, so a broken broker shows up as a difference
            outcome["obs"] = {"error": f"{type(exc).__name__}: {exc}"}

    worker = threading.Thread(target=body, name=f"compat-{name}", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        return {"error": "timeout"}
    return normalise(jsonable(outcome["obs"]))


def summarise(obs: Observation) -> str:
    text = json.dumps(obs, sort_keys=True)
    return text if len(text) <= 240 else text[:237] + "..."


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5672)
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these scenarios")
    parser.add_argument("--json", metavar="OUT", help="write {name: observation} to this file")
    parser.add_argument(
        "--merge", action="store_true", help="update the --json file instead of replacing it"
    )
    parser.add_argument(
        "--meta",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="add KEY to the '_meta' entry of the --json output (repeatable)",
    )
    parser.add_argument("--list", action="store_true", help="list scenario names and exit")
    args = parser.parse_args(argv)

    if args.list:
        for name, spec in SCENARIOS.items():
            print(f"{name}: {spec.doc.splitlines()[0] if spec.doc else ''}")
        return 0
    names = list(SCENARIOS) if not args.only else args.only
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s): {', '.join(unknown)}")

    meta: dict[str, str] = {}
    for item in args.meta:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--meta expects KEY=VALUE, got {item!r}")
        meta[key] = value

    results: dict[str, Observation] = {}
    for name in names:
        results[name] = run_scenario(name, args.host, args.port)
        print(f"{name}: {summarise(results[name])}", flush=True)
    if args.json:
        document: dict[str, Any] = {}
        if args.merge:
            with suppress(FileNotFoundError), open(args.json, encoding="utf-8") as existing:
                document = json.load(existing)
        document.update(results)
        if meta or "_meta" in document:
            document["_meta"] = {**document.get("_meta", {}), **meta}
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(document, out, indent=2, sort_keys=True)
            out.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
