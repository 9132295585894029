"""Single active consumer: of the subscriptions with ``single-active-consumer``
and the same ``name`` on a stream of a vhost, one at a time gets messages.

RabbitMQ's rules (rabbit_stream_sac_coordinator). Groups span the node's
stream connections: they are kept per node, by vhost, stream and name, each
with the stream's partition index in its super stream (-1: a plain stream,
or a Subscribe without ``super-stream``); a Subscribe whose index differs
from its group's is refused.

A plain stream's group: the first subscription is active and is told so with
a ConsumerUpdate; it answers with where to start (an offset spec; NONE: where
its Subscribe said) and deliveries begin there. The others wait,
unannounced. When the active one goes (Unsubscribe, its connection closed,
its stream deleted), the oldest waiting one becomes active the same way.

A super stream partition's group spreads the partitions over the group's
members: the one at position ``index % len(members)`` is the active one, so
that N consumers of a super stream's group each get some partitions. When
membership moves that position to another member, the current active one is
stopped and told ConsumerUpdate(active=false) first (the "hand-over": its
client may store its offset then), and the new one is activated only when it
answers, or after HANDOVER_TIMEOUT_MS on the node's clock for a client that
never does; meanwhile no one gets messages, and joins and departures wait
for that answer too (the choice is made again then).
"""

from __future__ import annotations

import logging
import weakref
from typing import TYPE_CHECKING, Any, Final

from warren.core import super_stream as super_streams
from warren.core.errors import NotFound

if TYPE_CHECKING:
    from warren.core.clock import Clock, TimerHandle
    from warren.core.vhost import VHost
    from warren.stream_protocol.control import Subscription
    from warren.stream_protocol.delivering import Delivering

__all__ = [
    "ACTIVE",
    "DEACTIVATING",
    "HANDOVER_TIMEOUT_MS",
    "WAITING",
    "Group",
    "Member",
    "SingleActiveGroups",
    "groups_of",
    "partition_index",
]

log = logging.getLogger("warren.stream")

#: ms an active consumer told to step down has to answer before the next one
#: is activated anyway (RabbitMQ's stream request_timeout; RabbitMQ closes
#: such a connection, Warren moves the group on and keeps it).
HANDOVER_TIMEOUT_MS: Final = 60_000

# A member's states.
WAITING: Final = 0
ACTIVE: Final = 1  # told it is active (its consumer attached once it answers)
DEACTIVATING: Final = 2  # told to step down, its answer awaited

#: The groups of each node (a test runs several brokers in one process).
_GROUPS: weakref.WeakKeyDictionary[Any, SingleActiveGroups] = weakref.WeakKeyDictionary()

GroupKey = tuple[str, str, str]


def partition_index(vhost: VHost, super_stream: str, stream: str) -> int:
    """``stream``'s index in ``super_stream`` (core/super_stream.py's, as
    RabbitMQ's stream manager finds it); -1 without such an exchange or a
    binding to the stream."""
    try:
        return super_streams.partition_index(vhost, super_stream, stream)
    except NotFound:
        return -1


class Member:
    """One subscription of a group."""

    __slots__ = ("delivering", "sub", "state", "correlation", "timer")

    def __init__(self, delivering: Delivering, sub: Subscription) -> None:
        self.delivering = delivering
        self.sub = sub
        self.state = WAITING
        #: The last ConsumerUpdate sent to it: only its answer counts.
        self.correlation = 0
        #: The hand-over's timeout while DEACTIVATING.
        self.timer: TimerHandle | None = None

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


class Group:
    """The members of one (vhost, stream, name), in the order they joined."""

    __slots__ = ("key", "index", "members")

    def __init__(self, key: GroupKey, index: int) -> None:
        self.key = key
        self.index = index
        self.members: list[Member] = []

    def current(self) -> Member | None:
        """The member that is active or stepping down (at most one)."""
        for m in self.members:
            if m.state != WAITING:
                return m
        return None

    def chosen(self) -> Member:
        """Who should be active: a plain stream's oldest member; a partition's
        member at ``index % size``."""
        members = self.members
        if self.index < 0:
            return members[0]
        return members[self.index % len(members)]


class SingleActiveGroups:
    """A node's groups, by (vhost name, stream, consumer name)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.groups: dict[GroupKey, Group] = {}

    def conflicts(self, key: GroupKey, index: int) -> bool:
        """Whether a subscription with partition ``index`` cannot join ``key``
        (its group has another index: RabbitMQ's partition_index_conflict)."""
        group = self.groups.get(key)
        return group is not None and group.index != index

    def join(self, key: GroupKey, index: int, member: Member) -> None:
        """Add ``member`` (waiting); the group's choice is made again."""
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = Group(key, index)
        group.members.append(member)
        self._rebalance(group)

    def leave(self, key: GroupKey, member: Member) -> None:
        """Remove ``member``; when it was the active one (or stepping down), or
        a partition's choice moves, another takes over."""
        group = self.groups.get(key)
        if group is None or member not in group.members:
            return
        group.members.remove(member)
        member._cancel_timer()
        was_current = member.state != WAITING
        member.state = WAITING
        if not group.members:
            del self.groups[key]
            return
        if group.index >= 0:
            self._rebalance(group)
        elif was_current:
            self._activate(group.chosen())

    def stepped_down(self, key: GroupKey, member: Member) -> None:
        """``member`` answered its ConsumerUpdate(active=false), or its time
        ran out: it waits, and the group's choice is activated (itself again,
        maybe, told so)."""
        group = self.groups.get(key)
        if group is None or member.state != DEACTIVATING or member not in group.members:
            return
        member._cancel_timer()
        member.state = WAITING
        self._rebalance(group)

    def _rebalance(self, group: Group) -> None:
        current = group.current()
        if current is None:
            self._activate(group.chosen())
            return
        if current.state == DEACTIVATING or group.index < 0:
            return  # the hand-over's answer decides; a plain stream keeps its active one
        if group.chosen() is not current:
            self._deactivate(group.key, current)

    @staticmethod
    def _activate(member: Member) -> None:
        member.state = ACTIVE
        member.delivering.activate(member)

    def _deactivate(self, key: GroupKey, member: Member) -> None:
        member.state = DEACTIVATING

        def timed_out() -> None:
            member.timer = None
            if member.state == DEACTIVATING:
                log.warning(
                    "stream subscription %d of group '%s' on '%s' did not answer its "
                    "ConsumerUpdate in %d ms; activating the next",
                    member.sub.subscription_id,
                    key[2],
                    key[1],
                    HANDOVER_TIMEOUT_MS,
                )
                self.stepped_down(key, member)

        member.timer = self.clock.call_later(HANDOVER_TIMEOUT_MS, timed_out)
        member.delivering.deactivate(member)


def groups_of(node: Any) -> SingleActiveGroups:
    groups = _GROUPS.get(node)
    if groups is None:
        groups = _GROUPS[node] = SingleActiveGroups(node.clock)
    return groups
