"""An AMQP connection, its channels and consumers as the management API shows them.

Kept out of connection.py and channel.py (compiled, on the per-message path):
these are built only when an operator asks, from the state those modules keep
anyway. Field names and values follow RabbitMQ 3.10's /api/connections,
/api/channels and /api/consumers; statistics (rates, octet counts) are left out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from warren.core.stats import CHANNEL_GROUPS, NO_AGES, Ages
from warren.node import node_name

if TYPE_CHECKING:
    from warren.amqp.channel import Channel
    from warren.amqp.connection import AMQPConnection
    from warren.core.channel_counts import ChannelCounts
    from warren.core.consumer import Consumer

PROTOCOL = "AMQP 0-9-1"


def connection_name(conn: AMQPConnection) -> str:
    """RabbitMQ's name for a connection: ``peer -> local`` (what DELETE takes)."""
    peer = f"{conn.peer[0]}:{conn.peer[1]}" if conn.peer else "local"
    local = f"{conn.local[0]}:{conn.local[1]}" if conn.local else "local"
    return f"{peer} -> {local}"


def connection_info(conn: AMQPConnection) -> dict[str, Any]:
    if conn.vhost is None or conn.user is None:
        return {}
    from warren.amqp.handshake import State

    state = "running"
    if conn.state >= State.CLOSING:
        state = "closing"
    elif conn.blocked and conn.has_published:
        state = "blocked"
    user = conn.user.name
    named = conn.client_properties.get("connection_name")
    return {
        **({"user_provided_name": named} if isinstance(named, str) else {}),
        "auth_mechanism": conn.auth_mechanism,
        "channel_max": conn.channel_max,
        "channels": len(conn.channels),
        "client_properties": conn.client_properties,
        "connected_at": conn.connected_at,
        "frame_max": conn.frame_max,
        "host": conn.local[0] if conn.local else None,
        "name": connection_name(conn),
        "node": node_name(),
        "peer_cert_issuer": None,
        "peer_cert_subject": None,
        "peer_cert_validity": None,
        "peer_host": conn.peer[0] if conn.peer else None,
        "peer_port": conn.peer[1] if conn.peer else None,
        "port": conn.local[1] if conn.local else None,
        "protocol": PROTOCOL,
        "send_pend": 0,
        "ssl": conn.tls_version is not None,
        "ssl_cipher": None,
        "ssl_hash": None,
        "ssl_key_exchange": None,
        "ssl_protocol": conn.tls_version,
        "state": state,
        "timeout": conn.heartbeat,
        "type": "network",
        "user": user,
        "user_who_performed_action": user,
        "vhost": conn.vhost.name,
        **conn.octets.as_dict(),
    }


def channels_info(conn: AMQPConnection, ages: Ages | None = None) -> list[dict[str, Any]]:
    if conn.vhost is None or conn.user is None:
        return []
    return [channel_info(conn, ch, ages or NO_AGES) for _, ch in sorted(conn.channels.items())]


def channel_counts(conn: AMQPConnection) -> list[tuple[str, str, ChannelCounts]]:
    if conn.vhost is None or conn.user is None:
        return []
    cname = connection_name(conn)
    return [
        (f"{cname} ({ch.id})", ch.vhost.name, ch.counts)
        for _, ch in sorted(conn.channels.items())
        if ch.vhost is not None and not ch.closed
    ]


def channel_event(conn: AMQPConnection, ch: Channel) -> dict[str, Any]:
    """channel.created's and channel.closed's properties (core/events.py)."""
    cname = connection_name(conn)
    return {
        "name": f"{cname} ({ch.id})",
        "connection": cname,
        "number": ch.id,
        "user": ch.user.name,
        "vhost": ch.vhost.name if ch.vhost is not None else "",
    }


def channel_info(conn: AMQPConnection, ch: Channel, ages: Ages = NO_AGES) -> dict[str, Any]:
    cname = connection_name(conn)
    user = conn.user.name if conn.user is not None else ""
    peer_host = conn.peer[0] if conn.peer else None
    peer_port = conn.peer[1] if conn.peer else None
    name = f"{cname} ({ch.id})"
    details = {
        "connection_name": cname,
        "name": name,
        "node": node_name(),
        "number": ch.id,
        "peer_host": peer_host,
        "peer_port": peer_port,
        "user": user,
    }
    state = "closing" if ch.closing else ("flow" if not ch.flow_active else "running")
    return {
        "acks_uncommitted": len(ch.settlement.tx_acks),
        "confirm": ch.publishing.confirm,
        "connection_details": {"name": cname, "peer_host": peer_host, "peer_port": peer_port},
        "consumer_count": len(ch.consumers),
        "consumer_details": [consumer_info(c, details) for _, c in sorted(ch.consumers.items())],
        "global_prefetch_count": ch.deliveries.prefetch_count,
        "messages_unacknowledged": len(ch.deliveries.unsettled),
        "messages_uncommitted": len(ch.publishing.tx_publishes),
        "messages_unconfirmed": len(ch.confirms.unconfirmed),
        "name": name,
        "node": node_name(),
        "number": ch.id,
        "pending_raft_commands": 0,
        "prefetch_count": ch.consumer_prefetch_count,
        "state": state,
        "transactional": ch.tx,
        "user": user,
        "user_who_performed_action": user,
        "vhost": ch.vhost.name if ch.vhost is not None else "",
        "message_stats": ch.stats.as_dict(CHANNEL_GROUPS, ages),
    }


def consumer_info(consumer: Consumer, channel_details: dict[str, Any]) -> dict[str, Any]:
    queue = consumer.queue
    single = queue.arguments.get("x-single-active-consumer") is True
    active = not single or queue.active_consumer is consumer
    status = ("single_active" if active else "waiting") if single else "up"
    return {
        "arguments": consumer.arguments,
        "ack_required": not consumer.no_ack,
        "active": active,
        "activity_status": status,
        "channel_details": channel_details,
        "consumer_tag": consumer.tag,
        "exclusive": consumer.exclusive,
        "prefetch_count": consumer.prefetch_count,
        "queue": {"name": queue.name, "vhost": queue.vhost.name},
    }
