"""An AMQP consumer: the core's Consumer, delivering as basic.deliver frames."""

from __future__ import annotations

import struct
from array import array
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import warren
from warren.amqp.frames import message_frames
from warren.amqp.record_deliveries import deliver_records as _frame_span
from warren.core.consumer import Consumer
from warren.core.message import Message, MessageRun
from warren.core.stats import count_delivery
from warren.core.store import StoredRun, StoreSpan

_pack_tag = struct.Struct(">QB").pack

_native = warren.native_module("_fastpath")
#: The C encoder of a run's deliveries, and the run type it reads (None: not built).
_deliver_frames: Callable[..., bytes] | None = None if _native is None else _native.deliver_frames
_NativeRun: type | None = None if _native is None else _native.PublishRun
#: The C framer of a stream's records (core/stream_queue.py's backlog path), or None.
_deliver_records: Callable[..., tuple[bytes, int, int, bytes, bytes]] | None = (
    None if _native is None else getattr(_native, "deliver_records", None)
)
#: The C framer of a stream's chunk records (the same path's), or None.
_deliver_entries: Callable[..., tuple[bytes, int, int, bytes]] | None = (
    None if _native is None else getattr(_native, "deliver_entries", None)
)

#: The frames of a span stop before the record that would take them past this
#: many bytes: one transport write of a backlog's deliveries stays bounded.
SPAN_BYTES = 1 << 21

if TYPE_CHECKING:
    from warren.amqp.channel import Channel
    from warren.core.queue import Queue


class AMQPConsumer(Consumer):
    """basic.consume's consumer: deliveries as basic.deliver frames on its channel,
    into the channel's delivery stream (core/deliveries.py)."""

    __slots__ = ("channel", "counts", "_deliver_head")

    def __init__(
        self,
        channel: Channel,
        tag: str,
        queue: Queue,
        no_ack: bool,
        exclusive: bool,
        priority: int,
        arguments: dict[str, Any] | None,
    ) -> None:
        # Per-consumer limits as RabbitMQ reinterprets basic.qos(global=false).
        super().__init__(
            channel.deliveries,
            tag,
            queue,
            no_ack,
            exclusive,
            priority,
            arguments,
            channel.consumer_prefetch_count,
            channel.consumer_prefetch_size,
        )
        self.channel = channel
        #: The channel's counts for this queue (core/channel_counts.py).
        self.counts = channel.counts.queue(queue)
        raw_tag = tag.encode("utf-8", "surrogateescape")
        self._deliver_head = b"\x00\x3c\x00\x3c" + bytes((len(raw_tag),)) + raw_tag

    def can_take(self) -> bool:
        ch = self.channel
        if not ch.flow_active or not ch.connection.writable:
            return False
        return self.has_credit()

    def deliver(self, seq: int, msg: Message, redelivered: bool) -> None:
        ch = self.channel
        count_delivery(ch.stats, self.queue.stats, self.no_ack, redelivered)
        counts = self.counts
        if self.no_ack:
            counts.deliver_no_ack += 1
        else:
            counts.deliver += 1
        if redelivered:
            counts.redeliver += 1
        deliveries = self.deliveries
        tag = deliveries.next_tag()
        body = msg.body
        if not self.no_ack:
            deliveries.track(tag, self.queue, seq, msg, self)
        conn = ch.connection
        # basic.deliver built by hand: the consumer-tag part is encoded once per
        # consumer, exchange and routing key once per message (fanout reuses them).
        payload = self._deliver_head + _pack_tag(tag, redelivered) + msg.exchange_and_key()
        conn.send_many(message_frames(ch.id, payload, msg.properties, body, conn.frame_max))

    def deliver_run(self, run: MessageRun, start: int, stop: int, step: int = 1) -> None:
        """A run's messages as one bytes object of basic.deliver, header and body
        frames, built in C from the publisher's bytes (no Message per message)."""
        raw = run.raw
        if _deliver_frames is None or type(raw) is not _NativeRun:
            super().deliver_run(run, start, stop, step)
            return
        ch = self.channel
        n = (stop - start + step - 1) // step
        ch.stats.deliver_no_ack += n
        self.queue.stats.deliver_no_ack += n
        self.counts.deliver_no_ack += n
        first = self.deliveries.next_tags(n)
        conn = ch.connection
        frames = _deliver_frames(
            raw, start, stop, step, ch.id, self._deliver_head, first, conn.frame_max
        )
        conn.send(frames)

    def run_credit(self, n: int) -> int:
        """Up to the prefetch counts (consumer and channel), when only counts
        limit it: a prefetch size would need the sizes one by one."""
        return self.prefetch_credit(n)

    def deliver_stored_run(self, run: MessageRun, start: int, stop: int, stored: StoredRun) -> None:
        """A run's messages the queue stored (one write) as one bytes object of
        basic.deliver, header and body frames, and one unacked entry."""
        ch = self.channel
        n = stop - start
        ch.stats.deliver += n
        self.queue.stats.deliver += n
        self.counts.deliver += n
        deliveries = self.deliveries
        first = deliveries.next_tags(n)
        deliveries.track_run(first, self.queue, stored, self, sum(stored.sizes))
        conn = ch.connection
        raw = run.raw
        if _deliver_frames is not None and type(raw) is _NativeRun:
            conn.send(
                _deliver_frames(
                    raw, start, stop, 1, ch.id, self._deliver_head, first, conn.frame_max
                )
            )
            return
        frames: list[bytes] = []
        head = self._deliver_head
        ex_rk = run.ex_rk
        for i in range(start, stop):
            payload = head + _pack_tag(first + i - start, False) + ex_rk
            frames += message_frames(ch.id, payload, raw.properties(i), raw.body(i), conn.frame_max)
        conn.send_many(frames)

    def deliver_records(
        self, buf: Any, pos: int, limit: int, seed: int, max_n: int, segment: int
    ) -> tuple[int, int]:
        """A stream's next records as one bytes object of deliveries, framed in C from
        the segment's map, and one unacked run (see Consumer.deliver_records)."""
        if _deliver_records is None or self.no_ack:
            return 0, pos
        ch = self.channel
        conn = ch.connection
        deliveries = self.deliveries
        first = deliveries.last_tag + 1
        frames, n, end, raw_sizes, _offsets = _deliver_records(
            buf, pos, limit, seed, max_n, ch.id, self._deliver_head, first, conn.frame_max
        )
        if not n:
            return 0, pos
        self._framed_run(frames, n, raw_sizes, first, segment)
        return n, end

    def _framed_run(
        self, frames: bytes, n: int, raw_sizes: bytes, first: int, segment: int
    ) -> None:
        """``n`` deliveries framed in C from a stream's segment (records or a chunk
        record's entries): their tags, counts and one unacked run, then sent."""
        ch = self.channel
        deliveries = self.deliveries
        deliveries.next_tags(n)
        ch.stats.deliver += n
        self.queue.stats.deliver += n
        self.counts.deliver += n
        sizes = array("I")
        sizes.frombytes(raw_sizes)
        stored = StoredRun(segment, array("I", range(n)), sizes, 0)
        deliveries.track_run(first, self.queue, stored, self, sum(sizes))
        ch.connection.send(frames)

    def takes_entries(self) -> bool:
        return _deliver_entries is not None and not self.no_ack

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
        """A stream's chunk record's next entries as one bytes object of deliveries,
        framed in C, and one unacked run (see Consumer.deliver_entries)."""
        if _deliver_entries is None or self.no_ack:
            return 0, pos
        ch = self.channel
        conn = ch.connection
        deliveries = self.deliveries
        first = deliveries.last_tag + 1
        rk = routing_key.encode("utf-8", "surrogateescape")
        frames, n, end, raw_sizes = _deliver_entries(
            buf,
            pos,
            end,
            max_n,
            offset,
            ts,
            decoder.layouts,
            decoder.learn,
            ch.id,
            self._deliver_head,
            first,
            conn.frame_max,
            b"\x00" + bytes((len(rk),)) + rk,
            SPAN_BYTES,
        )
        if not n:
            return 0, pos
        self._framed_run(frames, n, raw_sizes, first, segment)
        return n, end

    def takes_spans(self) -> bool:
        return True

    def deliver_span(
        self, span: StoreSpan, max_n: int, expired_at: int = -1, own_expiry: bool = False
    ) -> StoredRun | None:
        """A classic queue's next records as one bytes object of deliveries, framed
        from the segment's map (C, or its reference), and one unacked run."""
        ch = self.channel
        conn = ch.connection
        deliveries = self.deliveries
        first = deliveries.last_tag + 1
        frames, n, end, raw_sizes, raw_offsets = _frame_span(
            span.buf,
            span.pos,
            span.limit,
            span.seed,
            max_n,
            ch.id,
            self._deliver_head,
            first,
            conn.frame_max,
            span.redelivered,
            expired_at,
            own_expiry,
            SPAN_BYTES,
        )
        if not n:
            return None
        deliveries.next_tags(n)
        span.end = end
        sizes = array("I")
        sizes.frombytes(raw_sizes)
        offsets = array("I")
        offsets.frombytes(raw_offsets)
        stored = StoredRun(span.segment, offsets, sizes, 0)
        queue_stats = self.queue.stats
        counts = self.counts
        if self.no_ack:
            ch.stats.deliver_no_ack += n
            queue_stats.deliver_no_ack += n
            counts.deliver_no_ack += n
        else:
            ch.stats.deliver += n
            queue_stats.deliver += n
            counts.deliver += n
            deliveries.track_run(first, self.queue, stored, self, sum(sizes))
        if span.redelivered:
            ch.stats.redeliver += n
            queue_stats.redeliver += n
            counts.redeliver += n
        conn.send(frames)
        return stored

    def delivery_stream(self) -> object:
        return self.channel

    def cancelled(self) -> None:
        self.channel.consumer_cancelled_by_server(self)
