"""An AMQP 1.0 connection as the management API lists it (RabbitMQ 4's shape).

RabbitMQ 4 lists an AMQP 1.0 connection with ``protocol`` "AMQP 1-0" and shows
each session as a channel whose consumers are its sending links.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from warren.amqp1.outgoing import OutgoingLink
from warren.client_listing import ListedConsumer, channel_listing, connection_listing
from warren.core.stats import Ages

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
    props = {str(k): _plain(v) for k, v in conn.client_properties.items()}
    props.setdefault("container_id", conn.container_id)
    return connection_listing(
        conn,
        "AMQP 1-0",
        conn.peer_idle_timeout // 1000,
        auth_mechanism=conn.auth_mechanism,
        channel_max=conn.channel_max,
        channels=len(conn.sessions),
        client_properties=props,
        container_id=conn.container_id,
        frame_max=conn.peer_max_frame,
    )


def channels_info(conn: AMQP1Connection, ages: Ages | None = None) -> list[dict[str, Any]]:
    """Each session as a channel, its sending links with a consumer as its consumers."""
    if conn.vhost is None or conn.user is None:
        return []
    return [
        channel_listing(
            conn,
            channel,
            [
                ListedConsumer(
                    link.consumer.tag, not link.no_ack, link.credit, link.consumer.queue.name
                )
                for link in session.links.values()
                if isinstance(link, OutgoingLink) and link.consumer is not None
            ],
            prefetch_count=0,
            unacknowledged=len(session.outgoing),
            unconfirmed=len(session.unconfirmed),
            stats=session.stats,
            ages=ages,
        )
        for channel, session in sorted(conn.sessions.items())
    ]
