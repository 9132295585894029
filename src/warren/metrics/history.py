"""Counts that outlive what they count, so the ``_total`` families never go back.

Prometheus counters must only grow over the broker's life. Warren's counters
live on objects (channels, connections, queues, vhosts) that come and go; when
one goes, what it counted is folded in here (once per object, never per
message), and the metrics add the live objects' counts to these.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from warren.core.stats import MessageStats

if TYPE_CHECKING:
    from warren.core.vhost import VHost
    from warren.node import ClientConnection

__all__ = ["STREAM", "AuthAttempts", "Retired", "protocol_label"]

#: The stream protocol's label (and its connections' management ``protocol``).
STREAM = "stream"

#: VHost churn counters (their attribute names).
CHURN = (
    "channels_opened",
    "channels_closed",
    "queues_declared",
    "queues_created",
    "queues_deleted",
)


def protocol_label(management_protocol: str) -> str:
    """RabbitMQ's protocol label for a connection's management-API ``protocol``."""
    if management_protocol.startswith("MQTT"):
        return "mqtt50" if "5" in management_protocol.split()[-1][:1] else "mqtt311"
    if management_protocol == STREAM:
        return STREAM
    if management_protocol == "CoAP":  # a CoAP client (coap/clients.py)
        return "coap"
    return "amqp091"


class AuthAttempts:
    """Logins tried, per protocol (RabbitMQ's ``auth_attempt_metrics``): one call per
    login attempt, at the protocols' authentication steps."""

    def __init__(self) -> None:
        #: protocol -> [attempts, succeeded, failed]
        self.by_protocol: dict[str, list[int]] = {}

    def record(self, protocol: str, succeeded: bool) -> None:
        counts = self.by_protocol.get(protocol)
        if counts is None:
            counts = self.by_protocol[protocol] = [0, 0, 0]
        counts[0] += 1
        counts[1 if succeeded else 2] += 1


class Retired:
    """What closed connections, deleted queues and deleted vhosts counted."""

    def __init__(self) -> None:
        #: Message counters of closed non-AMQP sessions (MQTT, stream), per protocol label.
        #: (Closed AMQP channels go to their vhost's base_stats.)
        self.sessions: dict[str, MessageStats] = {}
        #: Bytes and reads/writes of closed connections:
        #: [recv_oct, send_oct, recv_cnt, send_cnt].
        self.octets = [0, 0, 0, 0]
        #: Deleted vhosts' base_stats, churn and what their deleted queues counted.
        self.vhost_stats = MessageStats()
        self.churn = dict.fromkeys(CHURN, 0)
        self.queue_stats: dict[str, MessageStats] = {}
        self.dead_lettered: dict[tuple[str, str, str], int] = {}
        self.received_confirm = 0

    def connection_closed(self, conn: ClientConnection, protocol: str) -> None:
        o = conn.octets
        for i, value in enumerate((o.recv_oct, o.send_oct, o.recv_cnt, o.send_cnt)):
            self.octets[i] += value
        if protocol != "amqp091":
            stats = self.sessions.setdefault(protocol, MessageStats())
            for _vhost, live in conn.channel_stats():
                stats.add(live)

    def vhost_deleted(self, vhost: VHost) -> None:
        """Called once its queues are deleted and its connections closed."""
        self.vhost_stats.add(vhost.base_stats)
        self.received_confirm += vhost.received_confirm
        for key in CHURN:
            self.churn[key] += getattr(vhost, key)
        merge_stats(self.queue_stats, vhost.deleted_queue_stats.items())
        for dl_key, n in vhost.dead_letters.counts.items():
            self.dead_lettered[dl_key] = self.dead_lettered.get(dl_key, 0) + n


def merge_stats(into: dict[str, MessageStats], parts: Iterable[tuple[str, MessageStats]]) -> None:
    for key, stats in parts:
        into.setdefault(key, MessageStats()).add(stats)
