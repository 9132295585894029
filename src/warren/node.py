"""The small interfaces between the broker and its listeners.

The broker (broker.py) owns the core and a list of :class:`Listener` objects
(AMQP, MQTT, HTTP with WebSocket, Prometheus), each started and stopped through
this interface. A listener and its connections see the broker only as a
:class:`Node`; the broker sees their clients only as :class:`ClientConnection`.
So the broker imports no protocol package, and a protocol package needs only
this module, never broker.py or another protocol.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from warren.core.session import is_loopback

if TYPE_CHECKING:
    from warren.config import Config
    from warren.core.auth_guard import AuthGuard
    from warren.core.channel_counts import ChannelCounts
    from warren.core.clock import Clock
    from warren.core.events import Events
    from warren.core.rate_limits import RateLimits
    from warren.core.runtime_parameters import ParameterComponent
    from warren.core.stats import Ages, GaugeStats, MessageStats, OctetStats
    from warren.core.users import User, UserStore
    from warren.core.vhost import VHost
    from warren.metrics.history import AuthAttempts, Retired
    from warren.oauth2_backend import OAuth2Backend
    from warren.store.layout import DataDir
    from warren.store.sync import GroupSync
    from warren.tls import TLSContexts
    from warren.webhooks import Webhooks

__all__ = [
    "ClientConnection",
    "HeaderHandoffs",
    "Listener",
    "Node",
    "WebSocketEndpoint",
    "is_loopback",
    "node_name",
]


def node_name() -> str:
    """This broker's node name, as RabbitMQ's ``rabbit@host``: ``warren@host``."""
    return f"warren@{socket.gethostname()}"


class ClientConnection(Protocol):
    """A client's connection, of any protocol, as the broker tracks it."""

    @property
    def name(self) -> str:
        """For logs: the peer and the protocol, e.g. ``127.0.0.1:50412 -> 127.0.0.1:5672``."""
        ...

    #: Who logged in (None before): the broker counts connections per user on it.
    user: User | None

    def set_blocked(self, blocked: bool) -> None:
        """The free-disk alarm rose (True) or cleared: stop or resume taking publishes."""

    def check_consumer_timeouts(self, now_ms: int, default_ms: int) -> None:
        """Once a second: act on deliveries unacknowledged for too long."""

    # -- what the management API (warren.http) shows and does ---------------------------
    def info(self) -> dict[str, Any]:
        """The connection as RabbitMQ's management API lists it: ``name`` (the
        identifier DELETE /api/connections/{name} takes), ``user``, ``vhost``,
        ``protocol``, ``peer_host``, ``peer_port``, ``channels``, ``state`` ...
        Empty while the client has not opened a vhost yet (not listed)."""
        ...

    def channels_info(self, ages: Ages | None = None) -> list[dict[str, Any]]:
        """Its channels as RabbitMQ lists them, each with ``consumer_details``
        (consumers in /api/consumers' shape); ``ages``: the message rates' history
        a request asks for (``msg_rates_age``)."""
        ...

    def force_close(self, reason: str) -> None:
        """Close it on an operator's request (AMQP: 320 CONNECTION_FORCED with ``reason``)."""

    #: Bytes and socket reads/writes, with rates (sampled by the broker).
    octets: OctetStats

    def channel_stats(self) -> list[tuple[str, MessageStats]]:
        """(vhost name, counters) of each open channel (or MQTT session, ...)."""
        ...

    def channel_counts(self) -> list[tuple[str, str, ChannelCounts]]:
        """(name, vhost name, counts by exchange and queue) of each open AMQP
        channel; none for MQTT sessions (RabbitMQ 3.13's MQTT has no channels)."""
        ...


class Node(Protocol):
    """What listeners, their connections and definitions import/export use of the broker."""

    config: Config
    #: The data directory: its paths, and the disk budget and replication mirror
    #: that a listener's own files (MQTT sessions, mgmt.json) are written with.
    layout: DataDir
    users: UserStore
    vhosts: dict[str, VHost]
    cluster_name: str
    #: The cluster's permanent id (RabbitMQ's internal_cluster_id; store/cluster_id.py).
    cluster_id: str
    #: Raised resource alarms ("memory", "disk"): while any is, publishers are blocked.
    alarms: set[str]

    @property
    def disk_alarm(self) -> bool: ...

    @property
    def mem_alarm(self) -> bool: ...

    @property
    def mem_used(self) -> int:
        """Bytes: the broker's memory use as last sampled."""
        ...

    @property
    def mem_limit(self) -> int:
        """Bytes: the memory alarm's limit."""
        ...

    syncer: GroupSync | None
    #: In a cluster, the cluster's state as this (leading) node sees it
    #: (cluster/node.py's ClusterNode.status); None without clustering.
    cluster_status: Callable[[], dict[str, Any]] | None
    #: In a cluster, host:port of the followers' stream read services (None without).
    stream_replicas: Callable[[], list[str]] | None
    #: In a cluster, host:port of the followers' stream protocol read services.
    stream_protocol_replicas: Callable[[], list[str]] | None
    #: Open client connections of every protocol (those that opened a vhost), and
    #: how many opened and closed so far.
    connections: set[ClientConnection]
    connections_opened: int
    connections_closed: int
    #: Every listener, started or not (the management API lists them).
    listeners: list[Listener]
    #: The whole broker's message counters (summed when rates are sampled).
    stats: MessageStats
    #: What closed connections and deleted vhosts counted (metrics/history.py).
    retired: Retired
    #: Logins tried, per protocol (rabbitmq_auth_attempts_*).
    auth_attempts: AuthAttempts
    #: Connections per address, publishes per connection, subscriptions per client.
    rate_limits: RateLimits
    #: Every queue's lengths summed, and the node's figures (node_stats.py), sampled.
    queue_totals: GaugeStats
    node_figures: GaugeStats
    #: Failed logins per address: how long to hold a refusal, whom to refuse unchecked.
    auth_guard: AuthGuard
    #: Access tokens as passwords (warren/oauth2_backend.py); None: [oauth2] unset.
    oauth2: OAuth2Backend | None
    #: Called with a vhost's name as it is deleted (its connections are closed
    #: already): protocols forget what they keep of it (MQTT's sessions, retained).
    vhost_deleted: list[Callable[[str], None]]
    #: The TLS context every TLS listener serves with (reloaded on SIGHUP).
    tls: TLSContexts
    #: The broker's one clock (core/clock.py): every timeout, keep alive,
    #: heartbeat and message time of a connection reads it and arms its timers on it.
    clock: Clock

    def add_vhost(self, name: str) -> VHost: ...

    def delete_vhost(self, name: str) -> None:
        """Close its connections, delete its queues and exchanges (and their files),
        drop every permission on it; NotFound when there is no such vhost."""

    def get_vhost(self, name: str) -> VHost: ...

    #: Observers of the broker's events (core/events.py): what the management
    #: API changes (users, permissions) is announced there too.
    events: Events
    #: The webhook targets' status (warren.webhooks: GET /api/webhooks, the
    #: metrics); None without webhooks.
    webhook_status: Callable[[], list[dict[str, Any]]] | None
    #: The webhook targets, which the API and the definitions change; None: none.
    webhooks: Webhooks | None

    #: Runtime-parameter components by name (shovel, ...; core/runtime_parameters.py).
    parameter_components: dict[str, ParameterComponent]

    def set_parameter(self, vhost_name: str, component: str, name: str, value: Any) -> None:
        """Validate, store and apply a component's parameter (ValidationFailed)."""
        ...

    def clear_parameter(self, vhost_name: str, component: str, name: str) -> bool:
        """Forget a component's parameter; whether it existed."""
        ...

    def save_users(self) -> None: ...

    def connection_opened(self, conn: ClientConnection) -> None:
        """``conn`` logged in and opened a vhost: listed, counted for its user."""

    def connection_closed(self, conn: ClientConnection) -> None: ...

    def blocked_reason(self) -> str:
        """connection.blocked's reason for the raised alarms ("low on memory", ...)."""
        ...

    def at_connection_max(self) -> bool:
        """Whether ``max_connections`` client connections are open: one more is refused."""
        ...


class Listener(Protocol):
    """One server socket of one protocol, started and stopped by the broker."""

    #: The protocol's name: ``amqp``, ``http``, ...
    name: str

    @property
    def port(self) -> int:
        """The port bound (the configured one, or the one the OS chose for 0)."""
        ...

    def bind_ports(self, node: Node) -> None:
        """Bind and listen on the ports, accepting nothing yet; raises
        bound_port.BindError (an OSError) when a port cannot be bound. The broker
        calls it for every listener before it reads its data directory."""

    async def start(self, node: Node) -> None:
        """Start accepting (binding first if bind_ports was not called); raises
        OSError when a port cannot be bound."""

    async def stop(self) -> None:
        """Stop accepting, close every client as the protocol does at shutdown, and
        wait for them (a few seconds at most)."""


#: Another protocol served on a listener's port, told apart by the client's first
#: bytes: {protocol header prefix: factory of the protocol that takes the
#: connection over}. The AMQP listener takes AMQP 1.0 clients this way, as RabbitMQ 4
#: does (``AMQP\x00\x01\x00\x00``, ``AMQP\x03\x01\x00\x00`` for SASL): once
#: enough bytes are in to tell, the new protocol gets ``connection_made`` with the
#: same transport and then every byte read so far. Given by the composition root
#: (warren.app), so the listener's package never imports the other protocol's; the
#: factory's side tracks and closes the protocols it makes.
HeaderHandoffs = Mapping[bytes, Callable[[], asyncio.Protocol]]


class WebSocketEndpoint(NamedTuple):
    """A byte-stream protocol the HTTP listener also serves over WebSocket.

    The HTTP listener accepts a WebSocket upgrade on ``path`` (or on any path
    when the client offers one of ``subprotocols`` that no other endpoint's path
    claims), answers with the first of the client's subprotocols it knows, and
    drives a fresh ``new_protocol()`` through a transport whose ``write`` sends
    binary messages and whose reads are the binary messages received, so the
    protocol (AMQP's, MQTT's) runs unchanged. Given by the composition root
    (warren.app), so http/ never imports another protocol package.
    """

    path: str
    subprotocols: tuple[str, ...]
    new_protocol: Callable[[], asyncio.Protocol]
