"""An observation's consumer: the core's view of a CoAP observer.

Compiled (setup.py): it subclasses core/consumer.py's compiled Consumer,
which an interpreted class cannot. What it does is the observation's
(coap/observe.py), reached through the small interface below.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from warren.core.consumer import Consumer

if TYPE_CHECKING:
    from warren.core.deliveries import Deliveries
    from warren.core.message import Message
    from warren.core.queue import Queue

__all__ = ["CoAPConsumer", "Observer"]


class Observer(Protocol):
    """coap/observe.py's Observation, as its consumer needs it."""

    def ready(self) -> bool:
        """Whether another notification may go out now."""
        ...

    def deliver(
        self, consumer: CoAPConsumer, seq: int, msg: Message, redelivered: bool
    ) -> None: ...

    def queue_gone(self) -> None:
        """The queue was deleted under the observation."""


class CoAPConsumer(Consumer):
    """Takes a message whenever its observation may notify (one confirmable
    notification in flight at a time)."""

    __slots__ = ("observer",)

    def __init__(
        self, observer: Observer, deliveries: Deliveries, tag: str, queue: Queue, no_ack: bool
    ) -> None:
        super().__init__(deliveries, tag, queue, no_ack)
        self.observer = observer

    def can_take(self) -> bool:
        return self.observer.ready()

    def deliver(self, seq: int, msg: Message, redelivered: bool) -> None:
        self.observer.deliver(self, seq, msg, redelivered)

    def cancelled(self) -> None:
        self.deliveries.cancelled(self.tag, self)
        self.observer.queue_gone()
