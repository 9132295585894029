"""An MQTT connection as the management API lists it (RabbitMQ's MQTT plugin's shape).

RabbitMQ 3.10 lists an MQTT connection with ``protocol`` "MQTT 3.1.1" (or
"MQTT 5-0" in 3.13) and the client id in ``client_properties``; its session
shows as one channel whose consumers are the session's queue subscriptions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from warren.client_listing import ListedConsumer, channel_listing, connection_listing
from warren.core.stats import Ages
from warren.mqtt.packets import MQTT_5

if TYPE_CHECKING:
    from warren.mqtt.connection import MQTTConnection


def protocol_name(conn: MQTTConnection) -> str:
    return "MQTT 5-0" if conn.level == MQTT_5 else "MQTT 3.1.1"


def connection_info(conn: MQTTConnection) -> dict[str, Any]:
    return connection_listing(
        conn,
        protocol_name(conn),
        conn.keepalive,
        auth_mechanism="none",
        channel_max=1,
        channels=1,
        client_properties={"client_id": conn.client_id, "transport": conn.transport_name},
        frame_max=0,
    )


def channels_info(conn: MQTTConnection, ages: Ages | None = None) -> list[dict[str, Any]]:
    """The session as channel 1, its queue subscriptions as its consumers."""
    if conn.vhost is None or conn.user is None:
        return []
    window = conn.delivery.window
    consumers = [
        ListedConsumer(consumer.tag, not consumer.no_ack, window, consumer.queue.name)
        for consumer in conn.delivery.consumers.values()
    ]
    return [
        channel_listing(
            conn,
            1,
            consumers,
            prefetch_count=window,
            unacknowledged=conn.delivery.in_flight(),
            unconfirmed=0,
            stats=conn.stats,
            ages=ages,
        )
    ]
