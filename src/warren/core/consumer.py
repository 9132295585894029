"""What a queue needs from a consumer, whatever protocol the consumer speaks."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import TypeAlias

    from warren.core.deliveries import Deliveries
    from warren.core.message import Message, MessageRun
    from warren.core.queue import Queue
    from warren.core.store import StoredRun, StoreSpan

    #: A consumer's own test of a stream's messages (Consumer.message_filter).
    MessageFilter: TypeAlias = Callable[[Message], bool]


class Consumer(ABC):
    """A subscription to one queue, delivering into a client session's delivery
    stream (core/deliveries.py). Protocol adapters subclass it.

    The queue asks ``can_take`` before every delivery, so prefetch limits, flow
    control and a full socket buffer all stop delivery in the same place; the
    prefetch part is the core's (has_credit, prefetch_credit).
    """

    __slots__ = (
        "tag",
        "queue",
        "no_ack",
        "exclusive",
        "priority",
        "arguments",
        "deliveries",
        "prefetch_count",
        "prefetch_size",
        "unacked_count",
        "unacked_bytes",
    )

    def __init__(
        self,
        deliveries: Deliveries,
        tag: str,
        queue: Queue,
        no_ack: bool,
        exclusive: bool = False,
        priority: int = 0,
        arguments: dict[str, Any] | None = None,
        prefetch_count: int = 0,
        prefetch_size: int = 0,
    ) -> None:
        self.deliveries = deliveries
        self.tag = tag
        self.queue = queue
        self.no_ack = no_ack
        self.exclusive = exclusive
        self.priority = priority
        self.arguments = arguments or {}
        #: Unsettled deliveries this consumer takes at most (0: no limit), and
        #: their body bytes (0: no limit).
        self.prefetch_count = prefetch_count
        self.prefetch_size = prefetch_size
        #: Its unsettled deliveries and their body bytes (Deliveries keeps them).
        self.unacked_count = 0
        self.unacked_bytes = 0

    def has_credit(self) -> bool:
        """Whether the prefetch limits (this consumer's, its delivery stream's)
        allow another delivery."""
        if self.no_ack:
            return True
        count = self.prefetch_count
        if count and self.unacked_count >= count:
            return False
        size = self.prefetch_size
        if size and self.unacked_bytes >= size:
            return False
        return self.deliveries.has_room()

    def prefetch_credit(self, n: int) -> int:
        """How many of ``n`` more deliveries the prefetch counts allow at once
        (this consumer's, its stream's); 0 under a prefetch size, which needs
        the sizes one by one."""
        deliveries = self.deliveries
        if self.prefetch_size or deliveries.prefetch_size:
            return 0
        if self.prefetch_count:
            n = min(n, self.prefetch_count - self.unacked_count)
        if deliveries.prefetch_count:
            n = min(n, deliveries.prefetch_count - deliveries.consumer_unsettled)
        return n

    @abstractmethod
    def can_take(self) -> bool: ...

    def credit_limit(self) -> int:
        """How many unacknowledged deliveries this consumer takes (0: no limit set);
        a stream refuses a consumer without one, as RabbitMQ does."""
        return self.prefetch_count

    def message_filter(self) -> MessageFilter | None:
        """Which of a stream's messages this consumer wants, beyond its arguments'
        ``x-stream-filter`` (None: all): a protocol's own filters, such as AMQP
        1.0's property filters, which are no consumer arguments of 0-9-1's."""
        return None

    @abstractmethod
    def deliver(self, seq: int, msg: Message, redelivered: bool) -> None:
        """Hand over one message; with no_ack the queue has already forgotten it."""

    def deliver_run(self, run: MessageRun, start: int, stop: int, step: int = 1) -> None:
        """Messages ``start, start + step, ... < stop`` of a run, in order, to this
        no-ack consumer, which the queue found able to take them
        (Queue.publish_run; step > 1: its share of a round-robin). One by one
        here; a protocol adapter may write them all at once."""
        for i in range(start, stop, step):
            self.deliver(0, run.message(i), False)

    def no_ack_credit(self, n: int) -> int:
        """How many of a run's next ``n`` messages this no-ack consumer takes at
        once (Queue.publish_run, round_robin_run): all, as here, for a consumer
        that takes whatever comes; fewer for one whose client gives credit
        (an AMQP 1.0 link)."""
        return n

    def run_credit(self, n: int) -> int:
        """How many of a run's next ``n`` messages this acknowledging consumer
        takes at once (Queue.publish_run stores them in one write, then calls
        deliver_stored_run); 0, as here: one by one."""
        return 0

    def deliver_stored_run(self, run: MessageRun, start: int, stop: int, stored: StoredRun) -> None:
        """Messages ``start .. stop - 1`` of a run to this acknowledging consumer,
        which the queue stored as ``stored`` (message ``start + i`` has sequence
        number ``stored.seq(i)``). One by one here."""
        for i in range(start, stop):
            self.deliver(stored.seq(i - start), run.message(i), False)

    def deliver_records(
        self, buf: Any, pos: int, limit: int, seed: int, max_n: int, segment: int
    ) -> tuple[int, int]:
        """The next stored records of a stream, at most ``max_n`` from ``buf[pos:limit]``
        (a segment's memory map, CRCs seeded with ``seed``), to this acknowledging
        consumer in one go: delivery ``i`` has sequence number ``(segment << 32) | i``.
        Returns how many were delivered and where the next record starts; (0, pos),
        as here, when they go one by one (StreamCursor.next and deliver)."""
        return 0, pos

    def takes_entries(self) -> bool:
        """Whether deliver_entries can take a chunk record's messages at all (else
        a stream reader does not ask its cursor for them)."""
        return False

    def deliver_entries(
        self,
        buf: Any,
        pos: int,
        end: int,
        max_n: int,
        offset: int,
        ts: int,
        routing_key: str,
        decoder: Any,
        segment: int,
    ) -> tuple[int, int]:
        """A stream's chunk record's next entries, at most ``max_n`` from ``buf[pos:end]``
        (StreamCursor.entries: offsets from ``offset`` on, timestamp ``ts``, the
        store's routing key and EntryDecoder), to this acknowledging consumer
        in one go, as deliver_records delivers records. Returns how many were
        delivered and where the next entry starts; (0, pos), as here, when
        they go one by one (StreamCursor.next and deliver)."""
        return 0, pos

    def takes_chunks(self) -> bool:
        """Whether this stream consumer takes a stream's chunk records whole
        (deliver_chunk: the stream protocol's subscriptions send them as they
        are), else their messages one by one, as here."""
        return False

    def deliver_chunk(self, first: int, count: int, chunk: bytes) -> None:
        """A stream's chunk record, whole: ``chunk`` (osiris header and data
        entries) holds offsets ``first .. first + count - 1``; no delivery to
        settle (such a consumer has no acks: its credit is its flow control)."""
        raise NotImplementedError

    def takes_spans(self) -> bool:
        """Whether deliver_span can take records at all (else the queue does not
        ask its store for spans)."""
        return False

    def deliver_span(
        self, span: StoreSpan, max_n: int, expired_at: int = -1, own_expiry: bool = False
    ) -> StoredRun | None:
        """A queue's next ready records (``span``), at most ``max_n`` of them, to
        this consumer in one go, framed straight from the store's map: what the
        consumer took as a StoredRun (their segment, offsets and body sizes),
        ``span.end`` set to where the next record starts; the queue then counts
        them shifted (and, for a no-ack consumer, acked). The records stop
        before one whose timestamp is at or below ``expired_at`` or, with
        ``own_expiry``, one with its own expiration: the queue takes those one
        by one. None, as here: one by one (shift and deliver)."""
        return None

    def delivery_stream(self) -> object:
        """What orders this consumer's deliveries on the wire (AMQP: its channel):
        a run is shared out among consumers only if each has its own."""
        return self

    @abstractmethod
    def cancelled(self) -> None:
        """The queue went away (deleted) while this consumer was attached."""
