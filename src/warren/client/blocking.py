"""A blocking AMQP 0-9-1 client on a raw socket: client/protocol.py's transport.

Setup (handshake, declarations, consume, confirm.select) goes through
:meth:`Client.rpc`, which waits for the reply. The hot paths (publishing,
consuming, confirms) do not live here: perf's workers and Spark's reader and
sink write pre-encoded frames straight to :attr:`Client.sock` and scan the
bytes they read themselves (``unread`` hands them what was read ahead), so
this module only has to be correct, not fast.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import time
from typing import Any, TypeVar

from warren.amqp import spec
from warren.amqp.frames import FRAME_METHOD
from warren.client.protocol import (
    AMQPError,
    ChannelClosed,
    ClientProtocol,
    ConnectionClosed,
    Event,
    MethodReceived,
    Opened,
)
from warren.client.uri import URI

__all__ = ["CLIENT_CAPABILITIES", "DEFAULT_FRAME_MAX", "Client"]

M = TypeVar("M", bound=spec.Method)

DEFAULT_FRAME_MAX = 131072
CLIENT_CAPABILITIES: dict[str, Any] = {
    "publisher_confirms": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "connection.blocked": True,
    "authentication_failure_close": True,
}
_RECV = 262144
_CLOSE = struct.pack(">I", spec.ConnectionClose.INDEX)
_CLOSE_OK = struct.pack(">I", spec.ConnectionCloseOk.INDEX)


class Client:
    """One AMQP connection. Blocking; setup calls wait for their reply."""

    def __init__(
        self,
        uri: URI | str,
        *,
        timeout: float = 30.0,
        heartbeat: int = 0,
        frame_max: int = DEFAULT_FRAME_MAX,
        name: str = "warren-client",
        product: str = "warren",
    ) -> None:
        self.uri = URI.parse(uri) if isinstance(uri, str) else uri
        self.timeout = timeout
        self.name = name
        self.sock: socket.socket | None = None
        self.protocol = ClientProtocol(
            user=self.uri.user,
            password=self.uri.password,
            vhost=self.uri.vhost,
            mechanism=self.uri.mechanism,
            frame_max=frame_max,
            heartbeat=heartbeat if self.uri.heartbeat is None else self.uri.heartbeat,
            properties={
                "product": product,
                "platform": "Python",
                "capabilities": CLIENT_CAPABILITIES,
                "connection_name": name,
            },
        )

    # What the handshake negotiated.
    @property
    def frame_max(self) -> int:
        return self.protocol.frame_max

    @property
    def channel_max(self) -> int:
        return self.protocol.channel_max

    @property
    def heartbeat(self) -> int:
        return self.protocol.heartbeat

    @property
    def server_properties(self) -> dict[str, Any]:
        return self.protocol.server_properties

    @property
    def blocked(self) -> bool:
        return self.protocol.blocked

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
            self.protocol.connect()
            while True:
                event = self.next_event()
                if isinstance(event, Opened):
                    break
                if isinstance(event, ConnectionClosed | ChannelClosed):
                    self._flush_quietly()
                    raise event.error()
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

    # -- bytes and frames ---------------------------------------------------------------
    def send(self, data: bytes) -> None:
        assert self.sock is not None
        self.sock.sendall(data)

    def send_method(self, channel: int, method: spec.Method) -> None:
        self.protocol.send_method(channel, method)
        self._flush()

    def _flush(self) -> None:
        out = self.protocol.data_to_send()
        if out:
            assert self.sock is not None
            self.sock.sendall(out)

    def _flush_quietly(self) -> None:
        with contextlib.suppress(OSError):
            self._flush()

    def _receive(self) -> None:
        assert self.sock is not None
        data = self.sock.recv(_RECV)
        if not data:
            raise EOFError("server closed the connection")
        self.protocol.receive_data(data)

    def read_frame(self) -> tuple[int, int, bytes]:
        """The next frame (type, channel, payload); answers heartbeats on the way."""
        while True:
            frame = self.protocol.next_frame()
            self._flush()
            if frame is not None:
                return frame
            self._receive()

    def next_event(self) -> Event:
        """The next event (client/protocol.py); what the protocol answers is sent."""
        while True:
            event = self.protocol.next_event()
            self._flush()
            if event is not None:
                return event
            self._receive()

    def unread(self) -> bytes:
        """Bytes received but not yet returned by read_frame (handed to a hot loop)."""
        return self.protocol.unread()

    def push_back(self, data: bytes) -> None:
        """Give back what a hot loop took with ``unread`` and did not use."""
        self.protocol.push_back(data)

    def wait_method(self, channel: int, cls: type[M]) -> M:
        """Read until a method of ``cls`` arrives on ``channel``; a close raises AMQPError.

        Content frames and unrelated methods (e.g. deliveries on a consuming
        channel) are skipped.
        """
        while True:
            event = self.next_event()
            if isinstance(event, ConnectionClosed):
                self.abort()
                raise event.error()
            if isinstance(event, ChannelClosed):
                raise event.error()
            if (
                isinstance(event, MethodReceived)
                and event.channel == channel
                and isinstance(event.method, cls)
            ):
                return event.method

    def collect(self, expected: dict[int, int]) -> dict[int, list[spec.Method]]:
        """Read until ``expected[channel]`` methods have arrived on each channel.

        For pipelined requests on several channels, whose replies may interleave.
        A channel.close or connection.close raises AMQPError.
        """
        got: dict[int, list[spec.Method]] = {ch: [] for ch in expected}
        missing = sum(expected.values())
        while missing > 0:
            event = self.next_event()
            if isinstance(event, ConnectionClosed | ChannelClosed):
                raise event.error()
            if not isinstance(event, MethodReceived):
                continue
            replies = got.get(event.channel)
            if replies is not None and len(replies) < expected[event.channel]:
                replies.append(event.method)
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
