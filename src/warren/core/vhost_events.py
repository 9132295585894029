"""What a vhost tells of its changes, and to whom.

:class:`VHostNotices` is a part :class:`~warren.core.vhost.VHost` holds
(``vhost.notices``). The changes to its exchanges, queues, bindings and
policies go to the broker's event observers (core/events.py, with RabbitMQ's
event names and properties: warren.webhooks sends them on); a change to an
exchange (a binding, its policy, its deletion) also goes to the exchange
watchers, as federation follows its upstream exchanges. Both are rare, never
one per message, and cost nothing when no one listens.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from warren.core.events import Events

if TYPE_CHECKING:
    from warren.core.exchange import Binding, Exchange
    from warren.core.queue import Queue
    from warren.core.vhost import VHost

__all__ = ["VHostNotices", "binding_event", "exchange_event"]


class VHostNotices:
    """The vhost's event observers and exchange watchers, and what it tells them."""

    def __init__(self, vhost: VHost) -> None:
        self.vhost = vhost  # what the exchange watchers are given
        #: The broker's event observers (the broker gives its own, shared by its vhosts).
        self.events = Events()
        #: Called with (vhost, exchange name) when an exchange goes, gets or loses
        #: a binding or another policy: federation follows them.
        self.exchange_watchers: list[Callable[[VHost, str], None]] = []

    def emit(self, event: str, /, **props: Any) -> None:
        """Emit a broker event about this vhost's objects (core/events.py)."""
        if self.events:
            self.events.emit(event, {**props, "vhost": self.vhost.name})

    def exchange_changed(self, name: str) -> None:
        """Tell the exchange watchers that exchange ``name`` changed."""
        for watcher in list(self.exchange_watchers):
            watcher(self.vhost, name)

    def exchange_created(self, ex: Exchange) -> None:
        if self.events:
            self.emit("exchange.created", **exchange_event(ex))

    def exchange_deleted(self, name: str) -> None:
        self.emit("exchange.deleted", name=name)
        if self.exchange_watchers:
            self.exchange_changed(name)

    def queue_created(self, q: Queue, exclusive: bool) -> None:
        self.emit(
            "queue.created",
            name=q.name,
            durable=q.durable,
            auto_delete=q.auto_delete,
            exclusive=exclusive,
            type=q.queue_type,
        )

    def queue_deleted(self, name: str) -> None:
        self.emit("queue.deleted", name=name)

    def binding_created(self, binding: Binding) -> None:
        if self.exchange_watchers:
            self.exchange_changed(binding.source.name)
        if self.events:
            self.emit("binding.created", **binding_event(binding))

    def binding_deleted(self, binding: Binding) -> None:
        """A binding went; its source's watchers hear of it unless the source went too."""
        if self.events:
            self.emit("binding.deleted", **binding_event(binding))
        if self.exchange_watchers and not binding.source.deleted:
            self.exchange_changed(binding.source.name)


def exchange_event(ex: Exchange) -> dict[str, Any]:
    """exchange.created's properties (RabbitMQ's event exchange's)."""
    return {
        "name": ex.name,
        "type": ex.type,
        "durable": ex.durable,
        "auto_delete": ex.auto_delete,
        "internal": ex.internal,
        "arguments": ex.arguments,
    }


def binding_event(binding: Binding) -> dict[str, Any]:
    """binding.created's and binding.deleted's properties (RabbitMQ's names)."""
    return {
        "source_name": binding.source.name,
        "source_kind": "exchange",
        "destination_name": binding.destination.name,
        "destination_kind": binding.destination_kind,
        "routing_key": binding.routing_key,
        "arguments": binding.arguments,
    }
