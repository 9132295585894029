"""Where a queue's replicas are, as the management API (HTTP) and the AMQP 1.0
/management node report them: this node alone, or in a cluster the leader
and its followers, a quorum queue's members chosen as RabbitMQ places them."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from warren.node import node_name

if TYPE_CHECKING:
    from warren.core.queue import Queue

__all__ = ["DEFAULT_QUORUM_GROUP_SIZE", "quorum_members", "replicas"]


def replicas(cluster: Callable[[], dict[str, Any]] | None) -> dict[str, Any]:
    """A replicated queue's leader, members and online members: this node alone,
    or in a cluster the leader and its followers (all of them hold every durable
    queue), online being the in-sync ones (docs/clustering.md)."""
    status = cluster() if cluster is not None else None
    if not status or not status.get("enabled"):
        me = node_name()
        return {"leader": me, "members": [me], "online": [me]}
    leader = status.get("node")
    followers = [f.get("node") for f in status.get("followers", ())]
    return {
        "leader": leader,
        "members": sorted({leader, *followers} - {None}),
        "online": list(status.get("in_sync_replicas") or [leader]),
    }


#: RabbitMQ's quorum_cluster_size: a quorum queue's members without
#: x-quorum-initial-group-size.
DEFAULT_QUORUM_GROUP_SIZE = 3


def quorum_members(q: Queue, replica_info: dict[str, Any]) -> dict[str, Any]:
    """A quorum queue's leader, members and online members: min(its group size,
    the cluster's size) of the nodes (x-quorum-initial-group-size, else 3, as
    RabbitMQ places them), the leader first, then in-sync followers, then the
    others. Every node holds every durable queue all the same (docs/quorum-queues.md)."""
    size = q.arguments.get("x-quorum-initial-group-size")
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        size = DEFAULT_QUORUM_GROUP_SIZE
    members = replica_info["members"]
    if len(members) <= size:
        return replica_info
    leader, online = replica_info["leader"], replica_info["online"]
    others = [m for m in members if m != leader]
    others.sort(key=lambda m: m not in online)  # in-sync first; stable: sorted names
    chosen = sorted([leader, *others[: size - 1]])
    return {"leader": leader, "members": chosen, "online": [m for m in online if m in chosen]}
