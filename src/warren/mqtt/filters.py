"""A session's own subscriptions by topic filter level: which match a topic.

Every delivery to a session asks which of its subscriptions the message's
topic matches (for the QoS, Retain As Published, Subscription Identifiers and
No Local). A scan of all of them cost 2 ms a message with 10,000 filters; the
index walks the topic's levels instead (exact level, ``+``, ``#``), so the
cost is the topic's depth and what matches.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from warren.mqtt.topics import amqp_to_mqtt

if TYPE_CHECKING:
    from warren.mqtt.session import SubscriptionOptions

__all__ = ["FilterIndex"]

Entry = tuple[int, "SubscriptionOptions"]


class _Node:
    __slots__ = ("children", "here", "rest")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        #: Subscriptions whose filter ends at this level, by the client's filter.
        self.here: dict[str, Entry] = {}
        #: Subscriptions whose filter goes on with ``#`` (this level and below).
        self.rest: dict[str, Entry] = {}


class FilterIndex:
    """Subscriptions (the client's filter -> options) indexed by what they match:
    the filter of their binding key, as delivery has always matched them."""

    def __init__(self) -> None:
        self._root = _Node()
        # The client's filter -> when it was first subscribed: matches come in
        # that order (a subscription whose options are replaced keeps its place).
        self._order: dict[str, int] = {}
        self._next = 0

    def __len__(self) -> int:
        return len(self._order)

    def put(self, name: str, opts: SubscriptionOptions) -> None:
        order = self._order.get(name)
        if order is None:
            self._next += 1
            order = self._order[name] = self._next
        node = self._root
        levels = amqp_to_mqtt(opts.binding_key).split("/")
        for i, level in enumerate(levels):
            if level == "#" and i == len(levels) - 1:
                node.rest[name] = (order, opts)
                return
            child = node.children.get(level)
            if child is None:
                child = node.children[level] = _Node()
            node = child
        node.here[name] = (order, opts)

    def remove(self, name: str, opts: SubscriptionOptions) -> None:
        if self._order.pop(name, None) is None:
            return
        levels = amqp_to_mqtt(opts.binding_key).split("/")
        path = [self._root]
        last = len(levels) - 1
        for i, level in enumerate(levels):
            if level == "#" and i == last:
                path[-1].rest.pop(name, None)
                levels = levels[:last]
                break
            child = path[-1].children.get(level)
            if child is None:
                return
            path.append(child)
        else:
            path[-1].here.pop(name, None)
        for depth in range(len(path) - 1, 0, -1):  # prune what is left empty
            node = path[depth]
            if node.here or node.rest or node.children:
                break
            del path[depth - 1].children[levels[depth - 1]]

    def matching(self, topic: str) -> list[SubscriptionOptions]:
        """The subscriptions ``topic`` matches, in the order they were made. A
        wildcard first level does not match a topic starting with ``$``
        (MQTT-4.7.2-1)."""
        levels = topic.split("/")
        dollar = topic[:1] == "$"
        found: list[Entry] = []
        stack = [(self._root, 0)]
        while stack:
            node, i = stack.pop()
            if node.rest and not (i == 0 and dollar):
                found.extend(node.rest.values())  # '#' matches this level and below
            if i == len(levels):
                found.extend(node.here.values())
                continue
            level = levels[i]
            exact = node.children.get(level)
            if exact is not None:
                stack.append((exact, i + 1))
            if level != "+" and not (i == 0 and dollar):
                plus = node.children.get("+")
                if plus is not None:
                    stack.append((plus, i + 1))
        found.sort(key=_first)
        return [opts for _, opts in found]


def _first(entry: Entry) -> int:
    return entry[0]
