"""What a follower's read services share: the server and the asyncio Protocol.

A cluster node that follows serves stream reads from its copy of the leader's
data, over AMQP 0-9-1 (amqp/replica_server.py) and the stream protocol
(stream_protocol/replica_server.py). Both run the same server here: one
ReplicaCatalog, a socket (TLS with the node's certificate), ``applied()``
waking the connections that read a stream the follower just grew, a heartbeat
ticker and stop. A subclass says only what differs: the sans-IO connection it
builds, where it listens, whether a connection reads a changed stream, what a
heartbeat tick does and its log line. Output is written once per connection
and loop turn. It imports no protocol package, so both may subclass it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from warren.config import Config
from warren.core import clock as clocks
from warren.core.clock import Clock, LoopClock
from warren.proxy_accept import ProxySettings, listener_proxy, proxy_factory
from warren.store.replica_catalog import ReplicaCatalog
from warren.tls import server_context

__all__ = ["ReadConnection", "ReadProtocol", "ReadService"]

#: Bytes waiting in a socket's buffer above which a connection reads no further ahead.
_HIGH_WATER = 4 << 20


class ReadConnection(Protocol):
    """The sans-IO side of a read connection, as the asyncio side drives it."""

    @property
    def closed(self) -> bool: ...

    def feed(self, data: bytes) -> None: ...

    def pump(self) -> bool: ...

    def take_output(self) -> list[bytes]: ...

    def close(self) -> None: ...


C = TypeVar("C", bound=ReadConnection)


class ReadProtocol(asyncio.Protocol, Generic[C]):
    """Bytes in to the service's connection, its output out once per loop turn."""

    def __init__(self, server: ReadService[C]) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.conn: C | None = None
        self._scheduled = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        name = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "local"
        self.conn = self.server.connection(name)
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
        """Deliver more on the next loop turn (a reader had more than a batch)."""
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


class ReadService(Generic[C]):
    """Serves stream reads from a follower's data directory (a subclass per protocol)."""

    #: The log line's name for what is served ("stream reads", ...) and its logger.
    served = "stream reads"
    log = logging.getLogger("warren")

    def __init__(
        self,
        config: Config,
        root: Path,
        leader: Callable[[], str],
        clock: Clock | None = None,
    ) -> None:
        self.config = config
        #: x-stream-offset and offset-spec times and heartbeats (core/clock.py);
        #: a follower runs no broker, so it has a clock of its own unless given one.
        self.clock: Clock = clock if clock is not None else LoopClock()
        self.catalog = ReplicaCatalog(root, config.default_user, config.default_password)
        #: Where the leader is, as this protocol's clients are told.
        self.leader = leader
        self.protocols: set[ReadProtocol[C]] = set()
        #: Connections accepted so far (the management API's and tests' view).
        self.connections_accepted = 0
        self._server: asyncio.AbstractServer | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._proxy: ProxySettings | None = None
        self.port = 0

    # What a protocol's service says.

    def connection(self, name: str) -> C:
        """A new sans-IO connection for the client at ``name``."""
        raise NotImplementedError

    def address(self) -> tuple[str, int]:
        """The bind address and configured port (0: any free port)."""
        raise NotImplementedError

    def reads_any(self, conn: C, changed: set[tuple[str, str]]) -> bool:
        """Whether ``conn`` reads one of the streams the follower just grew."""
        raise NotImplementedError

    def heartbeat_ms(self) -> int:
        """How often the ticker calls ``tick``."""
        raise NotImplementedError

    def tick(self, protocol: ReadProtocol[C], conn: C, now_ms: int) -> None:
        """A heartbeat turn for one connection (the ticker flushes after it)."""
        raise NotImplementedError

    # The lifecycle both share.

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        # With the node's certificate, reads are TLS only, as TLS readers expect.
        tls = server_context(self.config, "the stream read port") if self.config.tls_cert else None
        bind, port = self.address()
        secure = tls is not None
        factory: Callable[[], asyncio.BaseProtocol] = lambda: ReadProtocol(self)  # noqa: E731
        # Behind a balancer ([clustering] proxy_protocol): the header, then TLS.
        self._proxy = listener_proxy(self.config, self.clock, "clustering")
        if self._proxy is not None:
            factory, tls = proxy_factory(factory, tls, self._proxy, self.served), None
        self._server = await loop.create_server(factory, bind, port, ssl=tls)
        self.port = self._server.sockets[0].getsockname()[1]
        self._ticker = asyncio.ensure_future(self._heartbeats())
        self.log.info(
            "%s served on %s:%d%s (read-only, this node follows)",
            self.served,
            bind,
            self.port,
            " over TLS" if secure else "",
        )

    def applied(self) -> None:
        """The follower's disk holds more of the leader's actions: readers read on."""
        if not self.protocols:
            return
        changed = set(self.catalog.refresh())
        if not changed:
            return
        for protocol in list(self.protocols):
            conn = protocol.conn
            if conn is not None and self.reads_any(conn, changed):
                protocol.schedule()

    async def _heartbeats(self) -> None:
        interval_ms = self.heartbeat_ms()
        while True:
            await clocks.sleep(self.clock, interval_ms)
            now = self.clock.now_ms()
            for protocol in list(self.protocols):
                if protocol.conn is not None:
                    self.tick(protocol, protocol.conn, now)
                    protocol.flush()

    async def stop(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
        if self._server is not None:
            self._server.close()
            if self._proxy is not None:
                self._proxy.abort_waiting()  # still before their header
            for protocol in list(self.protocols):
                if protocol.transport is not None:
                    protocol.transport.close()
            await self._server.wait_closed()
            self._server = None
        for store in list(self.catalog.streams.values()):
            store.close()
        self.catalog.streams.clear()
