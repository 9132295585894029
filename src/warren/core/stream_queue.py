"""A stream queue (``x-queue-type: stream``): an append-only log that many consumers read.

Publishing appends to the stream's log (core/stream.py's StreamLog, kept on a
segment log by store/stream_store.py); consuming never removes anything. Each
consumer has its own cursor, starts where its ``x-stream-offset`` says, and
gets every message with the ``x-stream-offset`` and ``x-stream-timestamp``
headers it was stored with. As in RabbitMQ a stream consumer needs a prefetch
limit and manual acks: an ack only returns credit. Retention removes whole
segments from the front (``x-max-length``, ``x-max-length-bytes``,
``x-max-age``, by argument or policy), looked at on every publish and, for
age, once a minute.

Server-side offset tracking (LavinMQ's rules): a consumer with a tag and
``x-stream-automatic-offset-tracking: true``, or with ``x-stream-offset`` set
to void, resumes where it left off. Unlike LavinMQ, what is stored is the
offset after the last message acknowledged in order, so a message delivered
but not acknowledged before a disconnect or a restart is delivered again.

StreamQueue keeps the Queue interface (VHost and the protocol adapters treat it
as any queue) and replaces what a stream does differently: its delivery part
is core/stream_delivery.py's StreamDelivery (the readers and their passes),
its settler StreamSettlement (here), and it overrides publishing, consuming
and what a stream refuses.
"""

from __future__ import annotations

import contextlib
import logging
from array import array
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from warren.core.consumer import Consumer
from warren.core.errors import NotImplemented_, PreconditionFailed
from warren.core.message import Message, MessageRun
from warren.core.queue import DELIVERED, STORED, Queue
from warren.core.queue_delivery import QueueDelivery
from warren.core.queue_settle import QueueSettlement
from warren.core.stream import (
    StartSpec,
    StreamLog,
    parse_interval,
    parse_start,
)
from warren.core.stream_delivery import Reader, StreamDelivery

if TYPE_CHECKING:
    from warren.core.dedup import Deduplicator, KeyEntry
    from warren.core.policies import Policy
    from warren.core.queue import Held
    from warren.core.store import MessageStore
    from warren.core.vhost import VHost

__all__ = ["StreamQueue"]

log = logging.getLogger("warren.stream")

# How often retention by age is looked at (and after every new segment).
_RETENTION_INTERVAL_MS = 60_000


class StreamQueue(Queue):
    """A durable, append-only queue read by offset; see the module docstring."""

    keeps_every_message = True
    queue_type = "stream"
    queue_module = "rabbit_stream_queue"
    #: The delivery part (``delivery``), as its own kind: the readers.
    reading: StreamDelivery

    def __init__(
        self,
        vhost: VHost,
        name: str,
        stream: StreamLog,
        arguments: dict[str, Any] | None = None,
    ) -> None:
        self.stream = stream
        self._retention_timer: Any = None
        # Retention (arguments or policies, _configure).
        self._max_length: int | None = None
        self._max_bytes: int | None = None
        self._max_age_ms: int | None = None
        # Queue's store is a classic MessageStore; a stream's storage serves the few
        # calls VHost makes on any queue's store (flush, sync, close, delete, counts).
        super().__init__(
            vhost,
            name,
            cast("MessageStore", stream),
            durable=True,
            exclusive_owner=None,
            auto_delete=False,
            arguments=arguments,
        )

    def __repr__(self) -> str:
        return f"<StreamQueue {self.name!r} in {self.vhost.name!r}>"

    # -- settings -------------------------------------------------------------------------
    def _configure(self, settings: dict[str, Any]) -> None:
        """Retention settings (arguments, or merged with policies) apply at once."""
        self.settings = settings
        self._max_length = settings.get("max-length")
        self._max_bytes = settings.get("max-length-bytes")
        age = settings.get("max-age")
        if age is None:
            age = self.arguments.get("x-max-age")
        if isinstance(age, bytes):
            age = age.decode("utf-8", "surrogateescape")
        self._max_age_ms = parse_interval(age) if isinstance(age, str) else None
        self.plain = False
        if not self.deleted:
            self._apply_retention()

    def apply_policies(self, policy: Policy | None, operator_policy: Policy | None) -> None:
        from warren.core.policies import effective_queue_settings

        self.policy = policy
        self.operator_policy = operator_policy
        settings = effective_queue_settings(self.arguments, policy, operator_policy)
        for source in (operator_policy, policy):
            if source is not None and "max-age" in source.definition and "max-age" not in settings:
                settings["max-age"] = source.definition["max-age"]
        self._configure(settings)

    def _apply_retention(self) -> None:
        try:
            self.stream.apply_retention(
                self._max_length, self._max_bytes, self._max_age_ms, self.clock.now_ms()
            )
        except Exception:
            log.exception("stream '%s' in vhost '%s': retention failed", self.name, self.vhost.name)
        if self._max_age_ms is not None and self._retention_timer is None:
            self._retention_timer = self.clock.call_later(
                _RETENTION_INTERVAL_MS, self._on_retention_timer
            )

    def _on_retention_timer(self) -> None:
        self._retention_timer = None
        if not self.deleted:
            self._apply_retention()

    # -- counts ---------------------------------------------------------------------------
    @property
    def message_count(self) -> int:
        return self.stream.ready_count

    # -- publishing -----------------------------------------------------------------------
    def publish(self, msg: Message) -> int:
        self.stats.publish += 1
        if self._dedup is not None and self._dedup.seen(msg):
            return DELIVERED  # a duplicate: accepted and dropped, as a queue does
        self.stream.append(msg)
        self.vhost.store_written(self.store)
        if self._max_length is not None or self._max_bytes is not None or self._max_age_ms:
            self._apply_retention()
        self.reading.schedule()
        return STORED

    def publish_run(
        self,
        run: MessageRun,
        durable_out: list[MessageStore] | None = None,
        lost_out: list[int] | None = None,
    ) -> int:
        """All of a run of publishes at once (amqp/publishing.py's publish runs):
        each message is checked against the deduplication cache as `publish`
        does (its key read from the property list: no Message), the others are
        appended with consecutive offsets in as few pieces as segments they
        fill (StreamStore.append_stretches: stamped and encoded together), and
        retention and delivery are looked at once. ``durable_out`` gets the
        stream: the run's confirms wait for its sync, as each message's would;
        ``lost_out`` the indexes of the messages a failed write-out dropped
        while the run was stored (their confirms are nacks)."""
        n = len(run)
        self.stats.publish += n
        dedup = self._dedup
        if dedup is None:
            self.stream.append_stretches(run, ((0, n),), lost_out)
        else:
            stretches: list[tuple[int, int]] = []
            lo = 0
            raw = run.raw
            for i in range(n):
                if dedup.seen_properties(raw.properties(i)):  # a duplicate, dropped
                    if lo < i:
                        stretches.append((lo, i))
                    lo = i + 1
            if lo < n:
                stretches.append((lo, n))
            self.stream.append_stretches(run, stretches, lost_out)
        self.vhost.store_written(self.store)
        if self._max_length is not None or self._max_bytes is not None or self._max_age_ms:
            self._apply_retention()
        self.reading.schedule()
        if durable_out is not None:
            durable_out.append(self.store)
        return n

    def takes_chunks(self) -> bool:
        """Whether a chunk of published entries may be stored as it came
        (publish_chunk): nothing this stream does needs each message read
        (deduplication by header is the one such feature)."""
        return self._dedup is None and not self.deleted

    def publish_chunk(
        self,
        data: bytes | memoryview,
        count: int,
        ts: int,
        reference: str = "",
        last_id: int = 0,
        records: int = -1,
        sequences: Mapping[str, int] | None = None,
    ) -> int:
        """``count`` data entries (``data``, the stream protocol's Publish frames
        as they came) holding ``records`` messages (-1: every entry simple;
        sub-entry batches are kept closed) stored as one chunk record
        (StreamStore.append_chunk): no Message for any of them.
        ``reference``/``last_id`` or ``sequences``: the publishers' last
        publishing ids, kept with the record. Returns the first offset; the
        confirms wait for the stream's sync as a run's do."""
        self.stats.publish += count if records < 0 else records
        first = self.stream.append_chunk(
            data, count, ts, reference, last_id, num_records=records, sequences=sequences
        )
        self.vhost.store_written(self.store)
        if self._max_length is not None or self._max_bytes is not None or self._max_age_ms:
            self._apply_retention()
        self.reading.schedule()
        return first

    def publish_held(self, msg: Message, held: list[Held]) -> int:
        """A stream is only ever appended to: nothing it took can be taken back."""
        return self.publish(msg)

    def _recovered_keys(self, dedup: Deduplicator) -> list[KeyEntry]:
        """A stream's keys come from its records, from x-cache-ttl ago to the end."""
        return self.routed_keys(None, dedup)

    def routed_keys(self, exchange: str | None, dedup: Deduplicator) -> list[KeyEntry]:
        """``dedup``'s keys of the records published to ``exchange`` (None: all),
        from ``dedup``'s x-cache-ttl ago to the end."""
        from warren.core.properties import peek_headers

        stream = self.stream
        start = stream.first_offset
        if dedup.ttl is not None:
            start = max(start, stream.offset_at(self.clock.now_ms() - dedup.ttl))
        out: list[KeyEntry] = []
        cursor = stream.cursor(start)
        try:
            while True:
                item = cursor.next()
                if item is None:
                    break
                msg = item[1]
                if exchange is not None and msg.exchange != exchange:
                    continue
                entry = dedup.entry_of(peek_headers(msg.properties), float(msg.timestamp))
                if entry is not None:
                    out.append(entry)
        finally:
            cursor.close()
        return out

    def _delivery(self) -> QueueDelivery:
        self.reading = StreamDelivery(self)
        return self.reading

    def _settlement(self) -> QueueSettlement:
        return StreamSettlement(self)

    # -- consumers ------------------------------------------------------------------------
    def add_consumer(self, consumer: Consumer) -> None:
        """A new reader, starting where its arguments say (RabbitMQ's checks and texts;
        the exclusive flag is ignored, as RabbitMQ does for streams)."""
        what = self._what()
        args = consumer.arguments
        if "x-priority" in args:
            raise PreconditionFailed(
                f"invalid arg 'x-priority' for {what} of queue type rabbit_stream_queue"
            )
        if consumer.no_ack:
            raise NotImplemented_(
                f"automatic acknowledgement not supported by stream queues {what}"
            )
        if not consumer.credit_limit():
            raise PreconditionFailed(f"consumer prefetch count is not set for '{what}'")
        tracking: str | None = None
        automatic = args.get("x-stream-automatic-offset-tracking") is True
        if "x-stream-offset" in args and args["x-stream-offset"] is None:
            automatic = True
            start = StartSpec("first")
        elif "x-stream-offset" in args:
            start = parse_start(args["x-stream-offset"], self.clock.now_ms(), what)
        else:
            start = StartSpec("next")
        if automatic:
            tracking = consumer.tag
        offset = start.resolve(self.stream, messages=True)
        if tracking is not None:
            stored = self.stream.tracked(tracking)
            if stored is not None:
                offset = stored
        filters = _filters(args.get("x-stream-filter"), what)
        match_unfiltered = args.get("x-stream-match-unfiltered") is True
        reader = Reader(
            consumer,
            self.stream.cursor(offset),
            filters,
            match_unfiltered,
            tracking,
            consumer.message_filter(),
        )
        self.reading.readers[id(consumer)] = reader
        self.consumers.append(consumer)
        self._had_consumer = True
        self.reading.schedule()

    def remove_consumer(self, consumer: Consumer) -> None:
        reader = self.reading.readers.pop(id(consumer), None)
        if reader is None:
            return
        with contextlib.suppress(ValueError):
            self.consumers.remove(consumer)
        if reader.tracking is not None:
            # Its last position goes out with this turn's flush, not on the timer.
            self.stream.track(reader.tracking, reader.resume_offset(), at_once=True)
            self.vhost.store_written(self.store)
        reader.cursor.close()

    def scanning(self, consumer: Consumer) -> bool:
        """Whether the consumer's filter stopped a delivery pass mid-way (it skipped
        a whole batch) and could take what the next pass finds: a drain waits."""
        return self.reading.scanning(consumer)

    def _what(self) -> str:
        return f"queue '{self.name}' in vhost '{self.vhost.name}'"

    @property
    def consumer_count(self) -> int:
        """0, as RabbitMQ 3.10 reports for a stream in queue.declare-ok whatever reads it."""
        return 0

    def persistent_counts(self) -> tuple[int, int] | None:
        """A stream has no such figures (RabbitMQ's API and metrics leave them out)."""
        return None

    # -- what a stream refuses (540, RabbitMQ's texts) ------------------------------------
    def pull_next(self, no_ack: bool) -> tuple[int, Message, bool] | None:
        raise NotImplemented_(f"basic.get not supported by stream queues {self._what()}")

    def purge(self) -> int:
        raise NotImplemented_(f"queue.purge not supported by stream queues {self._what()}")

    def rebuild_expiry_index(self) -> None:
        """Streams have no per-message expiry: nothing to rebuild after a restart."""

    def touch(self) -> None:
        """Streams do not expire (x-expires is refused on declaration)."""

    # -- lifecycle ------------------------------------------------------------------------
    def delivered_marks(self) -> dict[Path, int]:
        return {}  # a stream redelivers nothing: its readers keep their offsets

    def mark_deleted(self) -> list[Consumer]:
        self.deleted = True
        if self._retention_timer is not None:
            self._retention_timer.cancel()
            self._retention_timer = None
        self.reading.stop()
        consumers, self.consumers = self.consumers, []
        self.stream.delete()
        return consumers


class StreamSettlement(QueueSettlement):
    """A stream's settler: an ack returns credit and moves a tracking consumer's
    stored offset; nothing leaves the log and nothing is requeued."""

    __slots__ = ("stream_queue",)

    def __init__(self, queue: StreamQueue) -> None:
        super().__init__(queue)
        self.stream_queue = queue

    def check_reject(self) -> None:
        raise NotImplemented_(
            "basic.nack and basic.reject not supported by stream queues "
            + self.stream_queue._what()
        )

    def ack_run(self, segment: int, offsets: array[int], size: int) -> None:
        """Acks of a span's deliveries (segment: minus its id; offsets: indexes in it)."""
        q = self.stream_queue
        if q.deleted:
            return
        span = q.reading.spans.get(-segment)
        if span is None:
            return
        n = len(offsets)
        span.left -= n
        q.unacked -= n
        if span.left <= 0:
            del q.reading.spans[-segment]
        reader = span.reader
        if reader.tracking is not None:
            first = span.first
            for i in offsets:
                reader.in_flight.pop(first + i, None)
            if id(reader.consumer) in q.reading.readers:
                q.stream.track(reader.tracking, reader.resume_offset())
                q.vhost.store_written(q.store)

    def ack_many(self, seqs: list[int], size: int) -> None:
        """An ack returns credit, and moves a tracking consumer's stored offset."""
        self._settle(seqs, False)

    def reject_many(
        self,
        seqs: list[int],
        msgs: list[Message | None],
        sizes: list[int] | array[int],
        requeue: bool,
        explicit: bool,
    ) -> None:
        """Deliveries given back by a closing channel or basic.recover (a client's
        nack or reject is refused: check_reject): the credit returns, each message
        counts as not processed, so a tracking consumer's stored offset stays
        before it, and nothing is redelivered."""
        for seq in seqs:
            self._settle([seq], True)

    def reject_run(
        self, segment: int, offsets: array[int], sizes: array[int], requeue: bool, explicit: bool
    ) -> None:
        """reject_many of a span's deliveries (basic.recover's)."""
        base = segment << 32
        for offset in offsets:
            self._settle([base | offset], True)

    def _settle(self, seqs: list[int], returned: bool) -> None:
        q = self.stream_queue
        if q.deleted:
            return
        touched: dict[int, Reader] = {}
        for seq in seqs:
            # A span's (negative), or one delivered alone.
            found = self._span_delivery(seq) if seq < 0 else q.reading.deliveries.pop(seq, None)
            if found is None:
                continue
            reader, offset = found
            reader.in_flight.pop(offset, None)
            q.unacked -= 1
            if returned and (reader.returned is None or offset < reader.returned):
                reader.returned = offset
            # A cancelled consumer's position was stored when it went; its late acks
            # must not overwrite what a new consumer with the same tag stored since.
            if reader.tracking is not None and id(reader.consumer) in q.reading.readers:
                touched[id(reader)] = reader
        for reader in touched.values():
            assert reader.tracking is not None
            q.stream.track(reader.tracking, reader.resume_offset())
        if touched:
            q.vhost.store_written(q.store)

    def _span_delivery(self, seq: int) -> tuple[Reader, int] | None:
        """The reader and offset of one of a span's deliveries, settled."""
        q = self.stream_queue
        sid = -(seq >> 32)
        span = q.reading.spans.get(sid)
        if span is None:
            return None
        span.left -= 1
        if span.left <= 0:
            del q.reading.spans[sid]
        return span.reader, span.first + (seq & 0xFFFFFFFF)


def _filters(value: Any, what: str) -> frozenset[str] | None:
    """The x-stream-filter consumer argument: a string or an array of strings."""
    if value is None:
        return None
    items = value if isinstance(value, list) else [value]
    out: set[str] = set()
    for item in items:
        if isinstance(item, bytes):
            item = item.decode("utf-8", "surrogateescape")
        if not isinstance(item, str):
            raise PreconditionFailed(f"Invalid x-stream-filter: {value!r} for {what}")
        out.add(item)
    return frozenset(out)
