"""A minimal blocking AMQP 0-9-1 client on a raw socket, for the perf tools.

Setup (handshake, declarations, consume, confirm.select) goes through
:meth:`Client.rpc`, which decodes replies with Warren's generated codec.
The hot paths (publishing, consuming, confirms) do not live here: the
throughput workers write pre-encoded frames straight to :attr:`Client.sock`
and scan incoming bytes themselves, so this module only has to be correct,
not fast.

It imports ``warren.amqp`` (codec and frame builders) and nothing of the broker.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import struct
import time
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import parse_qs, unquote, urlsplit

from warren.amqp import spec
from warren.amqp.frames import (
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    HEARTBEAT_FRAME,
    PROTOCOL_HEADER,
    content_frames,
    method_frame,
)
from warren.core.properties import BasicProperties

__all__ = [
    "AMQPError",
    "Client",
    "URI",
    "message_template",
]

M = TypeVar("M", bound=spec.Method)

_FRAME_HEADER = struct.Struct(">BHI")
DEFAULT_FRAME_MAX = 131072
#: amqps:// without a port (IANA's, as every client).
DEFAULT_TLS_PORT = 5671
CLIENT_PROPERTIES: dict[str, Any] = {
    "product": "warren-perf",
    "platform": "Python",
    "capabilities": {
        "publisher_confirms": True,
        "basic.nack": True,
        "consumer_cancel_notify": True,
        "connection.blocked": True,
        "authentication_failure_close": True,
    },
}


class AMQPError(Exception):
    """The server closed the channel or the connection, or broke the protocol."""

    def __init__(self, message: str, reply_code: int = 0) -> None:
        super().__init__(message)
        self.reply_code = reply_code


#: The query parameters only an amqps:// URI takes.
TLS_PARAMETERS = (
    "cacertfile",
    "certfile",
    "keyfile",
    "password",
    "verify",
    "server_name_indication",
)
#: The query parameters of an AMQP URI this client understands (RabbitMQ's URI
#: query parameters, as its Erlang client reads them).
URI_PARAMETERS = ("auth_mechanism", *TLS_PARAMETERS, "heartbeat", "connection_timeout")


@dataclass(frozen=True)
class TLS:
    """How to speak TLS to the server: RabbitMQ's URI parameters ``cacertfile``,
    ``certfile``, ``keyfile``, ``password`` (the key's), ``verify`` and
    ``server_name_indication``.

    Unlike the Erlang client's default, the server's certificate is verified
    (``verify_peer``) and its name checked against the host unless the URI says
    ``verify=verify_none`` or ``server_name_indication=disable``.
    """

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    key_password: str | None = None
    verify: bool = True
    #: The name sent (SNI) and checked in the certificate; None: the URI's host;
    #: "" : none sent or checked (the chain is still verified).
    server_name: str | None = None

    def context(self) -> ssl.SSLContext:
        """A client context; raises ssl.SSLError or OSError for unreadable files."""
        ctx = ssl.create_default_context(cafile=self.ca_file)
        if not self.verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        elif self.server_name == "":
            ctx.check_hostname = False
        if self.cert_file:
            ctx.load_cert_chain(self.cert_file, self.key_file, self.key_password)
        return ctx


@dataclass(frozen=True)
class URI:
    """The parts of an ``amqp://user:pass@host:port/vhost`` (or ``amqps://``) URI
    that the perf tools and the Spark data source use."""

    host: str = "127.0.0.1"
    port: int = spec.DEFAULT_PORT
    user: str = "guest"
    password: str = "guest"
    vhost: str = "/"
    #: None: plain TCP (amqp://); amqps:// sets it.
    tls: TLS | None = None
    #: "PLAIN" or "EXTERNAL" (the client certificate names the user).
    mechanism: str = "PLAIN"
    heartbeat: int | None = None
    connect_timeout_s: float | None = None

    @classmethod
    def parse(cls, uri: str) -> URI:
        """Parse an AMQP URI. An empty path or a bare ``/`` means the default vhost ``/``;
        other vhosts are percent-encoded (``%2F`` for a slash). Query parameters as
        RabbitMQ's (URI_PARAMETERS); others are refused (ValueError)."""
        parts = urlsplit(uri)
        if parts.scheme not in ("amqp", "amqps"):
            raise ValueError(f"unsupported URI scheme {parts.scheme!r} (amqp:// or amqps://)")
        secure = parts.scheme == "amqps"
        try:
            port = parts.port or (DEFAULT_TLS_PORT if secure else spec.DEFAULT_PORT)
        except ValueError as exc:
            raise ValueError(f"bad port in {uri!r}: {exc}") from None
        path = parts.path[1:] if parts.path.startswith("/") else parts.path
        query = _query(parts.query)
        if not secure and any(k in query for k in TLS_PARAMETERS):
            given = ", ".join(k for k in TLS_PARAMETERS if k in query)
            raise ValueError(f"TLS parameters ({given}) need an amqps:// URI")
        tls = None
        if secure:
            verify = query.get("verify", "verify_peer")
            if verify not in ("verify_peer", "verify_none"):
                raise ValueError(f"verify: expected verify_peer or verify_none, got {verify!r}")
            sni = query.get("server_name_indication")
            tls = TLS(
                ca_file=query.get("cacertfile"),
                cert_file=query.get("certfile"),
                key_file=query.get("keyfile"),
                key_password=query.get("password"),
                verify=verify == "verify_peer",
                server_name="" if sni == "disable" else sni,
            )
            if tls.key_file and not tls.cert_file:
                raise ValueError("keyfile needs certfile")
        mechanism = query.get("auth_mechanism", "plain").upper()
        if mechanism not in ("PLAIN", "EXTERNAL"):
            raise ValueError(
                f"auth_mechanism: expected plain or external, got {mechanism.lower()!r}"
            )
        if mechanism == "EXTERNAL" and (tls is None or not tls.cert_file):
            raise ValueError(
                "auth_mechanism=external needs amqps:// with a client certificate (certfile)"
            )
        return cls(
            host=parts.hostname or "127.0.0.1",
            port=port,
            user=unquote(parts.username) if parts.username is not None else "guest",
            password=unquote(parts.password) if parts.password is not None else "guest",
            vhost=unquote(path) if path else "/",
            tls=tls,
            mechanism=mechanism,
            heartbeat=_int_parameter(query, "heartbeat"),
            connect_timeout_s=(
                ms / 1000 if (ms := _int_parameter(query, "connection_timeout")) else None
            ),
        )


def _query(text: str) -> dict[str, str]:
    """A URI's query parameters, each once; unknown ones refused."""
    try:
        pairs = parse_qs(text, keep_blank_values=True, strict_parsing=bool(text))
    except ValueError:
        raise ValueError(f"malformed query {text!r}") from None
    out: dict[str, str] = {}
    for key, values in pairs.items():
        if key not in URI_PARAMETERS:
            raise ValueError(f"unknown URI parameter {key!r} (known: {', '.join(URI_PARAMETERS)})")
        if len(values) > 1:
            raise ValueError(f"URI parameter {key!r} given {len(values)} times")
        out[key] = values[0]
    return out


def _int_parameter(query: dict[str, str], key: str) -> int | None:
    raw = query.get(key)
    if raw is None:
        return None
    if not raw.isdigit():
        raise ValueError(f"{key}: expected a non-negative integer, got {raw!r}")
    return int(raw)


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


class Client:
    """One AMQP connection. Blocking; setup calls wait for their reply."""

    def __init__(
        self,
        uri: URI | str,
        *,
        timeout: float = 30.0,
        heartbeat: int = 0,
        frame_max: int = DEFAULT_FRAME_MAX,
        name: str = "warren-perf",
    ) -> None:
        self.uri = URI.parse(uri) if isinstance(uri, str) else uri
        self.timeout = timeout
        self.want_heartbeat = heartbeat if self.uri.heartbeat is None else self.uri.heartbeat
        self.want_frame_max = frame_max
        self.name = name
        self.sock: socket.socket | None = None
        self.frame_max = frame_max
        self.channel_max = 0
        self.heartbeat = 0
        self.server_properties: dict[str, Any] = {}
        self.blocked = False
        self.buf = b""
        self.pos = 0

    # -- connection ---------------------------------------------------------------------
    def connect(self) -> Client:
        """Open the TCP connection (TLS for amqps://) and run the handshake
        (PLAIN or EXTERNAL, tune, open).

        Raises OSError (ssl.SSLError among them) when the server cannot be reached
        or its certificate does not check out, AMQPError when it refuses us."""
        uri = self.uri
        timeout = uri.connect_timeout_s or self.timeout
        context = uri.tls.context() if uri.tls is not None else None
        sock = socket.create_connection((uri.host, uri.port), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if context is not None and uri.tls is not None:
            name = uri.host if uri.tls.server_name is None else uri.tls.server_name
            try:
                sock = context.wrap_socket(sock, server_hostname=name or None)
            except BaseException:
                sock.close()
                raise
        sock.settimeout(self.timeout)
        self.sock = sock
        try:
            sock.sendall(PROTOCOL_HEADER)
            start = self.wait_method(0, spec.ConnectionStart)
            mechanism = uri.mechanism
            if mechanism.encode() not in start.mechanisms.split():
                raise AMQPError(
                    f"server offers no {mechanism} mechanism ({start.mechanisms.decode(errors='replace')})",
                    spec.ACCESS_REFUSED,
                )
            self.server_properties = start.server_properties
            response = b"" if mechanism == "EXTERNAL" else f"\0{uri.user}\0{uri.password}".encode()
            props = dict(CLIENT_PROPERTIES, connection_name=self.name)
            self.send_method(
                0,
                spec.ConnectionStartOk(
                    client_properties=props, mechanism=mechanism, response=response
                ),
            )
            tune = self.wait_method(0, spec.ConnectionTune)
            self.channel_max = tune.channel_max
            self.frame_max = _negotiate(tune.frame_max, self.want_frame_max)
            # 0 from the client switches heartbeats off, whatever the server proposed.
            want = self.want_heartbeat
            self.heartbeat = min(tune.heartbeat, want) if tune.heartbeat and want else want
            self.send_method(
                0,
                spec.ConnectionTuneOk(
                    channel_max=tune.channel_max, frame_max=self.frame_max, heartbeat=self.heartbeat
                ),
            )
            self.rpc(0, spec.ConnectionOpen(virtual_host=self.uri.vhost), spec.ConnectionOpenOk)
        except BaseException:
            self.abort()
            raise
        return self

    def close(self) -> None:
        """connection.close and wait (briefly) for close-ok; never raises."""
        self.close_begin()
        self.close_end()

    def close_begin(self) -> None:
        """Send connection.close (close_end waits for the reply): lets many connections
        close in parallel."""
        if self.sock is None:
            return
        try:
            self.sock.settimeout(5)
            self.send_method(0, spec.ConnectionClose(reply_code=200, reply_text="bye"))
        except OSError:
            self.abort()

    def close_end(self, timeout: float = 5.0) -> bool:
        """Wait up to ``timeout`` s for close-ok (skipping whatever is still in
        flight), then close the socket. False: the broker did not answer in time."""
        if self.sock is None:
            return False
        answered = False
        try:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                self.sock.settimeout(max(deadline - time.monotonic(), 0.001))
                ftype, ch, payload = self.read_frame()
                if ftype == FRAME_METHOD and ch == 0 and payload[:4] in (_CLOSE_OK, _CLOSE):
                    if payload[:4] == _CLOSE:
                        self.send_method(0, spec.ConnectionCloseOk())
                    answered = True
                    break
        except (OSError, AMQPError, EOFError):
            pass
        self.abort()
        return answered

    def abort(self) -> None:
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.close()
            self.sock = None

    def __enter__(self) -> Client:
        return self.connect() if self.sock is None else self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- frames -------------------------------------------------------------------------
    def send(self, data: bytes) -> None:
        assert self.sock is not None
        self.sock.sendall(data)

    def send_method(self, channel: int, method: spec.Method) -> None:
        self.send(method_frame(channel, method))

    def read_frame(self) -> tuple[int, int, bytes]:
        """The next frame (type, channel, payload); answers heartbeats on the way."""
        assert self.sock is not None
        while True:
            buf = self.buf
            pos = self.pos
            if len(buf) - pos >= 7:
                ftype, channel, size = _FRAME_HEADER.unpack_from(buf, pos)
                end = pos + 7 + size
                if len(buf) > end:
                    if buf[end] != 0xCE:
                        raise AMQPError(f"bad frame end octet {buf[end]:#x}", spec.FRAME_ERROR)
                    self.pos = end + 1
                    if ftype == FRAME_HEARTBEAT:
                        self.sock.sendall(HEARTBEAT_FRAME)
                        continue
                    return ftype, channel, buf[pos + 7 : end]
            data = self.sock.recv(262144)
            if not data:
                raise EOFError("server closed the connection")
            # Only the unread tail (at most one partial frame) is copied.
            self.buf = buf[pos:] + data if pos < len(buf) else data
            self.pos = 0

    def unread(self) -> bytes:
        """Bytes received but not yet returned by read_frame (handed to a hot loop)."""
        rest = self.buf[self.pos :]
        self.buf = b""
        self.pos = 0
        return rest

    def wait_method(self, channel: int, cls: type[M]) -> M:
        """Read until a method of ``cls`` arrives on ``channel``; a close raises AMQPError.

        Content frames and unrelated methods (e.g. deliveries on a consuming
        channel) are skipped.
        """
        while True:
            ftype, ch, payload = self.read_frame()
            if ftype != FRAME_METHOD:  # content of a delivery on a consuming channel
                continue
            method = spec.decode_method(payload)
            if isinstance(method, spec.ConnectionClose):
                try:
                    self.send_method(0, spec.ConnectionCloseOk())
                finally:
                    self.abort()
                raise AMQPError(
                    f"connection closed by server: {method.reply_code} {method.reply_text}",
                    method.reply_code,
                )
            if isinstance(method, spec.ChannelClose):
                self.send_method(ch, spec.ChannelCloseOk())
                raise AMQPError(
                    f"channel {ch} closed by server: {method.reply_code} {method.reply_text}",
                    method.reply_code,
                )
            if isinstance(method, spec.ConnectionBlocked):
                self.blocked = True
                continue
            if isinstance(method, spec.ConnectionUnblocked):
                self.blocked = False
                continue
            if ch == channel and isinstance(method, cls):
                return method

    def collect(self, expected: dict[int, int]) -> dict[int, list[spec.Method]]:
        """Read until ``expected[channel]`` methods have arrived on each channel.

        For pipelined requests on several channels, whose replies may interleave.
        A channel.close or connection.close raises AMQPError.
        """
        got: dict[int, list[spec.Method]] = {ch: [] for ch in expected}
        missing = sum(expected.values())
        while missing > 0:
            ftype, ch, payload = self.read_frame()
            if ftype != FRAME_METHOD:
                continue
            method = spec.decode_method(payload)
            if isinstance(method, (spec.ConnectionClose, spec.ChannelClose)):
                what = "connection" if ch == 0 else f"channel {ch}"
                raise AMQPError(
                    f"{what} closed by server: {method.reply_code} {method.reply_text}",
                    method.reply_code,
                )
            replies = got.get(ch)
            if replies is not None and len(replies) < expected[ch]:
                replies.append(method)
                missing -= 1
        return got

    def rpc(self, channel: int, method: spec.Method, reply: type[M]) -> M:
        self.send_method(channel, method)
        return self.wait_method(channel, reply)

    # -- channel-level helpers ----------------------------------------------------------------
    def channel_open(self, channel: int = 1) -> None:
        self.rpc(channel, spec.ChannelOpen(), spec.ChannelOpenOk)

    def exchange_declare(
        self, channel: int, exchange: str, type: str = "direct", durable: bool = False
    ) -> None:
        self.rpc(
            channel,
            spec.ExchangeDeclare(exchange=exchange, type=type, durable=durable),
            spec.ExchangeDeclareOk,
        )

    def exchange_delete(self, channel: int, exchange: str) -> None:
        self.rpc(channel, spec.ExchangeDelete(exchange=exchange), spec.ExchangeDeleteOk)

    def queue_declare(
        self,
        channel: int,
        queue: str = "",
        *,
        durable: bool = False,
        exclusive: bool = False,
        auto_delete: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> str:
        """Declare a queue; returns its name (the server's for ``queue=""``)."""
        return self.queue_declare_ok(
            channel,
            queue,
            durable=durable,
            exclusive=exclusive,
            auto_delete=auto_delete,
            arguments=arguments,
        ).queue

    def queue_declare_ok(
        self,
        channel: int,
        queue: str = "",
        *,
        durable: bool = False,
        exclusive: bool = False,
        auto_delete: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> spec.QueueDeclareOk:
        """Declare a queue; returns the broker's reply (name, message and consumer count)."""
        ok: spec.QueueDeclareOk = self.rpc(
            channel,
            spec.QueueDeclare(
                queue=queue,
                durable=durable,
                exclusive=exclusive,
                auto_delete=auto_delete,
                arguments=arguments,
            ),
            spec.QueueDeclareOk,
        )
        return ok

    def queue_bind(self, channel: int, queue: str, exchange: str, routing_key: str) -> None:
        self.rpc(
            channel,
            spec.QueueBind(queue=queue, exchange=exchange, routing_key=routing_key),
            spec.QueueBindOk,
        )

    def queue_delete(self, channel: int, queue: str) -> int:
        ok = self.rpc(channel, spec.QueueDelete(queue=queue), spec.QueueDeleteOk)
        return ok.message_count

    def qos(self, channel: int, prefetch_count: int) -> None:
        self.rpc(channel, spec.BasicQos(prefetch_count=prefetch_count), spec.BasicQosOk)

    def consume(self, channel: int, queue: str, no_ack: bool, consumer_tag: str = "") -> str:
        ok = self.rpc(
            channel,
            spec.BasicConsume(queue=queue, consumer_tag=consumer_tag, no_ack=no_ack),
            spec.BasicConsumeOk,
        )
        return ok.consumer_tag

    def confirm_select(self, channel: int) -> None:
        self.rpc(channel, spec.ConfirmSelect(), spec.ConfirmSelectOk)


_CLOSE = struct.pack(">I", spec.ConnectionClose.INDEX)
_CLOSE_OK = struct.pack(">I", spec.ConnectionCloseOk.INDEX)


def _negotiate(server: int, client: int) -> int:
    """The smaller non-zero value (0 means 'no limit' on either side)."""
    if not server:
        return client
    if not client:
        return server
    return min(server, client)
