"""CoAP clients as the management API lists connections (docs/coap.md).

CoAP has no connections: a client is its source address. So that operators
see CoAP clients where they see MQTT's and AMQP's (/api/connections,
/api/consumers, rabbitmq_connections), a source address that logged in is
listed as a connection with protocol "CoAP": its user and vhost (the last
login's), its observations' queues as the consumers of its one channel, the
datagrams it sent and was sent, and when it was last heard (a request, on the
node clock). It is forgotten ``[coap] client_idle_timeout`` seconds after its
last request once it observes nothing. Closing it (DELETE
/api/connections/{name}) ends its observations and forgets it; its next
request lists it again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from warren.client_listing import (
    ListedConsumer,
    channel_listing,
    connection_listing,
    connection_name,
)
from warren.coap import codec as C
from warren.core.stats import MessageStats, OctetStats

if TYPE_CHECKING:
    from warren.coap.endpoint import Address
    from warren.coap.observe import Observation
    from warren.core.channel_counts import ChannelCounts
    from warren.core.clock import TimerHandle
    from warren.core.session import ClientSession
    from warren.core.stats import Ages
    from warren.core.users import User
    from warren.core.vhost import VHost
    from warren.node import Node

__all__ = ["CoAPClient", "CoAPClients", "PROTOCOL"]

log = logging.getLogger("warren.coap")

#: The management API's ``protocol`` of a CoAP client (Prometheus: "coap").
PROTOCOL = "CoAP"


def _ignored(outcome: str) -> None:
    """A last notification's outcome: the observation is gone already."""


class CoAPClient:
    """One source address, as a connection (warren.node.ClientConnection)."""

    transport_name = "UDP"

    def __init__(
        self,
        clients: CoAPClients,
        addr: Address,
        local: tuple[str, int] | None,
        session: ClientSession,
        vhost: VHost,
        now_ms: int,
    ) -> None:
        self._clients = clients
        #: The session of the request that listed it: it counts and lists it.
        self.session = session
        self.addr = addr
        self.peer: tuple[str, int] | None = (str(addr[0]), int(addr[1]))
        self.local = local
        self.user: User | None = session.user
        self.vhost: VHost | None = vhost
        self.closed = False
        self.connected_at = now_ms
        self.last_seen_ms = now_ms
        self.octets = OctetStats()
        self._name = connection_name(self.peer, local)

    @property
    def name(self) -> str:
        return self._name

    def observations(self) -> list[Observation]:
        return self._clients.observations_of(self.addr)

    # -- warren.node.ClientConnection ---------------------------------------------------------
    def set_blocked(self, blocked: bool) -> None:
        """Nothing to do: a publish during an alarm is answered 5.03 (pubsub.py)."""

    def check_consumer_timeouts(self, now_ms: int, default_ms: int) -> None:
        """Nothing to do: a notification unanswered times out on CoAP's own clock."""

    def info(self) -> dict[str, Any]:
        idle_s = self._clients.idle_ms // 1000
        return connection_listing(
            self,
            PROTOCOL,
            idle_s,
            auth_mechanism="PLAIN",
            channel_max=1,
            channels=1,
            client_properties={"transport": self.transport_name},
            frame_max=0,
            last_seen=self.last_seen_ms,
            observations=len(self.observations()),
        )

    def channels_info(self, ages: Ages | None = None) -> list[dict[str, Any]]:
        """Its observations as the consumers of channel 1 (as an MQTT session's
        subscriptions are); their messages are counted with the vhost's."""
        if self.vhost is None or self.user is None:
            return []
        observations = self.observations()
        consumers = [
            ListedConsumer(obs.queue_name, obs.qos > 0, 1, obs.queue_name) for obs in observations
        ]
        return [
            channel_listing(
                self,
                1,
                consumers,
                prefetch_count=1,
                unacknowledged=sum(1 for obs in observations if obs.in_flight is not None),
                unconfirmed=0,
                stats=MessageStats(),
                ages=ages,
            )
        ]

    def force_close(self, reason: str) -> None:
        """An operator closed it: its observations end, it is forgotten."""
        self._clients.forget(self, reason)

    def channel_stats(self) -> list[tuple[str, MessageStats]]:
        return []

    def channel_counts(self) -> list[tuple[str, str, ChannelCounts]]:
        return []


class CoAPClients:
    """The listener's clients by source address, forgotten when idle."""

    def __init__(
        self,
        node: Node,
        local: tuple[str, int] | None,
        observations_of: Callable[[Address], list[Observation]],
    ) -> None:
        self.node = node
        self.local = local
        self.observations_of = observations_of
        self.idle_ms = node.config.coap_client_idle_timeout * 1000
        self.by_addr: dict[Address, CoAPClient] = {}
        self._timer: TimerHandle | None = None

    def seen(self, addr: Address, session: ClientSession, vhost: VHost) -> bool:
        """A request from ``addr`` logged in (``session``, open in ``vhost``);
        False: a new client while the node's connection limit is reached."""
        user = session.user
        assert user is not None
        now = self.node.clock.now_ms()
        client = self.by_addr.get(addr)
        if client is not None and client.user is not None and client.user.name != user.name:
            self.forget(client, "logged in as another user")
            client = None
        if client is None:
            if self.node.at_connection_max():
                return False
            client = self.by_addr[addr] = CoAPClient(self, addr, self.local, session, vhost, now)
            session.opened(client, vhost)
            self._arm()
        client.user = user  # an access token's refreshed User
        client.last_seen_ms = now
        return True

    def count(self, addr: Address, octets: int, incoming: bool) -> None:
        """A datagram from (or to) ``addr``: counted for a known client."""
        client = self.by_addr.get(addr)
        if client is None:
            return
        o = client.octets
        if incoming:  # heard from: an ACK to a notification too
            client.last_seen_ms = self.node.clock.now_ms()
            o.recv_oct += octets
            o.recv_cnt += 1
        else:
            o.send_oct += octets
            o.send_cnt += 1

    def forget(self, client: CoAPClient, reason: str) -> None:
        if client.closed:
            return
        client.closed = True
        log.info("CoAP client %s forgotten: %s", client.name, reason)
        for obs in client.observations():
            if reason != "idle":  # RFC 7641 3.2: a non-2.xx notification ends it there too
                obs.endpoint.notify(
                    obs.addr,
                    obs.token,
                    C.SERVICE_UNAVAILABLE,
                    [],
                    f"closed: {reason}".encode(),
                    False,
                    _ignored,
                )
            obs.end()
        if self.by_addr.get(client.addr) is client:
            del self.by_addr[client.addr]
        if client.vhost is not None:
            client.session.closed(client, client.vhost)

    def _arm(self) -> None:
        """A timer for when the oldest client may be idle long enough."""
        if self._timer is not None or not self.by_addr or self.idle_ms <= 0:
            return
        oldest = min(c.last_seen_ms for c in self.by_addr.values())
        due = max(0, oldest + self.idle_ms - self.node.clock.now_ms())
        self._timer = self.node.clock.call_later(due + 1, self._sweep)

    def _sweep(self) -> None:
        self._timer = None
        now = self.node.clock.now_ms()
        for client in list(self.by_addr.values()):
            if now - client.last_seen_ms >= self.idle_ms and not client.observations():
                self.forget(client, "idle")
        if self.by_addr:  # those observing (or seen since) are looked at again later
            oldest = min(c.last_seen_ms for c in self.by_addr.values())
            if oldest + self.idle_ms <= now:  # observing: look again after a full idle time
                self._timer = self.node.clock.call_later(self.idle_ms, self._sweep)
            else:
                self._arm()

    def close(self) -> None:
        """Shutdown: every client is forgotten."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for client in list(self.by_addr.values()):
            self.forget(client, "shutdown")
