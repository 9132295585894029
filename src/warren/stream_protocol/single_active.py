"""Single active consumer: of the subscriptions with ``single-active-consumer``
and the same ``name`` on a stream of a vhost, one at a time gets messages.

RabbitMQ's rules (rabbit_stream_sac_coordinator, for a stream that is no
super stream partition): the first subscription of a group is active and is
told so with a ConsumerUpdate; it answers with where to start (an offset
spec; NONE: where its Subscribe said) and deliveries begin there. The others
wait, unannounced. When the active one goes (Unsubscribe, its connection
closed, its stream deleted), the group's oldest waiting subscription becomes
active the same way. Groups span the node's stream connections: they are
kept per node, by vhost, stream and name.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from warren.stream_protocol.control import Subscription
    from warren.stream_protocol.delivering import Delivering

__all__ = ["Member", "SingleActiveGroups", "groups_of"]

#: The groups of each node (a test runs several brokers in one process).
_GROUPS: weakref.WeakKeyDictionary[Any, SingleActiveGroups] = weakref.WeakKeyDictionary()


class Member:
    """One subscription of a group."""

    __slots__ = ("delivering", "sub", "active")

    def __init__(self, delivering: Delivering, sub: Subscription) -> None:
        self.delivering = delivering
        self.sub = sub
        self.active = False


class SingleActiveGroups:
    """A node's groups, by (vhost name, stream, consumer name), members in
    the order they subscribed."""

    def __init__(self) -> None:
        self.groups: dict[tuple[str, str, str], list[Member]] = {}

    def join(self, key: tuple[str, str, str], member: Member) -> None:
        """Add ``member``; active (and told) when no other is."""
        group = self.groups.setdefault(key, [])
        group.append(member)
        if not any(m.active for m in group):
            self._activate(member)

    def leave(self, key: tuple[str, str, str], member: Member) -> None:
        """Remove ``member``; when it was the active one, the next takes over."""
        group = self.groups.get(key)
        if group is None or member not in group:
            return
        group.remove(member)
        if not group:
            del self.groups[key]
            return
        if member.active:
            self._activate(group[0])

    @staticmethod
    def _activate(member: Member) -> None:
        member.active = True
        member.delivering.activate(member)


def groups_of(node: Any) -> SingleActiveGroups:
    groups = _GROUPS.get(node)
    if groups is None:
        groups = _GROUPS[node] = SingleActiveGroups()
    return groups
