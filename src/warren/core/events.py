"""Broker events: one observer list for what happens to the broker's objects.

RabbitMQ's event exchange (rabbitmq_event_exchange) publishes ``queue.created``,
``connection.closed``, ``alarm.set`` ... as messages; Warren's core announces the
same names here, protocol-neutral, and components (warren.webhooks) observe
them. Events are rare (declarations, connections, consumers, alarms, policy and
user changes): never one per message, so emitting one is a plain loop over the
observers, and nothing at all when there are none.

An observer must not block nor raise: it is called on the broker's loop in the
middle of the change it hears of. One that raises is logged and kept.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

__all__ = ["Events", "Observer", "EVENT_NAMES"]

log = logging.getLogger("warren.events")

#: An observer: called with the event's name and its properties (JSON values).
Observer = Callable[[str, dict[str, Any]], None]

#: The events the broker emits, named as RabbitMQ's event exchange names them.
EVENT_NAMES = (
    "connection.created",
    "connection.closed",
    "channel.created",
    "channel.closed",
    "consumer.created",
    "consumer.deleted",
    "queue.created",
    "queue.deleted",
    "exchange.created",
    "exchange.deleted",
    "binding.created",
    "binding.deleted",
    "vhost.created",
    "vhost.deleted",
    "policy.set",
    "policy.cleared",
    "operator.policy.set",
    "operator.policy.cleared",
    "user.created",
    "user.deleted",
    "permission.created",
    "permission.deleted",
    "alarm.set",
    "alarm.cleared",
)


class Events:
    """The broker's observers of its events (one per broker, shared by its vhosts)."""

    __slots__ = ("observers",)

    def __init__(self) -> None:
        self.observers: list[Observer] = []

    def __bool__(self) -> bool:
        """Whether anyone listens: callers skip building an event's properties if not."""
        return bool(self.observers)

    def emit(self, name: str, props: dict[str, Any]) -> None:
        """Tell every observer of ``name`` with ``props``."""
        for observer in list(self.observers):
            try:
                observer(name, props)
            except Exception:
                log.exception("an observer of %s failed", name)
