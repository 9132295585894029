"""The MQTT client side of ``warren perf mqtt`` and ``mqtt-idle``: URIs, connection
setup (correct rather than fast: the codec decodes these few packets) and the
fixed-header walking the workers' hot loops use.
"""

from __future__ import annotations

import contextlib
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from warren.mqtt import properties as P
from warren.mqtt.codec import Decoder, encode
from warren.mqtt.errors import MQTTCodecError
from warren.mqtt.packets import ConnAck, Connect, Disconnect, SubAck, Subscribe, Subscription

if TYPE_CHECKING:
    from warren.perf.mqtt import MQTTParams

__all__ = [
    "DEFAULT_PORT",
    "MAX_INFLIGHT",
    "MQTTError",
    "MQTTTarget",
    "check_connack",
    "connect",
    "connect_packet",
    "disconnect",
    "drop_session",
    "packet_end",
    "packet_span",
    "parse_uri",
    "read_packet",
    "reason",
    "rl_value",
    "subscribe",
]

DEFAULT_PORT = 1883
#: Packet ids are 1..65535; a publisher's window stays below so none is reused while in flight.
MAX_INFLIGHT = 65535
CONNECT_TIMEOUT = 10.0
#: MQTT 5 Session Expiry Interval asked for with --persistent.
PERSISTENT_SESSION_EXPIRY = 3600


class MQTTError(Exception):
    """The broker refused the connection or subscription, or closed the connection."""


def parse_uri(uri: str) -> dict[str, Any]:
    """``mqtt://user:pass@host:port`` -> host, port, username, password (missing: None)."""
    parts = urlsplit(uri)
    if parts.scheme not in ("mqtt", "tcp"):
        raise ValueError(f"unsupported URI scheme {parts.scheme!r} (only mqtt://)")
    try:
        port = parts.port or DEFAULT_PORT
    except ValueError as exc:
        raise ValueError(f"bad port in {uri!r}: {exc}") from None
    return {
        "host": parts.hostname or "127.0.0.1",
        "port": port,
        "username": unquote(parts.username) if parts.username is not None else None,
        "password": unquote(parts.password) if parts.password is not None else None,
    }


def read_packet(sock: socket.socket, buf: bytes) -> tuple[bytes, bytes]:
    """Block until one whole packet is in ``buf`` + what the socket gives; returns
    ``(packet, rest)``."""
    while True:
        end = packet_end(buf, 0)
        if end:
            return buf[:end], buf[end:]
        data = sock.recv(65536)
        if not data:
            raise MQTTError("the broker closed the connection")
        buf += data


def packet_end(buf: bytes, pos: int) -> int:
    """End offset of the packet starting at ``pos``, or 0 when it is not all in ``buf``."""
    n = len(buf)
    i = pos + 1
    rl = 0
    shift = 0
    while i < n:
        b = buf[i]
        i += 1
        rl |= (b & 0x7F) << shift
        if b < 0x80:
            return i + rl if i + rl <= n else 0
        shift += 7
        if shift > 21:
            raise MQTTError("malformed remaining length from the broker")
    return 0


@dataclass(frozen=True)
class MQTTTarget:
    """The broker and how to log in: the first parameters of the MQTT tools."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    username: str | None = None
    password: str | None = None
    #: 4 = MQTT 3.1.1, 5 = MQTT 5.
    protocol: int = 4


def connect_packet(p: MQTTTarget, client_id: str, clean: bool, keepalive: int) -> bytes:
    props: P.Properties = {}
    if p.protocol == 5 and not clean:
        props[P.SESSION_EXPIRY_INTERVAL] = PERSISTENT_SESSION_EXPIRY
    return encode(
        Connect(
            client_id=client_id,
            protocol_level=p.protocol,
            clean_start=clean,
            keep_alive=keepalive,
            username=p.username,
            password=p.password.encode() if p.password is not None else None,
            properties=props,
        ),
        p.protocol,
    )


def check_connack(packet: bytes, protocol: int) -> ConnAck:
    """Decode a CONNACK; raises MQTTError unless it accepts the connection."""
    try:
        decoded = Decoder(protocol).feed(packet)
    except MQTTCodecError as exc:
        raise MQTTError(f"bad CONNACK: {exc}") from None
    if len(decoded) != 1 or not isinstance(decoded[0], ConnAck):
        raise MQTTError(f"expected CONNACK, got {decoded!r}")
    ack = decoded[0]
    if ack.reason_code:
        raise MQTTError(f"connection refused by the broker: reason code 0x{ack.reason_code:02x}")
    return ack


def connect(
    p: MQTTParams, client_id: str, clean: bool | None = None
) -> tuple[socket.socket, ConnAck, bytes]:
    """Open a connection and complete CONNECT/CONNACK; returns the socket (blocking, no
    timeout), the CONNACK and any bytes received after it."""
    sock = socket.create_connection((p.host, p.port), timeout=CONNECT_TIMEOUT)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        clean = p.clean_session if clean is None else clean
        sock.sendall(connect_packet(p, client_id, clean, p.keepalive))
        packet, rest = read_packet(sock, b"")
        ack = check_connack(packet, p.protocol)
        sock.settimeout(None)
    except BaseException:
        sock.close()
        raise
    return sock, ack, rest


def subscribe(sock: socket.socket, p: MQTTParams, buf: bytes) -> bytes:
    """SUBSCRIBE to ``p.topic`` at ``p.qos`` and wait for the SUBACK; returns what else
    arrived (``buf`` and every read but the SUBACK) for the caller to handle: a
    resumed session's queued messages come right after CONNACK, and until they are
    acked the broker's window may let no more through."""
    sock.settimeout(CONNECT_TIMEOUT)
    sock.sendall(encode(Subscribe(1, [Subscription(p.topic, p.qos)]), p.protocol))
    before: list[bytes] = []
    while True:
        packet, buf = read_packet(sock, buf)
        if packet[0] >> 4 != P.SUBACK:
            before.append(packet)
            continue
        acks = Decoder(p.protocol).feed(packet)
        ack = acks[0]
        assert isinstance(ack, SubAck)
        if not ack.reason_codes or ack.reason_codes[0] >= 0x80:
            raise MQTTError(f"subscription to {p.topic!r} refused: {ack.reason_codes}")
        sock.settimeout(None)
        return b"".join(before) + buf


def disconnect(sock: socket.socket, protocol: int) -> None:
    """Send DISCONNECT and close, ignoring a connection the broker already dropped."""
    with contextlib.suppress(OSError):
        sock.sendall(encode(Disconnect(), protocol))
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


def drop_session(p: MQTTParams, client_id: str) -> None:
    """After a --persistent run: reconnect with a clean session so the broker forgets it."""
    with contextlib.suppress(OSError, MQTTError):
        sock, _, _ = connect(p, client_id, clean=True)
        disconnect(sock, p.protocol)


def packet_span(buf: bytes, pos: int) -> tuple[int, int]:
    """``(start of the variable header, end)`` of the packet starting at ``pos``;
    ``(0, 0)`` when it is not all in ``buf``."""
    end = packet_end(buf, pos)
    if not end:
        return 0, 0
    return end - rl_value(buf, pos), end


def rl_value(buf: bytes, pos: int) -> int:
    """The remaining length of the packet starting at ``pos`` (all of it is in ``buf``)."""
    rl = 0
    shift = 0
    i = pos + 1
    while True:
        b = buf[i]
        i += 1
        rl |= (b & 0x7F) << shift
        if b < 0x80:
            return rl
        shift += 7


def reason(buf: bytes, vh: int, end: int) -> str:
    return f" (reason code 0x{buf[vh]:02x})" if end > vh else ""
