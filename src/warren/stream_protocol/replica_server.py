"""The asyncio side of a follower's stream protocol read service (replica.py).

A cluster node that follows starts one ReplicaStreamServer on
``[clustering] stream_protocol_read_port`` (on ``[stream] bind``); the
follower calls ``applied()`` each time the leader's actions it applied are on
its disk, and every subscription whose stream grew reads on. Output is
written once per connection and loop turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from pathlib import Path

from warren.config import Config
from warren.core import clock as clocks
from warren.core.clock import Clock, LoopClock
from warren.store.replica_catalog import ReplicaCatalog
from warren.stream_protocol.messages import RawMessages, StreamMessageCodec
from warren.stream_protocol.replica import ReplicaStreamConnection
from warren.tls import server_context

__all__ = ["ReplicaStreamServer", "split_address"]

log = logging.getLogger("warren.stream")

#: Bytes waiting in a socket's buffer above which a connection reads no further ahead.
_HIGH_WATER = 4 << 20


def split_address(address: str) -> tuple[str, int] | None:
    """``host:port`` as a pair; None when it is not one."""
    host, _, port = address.rpartition(":")
    return (host, int(port)) if host and port.isdigit() else None


class _Protocol(asyncio.Protocol):
    def __init__(self, server: ReplicaStreamServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.conn: ReplicaStreamConnection | None = None
        self._scheduled = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        server = self.server
        self.conn = ReplicaStreamConnection(
            server.catalog,
            f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "local",
            server.advertised,
            server.metadata,
            server.clock.now_ms,
            server.messages,
            server.config.stream_frame_max,
            server.config.stream_heartbeat,
        )
        server.protocols.add(self)
        server.connections_accepted += 1

    def data_received(self, data: bytes) -> None:
        if self.conn is not None:
            self.conn.feed(data)
            self.flush()
            self.schedule()

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.protocols.discard(self)
        if self.conn is not None:
            self.conn.close()

    def schedule(self) -> None:
        """Deliver more on the next loop turn."""
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._pump)

    def _pump(self) -> None:
        self._scheduled = False
        conn, transport = self.conn, self.transport
        if conn is None or conn.closed or transport is None:
            return
        if transport.get_write_buffer_size() >= _HIGH_WATER:
            return  # resume_writing schedules again
        more = conn.pump()
        self.flush()
        if more:
            self.schedule()

    def resume_writing(self) -> None:
        self.schedule()

    def flush(self) -> None:
        conn, transport = self.conn, self.transport
        if conn is None or transport is None or transport.is_closing():
            return
        out = conn.take_output()
        if out:
            transport.write(b"".join(out))
        if conn.closed:
            transport.close()


class ReplicaStreamServer:
    """Serves stream protocol reads from a follower's data directory."""

    def __init__(
        self,
        config: Config,
        root: Path,
        leader: Callable[[], str],
        host: str,
        clock: Clock | None = None,
        messages: StreamMessageCodec | None = None,
    ) -> None:
        self.config = config
        #: Offset specs by time and heartbeats; a follower runs no broker.
        self.clock: Clock = clock if clock is not None else LoopClock()
        self.catalog = ReplicaCatalog(root, config.default_user, config.default_password)
        #: host:port of the leader's stream port (its Metadata's leader).
        self.leader = leader
        #: The host clients reach this node by: [stream] advertised_host, else the
        #: node's advertised host (as the leader's Metadata names it).
        self.host = config.stream_advertised_host or host
        self.messages: StreamMessageCodec = messages or RawMessages()
        self.protocols: set[_Protocol] = set()
        self.connections_accepted = 0
        self._server: asyncio.AbstractServer | None = None
        self._ticker: asyncio.Task[None] | None = None
        self.port = 0

    @property
    def advertised(self) -> tuple[str, int]:
        return self.host, self.port

    def metadata(self) -> tuple[tuple[str, int] | None, list[tuple[str, int]]]:
        """The leader's stream address and this replica (it knows no other)."""
        return split_address(self.leader()), [self.advertised]

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        tls = server_context(self.config, "the stream read port") if self.config.tls_cert else None
        self._server = await loop.create_server(
            lambda: _Protocol(self),
            self.config.stream_bind,
            self.config.clustering_stream_protocol_read_port,
            ssl=tls,
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self._ticker = asyncio.ensure_future(self._heartbeats())
        log.info(
            "stream protocol reads served on %s:%d%s (read-only, this node follows)",
            self.config.stream_bind,
            self.port,
            " over TLS" if tls is not None else "",
        )

    def applied(self) -> None:
        """The follower's disk holds more of the leader's actions: subscriptions read on."""
        if not self.protocols:
            return
        changed = set(self.catalog.refresh())
        if not changed:
            return
        for protocol in list(self.protocols):
            conn = protocol.conn
            if conn is not None and conn.streams() & changed:
                protocol.schedule()

    async def _heartbeats(self) -> None:
        while True:
            await clocks.sleep(self.clock, 1000)
            now = self.clock.now_ms()
            for protocol in list(self.protocols):
                if protocol.conn is not None:
                    protocol.conn.tick(now)
                    protocol.schedule()  # and streams whose files appeared since
                    protocol.flush()

    async def stop(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
        if self._server is not None:
            self._server.close()
            for protocol in list(self.protocols):
                if protocol.transport is not None:
                    protocol.transport.close()
            await self._server.wait_closed()
            self._server = None
        for store in list(self.catalog.streams.values()):
            store.close()
        self.catalog.streams.clear()
