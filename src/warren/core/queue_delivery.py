"""A queue's delivery passes (Queue's base, between it and QueueFeatures).

A pass goes to the consumers in turn: the highest priority with capacity
first, round-robin within it, or the single active consumer. From a backlog
each consumer's turn takes a span (MessageStore.span: records side by side
in a segment's map, framed by the consumer in one pass, docs/architecture.md
"Backlog spans"), as much of it as its credit allows and, with several
consumers, at most its share of what is ready; what a span cannot carry
goes one by one: shift() on the plain path, _take() on the featured one
(expired messages dead-lettered, delivery counts shown). A pass sends at
most _DELIVERY_BATCH messages, then reschedules itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from mypy_extensions import mypyc_attr

from warren.core import dead_letter as dl
from warren.core.codec_errors import DecodeError
from warren.core.consumer import Consumer
from warren.core.message import Message
from warren.core.queue_features import RETRY_MS, QueueFeatures
from warren.core.queue_settings import with_delivery_count
from warren.core.store import StoreSpan

__all__ = ["RETURNS", "QueueDelivery"]

log = logging.getLogger("warren.queue")

#: A message's returns (_delivery_counts): all of them in these bits (what
#: x-delivery-count shows and the delivery limit counts), the explicit ones
#: (basic.nack and basic.reject) above: kept, and journalled by quorum queues,
#: for RabbitMQ 4.3's counting (docs/quorum-queues.md), not shown.
RETURNS = 0xFFFFFFFF

# Deliveries per scheduled run: bounds how long one busy queue holds the event loop.
_DELIVERY_BATCH = 2048


# Queue's base; Queue is subclassed by core/exchange_delayed.py, not compiled.
@mypyc_attr(allow_interpreted_subclasses=True)
class QueueDelivery(QueueFeatures):
    """The delivery passes of a Queue (which sets the state declared here)."""

    # Consumers grouped by priority, highest first; within a group, round-robin.
    _groups: list[tuple[int, list[Consumer]]]
    _rr: dict[int, int]
    _single_active: bool
    active_consumer: Consumer | None
    _scheduled: bool
    _call_soon: Callable[[Callable[[], None]], Any]
    unacked: int
    unacked_bytes: int

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
        if self._single_active:
            active = self.active_consumer
            return active if active is not None and active.can_take() else None
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
        try:
            if self._plain:
                self._run_delivery_plain()
            else:
                self._run_delivery_featured()
        except Exception:
            # A bug must not stop the queue for good: log it, try again later.
            log.exception(
                "queue '%s' in vhost '%s': delivering messages failed", self.name, self.vhost.name
            )
            if not self._scheduled:
                self._scheduled = True
                self.clock.call_later(RETRY_MS, self._run_delivery)

    def _run_delivery_plain(self) -> None:
        store = self.store
        budget = _DELIVERY_BATCH
        while budget > 0:
            if not store.ready_count:
                return
            consumer = self._next_consumer()
            if consumer is None:
                return
            n = self._span_to(consumer, budget, -1, False)
            if n:
                budget -= n
                continue
            item = store.shift()
            if item is None:
                return
            seq, msg, redelivered = item
            if consumer.no_ack:
                store.ack(seq)
                self.vhost.store_written(store)
            else:
                self.unacked += 1
                self.unacked_bytes += len(msg.body)
            consumer.deliver(seq, msg, redelivered)
            budget -= 1
        self.schedule_delivery()

    def _run_delivery_featured(self) -> None:
        store = self.store
        now = self.clock.now_ms()
        # A span stops before an expired record (queue TTL: timestamp + TTL <= now)
        # and one with its own expiration: _take deals with those.
        ttl = self._ttl
        expired_at = now - ttl if ttl is not None and now >= ttl else -1
        own_expiry = self._has_expiring
        budget = _DELIVERY_BATCH
        while budget > 0:
            if not store.ready_count:
                return
            consumer = self._next_consumer()
            if consumer is None:
                return
            n = self._span_to(consumer, budget, expired_at, own_expiry)
            if n:
                budget -= n
                continue
            item = self._take(now)
            if item is None:
                return
            seq, msg, redelivered = item
            if consumer.no_ack:
                store.ack(seq)
                self._delivery_counts.pop(seq, None)
                self.vhost.store_written(store)
            else:
                self.unacked += 1
                self.unacked_bytes += len(msg.body)
            consumer.deliver(seq, msg, redelivered)
            budget -= 1
        self.schedule_delivery()

    def _span_to(self, consumer: Consumer, budget: int, expired_at: int, own_expiry: bool) -> int:
        """As many of the next ready records as the consumer's credit allows (and
        the budget; with several consumers, their share of what is ready), framed
        in one pass from the store's map and written at once: a run per
        consumer turn. How many (0: one by one, as the store or consumer wants).
        A record with a delivery count to show (a quorum queue's, kept over a
        restart) ends the span: _take adds the header."""
        if not consumer.takes_spans():
            return 0
        credit = budget if consumer.no_ack else consumer.run_credit(budget)
        store = self.store
        consumers = len(self.consumers)
        if consumers > 1 and not self._single_active:
            credit = min(credit, -(-store.ready_count // consumers))
        if credit < 1:
            return 0
        span = store.span()
        if span is None:
            return 0
        if self._delivery_counts:
            self._stop_at_counted(span)
        stored = consumer.deliver_span(span, min(credit, span.left), expired_at, own_expiry)
        if stored is None:
            return 0
        n = len(stored)
        no_ack = consumer.no_ack
        store.take_span(span, stored, no_ack)
        if no_ack:
            store.ack_run(stored.segment, stored.offsets)
            self.vhost.store_written(store)
        else:
            self.unacked += n
            self.unacked_bytes += sum(stored.sizes)
        return n

    def _stop_at_counted(self, span: StoreSpan) -> None:
        """End ``span`` before its first record that has a delivery count."""
        base = span.segment << 32
        first, end = base | span.pos, base | span.limit
        cut = min((seq for seq in self._delivery_counts if first <= seq < end), default=end)
        span.limit = cut - base

    def _take(self, now: int) -> tuple[int, Message, bool] | None:
        """Shift the next live message: expired ones met on the way are dead-lettered,
        and a redelivery carries its x-delivery-count."""
        store = self.store
        while True:
            item = store.shift()
            if item is None:
                return None
            seq, msg, redelivered = item
            if (self._ttl is not None or self._has_expiring) and seq not in self._stuck:
                deadline = self._deadline(msg)
                if deadline is not None and deadline <= now:
                    store.ack(seq)
                    self._delivery_counts.pop(seq, None)
                    self.vhost.store_written(store)
                    self._let_go(seq, msg, dl.EXPIRED, now)
                    continue
            count = 0
            if self._delivery_counts:  # every return, as the delivery limit counts them
                count = self._delivery_counts.get(seq, 0) & RETURNS
            if count:
                try:
                    msg = with_delivery_count(msg, count)
                except DecodeError:
                    # Properties stored before publish validated them: delivered as
                    # they are rather than failing whoever asked for the message.
                    log.warning(
                        "queue '%s' in vhost '%s': cannot add x-delivery-count to a "
                        "message with unreadable properties; delivered without it",
                        self.name,
                        self.vhost.name,
                    )
            return seq, msg, redelivered
