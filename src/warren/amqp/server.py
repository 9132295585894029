"""The thin asyncio layer: sockets in, bytes to the sans-IO connection, bytes out."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from warren.amqp.connection import AMQPConnection
from warren.amqp.handshake import State
from warren.batched_protocol import YIELD_AFTER_BYTES, BatchedProtocol
from warren.bound_port import ListenerPorts
from warren.header_handoff import PENDING, choose, hand_off
from warren.tls import cert_login

if TYPE_CHECKING:
    from warren.core.clock import TimerHandle
    from warren.node import HeaderHandoffs, Node

log = logging.getLogger("warren.amqp")

#: ms of the broker's clock a client has to open the connection, and to answer
#: a close with close-ok.
HANDSHAKE_TIMEOUT_MS = 10_000
CLOSE_OK_TIMEOUT_MS = 3000


class AMQPProtocol(BatchedProtocol):
    """One client socket. Output is gathered during a loop turn and written once."""

    conn: AMQPConnection | None

    def __init__(self, listener: AMQPListener) -> None:
        super().__init__()
        self.listener = listener
        self.broker = listener.node
        #: The broker's clock: message times, the handshake, close-ok and heartbeat timers.
        self.clock = listener.node.clock
        self.conn = None
        self._timers: list[TimerHandle] = []
        self._heartbeat_started = False
        self._closing_timer = False
        #: The first bytes, while they may still be another protocol's header
        #: (listener.handoffs); None once decided or without handoffs.
        self._head: bytearray | None = None
        self.closed = self.loop.create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its API.
        self.transport = cast(asyncio.Transport, transport)
        if self.broker.at_connection_max():
            # As RabbitMQ's connection_max (ranch's max_connections): no handshake,
            # the socket is closed (nothing more is read from it).
            peer = transport.get_extra_info("peername")
            log.warning(
                "%s: connection refused: max_connections (%d) reached",
                f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "local",
                self.broker.config.max_connections,
            )
            self.transport.close()
            return
        self.listener.protocols.add(self)
        self._timers.append(self.clock.call_later(HANDSHAKE_TIMEOUT_MS, self._handshake_timeout))
        if self.listener.handoffs:
            # Another protocol may be served on this port (AMQP 1.0): the 0-9-1
            # connection is made once the protocol header says it is 0-9-1's.
            self._head = bytearray()
        else:
            self._open_connection()

    def _open_connection(self) -> None:
        transport = self.transport
        assert transport is not None
        peer = transport.get_extra_info("peername")
        peer_addr = (str(peer[0]), int(peer[1])) if isinstance(peer, tuple) else None
        self.conn = AMQPConnection(self.broker, peer_addr, self.request_flush, self.request_close)
        self.conn.reading_control = self.set_reading
        self.conn.resume_input = self.resume_input
        local = transport.get_extra_info("sockname")
        if isinstance(local, tuple):
            self.conn.local = (str(local[0]), int(local[1]))
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is not None:
            self.conn.tls_version = ssl_object.version()
            self.conn.cert_login = cert_login(
                ssl_object.getpeercert(), self.broker.config.tls_cert_login_from
            )
        self.conn.on_forced_close = self._forced_close

    def _read_header(self, data: bytes) -> bytes:
        """Gather the first bytes until they tell whose connection this is: what the
        0-9-1 connection is to read (b"" while undecided or handed off)."""
        head = self._head
        assert head is not None
        head += data
        factory = choose(self.listener.handoffs, head)
        if factory == PENDING:
            return b""
        self._head = None
        if callable(factory):
            self._hand_off(factory, bytes(head))
            return b""
        self._open_connection()
        return bytes(head)

    def _hand_off(self, factory: Callable[[], asyncio.Protocol], data: bytes) -> None:
        """Another protocol's client (AMQP 1.0): it takes the transport over, and this
        protocol ends as if its connection were lost, leaving the socket open."""
        transport = self.transport
        assert transport is not None
        self._forget()
        try:
            hand_off(transport, factory, data)
        except Exception:
            log.exception("protocol handoff failed, closing")
            transport.abort()

    def data_received(self, data: bytes) -> None:
        if self._head is not None:
            data = self._read_header(data)
            if not data:
                return
        conn = self.conn
        if conn is None:  # refused at accept (max_connections), or handed off
            return
        conn.now_ms = self.clock.now_ms()  # one clock read per socket read
        self.count_read(data)
        conn.feed(data)
        if conn.backlog or len(data) >= YIELD_AFTER_BYTES:
            # At most one large read, or FRAME_BUDGET frames, per connection and loop
            # turn (batched_protocol.py; without it 2.5k msg/s were delivered while
            # 145k msg/s were accepted).
            self.yield_reading()
        if not self._heartbeat_started and conn.state == State.OPEN:
            self._heartbeat_started = True
            if conn.heartbeat:
                self._schedule_tick(conn.heartbeat * 500)
        if conn.state == State.CLOSING:
            self._await_close_ok()

    def resume_input(self) -> None:
        """Process the input kept while replies were held (hold_replies)."""
        conn = self.conn
        if conn is None:
            return
        conn.feed(b"")
        if conn.backlog:
            self.yield_reading()

    def drain_backlog(self) -> bool:
        conn = self.conn
        if conn is not None and conn.backlog:
            conn.feed(b"")
            return bool(conn.backlog)
        return False

    def _abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def _handshake_timeout(self) -> None:
        if self._head is not None:
            log.warning("handshake timeout before a protocol header, closing")
            self._abort()
        elif self.conn is not None and self.conn.state < State.OPEN:
            log.warning("%s: handshake timeout, closing", self.conn.name)
            self._abort()

    def _schedule_tick(self, interval_ms: int) -> None:
        self._timers.append(self.clock.call_later(interval_ms, lambda: self._tick(interval_ms)))

    def _tick(self, interval_ms: int) -> None:
        conn = self.conn
        if conn is None:
            return
        if conn.tick():
            self._schedule_tick(interval_ms)

    def close(self) -> None:
        """Server-initiated close with 320 CONNECTION_FORCED (broker shutdown)."""
        if self._head is not None and self.transport is not None:
            self.transport.close()  # no protocol spoken yet: nothing to say
            return
        if self.conn is not None:
            self.conn.close()
            self.flush()
        self._await_close_ok()

    def _forced_close(self) -> None:
        """The management API closed the connection: the client has CLOSE_OK_TIMEOUT_MS."""
        self.flush()
        self._await_close_ok()

    def _await_close_ok(self) -> None:
        """This side closed: the client has CLOSE_OK_TIMEOUT_MS to answer, and is
        read meanwhile even if an alarm had blocked it."""
        if not self._closing_timer:
            self._closing_timer = True
            self.read_until_closed()
            self._timers.append(self.clock.call_later(CLOSE_OK_TIMEOUT_MS, self._abort))

    def connection_lost(self, exc: Exception | None) -> None:
        if self.conn is not None:
            self.conn.connection_lost()
        self._forget()

    def _forget(self) -> None:
        """Let go of the transport: timers cancelled, no longer the listener's."""
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        self._head = None
        self.transport = None
        self.listener.protocols.discard(self)
        if not self.closed.done():
            self.closed.set_result(None)


class AMQPListener:
    """The AMQP 0-9-1 listener: one server socket, the protocols of its clients.

    ``handoffs`` serves other protocols on the same ports by their protocol
    header (AMQP 1.0, as RabbitMQ 4 does; warren/header_handoff.py): a client
    whose header is not registered is 0-9-1's, answered as before (an unknown
    header gets 0-9-1's own header back, then the close)."""

    name = "amqp"

    def __init__(
        self, bind: str, port: int, tls_port: int = -1, handoffs: HeaderHandoffs | None = None
    ) -> None:
        self.bind = bind
        #: Other protocols on these ports, by protocol header (AMQP 1.0; warren.app).
        self.handoffs: HeaderHandoffs = dict(handoffs or {})
        self.requested_port = port
        self.requested_tls_port = tls_port
        self.protocols: set[AMQPProtocol] = set()
        self._node: Node | None = None
        #: Bound and listening before the data dir is read; served by start().
        self._ports = ListenerPorts("AMQP", bind, backlog=1024)

    @property
    def node(self) -> Node:
        assert self._node is not None, "the listener is not started"
        return self._node

    @property
    def port(self) -> int:
        return self._ports.port

    @property
    def tls_port(self) -> int:
        """The amqps port bound (0: none)."""
        return self._ports.tls_port

    def new_protocol(self) -> AMQPProtocol:
        """A protocol for a client arriving by another transport (WebSocket, through
        the HTTP listener): tracked, listed and closed at stop like this socket's."""
        return AMQPProtocol(self)

    def bind_ports(self, node: Node) -> None:
        """Bind and listen on the AMQP (and amqps) port, accepting nothing yet:
        BindError when a port is taken (broker_lifecycle.py binds before it reads
        the data dir)."""
        self._ports.bind(
            self.requested_port,
            self.requested_tls_port,
            lambda: node.tls.context("the AMQP TLS port"),
        )

    async def start(self, node: Node) -> None:
        """Start accepting on the ports bind_ports() bound (binding them first if not)."""
        self._node = node
        self.bind_ports(node)
        try:
            await self._ports.serve(lambda tls: self.new_protocol(), log)
        except OSError:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Stop accepting, close every client with 320 CONNECTION_FORCED, then wait."""
        await self._ports.stop(self._close_clients)

    async def _close_clients(self) -> None:
        protocols = list(self.protocols)
        for proto in protocols:
            proto.close()
        if protocols:
            await asyncio.wait([p.closed for p in protocols], timeout=5)
