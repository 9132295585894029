"""A queue: ordered messages behind a store, and the consumers it delivers to."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from warren.core.consumer import Consumer
from warren.core.errors import AccessRefused
from warren.core.message import Message
from warren.core.store import MessageStore

if TYPE_CHECKING:
    from warren.core.policies import Policy
    from warren.core.vhost import VHost

log = logging.getLogger("warren.queue")

# What Queue.publish did with a message.
NOT_TAKEN, STORED, DELIVERED = 0, 1, 2

# Deliveries per scheduled run: bounds how long one busy queue holds the event loop.
_DELIVERY_BATCH = 2048


class Queue:
    def __init__(
        self,
        vhost: VHost,
        name: str,
        store: MessageStore,
        durable: bool = True,
        exclusive_owner: object | None = None,
        auto_delete: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> None:
        self.vhost = vhost
        self.name = name
        self.store = store
        self.durable = durable
        self.exclusive_owner = exclusive_owner
        self.auto_delete = auto_delete
        self.arguments: dict[str, Any] = arguments or {}
        self.consumers: list[Consumer] = []
        # Consumers grouped by priority, highest first; within a group, round-robin.
        self._groups: list[tuple[int, list[Consumer]]] = []
        self._rr: dict[int, int] = {}
        self.unacked = 0
        self.deleted = False
        self._had_consumer = False
        self._scheduled = False
        self._call_soon: Callable[[Callable[[], None]], Any] = vhost.call_soon
        # The policy and operator policy that apply (set by the vhost).
        self.policy: Policy | None = None
        self.operator_policy: Policy | None = None

    def __repr__(self) -> str:
        return f"<Queue {self.name!r} in {self.vhost.name!r}>"

    @property
    def persistent(self) -> bool:
        """Durable and not exclusive: its store and definition survive a restart."""
        return self.durable and self.exclusive_owner is None

    @property
    def exclusive(self) -> bool:
        return self.exclusive_owner is not None

    @property
    def message_count(self) -> int:
        return self.store.ready_count

    @property
    def consumer_count(self) -> int:
        return len(self.consumers)

    # -- publishing -------------------------------------------------------------------
    def publish(self, msg: Message) -> int:
        """Take a routed message: NOT_TAKEN, STORED, or DELIVERED (handed straight to
        a no-ack consumer, never stored: nothing could bring it back). With an empty
        backlog and a consumer that can take it, delivery happens right here."""
        if self.consumers and not self.store.ready_count:
            consumer = self._next_consumer()
            if consumer is not None:
                if consumer.no_ack:
                    consumer.deliver(0, msg, False)
                    return DELIVERED
                # Stored (for requeue, and for a restart until acked) but delivered
                # now, without a delivery pass reading it back from the segment.
                store = self.store
                seq = store.append_shifted(msg)
                self.vhost.store_written(store)
                self.unacked += 1
                consumer.deliver(seq, msg, False)
                return STORED
        self.store.append(msg)
        self.vhost.store_written(self.store)
        if self.consumers and not self._scheduled:
            self._scheduled = True
            self._call_soon(self._run_delivery)
        return STORED

    # -- consumers --------------------------------------------------------------------
    def add_consumer(self, consumer: Consumer) -> None:
        if self.consumers and (consumer.exclusive or any(c.exclusive for c in self.consumers)):
            raise AccessRefused(
                f"queue '{self.name}' in vhost '{self.vhost.name}' in exclusive use"
            )
        self.consumers.append(consumer)
        self._had_consumer = True
        self._regroup()
        self.schedule_delivery()

    def remove_consumer(self, consumer: Consumer) -> None:
        """Detach a consumer; an auto-delete queue goes with its last consumer."""
        try:
            self.consumers.remove(consumer)
        except ValueError:
            return
        self._regroup()
        if self.auto_delete and self._had_consumer and not self.consumers and not self.deleted:
            self.vhost.delete_queue(self.name)

    def _regroup(self) -> None:
        groups: dict[int, list[Consumer]] = {}
        for c in self.consumers:
            groups.setdefault(c.priority, []).append(c)
        self._groups = sorted(groups.items(), key=lambda g: -g[0])

    def schedule_delivery(self) -> None:
        """Ask for a delivery pass soon; cheap to call repeatedly (once per loop turn)."""
        if not self._scheduled and self.consumers and self.store.ready_count:
            self._scheduled = True
            self._call_soon(self._run_delivery)

    def _next_consumer(self) -> Consumer | None:
        consumers = self.consumers
        if len(consumers) == 1:  # the common case: no priorities, no round-robin
            only = consumers[0]
            return only if only.can_take() else None
        for prio, group in self._groups:
            n = len(group)
            start = self._rr.get(prio, 0) % n
            for i in range(n):
                c = group[(start + i) % n]
                if c.can_take():
                    self._rr[prio] = start + i + 1
                    return c
        return None

    def _run_delivery(self) -> None:
        self._scheduled = False
        if self.deleted:
            return
        store = self.store
        for _ in range(_DELIVERY_BATCH):
            if not store.ready_count:
                return
            consumer = self._next_consumer()
            if consumer is None:
                return
            item = store.shift()
            if item is None:
                return
            seq, msg, redelivered = item
            if consumer.no_ack:
                store.ack(seq)
                self.vhost.store_written(store)
            else:
                self.unacked += 1
            consumer.deliver(seq, msg, redelivered)
        self.schedule_delivery()

    # -- pull, ack, requeue -----------------------------------------------------------
    def get(self, no_ack: bool) -> tuple[int, Message, bool] | None:
        item = self.store.shift()
        if item is None:
            return None
        if no_ack:
            self.store.ack(item[0])
            self.vhost.store_written(self.store)
        else:
            self.unacked += 1
        return item

    def ack_many(self, seqs: list[int]) -> None:
        if self.deleted:
            return
        self.unacked -= len(seqs)
        store = self.store
        ack = store.ack
        for seq in seqs:
            ack(seq)
        self.vhost.store_written(store)

    def reject(self, seq: int, msg: Message, requeue: bool) -> None:
        if self.deleted:
            return
        self.unacked -= 1
        if requeue:
            self.store.requeue(seq, msg)
            self.schedule_delivery()
        else:
            self.store.ack(seq)
            self.vhost.store_written(self.store)

    def purge(self) -> int:
        count = self.store.purge()
        self.vhost.store_written(self.store)
        return count

    # -- policies ---------------------------------------------------------------------
    def apply_policies(self, policy: Policy | None, operator_policy: Policy | None) -> None:
        """Called by the vhost when the queue is created and whenever its policies
        change; policies.effective_queue_settings tells what they enforce."""
        self.policy = policy
        self.operator_policy = operator_policy

    # -- lifecycle --------------------------------------------------------------------
    def mark_deleted(self) -> list[Consumer]:
        """Called by the vhost: stop delivering and hand back consumers to notify."""
        self.deleted = True
        consumers, self.consumers = self.consumers, []
        self._groups = []
        self.store.delete()
        return consumers
