"""An AMQP 1.0 connection as the management API lists it (RabbitMQ 4's shape).

RabbitMQ 4 lists an AMQP 1.0 connection with ``protocol`` "AMQP 1-0" and shows
each session as a channel whose consumers are its sending links.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from warren.amqp1.outgoing import OutgoingLink
from warren.core.stats import CHANNEL_GROUPS, NO_AGES, Ages
from warren.node import node_name

if TYPE_CHECKING:
    from warren.amqp1.connection import AMQP1Connection

__all__ = ["channels_info", "connection_info"]


def _plain(value: Any) -> Any:
    """A client property as JSON can show it."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def connection_info(conn: AMQP1Connection) -> dict[str, Any]:
    if conn.vhost is None or conn.user is None:
        return {}
    user = conn.user.name
    props = {str(k): _plain(v) for k, v in conn.client_properties.items()}
    props.setdefault("container_id", conn.container_id)
    return {
        "auth_mechanism": conn.auth_mechanism,
        "channel_max": conn.channel_max,
        "channels": len(conn.sessions),
        "client_properties": props,
        "connected_at": conn.connected_at,
        "container_id": conn.container_id,
        "frame_max": conn.peer_max_frame,
        "host": conn.local[0] if conn.local else None,
        "name": conn.name,
        "node": node_name(),
        "peer_host": conn.peer[0] if conn.peer else None,
        "peer_port": conn.peer[1] if conn.peer else None,
        "port": conn.local[1] if conn.local else None,
        "protocol": "AMQP 1-0",
        "send_pend": 0,
        "ssl": conn.transport_name.endswith("TLS"),
        "state": "closing" if conn.closed else "running",
        "timeout": conn.peer_idle_timeout // 1000,
        "type": "network",
        "user": user,
        "user_who_performed_action": user,
        "vhost": conn.vhost.name,
        **conn.octets.as_dict(),
    }


def channels_info(conn: AMQP1Connection, ages: Ages | None = None) -> list[dict[str, Any]]:
    if conn.vhost is None or conn.user is None:
        return []
    user = conn.user.name
    vhost = conn.vhost.name
    peer_host = conn.peer[0] if conn.peer else None
    peer_port = conn.peer[1] if conn.peer else None
    out = []
    for channel, session in sorted(conn.sessions.items()):
        name = f"{conn.name} ({channel})"
        links = [
            link
            for link in session.links.values()
            if isinstance(link, OutgoingLink) and link.consumer is not None
        ]
        details = [
            {
                "arguments": {},
                "ack_required": not link.no_ack,
                "active": True,
                "activity_status": "up",
                "channel_details": {
                    "connection_name": conn.name,
                    "name": name,
                    "node": node_name(),
                    "number": channel,
                    "peer_host": peer_host,
                    "peer_port": peer_port,
                    "user": user,
                },
                "consumer_tag": link.consumer.tag,  # type: ignore[union-attr]
                "exclusive": False,
                "prefetch_count": link.credit,
                "queue": {"name": link.consumer.queue.name, "vhost": vhost},  # type: ignore[union-attr]
            }
            for link in links
        ]
        out.append(
            {
                "acks_uncommitted": 0,
                "confirm": False,
                "connection_details": {
                    "name": conn.name,
                    "peer_host": peer_host,
                    "peer_port": peer_port,
                },
                "consumer_count": len(details),
                "consumer_details": details,
                "global_prefetch_count": 0,
                "messages_unacknowledged": len(session.outgoing),
                "messages_uncommitted": 0,
                "messages_unconfirmed": len(session.unconfirmed),
                "name": name,
                "node": node_name(),
                "number": channel,
                "prefetch_count": 0,
                "state": "running",
                "transactional": False,
                "user": user,
                "user_who_performed_action": user,
                "vhost": vhost,
                "message_stats": session.stats.as_dict(CHANNEL_GROUPS, ages or NO_AGES),
            }
        )
    return out
