"""The asyncio layer for AMQP 1.0: a transport handed over by its protocol header.

AMQP 1.0 clients come in on the AMQP port (and over WebSocket at ``/ws``), as
RabbitMQ 4 takes them: the AMQP listener reads the first bytes and hands the
transport to `AMQP1Listener.new_protocol`'s protocol (warren/header_handoff.py;
warren.app registers both 1.0 headers). The listener binds no port of its
own: it gives its protocols the broker, keeps them, and closes them at
shutdown. `AMQP1Protocol` only moves bytes and runs the timers on the
broker's clock (the handshake's, the idle timeout's): the protocol is
connection.py's, sans-IO.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, cast

from warren.amqp1.connection import OPEN, AMQP1Connection
from warren.batched_protocol import (
    YIELD_AFTER_BYTES,
    BatchedProtocol,
    HandshakeTimer,
    OpenClients,
    end_connection,
    socket_addresses,
)
from warren.tls import cert_login

if TYPE_CHECKING:
    from warren.amqp1.links import ManagementFactory
    from warren.node import Node

__all__ = ["AMQP1Listener", "AMQP1Protocol", "HANDSHAKE_TIMEOUT_MS"]

log = logging.getLogger("warren.amqp1")

#: ms of the broker's clock a client has to log in and open (RabbitMQ's handshake_timeout).
HANDSHAKE_TIMEOUT_MS = 10_000


class AMQP1Protocol(BatchedProtocol):
    """One AMQP 1.0 client. Output gathered during a loop turn is written once."""

    conn: AMQP1Connection | None

    def __init__(self, listener: AMQP1Listener) -> None:
        super().__init__()
        self.listener = listener
        self.conn = None
        self.clock = listener.node.clock
        self._timer = HandshakeTimer(self.clock, OPEN, "AMQP 1.0", log)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        node = self.listener.node
        peer, local = socket_addresses(transport)
        ssl_object = transport.get_extra_info("ssl_object")
        name = "AMQP 1.0/TLS" if ssl_object is not None else "AMQP 1.0"
        conn = self.conn = AMQP1Connection(
            node,
            peer,
            local,
            self.request_flush,
            self.request_close,
            name,
            self.listener.management,
        )
        conn.reading_control = self.set_reading
        if ssl_object is not None:
            conn.cert_login = cert_login(ssl_object.getpeercert(), node.config.tls_cert_login_from)
        self.listener.protocols.add(self)
        self._timer.start(conn, HANDSHAKE_TIMEOUT_MS, self._abort)

    def data_received(self, data: bytes) -> None:
        conn = self.conn
        if conn is None:
            return
        now = self.clock.now_ms()
        conn.now_ms = now
        self.count_read(data)
        was_open = self._timer.opened
        conn.feed(data)
        if not was_open and self._timer.opened:
            self._timer.handshake_done()  # the idle timeout's checks from now on
        if len(data) >= YIELD_AFTER_BYTES:
            self.yield_reading()

    def _abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def close(self) -> None:
        """Broker shutdown: the client hears amqp:connection:forced."""
        if self.conn is not None:
            self.conn.force_close("broker shutting down")
        self.close_now()

    def connection_lost(self, exc: Exception | None) -> None:
        self._timer.cancel()
        end_connection(self.conn, log, "cleaning up the AMQP 1.0 connection failed")
        self.transport = None
        self.listener.protocols.discard(self)


class AMQP1Listener:
    """AMQP 1.0's side of the AMQP port: no socket of its own, the protocols
    the AMQP listener hands over (``new_protocol``), closed at shutdown."""

    name = "amqp1"
    port = 0
    tls_port = 0

    def __init__(self, management: ManagementFactory | None = None) -> None:
        #: The /management node's handler factory (links.py), None: refused.
        self.management = management
        self.protocols: OpenClients[AMQP1Protocol] = OpenClients()
        self._node: Node | None = None

    @property
    def node(self) -> Node:
        assert self._node is not None, "the AMQP 1.0 listener is not started"
        return self._node

    def new_protocol(self) -> AMQP1Protocol:
        """The protocol for a client the AMQP listener hands over."""
        return AMQP1Protocol(self)

    def bind_ports(self, node: Node) -> None:
        self._node = node

    async def start(self, node: Node) -> None:
        self._node = node

    async def stop(self) -> None:
        await self.protocols.close_all()
