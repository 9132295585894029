"""The asyncio side of a follower's stream read service (amqp/replica.py).

A cluster node that follows starts one ReplicaReadServer on
``[clustering] stream_read_port``; the follower calls ``applied()`` each time
the leader's actions it applied are on its disk, and every consumer whose
stream grew reads on. The server and Protocol are replica_reads.py's.
"""

from __future__ import annotations

import logging

from warren.amqp.replica import ReplicaConnection
from warren.replica_reads import ReadProtocol, ReadService

__all__ = ["ReplicaReadServer"]

log = logging.getLogger("warren.amqp")


class ReplicaReadServer(ReadService[ReplicaConnection]):
    """Serves stream reads over AMQP 0-9-1 from a follower's data directory."""

    served = "stream reads"
    log = log

    def connection(self, name: str) -> ReplicaConnection:
        return ReplicaConnection(
            self.catalog, name, self.leader, self.clock.now_ms, heartbeat=self.config.heartbeat
        )

    def address(self) -> tuple[str, int]:
        return self.config.bind, self.config.clustering_stream_read_port

    def reads_any(self, conn: ReplicaConnection, changed: set[tuple[str, str]]) -> bool:
        return conn.consumers_of(changed)

    def heartbeat_ms(self) -> int:
        heartbeat = self.config.heartbeat
        return max(heartbeat * 500, 1000) if heartbeat else 30_000

    def tick(
        self, protocol: ReadProtocol[ReplicaConnection], conn: ReplicaConnection, now_ms: int
    ) -> None:
        conn.tick()
