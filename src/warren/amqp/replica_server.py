"""The asyncio side of a follower's stream read service (amqp/replica.py).

A cluster node that follows starts one ReplicaReadServer on
``[clustering] stream_read_port``; the follower calls ``applied()`` each time
the leader's actions it applied are on its disk, and every consumer whose
stream grew reads on. Output is written once per connection and loop turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from pathlib import Path

from warren.amqp.replica import ReplicaConnection
from warren.config import Config
from warren.core import clock as clocks
from warren.core.clock import Clock, LoopClock
from warren.store.replica_catalog import ReplicaCatalog
from warren.tls import server_context

__all__ = ["ReplicaReadServer"]

log = logging.getLogger("warren.amqp")


class _ReplicaProtocol(asyncio.Protocol):
    def __init__(self, server: ReplicaReadServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.conn: ReplicaConnection | None = None
        self._scheduled = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        name = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "local"
        self.conn = ReplicaConnection(
            self.server.catalog,
            name,
            self.server.leader,
            self.server.clock.now_ms,
            heartbeat=self.server.config.heartbeat,
        )
        self.server.protocols.add(self)
        self.server.connections_accepted += 1

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
        """Deliver more on the next loop turn (a consumer had more than a batch)."""
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._pump)

    def _pump(self) -> None:
        self._scheduled = False
        conn = self.conn
        if conn is None or conn.closed:
            return
        more = conn.pump()
        self.flush()
        transport = self.transport
        if more and transport is not None and transport.get_write_buffer_size() < 4 << 20:
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


class ReplicaReadServer:
    """Serves stream reads from a follower's data directory."""

    def __init__(
        self,
        config: Config,
        root: Path,
        leader: Callable[[], str],
        clock: Clock | None = None,
    ) -> None:
        self.config = config
        #: x-stream-offset times and heartbeats (core/clock.py); a follower runs
        #: no broker, so it has a clock of its own unless given one.
        self.clock: Clock = clock if clock is not None else LoopClock()
        self.catalog = ReplicaCatalog(root, config.default_user, config.default_password)
        self.leader = leader
        self.protocols: set[_ReplicaProtocol] = set()
        #: Connections accepted so far (the management API's and tests' view).
        self.connections_accepted = 0
        self._server: asyncio.AbstractServer | None = None
        self._ticker: asyncio.Task[None] | None = None
        self.port = 0

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        # With the node's certificate, reads are TLS only, as amqps:// readers expect.
        tls = server_context(self.config, "the stream read port") if self.config.tls_cert else None
        self._server = await loop.create_server(
            lambda: _ReplicaProtocol(self),
            self.config.bind,
            self.config.clustering_stream_read_port,
            ssl=tls,
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self._ticker = asyncio.ensure_future(self._heartbeats())
        log.info(
            "stream reads served on %s:%d%s (read-only, this node follows)",
            self.config.bind,
            self.port,
            " over TLS" if tls is not None else "",
        )

    def applied(self) -> None:
        """The follower's disk holds more of the leader's actions: consumers read on."""
        if not self.protocols:
            return
        changed = set(self.catalog.refresh())
        if not changed:
            return
        for protocol in list(self.protocols):
            conn = protocol.conn
            if conn is not None and conn.consumers_of(changed):
                protocol.schedule()

    async def _heartbeats(self) -> None:
        interval_ms = max(self.config.heartbeat * 500, 1000) if self.config.heartbeat else 30_000
        while True:
            await clocks.sleep(self.clock, interval_ms)
            for protocol in list(self.protocols):
                if protocol.conn is not None:
                    protocol.conn.tick()
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
