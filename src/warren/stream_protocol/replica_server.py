"""The asyncio side of a follower's stream protocol read service (replica.py).

A cluster node that follows starts one ReplicaStreamServer on
``[clustering] stream_protocol_read_port`` (on ``[stream] bind``); the
follower calls ``applied()`` each time the leader's actions it applied are on
its disk, and every subscription whose stream grew reads on. The server and
Protocol are replica_reads.py's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from warren.config import Config
from warren.core.clock import Clock
from warren.replica_reads import ReadProtocol, ReadService
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
    ) -> None:
        super().__init__(config, root, leader, clock)
        #: The host clients reach this node by: [stream] advertised_host, else the
        #: node's advertised host (as the leader's Metadata names it).
        self.host = config.stream_advertised_host or host
        self.messages: StreamMessageCodec = messages or RawMessages()

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
        )

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
