"""An MQTT connection as the management API lists it (RabbitMQ's MQTT plugin's shape).

RabbitMQ 3.10 lists an MQTT connection with ``protocol`` "MQTT 3.1.1" (or
"MQTT 5-0" in 3.13) and the client id in ``client_properties``; its session
shows as one channel whose consumers are the session's queue subscriptions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from warren.core.stats import CHANNEL_GROUPS, NO_AGES, Ages
from warren.mqtt.packets import MQTT_5
from warren.node import node_name

if TYPE_CHECKING:
    from warren.mqtt.connection import MQTTConnection


def protocol_name(conn: MQTTConnection) -> str:
    return "MQTT 5-0" if conn.level == MQTT_5 else "MQTT 3.1.1"


def connection_info(conn: MQTTConnection) -> dict[str, Any]:
    if conn.vhost is None or conn.user is None:
        return {}
    user = conn.user.name
    return {
        "auth_mechanism": "none",
        "channel_max": 1,
        "channels": 1,
        "client_properties": {"client_id": conn.client_id, "transport": conn.transport_name},
        "connected_at": conn.connected_at,
        "frame_max": 0,
        "host": conn.local[0] if conn.local else None,
        "name": conn.name,
        "node": node_name(),
        "peer_host": conn.peer[0] if conn.peer else None,
        "peer_port": conn.peer[1] if conn.peer else None,
        "port": conn.local[1] if conn.local else None,
        "protocol": protocol_name(conn),
        "send_pend": 0,
        "ssl": conn.transport_name.endswith("TLS"),
        "state": "closing" if conn.closed else "running",
        "timeout": conn.keepalive,
        "type": "network",
        "user": user,
        "user_who_performed_action": user,
        "vhost": conn.vhost.name,
        **conn.octets.as_dict(),
    }


def channels_info(conn: MQTTConnection, ages: Ages | None = None) -> list[dict[str, Any]]:
    if conn.vhost is None or conn.user is None:
        return []
    name = f"{conn.name} (1)"
    details = [
        {
            "arguments": {},
            "ack_required": not consumer.no_ack,
            "active": True,
            "activity_status": "up",
            "channel_details": {
                "connection_name": conn.name,
                "name": name,
                "node": node_name(),
                "number": 1,
                "peer_host": conn.peer[0] if conn.peer else None,
                "peer_port": conn.peer[1] if conn.peer else None,
                "user": conn.user.name,
            },
            "consumer_tag": consumer.tag,
            "exclusive": False,
            "prefetch_count": conn.delivery.window,
            "queue": {"name": consumer.queue.name, "vhost": conn.vhost.name},
        }
        for consumer in conn.delivery.consumers.values()
    ]
    return [
        {
            "acks_uncommitted": 0,
            "confirm": False,
            "connection_details": {
                "name": conn.name,
                "peer_host": conn.peer[0] if conn.peer else None,
                "peer_port": conn.peer[1] if conn.peer else None,
            },
            "consumer_count": len(details),
            "consumer_details": details,
            "global_prefetch_count": 0,
            "messages_unacknowledged": conn.delivery.in_flight(),
            "messages_uncommitted": 0,
            "messages_unconfirmed": 0,
            "name": name,
            "node": node_name(),
            "number": 1,
            "prefetch_count": conn.delivery.window,
            "state": "running",
            "transactional": False,
            "user": conn.user.name,
            "user_who_performed_action": conn.user.name,
            "vhost": conn.vhost.name,
            "message_stats": conn.stats.as_dict(CHANNEL_GROUPS, ages or NO_AGES),
        }
    ]
