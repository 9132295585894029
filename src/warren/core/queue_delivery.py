"""A queue's delivery passes, a part every Queue holds (``queue.delivery``).

It knows the consumers' order: the highest priority with capacity first,
round-robin within it, or the single active consumer. A pass goes to them in
turn. From a backlog each consumer's turn takes a span (MessageStore.span:
records side by side in a segment's map, framed by the consumer in one pass,
docs/architecture.md "Backlog spans"), as much of it as its credit allows
and, with several consumers, at most its share of what is ready; what a span
cannot carry goes one by one: shift() on the plain path, take() on the
featured one (expired messages dead-lettered, delivery counts shown). A pass
sends at most _DELIVERY_BATCH messages, then reschedules itself. A stream's
part is its own kind (core/stream_delivery.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from warren.core import dead_letter as dl
from warren.core.codec_errors import DecodeError
from warren.core.consumer import Consumer
from warren.core.message import Message, MessageRun
from warren.core.queue_features import RETRY_MS
from warren.core.queue_settings import with_delivery_count
from warren.core.store import StoreSpan

if TYPE_CHECKING:
    from warren.core.queue import Queue

__all__ = ["RETURNS", "QueueDelivery"]

log = logging.getLogger("warren.queue")

#: A message's returns (Queue.delivery_counts): all of them in these bits (what
#: x-delivery-count shows and the delivery limit counts), the explicit ones
#: (basic.nack and basic.reject) above: kept, and journalled by quorum queues,
#: for RabbitMQ 4.3's counting (docs/quorum-queues.md), not shown.
RETURNS = 0xFFFFFFFF

# Deliveries per scheduled run: bounds how long one busy queue holds the event loop.
_DELIVERY_BATCH = 2048


class QueueDelivery:
    """Which consumer gets the next message, and the passes that deliver the backlog."""

    def __init__(self, queue: Queue, single_active: bool) -> None:
        self.queue = queue
        #: Single active consumer (x-single-active-consumer): only it gets messages.
        self.single_active = single_active
        #: The consumer that gets the messages under single active consumer.
        self.active_consumer: Consumer | None = None
        # Consumers grouped by priority, highest first; within a group, round-robin.
        self._groups: list[tuple[int, list[Consumer]]] = []
        self._rr: dict[int, int] = {}
        self._scheduled = False
        self._call_soon: Callable[[Callable[[], None]], Any] = queue.vhost.call_soon

    # -- consumers ----------------------------------------------------------------------
    def added(self, consumer: Consumer) -> None:
        """A consumer was attached (the queue's list has it)."""
        self._regroup()
        if self.single_active and self.active_consumer is None:
            self.active_consumer = consumer

    def removed(self, consumer: Consumer) -> None:
        """A consumer was detached: the next takes over from an active one, the
        highest priority, then the oldest."""
        self._regroup()
        if consumer is self.active_consumer:
            consumers = self.queue.consumers
            self.active_consumer = max(consumers, key=lambda c: c.priority) if consumers else None
            self.schedule()

    def stop(self) -> None:
        """The queue is deleted: no consumer any more."""
        self._groups = []
        self.active_consumer = None

    def _regroup(self) -> None:
        groups: dict[int, list[Consumer]] = {}
        for c in self.queue.consumers:
            groups.setdefault(c.priority, []).append(c)
        self._groups = sorted(groups.items(), key=lambda g: -g[0])

    def next_consumer(self) -> Consumer | None:
        """The consumer the next message goes to, or None when none can take it."""
        consumers = self.queue.consumers
        if len(consumers) == 1:  # the common case: no priorities, no round-robin
            only = consumers[0]
            return only if only.can_take() else None
        if self.single_active:
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

    def run_consumer(self) -> Consumer | None:
        """The one consumer a run goes to whole (Queue.publish_run): the only one,
        or the active one; None with several."""
        consumers = self.queue.consumers
        if len(consumers) == 1:
            return consumers[0]
        return self.active_consumer if self.single_active else None

    def round_robin_run(self, run: MessageRun) -> int:
        """Deliver a whole run round-robin within the highest priority, as
        next_consumer would go, when every consumer there takes whatever comes
        (no-ack, not blocked) and each has its own stream (the interleaving on
        one channel stays): how many (0: not so)."""
        prio, group = self._groups[0]
        k = len(group)
        streams = set()
        n = len(run)
        for c in group:
            if not c.no_ack or not c.can_take() or c.no_ack_credit(n) < n:
                return 0  # (a consumer short of credit: one by one, as next_consumer goes)
            streams.add(id(c.delivery_stream()))
        if len(streams) != k:
            return 0
        first = self._rr.get(prio, 0) % k
        self._rr[prio] = first + n
        self.queue.stats.publish += n
        for j in range(min(k, n)):
            group[(first + j) % k].deliver_run(run, j, n, k)
        return n

    # -- passes -------------------------------------------------------------------------
    def schedule(self) -> None:
        """Ask for a delivery pass soon; cheap to call repeatedly (once per loop turn)."""
        q = self.queue
        if not self._scheduled and q.consumers and q.store.ready_count:
            self._scheduled = True
            self._call_soon(self.run)

    def stored(self) -> None:
        """A message was just stored ready: a pass soon, if anyone consumes."""
        if not self._scheduled and self.queue.consumers:
            self._scheduled = True
            self._call_soon(self.run)

    def run(self) -> None:
        """A delivery pass (scheduled)."""
        self._scheduled = False
        q = self.queue
        if q.deleted:
            return
        try:
            if q.plain:
                self._run_plain()
            else:
                self._run_featured()
        except Exception:
            # A bug must not stop the queue for good: log it, try again later.
            log.exception(
                "queue '%s' in vhost '%s': delivering messages failed", q.name, q.vhost.name
            )
            if not self._scheduled:
                self._scheduled = True
                q.clock.call_later(RETRY_MS, self.run)

    def _run_plain(self) -> None:
        q = self.queue
        store = q.store
        budget = _DELIVERY_BATCH
        while budget > 0:
            if not store.ready_count:
                return
            consumer = self.next_consumer()
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
                q.vhost.store_written(store)
            else:
                q.unacked += 1
                q.unacked_bytes += len(msg.body)
            consumer.deliver(seq, msg, redelivered)
            budget -= 1
        self.schedule()

    def _run_featured(self) -> None:
        q = self.queue
        store = q.store
        now = q.clock.now_ms()
        # A span stops before an expired record (queue TTL: timestamp + TTL <= now)
        # and one with its own expiration: take() deals with those.
        features = q.features
        ttl = features.ttl
        expired_at = now - ttl if ttl is not None and now >= ttl else -1
        own_expiry = features.has_expiring
        counts = q.delivery_counts
        budget = _DELIVERY_BATCH
        while budget > 0:
            if not store.ready_count:
                return
            consumer = self.next_consumer()
            if consumer is None:
                return
            n = self._span_to(consumer, budget, expired_at, own_expiry)
            if n:
                budget -= n
                continue
            item = self.take(now)
            if item is None:
                return
            seq, msg, redelivered = item
            if consumer.no_ack:
                store.ack(seq)
                counts.pop(seq, None)
                q.vhost.store_written(store)
            else:
                q.unacked += 1
                q.unacked_bytes += len(msg.body)
            consumer.deliver(seq, msg, redelivered)
            budget -= 1
        self.schedule()

    def _span_to(self, consumer: Consumer, budget: int, expired_at: int, own_expiry: bool) -> int:
        """As many of the next ready records as the consumer's credit allows (and
        the budget; with several consumers, their share of what is ready), framed
        in one pass from the store's map and written at once: a run per
        consumer turn. How many (0: one by one, as the store or consumer wants).
        A record with a delivery count to show (a quorum queue's, kept over a
        restart) ends the span: take() adds the header."""
        if not consumer.takes_spans():
            return 0
        credit = budget if consumer.no_ack else consumer.run_credit(budget)
        q = self.queue
        store = q.store
        consumers = len(q.consumers)
        if consumers > 1 and not self.single_active:
            credit = min(credit, -(-store.ready_count // consumers))
        if credit < 1:
            return 0
        span = store.span()
        if span is None:
            return 0
        if q.delivery_counts:
            self._stop_at_counted(span)
        stored = consumer.deliver_span(span, min(credit, span.left), expired_at, own_expiry)
        if stored is None:
            return 0
        n = len(stored)
        no_ack = consumer.no_ack
        store.take_span(span, stored, no_ack)
        if no_ack:
            store.ack_run(stored.segment, stored.offsets)
            q.vhost.store_written(store)
        else:
            q.unacked += n
            q.unacked_bytes += sum(stored.sizes)
        return n

    def _stop_at_counted(self, span: StoreSpan) -> None:
        """End ``span`` before its first record that has a delivery count."""
        base = span.segment << 32
        first, end = base | span.pos, base | span.limit
        counts = self.queue.delivery_counts
        cut = min((seq for seq in counts if first <= seq < end), default=end)
        span.limit = cut - base

    def take(self, now: int) -> tuple[int, Message, bool] | None:
        """Shift the next live message: expired ones met on the way are dead-lettered,
        and a redelivery carries its x-delivery-count."""
        q = self.queue
        store = q.store
        features = q.features
        counts = q.delivery_counts
        while True:
            item = store.shift()
            if item is None:
                return None
            seq, msg, redelivered = item
            if features.expiring and seq not in features.stuck:
                deadline = features.deadline(msg)
                if deadline is not None and deadline <= now:
                    store.ack(seq)
                    counts.pop(seq, None)
                    q.vhost.store_written(store)
                    features.let_go(seq, msg, dl.EXPIRED, now)
                    continue
            count = 0
            if counts:  # every return, as the delivery limit counts them
                count = counts.get(seq, 0) & RETURNS
            if count:
                try:
                    msg = with_delivery_count(msg, count)
                except DecodeError:
                    # Properties stored before publish validated them: delivered as
                    # they are rather than failing whoever asked for the message.
                    log.warning(
                        "queue '%s' in vhost '%s': cannot add x-delivery-count to a "
                        "message with unreadable properties; delivered without it",
                        q.name,
                        q.vhost.name,
                    )
            return seq, msg, redelivered
