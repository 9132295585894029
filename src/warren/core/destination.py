"""What a binding points at, and what routing needs to know about it.

A destination is either a queue, which takes the messages routed to it, or an
exchange, which routes them on (exchange-to-exchange bindings). Routing asks
``destination_kind`` rather than a destination's class, so that any kind of
queue (classic, priority, stream) is a queue to it.
"""

from __future__ import annotations

from typing import ClassVar, Protocol

#: ``destination_kind`` of queues and of exchanges: RabbitMQ's names for a
#: binding's destination type (definitions, management API).
QUEUE = "queue"
EXCHANGE = "exchange"


class Destination(Protocol):
    name: str
    destination_kind: ClassVar[str]
