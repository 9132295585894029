"""The thin asyncio layer: sockets in, bytes to the sans-IO connection, bytes out."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, cast

from warren.amqp.connection import AMQPConnection, State

if TYPE_CHECKING:
    from warren.node import Node

log = logging.getLogger("warren.amqp")

HANDSHAKE_TIMEOUT = 10.0
CLOSE_OK_TIMEOUT = 3.0
# Reads at least this large end the connection's reading for the current loop turn.
YIELD_AFTER_BYTES = 16 * 1024


class AMQPProtocol(asyncio.Protocol):
    """One client socket. Output is gathered during a loop turn and written once."""

    def __init__(self, listener: AMQPListener) -> None:
        self.listener = listener
        self.broker = listener.node
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.conn: AMQPConnection | None = None
        self._flush_scheduled = False
        self._timers: list[asyncio.TimerHandle] = []
        self._heartbeat_started = False
        self._closing_timer = False
        self._yielding = False
        self._blocked = False
        self.closed = self.loop.create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its API.
        self.transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        peer_addr = (str(peer[0]), int(peer[1])) if isinstance(peer, tuple) else None
        self.conn = AMQPConnection(self.broker, peer_addr, self._request_flush, self._request_close)
        self.conn.reading_control = self._set_reading
        local = transport.get_extra_info("sockname")
        if isinstance(local, tuple):
            self.conn.local = (str(local[0]), int(local[1]))
        self.conn.on_forced_close = self._forced_close
        self.listener.protocols.add(self)
        self._timers.append(self.loop.call_later(HANDSHAKE_TIMEOUT, self._handshake_timeout))

    def data_received(self, data: bytes) -> None:
        conn = self.conn
        assert conn is not None
        conn.now_ms = int(time.time() * 1000)  # one clock read per socket read
        octets = conn.octets
        octets.recv_oct += len(data)
        octets.recv_cnt += 1
        conn.feed(data)
        if (conn.backlog or len(data) >= YIELD_AFTER_BYTES) and not self._yielding:
            # At most one large read, or FRAME_BUDGET frames, per connection and loop
            # turn. uvloop otherwise reads a busy publisher's socket up to 32 times
            # per turn, and the delivery passes and acks waiting behind it starve
            # (2.5k msg/s delivered while 145k msg/s were accepted).
            transport = self.transport
            if transport is not None and not transport.is_closing():
                self._yielding = True
                transport.pause_reading()
                self.loop.call_soon(self._end_yield)
        if not self._heartbeat_started and conn.state == State.OPEN:
            self._heartbeat_started = True
            if conn.heartbeat:
                self._schedule_tick(conn.heartbeat / 2)
        if conn.state == State.CLOSING and not self._closing_timer:
            self._closing_timer = True
            self._timers.append(self.loop.call_later(CLOSE_OK_TIMEOUT, self._abort))

    def _request_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        transport, conn = self.transport, self.conn
        if transport is None or conn is None or transport.is_closing():
            return
        out = conn.take_output()
        if out:
            data = b"".join(out)
            octets = conn.octets
            octets.send_oct += len(data)
            octets.send_cnt += 1
            transport.write(data)

    def _end_yield(self) -> None:
        conn = self.conn
        if conn is not None and conn.backlog:
            conn.feed(b"")
            if conn.backlog:
                self.loop.call_soon(self._end_yield)
                return
        self._yielding = False
        transport = self.transport
        if transport is not None and not transport.is_closing() and not self._blocked:
            transport.resume_reading()

    def _set_reading(self, reading: bool) -> None:
        """The connection's own pause (free-disk alarm), independent of yielding."""
        self._blocked = not reading
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if not reading:
            transport.pause_reading()
        elif not self._yielding:
            transport.resume_reading()

    def _request_close(self) -> None:
        self.loop.call_soon(self._close_now)

    def _close_now(self) -> None:
        self._flush()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def _abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def _handshake_timeout(self) -> None:
        if self.conn is not None and self.conn.state < State.OPEN:
            log.warning("%s: handshake timeout, closing", self.conn.name)
            self._abort()

    def _schedule_tick(self, interval: float) -> None:
        self._timers.append(self.loop.call_later(interval, self._tick, interval))

    def _tick(self, interval: float) -> None:
        conn = self.conn
        if conn is None:
            return
        if conn.tick():
            self._schedule_tick(interval)

    def close(self) -> None:
        """Server-initiated close with 320 CONNECTION_FORCED (broker shutdown)."""
        if self.conn is not None:
            self.conn.close()
            self._flush()
        if not self._closing_timer:
            self._closing_timer = True
            self._timers.append(self.loop.call_later(CLOSE_OK_TIMEOUT, self._abort))

    def _forced_close(self) -> None:
        """The management API closed the connection: the client has CLOSE_OK_TIMEOUT."""
        self._flush()
        if not self._closing_timer:
            self._closing_timer = True
            self._timers.append(self.loop.call_later(CLOSE_OK_TIMEOUT, self._abort))

    def pause_writing(self) -> None:
        if self.conn is not None:
            self.conn.set_writable(False)

    def resume_writing(self) -> None:
        if self.conn is not None:
            self.conn.set_writable(True)

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        if self.conn is not None:
            self.conn.connection_lost()
        self.transport = None
        self.listener.protocols.discard(self)
        if not self.closed.done():
            self.closed.set_result(None)


class AMQPListener:
    """The AMQP 0-9-1 listener: one server socket, the protocols of its clients."""

    name = "amqp"

    def __init__(self, bind: str, port: int) -> None:
        self.bind = bind
        self.requested_port = port
        self.protocols: set[AMQPProtocol] = set()
        self._node: Node | None = None
        self._server: asyncio.base_events.Server | None = None
        self._port = 0

    @property
    def node(self) -> Node:
        assert self._node is not None, "the listener is not started"
        return self._node

    @property
    def port(self) -> int:
        return self._port

    def new_protocol(self) -> AMQPProtocol:
        """A protocol for a client arriving by another transport (WebSocket, through
        the HTTP listener): tracked, listed and closed at stop like this socket's."""
        return AMQPProtocol(self)

    async def start(self, node: Node) -> None:
        self._node = node
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self.new_protocol,
            host=self.bind,
            port=self.requested_port,
            reuse_address=True,
            backlog=1024,
        )
        self._port = self._server.sockets[0].getsockname()[1]
        log.info("listening on AMQP %s:%s", self.bind, self._port)

    async def stop(self) -> None:
        """Stop accepting, close every client with 320 CONNECTION_FORCED, then wait."""
        if self._server is None:
            return
        self._server.close()
        protocols = list(self.protocols)
        for proto in protocols:
            proto.close()
        if protocols:
            await asyncio.wait([p.closed for p in protocols], timeout=5)
        await self._server.wait_closed()
        self._server = None
