"""The asyncio layer of the stream protocol: its listener on ``[stream] port``
(RabbitMQ's 5552) and TLS port (5551), and a thin protocol per client.

`StreamProtocol` only moves bytes and runs one timer on the broker's clock:
the handshake's deadline, then the heartbeat's checks. The protocol itself is
connection.py's, sans-IO.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, cast

from warren.batched_protocol import (
    YIELD_AFTER_BYTES,
    BatchedProtocol,
    HandshakeTimer,
    OpenClients,
    end_connection,
    socket_addresses,
)
from warren.bound_port import ListenerPorts
from warren.stream_protocol.connection import OPEN, StreamConnection
from warren.stream_protocol.messages import RawMessages, StreamMessageCodec
from warren.tls import cert_login

if TYPE_CHECKING:
    from warren.node import Node

__all__ = ["HANDSHAKE_TIMEOUT_MS", "StreamListener", "StreamProtocol"]

log = logging.getLogger("warren.stream")

#: ms of the broker's clock a client has to log in and open (RabbitMQ's
#: handshake timeout, 10 s).
HANDSHAKE_TIMEOUT_MS = 10_000


class StreamProtocol(BatchedProtocol):
    """One stream protocol client. Output gathered during a loop turn is written once."""

    conn: StreamConnection | None

    def __init__(self, listener: StreamListener, tls: bool = False) -> None:
        super().__init__()
        self.listener = listener
        self.tls = tls
        self.conn = None
        self.clock = listener.node.clock
        self._timer = HandshakeTimer(self.clock, OPEN, "stream", log)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        node = self.listener.node
        peer, local = socket_addresses(transport)
        ssl_object = transport.get_extra_info("ssl_object")
        config = node.config
        advertised = None
        if local is not None:
            port = config.stream_advertised_port or local[1]
            advertised = (config.stream_advertised_host or local[0], port)
        conn = self.conn = StreamConnection(
            node,
            peer,
            local,
            self.request_flush,
            self.request_close,
            "stream/TLS" if ssl_object is not None else "stream",
            advertised,
            self.listener.messages,
        )
        conn.reading_control = self.set_reading
        if ssl_object is not None:
            conn.cert_login = cert_login(ssl_object.getpeercert(), config.tls_cert_login_from)
        self.listener.protocols.add(self)
        self._timer.start(conn, HANDSHAKE_TIMEOUT_MS, self._abort)

    def data_received(self, data: bytes) -> None:
        conn = self.conn
        if conn is None:
            return
        conn.now_ms = self.clock.now_ms()
        self.count_read(data)
        was_open = self._timer.opened
        try:
            conn.feed(data)
        except Exception as exc:  # a bug: the client hears INTERNAL_ERROR
            conn.internal_error(exc)
        if not was_open and self._timer.opened:
            self._timer.handshake_done()  # the heartbeat's checks from now on
        if len(data) >= YIELD_AFTER_BYTES:
            self.yield_reading()

    def _abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def close(self) -> None:
        """Broker shutdown: the client hears a Close."""
        if self.conn is not None:
            self.conn.force_close("broker shutting down")
        self.close_now()

    def connection_lost(self, exc: Exception | None) -> None:
        self._timer.cancel()
        end_connection(self.conn, log, "cleaning up the stream connection failed")
        self.transport = None
        self.listener.protocols.discard(self)


class StreamListener:
    """The stream protocol on TCP (``[stream] port``) and TLS (``tls_port``)."""

    name = "stream"

    def __init__(
        self,
        bind: str,
        port: int,
        tls_port: int = -1,
        messages: StreamMessageCodec | None = None,
    ) -> None:
        self.bind = bind
        #: How records become core messages and back (warren.app gives AMQP 1.0's).
        self.messages: StreamMessageCodec = messages or RawMessages()
        self.requested_port = port
        self.requested_tls_port = tls_port
        self.protocols: OpenClients[StreamProtocol] = OpenClients()
        self._node: Node | None = None
        self._ports = ListenerPorts("stream", bind)

    @property
    def node(self) -> Node:
        assert self._node is not None, "the stream listener is not started"
        return self._node

    @property
    def port(self) -> int:
        return self._ports.port

    @property
    def tls_port(self) -> int:
        return self._ports.tls_port

    def bind_ports(self, node: Node) -> None:
        """Bind and listen, accepting nothing yet (BindError when a port is taken)."""
        self._node = node
        self._ports.bind(
            self.requested_port,
            self.requested_tls_port,
            lambda: node.tls.context("the stream TLS port"),
        )

    async def start(self, node: Node) -> None:
        self.bind_ports(node)
        try:
            await self._ports.serve(lambda tls: StreamProtocol(self, tls), log)
        except OSError:
            await self.stop()
            raise

    async def stop(self) -> None:
        await self._ports.stop(self.protocols.close_all)
