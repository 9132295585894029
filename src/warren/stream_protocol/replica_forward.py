"""What a follower's read service forwards to the leader, sans-IO.

RabbitMQ takes single active consumers and StoreOffset on any node: the
groups are the cluster's, offsets are written to the stream by its leader.
A follower's ReplicaStreamConnection does the same through a LeaderLink
(leader_link.py: the stream protocol, logged in as its client):

- Subscribe with ``single-active-consumer`` goes to the leader as it came,
  with no credit (the leader keeps the group and never delivers there), and
  its answer is the client's. The leader's ConsumerUpdate goes to the client
  under a correlation id of this connection; the client's answer goes back
  to the leader under the leader's. When the answer activates the
  subscription, it reads here from where the answer says (resolved on the
  replicated stream; NONE: where its Subscribe said); ConsumerUpdate
  (active=false) stops it here at once, as the leader stops a consumer it
  deactivates. Unsubscribe and the client's end (the link closes) leave the
  group on the leader, which hands over to the next member. An Unsubscribe
  that comes while its Subscribe waits for the leader is answered after it,
  in the client's order, as RabbitMQ (which answers a Subscribe before it
  reads the next command) would: it succeeds once the leader took the
  Subscribe, and finds no subscription when the leader refused it.
- StoreOffset goes to the leader as it came (it has no answer either way);
  QueryOffset is answered from the replicated stream's tracking.

A link that ends (the leader went, or refused the login) ends what went
through it: Subscribes not yet answered are refused with
STREAM_NOT_AVAILABLE, forwarded subscriptions go with a MetadataUpdate
(STREAM_NOT_AVAILABLE), as for a stream gone; the next need opens a new link.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from warren.stream_protocol import commands as c
from warren.stream_protocol.constants import ResponseCode
from warren.stream_protocol.control import start_spec
from warren.stream_protocol.leader_link import LeaderLink

if TYPE_CHECKING:
    from warren.stream_protocol.replica import ReplicaStreamConnection, ReplicaSubscription

__all__ = ["Connect", "Forwarding"]

log = logging.getLogger("warren.stream")

OK: Final = int(ResponseCode.OK)
NOT_AVAILABLE: Final = int(ResponseCode.STREAM_NOT_AVAILABLE)
NO_SUBSCRIPTION: Final = int(ResponseCode.SUBSCRIPTION_ID_DOES_NOT_EXIST)

#: Opens a link's transport to the leader for a connection (the read server's;
#: it calls the link's ``lost`` when it cannot).
Connect = Callable[[LeaderLink, "ReplicaStreamConnection"], None]


class Forwarding:
    """One read-service connection's forwarded subscriptions and offsets."""

    def __init__(self, conn: ReplicaStreamConnection, connect: Connect) -> None:
        self.conn = conn
        self._connect = connect
        self.link: LeaderLink | None = None
        #: Subscribes sent to the leader: link correlation id -> (client's, subscription).
        self._subscribes: dict[int, tuple[int, ReplicaSubscription]] = {}
        #: Unsubscribes that wait for their Subscribe's answer: sid -> client's correlation id.
        self._unsubscribes: dict[int, int] = {}
        #: ConsumerUpdates sent to the client: its correlation id -> (the
        #: leader's, sid, whether it activates).
        self._updates: dict[int, tuple[int, int, bool]] = {}
        self._correlation = 0

    def pending(self, subscription_id: int) -> bool:
        """Whether a Subscribe with this id waits for the leader's answer."""
        return any(s.subscription_id == subscription_id for _, s in self._subscribes.values())

    # -- the client's commands ---------------------------------------------------------
    def subscribe(self, command: c.Subscribe, sub: ReplicaSubscription) -> None:
        """A single active consumer: the leader's group decides (answered when
        the leader answers)."""
        link = self._link()
        if link is None:
            self.conn.send(c.SubscribeResponse(command.correlation_id, NOT_AVAILABLE))
            return
        corr = link.next_id()
        self._subscribes[corr] = (command.correlation_id, sub)
        link.send(
            c.Subscribe(corr, sub.subscription_id, sub.stream, command.offset, 0, sub.properties)
        )

    def unsubscribe_pending(self, command: c.Unsubscribe) -> bool:
        """Whether ``command`` is for a Subscribe that waits for the leader (it
        is answered after that Subscribe's answer)."""
        sid = command.subscription_id
        if sid in self._unsubscribes or not self.pending(sid):
            return False
        self._unsubscribes[sid] = command.correlation_id
        return True

    def unsubscribed(self, sub: ReplicaSubscription) -> None:
        """A forwarded subscription went here: it leaves its group there."""
        for corr in [k for k, (_, sid, _) in self._updates.items() if sid == sub.subscription_id]:
            del self._updates[corr]
        if self.link is not None:
            self.link.send(c.Unsubscribe(self.link.next_id(), sub.subscription_id))

    def store_offset(self, command: c.StoreOffset) -> None:
        link = self._link()
        if link is None:
            log.warning(
                "%s: StoreOffset on '%s' dropped: no leader", self.conn.name, command.stream
            )
            return
        link.send(command)

    def answered(self, command: c.ConsumerUpdateResponse) -> None:
        """The client's answer to a ConsumerUpdate: an activated subscription
        reads from where it says; the leader gets the answer."""
        entry = self._updates.pop(command.correlation_id, None)
        if entry is None:
            return
        leader_corr, sid, active = entry
        sub = self.conn.subscriptions.get(sid)
        if active and sub is not None and sub.update == command.correlation_id:
            if command.code == OK:
                spec = start_spec(command.offset) or start_spec(sub.offset)
                if spec is not None:
                    self.conn.start_at(sub, spec)
            else:
                log.warning("%s: ConsumerUpdate refused with %d", self.conn.name, command.code)
        if self.link is not None:
            self.link.send(c.ConsumerUpdateResponse(leader_corr, command.code, command.offset))

    def close(self) -> None:
        """The client went: so does the link (and the leader's members with it)."""
        link, self.link = self.link, None
        self._subscribes.clear()
        self._unsubscribes.clear()
        self._updates.clear()
        if link is not None:
            link.close()

    # -- the link ----------------------------------------------------------------------
    def _link(self) -> LeaderLink | None:
        """The open link, or a new one; None when the leader cannot be reached."""
        if self.link is not None and not self.link.closed:
            return self.link
        user, password = self.conn.credentials
        link = LeaderLink(
            user, password, self.conn.vhost, self.conn.name, self._from_leader, self._lost
        )
        self.link = link
        self._connect(link, self.conn)
        return None if link.closed else link

    def _from_leader(self, command: c.Command) -> None:
        if isinstance(command, c.SubscribeResponse):
            self._subscribed(command)
        elif isinstance(command, c.ConsumerUpdate):
            self._consumer_update(command)
        elif isinstance(command, c.MetadataUpdate):
            self._gone(command.stream)
        # Unsubscribe's answers and the rest: nothing to do here.

    def _subscribed(self, command: c.SubscribeResponse) -> None:
        entry = self._subscribes.pop(command.correlation_id, None)
        if entry is None or self.conn.closed:
            return
        client_corr, sub = entry
        unsubscribe = self._unsubscribes.pop(sub.subscription_id, None)
        if command.code == OK and unsubscribe is None:
            self.conn.subscriptions[sub.subscription_id] = sub
        self.conn.send(c.SubscribeResponse(client_corr, command.code))
        if unsubscribe is not None:
            if command.code == OK:
                self.unsubscribed(sub)
            code = OK if command.code == OK else NO_SUBSCRIPTION
            self.conn.send(c.UnsubscribeResponse(unsubscribe, code))

    def _consumer_update(self, command: c.ConsumerUpdate) -> None:
        sub = self.conn.subscriptions.get(command.subscription_id)
        if sub is None or sub.sac_active is None or self.conn.closed:
            return  # unsubscribed here: the leader hears so
        if not command.active:
            self.conn.stop(sub)
        self._correlation += 1
        corr = sub.update = self._correlation
        self._updates[corr] = (command.correlation_id, sub.subscription_id, command.active)
        self.conn.send(c.ConsumerUpdate(corr, sub.subscription_id, command.active))

    def _gone(self, stream: str) -> None:
        """The leader ended the forwarded subscriptions of ``stream``."""
        subs = [s for s in self.conn.subscriptions.values() if s.sac_active is not None]
        self.conn.drop([s for s in subs if s.stream == stream])

    def _lost(self, link: LeaderLink, reason: str) -> None:
        if link is not self.link:
            return  # an earlier link's end
        self.link = None
        log.warning("%s: the link to the leader ended: %s", self.conn.name, reason)
        subscribes, self._subscribes = self._subscribes, {}
        unsubscribes, self._unsubscribes = self._unsubscribes, {}
        self._updates.clear()
        if self.conn.closed:
            return
        for client_corr, sub in subscribes.values():
            self.conn.send(c.SubscribeResponse(client_corr, NOT_AVAILABLE))
            unsubscribe = unsubscribes.get(sub.subscription_id)
            if unsubscribe is not None:
                self.conn.send(c.UnsubscribeResponse(unsubscribe, NO_SUBSCRIPTION))
        self.conn.drop([s for s in self.conn.subscriptions.values() if s.sac_active is not None])
