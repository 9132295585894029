"""A client connection and its channels as the management API lists them, for
the protocols that fill RabbitMQ's shape alike (MQTT's, AMQP 1.0's).

RabbitMQ lists an MQTT connection and an AMQP 1.0 one with the fields of an
AMQP 0-9-1 connection; what only a protocol knows (its name, its client
properties, what stands for a channel and its consumers) the protocol's own
listing gives, the rest is here. It lives outside the protocol packages so that
neither imports the other.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from warren.core.stats import CHANNEL_GROUPS, NO_AGES, Ages, MessageStats, OctetStats
from warren.node import node_name

if TYPE_CHECKING:
    from warren.core.users import User
    from warren.core.vhost import VHost

__all__ = [
    "ListedConnection",
    "ListedConsumer",
    "channel_listing",
    "connection_listing",
    "connection_name",
]


def connection_name(peer: tuple[str, int] | None, local: tuple[str, int] | None) -> str:
    """RabbitMQ's name for a connection, ``peer -> local`` (what the management
    API's DELETE takes, and what the logs say)."""
    peer_part = f"{peer[0]}:{peer[1]}" if peer else "local"
    local_part = f"{local[0]}:{local[1]}" if local else "local"
    return f"{peer_part} -> {local_part}"


class ListedConnection(Protocol):
    """What the listing reads of a connection."""

    @property
    def name(self) -> str: ...

    peer: tuple[str, int] | None
    local: tuple[str, int] | None
    user: User | None
    vhost: VHost | None
    closed: bool
    transport_name: str
    connected_at: int
    octets: OctetStats


class ListedConsumer(NamedTuple):
    """A consumer in a channel's ``consumer_details``."""

    tag: str
    ack_required: bool
    prefetch_count: int
    queue: str


def connection_listing(
    conn: ListedConnection, protocol: str, timeout: int, **fields: Any
) -> dict[str, Any]:
    """``conn`` in /api/connections' shape, with the protocol's own ``fields``
    (auth_mechanism, channel_max, channels, client_properties, frame_max, ...);
    empty while it has no vhost open (not listed). Keys in name order, then the
    octet counts, as RabbitMQ's JSON has them."""
    if conn.vhost is None or conn.user is None:
        return {}
    user = conn.user.name
    entry = {
        "connected_at": conn.connected_at,
        "host": conn.local[0] if conn.local else None,
        "name": conn.name,
        "node": node_name(),
        "peer_host": conn.peer[0] if conn.peer else None,
        "peer_port": conn.peer[1] if conn.peer else None,
        "port": conn.local[1] if conn.local else None,
        "protocol": protocol,
        "send_pend": 0,
        "ssl": conn.transport_name.endswith("TLS"),
        "state": "closing" if conn.closed else "running",
        "timeout": timeout,
        "type": "network",
        "user": user,
        "user_who_performed_action": user,
        "vhost": conn.vhost.name,
        **fields,
    }
    return {**dict(sorted(entry.items())), **conn.octets.as_dict()}


def channel_listing(
    conn: ListedConnection,
    number: int,
    consumers: Iterable[ListedConsumer],
    *,
    prefetch_count: int,
    unacknowledged: int,
    unconfirmed: int,
    stats: MessageStats,
    ages: Ages | None = None,
) -> dict[str, Any]:
    """What stands for channel ``number`` of ``conn`` (an MQTT session, an AMQP 1.0
    session) in /api/channels' shape, with ``consumers`` in /api/consumers'.
    ``conn`` has a vhost open (the caller lists none otherwise)."""
    assert conn.vhost is not None and conn.user is not None
    user = conn.user.name
    vhost = conn.vhost.name
    peer_host = conn.peer[0] if conn.peer else None
    peer_port = conn.peer[1] if conn.peer else None
    name = f"{conn.name} ({number})"
    channel_details = {
        "connection_name": conn.name,
        "name": name,
        "node": node_name(),
        "number": number,
        "peer_host": peer_host,
        "peer_port": peer_port,
        "user": user,
    }
    details = [
        {
            "arguments": {},
            "ack_required": consumer.ack_required,
            "active": True,
            "activity_status": "up",
            "channel_details": dict(channel_details),
            "consumer_tag": consumer.tag,
            "exclusive": False,
            "prefetch_count": consumer.prefetch_count,
            "queue": {"name": consumer.queue, "vhost": vhost},
        }
        for consumer in consumers
    ]
    return {
        "acks_uncommitted": 0,
        "confirm": False,
        "connection_details": {"name": conn.name, "peer_host": peer_host, "peer_port": peer_port},
        "consumer_count": len(details),
        "consumer_details": details,
        "global_prefetch_count": 0,
        "messages_unacknowledged": unacknowledged,
        "messages_uncommitted": 0,
        "messages_unconfirmed": unconfirmed,
        "name": name,
        "node": node_name(),
        "number": number,
        "prefetch_count": prefetch_count,
        "state": "running",
        "transactional": False,
        "user": user,
        "user_who_performed_action": user,
        "vhost": vhost,
        "message_stats": stats.as_dict(CHANNEL_GROUPS, ages or NO_AGES),
    }
