"""A stream's delivery part (``queue.delivery`` of a StreamQueue): its readers
and the passes that deliver to them.

Each consumer is a reader with its own cursor on the log (and filter, offset
tracking, what is in flight). A pass goes round-robin over the readers that
can take more, up to a batch: a chunk record whole to a consumer that takes
them (Consumer.deliver_chunk: the stream protocol's; nothing to settle; with
``x-stream-filter`` values a chunk record, which holds no filter value,
goes whole when the consumer matches unfiltered and is passed over whole
otherwise, as RabbitMQ's chunk filter does), a span of records framed at
once where a reader has no filter and credit for two or more
(Consumer.deliver_records, or deliver_entries for a chunk record's simple
messages: delivery seqs ``(-span id << 32) | i``), else one by one (a seq
of its own).
A filter is 0-9-1's ``x-stream-filter`` values and, for a protocol that has
more (AMQP 1.0's property filters), the consumer's ``message_filter``; a
record it skips is never delivered, so nothing waits for its settlement, and
skipped records count against the batch, so a reader that matches little
does not hold the loop. core/stream_queue.py's StreamSettlement settles them.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from warren.core.consumer import Consumer
from warren.core.message import Message
from warren.core.queue_delivery import QueueDelivery
from warren.core.stream import filter_wants

if TYPE_CHECKING:
    from warren.core.consumer import MessageFilter
    from warren.core.queue import Queue

__all__ = ["Reader", "Span", "StreamDelivery"]

log = logging.getLogger("warren.stream")

# Deliveries per scheduled run, over all consumers.
_DELIVERY_BATCH = 2048


class Reader:
    """A consumer of the stream: its cursor, filter, tracking and what is in flight."""

    __slots__ = (
        "consumer",
        "cursor",
        "filters",
        "match_unfiltered",
        "predicate",
        "plain",
        "chunks",
        "entries",
        "entries_from",
        "scanning",
        "tracking",
        "in_flight",
        "returned",
    )

    def __init__(
        self,
        consumer: Consumer,
        cursor: Any,
        filters: frozenset[str] | None,
        match_unfiltered: bool,
        tracking: str | None,
        predicate: MessageFilter | None = None,
    ) -> None:
        self.consumer = consumer
        self.cursor = cursor
        self.filters = filters
        self.match_unfiltered = match_unfiltered
        #: The consumer's own filter (Consumer.message_filter), after ``filters``.
        self.predicate = predicate
        #: No filter of either kind: the delivery pass's fast path (spans).
        self.plain = filters is None and predicate is None
        #: Takes chunk records whole (Consumer.takes_chunks): no predicate and
        #: no offset to track per message; ``filters`` decide per chunk record.
        self.chunks = predicate is None and tracking is None and consumer.takes_chunks()
        #: Frames a chunk record's messages at once (Consumer.takes_entries).
        self.entries = self.plain and consumer.takes_entries()
        #: Where that can start again: the end of a chunk record with a message
        #: it could not frame (the rest of that record goes one by one).
        self.entries_from = 0
        #: Its filter skipped a whole batch: the next pass reads on.
        self.scanning = False
        self.tracking = tracking
        self.in_flight: dict[int, None] = {}  # offsets delivered, not acked (in order)
        # The oldest offset given back with a reject or nack (or by a closing
        # channel): not processed, so tracking never moves past it.
        self.returned: int | None = None

    def resume_offset(self) -> int:
        """Where this consumer would start again: its oldest delivery not acked
        (in flight or given back), else the next message it would read."""
        offset = int(self.cursor.offset)
        for oldest in self.in_flight:
            offset = oldest
            break
        returned = self.returned
        return offset if returned is None or returned > offset else returned

    def wants(self, msg: Message) -> bool:
        filters = self.filters
        if filters is not None and not filter_wants(filters, self.match_unfiltered, msg.headers):
            return False
        predicate = self.predicate
        return predicate is None or predicate(msg)


class Span:
    """Deliveries a consumer got at once from consecutive records (the backlog path):
    sequence numbers ``(-id << 32) | i`` for offsets ``first + i``, ``left`` not acked."""

    __slots__ = ("reader", "first", "left")

    def __init__(self, reader: Reader, first: int, left: int) -> None:
        self.reader = reader
        self.first = first
        self.left = left


class StreamDelivery(QueueDelivery):
    """A stream's readers, their deliveries in flight, and the delivery passes."""

    def __init__(self, queue: Queue) -> None:
        super().__init__(queue, False)
        #: The readers, by id() of their consumer.
        self.readers: dict[int, Reader] = {}
        #: Deliveries made one by one: seq -> (reader, offset).
        self.deliveries: dict[int, tuple[Reader, int]] = {}
        self._next_delivery = 1
        #: Deliveries made a span at once: span id -> span.
        self.spans: dict[int, Span] = {}
        self._next_span = 1
        self._turn = 0

    def schedule(self) -> None:
        if not self._scheduled and self.readers and not self.queue.deleted:
            self._scheduled = True
            self._call_soon(self.run)

    def stored(self) -> None:
        self.schedule()

    def scanning(self, consumer: Consumer) -> bool:
        """StreamQueue.scanning: the consumer's filter ended a pass, the next one is
        scheduled, and the consumer can take what it finds."""
        reader = self.readers.get(id(consumer))
        return reader is not None and reader.scanning and self._scheduled and consumer.can_take()

    def stop(self) -> None:
        """The stream is deleted: every reader's cursor closes."""
        for reader in self.readers.values():
            reader.cursor.close()
        self.readers.clear()
        self.deliveries.clear()
        self.spans.clear()

    def run(self) -> None:
        """A delivery pass (scheduled)."""
        self._scheduled = False
        q = self.queue
        if q.deleted:
            return
        try:
            more = self._deliver_some()
        except Exception:
            log.exception(
                "stream '%s' in vhost '%s': delivering messages failed", q.name, q.vhost.name
            )
            return
        if more:
            self.schedule()

    def _deliver_some(self) -> bool:
        """Deliver to every consumer that can take more, round-robin, up to a batch;
        True when a consumer could take more and has more to read."""
        readers = list(self.readers.values())
        if not readers:
            return False
        budget = _DELIVERY_BATCH
        n = len(readers)
        start = self._turn % n
        self._turn += 1
        active = [readers[(start + i) % n] for i in range(n)]
        while active and budget:
            still: list[Reader] = []
            for reader in active:
                consumer = reader.consumer
                if not consumer.can_take():
                    continue
                cursor = reader.cursor
                if reader.chunks:
                    got = cursor.chunk()
                    if got is not None:
                        first, count, m, start, end = got
                        if reader.filters is None or reader.match_unfiltered:
                            consumer.deliver_chunk(first, count, m[start:end])
                        budget = max(budget - count, 0)
                        still.append(reader)
                        if not budget:
                            return True
                        continue
                if reader.plain:
                    n = self._deliver_span(reader, budget)
                    if n:
                        budget -= n
                        still.append(reader)
                        if not budget:
                            return True
                        continue
                item = cursor.next()
                if not reader.plain:
                    while item is not None and not reader.wants(item[1]):
                        budget -= 1
                        if not budget:
                            reader.scanning = True  # the next pass reads on
                            return True
                        item = cursor.next()
                    reader.scanning = False
                if item is None:
                    continue
                offset, msg = item
                seq = self._next_delivery
                self._next_delivery = seq + 1
                self.deliveries[seq] = (reader, offset)
                reader.in_flight[offset] = None
                self.queue.unacked += 1
                consumer.deliver(seq, msg, False)
                budget -= 1
                still.append(reader)
                if not budget:
                    return True
            active = still
        return False

    def _deliver_span(self, reader: Reader, budget: int) -> int:
        """As many of the reader's next records as its consumer's credit allows, framed
        in one pass (Consumer.deliver_records) when it can; how many (0: go one by one)."""
        consumer = reader.consumer
        credit = consumer.run_credit(budget)
        if credit < 2:
            return 0
        cursor = reader.cursor
        if cursor.offset < reader.entries_from:
            return 0  # inside a chunk record that goes one by one
        span = cursor.span()
        sid = self._next_span
        if span is not None:
            first = int(cursor.offset)
            buf, pos, seed, left = span
            n, end = consumer.deliver_records(buf, pos, len(buf), seed, min(credit, left), -sid)
            if not n:
                return 0
            cursor.skip(n, end)
        else:
            # A chunk record's entries (or caught up): framed at once by a consumer that can.
            got = cursor.entries() if reader.entries else None
            if got is None:
                return 0
            buf, pos, end, left, ts, routing_key, decoder = got
            first = int(cursor.offset)
            n, end = consumer.deliver_entries(
                buf, pos, end, min(credit, left), first, ts, routing_key, decoder, -sid
            )
            if not n:
                reader.entries_from = first + left
                return 0
            cursor.skip_entries(n, end)
        self._next_span = sid + 1
        self.spans[sid] = Span(reader, first, n)
        if reader.tracking is not None:
            in_flight = reader.in_flight
            for offset in range(first, first + n):
                in_flight[offset] = None
        self.queue.unacked += n
        return n
