"""The asyncio side of a follower's stream protocol read service (replica.py).

A cluster node that follows starts one ReplicaStreamServer on
``[clustering] stream_protocol_read_port`` (on ``[stream] bind``); the
follower calls ``applied()`` each time the leader's actions it applied are on
its disk, and every subscription whose stream grew reads on. The server and
Protocol are replica_reads.py's. What a client's connection forwards to the
leader (replica_forward.py) goes over a LeaderLink on a connection to the
leader's stream port, or its stream TLS port with ``[clustering] tls``
(cluster/node.py picks the target and gives the replication's client
context, which verifies the leader's certificate against the cluster's CA).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from pathlib import Path

from warren.config import Config
from warren.core.clock import Clock
from warren.replica_reads import ReadProtocol, ReadService
from warren.stream_protocol.leader_link import LeaderLink
from warren.stream_protocol.messages import RawMessages, StreamMessageCodec
from warren.stream_protocol.replica import ReplicaStreamConnection

__all__ = ["ReplicaStreamServer", "split_address"]

log = logging.getLogger("warren.stream")


def split_address(address: str) -> tuple[str, int] | None:
    """``host:port`` as a pair; None when it is not one."""
    host, _, port = address.rpartition(":")
    return (host, int(port)) if host and port.isdigit() else None


class ReplicaStreamServer(ReadService[ReplicaStreamConnection]):
    """Serves stream protocol reads from a follower's data directory."""

    served = "stream protocol reads"
    log = log

    def __init__(
        self,
        config: Config,
        root: Path,
        leader: Callable[[], str],
        host: str,
        clock: Clock | None = None,
        messages: StreamMessageCodec | None = None,
        link: tuple[str, ssl.SSLContext | None] | None = None,
    ) -> None:
        super().__init__(config, root, leader, clock)
        #: Where links to the leader dial ("host:port") and their TLS client
        #: context (None: plain TCP); by default the leader's address, plain.
        self.link = link
        #: The host clients reach this node by: [stream] advertised_host, else the
        #: node's advertised host (as the leader's Metadata names it).
        self.host = config.stream_advertised_host or host
        self.messages: StreamMessageCodec = messages or RawMessages()
        #: The links to the leader, while they connect or are connected.
        self.links: set[_LinkProtocol] = set()
        self._connecting: set[asyncio.Future[None]] = set()

    @property
    def advertised(self) -> tuple[str, int]:
        return self.host, self.port

    def metadata(self) -> tuple[tuple[str, int] | None, list[tuple[str, int]]]:
        """The leader's stream address and this replica (it knows no other)."""
        return split_address(self.leader()), [self.advertised]

    def connection(self, name: str) -> ReplicaStreamConnection:
        config = self.config
        return ReplicaStreamConnection(
            self.catalog,
            name,
            self.advertised,
            self.metadata,
            self.clock.now_ms,
            self.messages,
            config.stream_frame_max,
            config.stream_heartbeat,
            self._connect,
        )

    def _connect(self, link: LeaderLink, conn: ReplicaStreamConnection) -> None:
        """Open ``link``'s transport to the leader's stream port; what the link
        gets wakes ``conn``, its client's connection."""
        target, tls = self.link if self.link is not None else (self.leader(), None)
        address = split_address(target)
        if address is None:
            # A leader whose stream protocol is TLS only is reached with [clustering] tls.
            link.lost(
                "no stream port of the leader to link to (its TLS port needs [clustering] tls)"
            )
            return

        def wake() -> None:
            for protocol in list(self.protocols):
                if protocol.conn is conn:
                    protocol.schedule()

        async def run() -> None:
            loop = asyncio.get_running_loop()
            try:
                await loop.create_connection(
                    lambda: _LinkProtocol(self, link, wake),
                    *address,
                    ssl=tls,
                    server_hostname=address[0] if tls is not None else None,
                )
            except OSError as exc:  # ssl.SSLError too (a certificate not verified)
                link.lost(f"cannot reach {address[0]}:{address[1]}: {exc}")
                wake()

        task = asyncio.ensure_future(run())
        self._connecting.add(task)
        task.add_done_callback(self._connecting.discard)

    def address(self) -> tuple[str, int]:
        return self.config.stream_bind, self.config.clustering_stream_protocol_read_port

    def reads_any(self, conn: ReplicaStreamConnection, changed: set[tuple[str, str]]) -> bool:
        return bool(conn.streams() & changed)

    def heartbeat_ms(self) -> int:
        return 1000

    def tick(
        self,
        protocol: ReadProtocol[ReplicaStreamConnection],
        conn: ReplicaStreamConnection,
        now_ms: int,
    ) -> None:
        conn.tick(now_ms)
        protocol.schedule()  # and streams whose files appeared since

    async def stop(self) -> None:
        for task in list(self._connecting):
            task.cancel()
        for protocol in list(self.links):
            protocol.close()
        await super().stop()


class _LinkProtocol(asyncio.Protocol):
    """A LeaderLink's transport: the leader's bytes in, the link's out."""

    def __init__(self, server: ReplicaStreamServer, link: LeaderLink, wake: Callable[[], None]):
        self.server = server
        self.link = link
        self.wake_client = wake
        self.transport: asyncio.Transport | None = None
        self._scheduled = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server.links.add(self)
        self.link.wake = self.schedule
        self.flush()

    def data_received(self, data: bytes) -> None:
        self.link.feed(data)
        self.flush()
        self.wake_client()

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.links.discard(self)
        if not self.link.closed:
            self.link.lost(f"the connection ended ({exc or 'closed by the leader'})")
            self.wake_client()

    def schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self._scheduled = False
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        out = self.link.take_output()
        if out:
            transport.write(b"".join(out))
        if self.link.closed:
            transport.close()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
