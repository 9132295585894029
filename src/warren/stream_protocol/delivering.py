"""Deliver: a subscription as a core consumer of its stream queue, its records
sent as osiris chunks.

A subscription is a core Consumer of the stream queue (as an AMQP 0-9-1 or
1.0 consumer of a stream is), starting at the offset its Subscribe resolved,
with Subscribe's ``filter.N`` and ``match-unfiltered`` properties as the
core's ``x-stream-filter`` and ``x-stream-match-unfiltered`` arguments. What
the queue delivers during a loop turn is gathered; at the end of the turn
(the connection's output) each subscription's records become chunks (a new
chunk where offsets stop being consecutive, a filter's gap, or after
CHUNK_RECORDS records), one Deliver frame per chunk, all of the turn's frames
in one write, and the deliveries are acknowledged at once (a stream
consumer of this protocol has no acks: credit is the flow control).

Credit is counted in chunks, as RabbitMQ does: each chunk takes one, and the
queue stops delivering to a subscription whose credit its gathered records
would use up. A stream record holding one message comes as a record and
goes out in a chunk of what one turn read; a chunk record (the Publish
frames of a read stored whole: store/stream_records.py) comes whole
(Consumer.deliver_chunk, no Message built) and goes out as it is stored, the
Deliver prefix before it, the whole chunk also when the subscription starts
inside it (the client skips the entries before its offset, as with RabbitMQ).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Final, Protocol

from warren.core.consumer import Consumer
from warren.core.errors import BrokerError
from warren.core.stream import OFFSET_HEADER
from warren.stream_protocol import commands as c
from warren.stream_protocol.chunk import build_chunk, simple_entry
from warren.stream_protocol.constants import ResponseCode
from warren.stream_protocol.publish import deliver_prefix
from warren.stream_protocol.single_active import (
    ACTIVE,
    DEACTIVATING,
    Member,
    groups_of,
    partition_index,
)

if TYPE_CHECKING:
    from warren.core.deliveries import Deliveries
    from warren.core.message import Message
    from warren.stream_protocol.connection import StreamConnection
    from warren.stream_protocol.control import Subscription

__all__ = [
    "CHUNK_RECORDS",
    "Delivering",
    "SubscriptionConsumer",
    "consumer_arguments",
    "send_chunk",
]

log = logging.getLogger("warren.stream")

#: The most records in one delivered chunk.
CHUNK_RECORDS: Final = 1024
#: Deliveries a subscription holds unacknowledged at most (they are acked at
#: the end of each turn, so this bounds one turn's read).
_PREFETCH: Final = 8 * CHUNK_RECORDS


class Counted(Protocol):
    """What a subscription counts of its chunks (the leader's and a follower's)."""

    subscription_id: int
    credit: int
    consumed: int
    last_offset: int


def send_chunk(
    out: list[bytes], sub: Counted, chunk: bytes, first: int, count: int, committed: int | None
) -> None:
    """One Deliver of ``chunk`` (``count`` records from ``first``) into ``out``:
    it takes a credit and is counted, on the leader and on a follower alike."""
    out.append(deliver_prefix(sub.subscription_id, len(chunk), committed))
    out.append(chunk)
    sub.credit = max(sub.credit - 1, 0)
    sub.consumed += count
    sub.last_offset = first + count - 1


def consumer_arguments(sub: Subscription) -> dict[str, Any]:
    """The core consumer arguments of a subscription: where it starts (resolved
    at Subscribe) and its filter."""
    args: dict[str, Any] = {"x-stream-offset": sub.start}
    props = sub.properties
    values = [v for k, v in sorted(props.items()) if k.startswith("filter.")]
    if values:
        args["x-stream-filter"] = values
        args["x-stream-match-unfiltered"] = props.get("match-unfiltered", "false").lower() == "true"
    return args


class SubscriptionConsumer(Consumer):
    """A subscription's core consumer: gathers the records of a turn."""

    __slots__ = ("sub", "delivering", "records", "chunks", "last_tag")

    def __init__(self, deliveries: Deliveries, sub: Subscription, delivering: Delivering) -> None:
        super().__init__(
            deliveries,
            f"stream-subscription-{sub.subscription_id}",
            sub.queue,
            False,
            arguments=consumer_arguments(sub),
            prefetch_count=_PREFETCH,
        )
        self.sub = sub
        self.delivering = delivering
        #: This turn's records: (offset, timestamp ms, record); a chunk record
        #: is (first offset, -count, chunk) among them.
        self.records: list[tuple[int, int, bytes]] = []
        #: Chunk records among ``records`` (a credit each).
        self.chunks = 0
        self.last_tag = 0

    def can_take(self) -> bool:
        conn = self.delivering.conn
        if conn.closed or not conn.writable:
            return False
        credit = self.sub.credit - self.chunks
        return credit > 0 and len(self.records) < credit * CHUNK_RECORDS and self.has_credit()

    def takes_chunks(self) -> bool:
        return True

    def deliver_chunk(self, first: int, count: int, chunk: bytes) -> None:
        if not self.records:
            self.delivering.gathered(self)
        self.records.append((first, -count, chunk))
        self.chunks += 1

    def deliver(self, seq: int, msg: Message, redelivered: bool) -> None:
        deliveries = self.deliveries
        tag = deliveries.next_tag()
        deliveries.track(tag, self.queue, seq, msg, self)
        self.last_tag = tag
        headers = msg.headers or {}
        offset = int(headers.get(OFFSET_HEADER, 0))
        record = self.delivering.conn.messages.to_wire(msg)
        if not self.records:
            self.delivering.gathered(self)
        self.records.append((offset, msg.timestamp or 0, record))

    def cancelled(self) -> None:
        """The stream was deleted: the subscription goes, the client is told."""
        self.delivering.cancelled(self)


class Delivering:
    """One connection's subscriptions as core consumers, and their chunks."""

    def __init__(self, conn: StreamConnection) -> None:
        self.conn = conn
        self.deliveries = conn.client_session.deliveries(conn.stats)
        self.consumers: dict[int, SubscriptionConsumer] = {}
        self._gathered: list[SubscriptionConsumer] = []
        #: Deliver v2 (with the committed chunk id): the client offered it.
        self.v2 = False
        #: Single active consumer subscriptions: id -> (group key, member).
        self.members: dict[int, tuple[tuple[str, str, str], Member]] = {}
        #: ConsumerUpdates sent, waiting for their answer: correlation id -> subscription.
        self.updates: dict[int, int] = {}
        self._correlation = 0

    def subscribe(self, sub: Subscription) -> None:
        """Attach the subscription's consumer (BrokerError: its arguments
        refused); a single active consumer joins its group instead."""
        group = self._group(sub)
        if group is not None:
            key, index = group
            member = Member(self, sub)
            self.members[sub.subscription_id] = (key, member)
            groups_of(self.conn.node).join(key, index, member)
            return
        self._attach(sub)

    def group_conflict(self, sub: Subscription) -> bool:
        """Whether ``sub`` cannot join its single active consumer group: the
        group has another partition index (Subscribe is refused)."""
        group = self._group(sub)
        return group is not None and groups_of(self.conn.node).conflicts(*group)

    def _group(self, sub: Subscription) -> tuple[tuple[str, str, str], int] | None:
        """A single active consumer's group and partition index; None for
        another subscription."""
        props = sub.properties
        if props.get("single-active-consumer", "false").lower() != "true":
            return None
        vhost = self.conn.vhost
        assert vhost is not None
        super_stream = props.get("super-stream")
        index = -1 if super_stream is None else partition_index(vhost, super_stream, sub.stream)
        return (vhost.name, sub.stream, props.get("name", "")), index

    def _attach(self, sub: Subscription) -> None:
        consumer = SubscriptionConsumer(self.deliveries, sub, self)
        self.deliveries.consume(consumer.tag, consumer)
        self.consumers[sub.subscription_id] = consumer

    def _detach(self, subscription_id: int) -> None:
        """The subscription's consumer goes; what it gathered is not sent."""
        consumer = self.consumers.pop(subscription_id, None)
        if consumer is not None:
            consumer.records.clear()
            consumer.chunks = 0
            self.deliveries.cancel(consumer.tag)
            self._ack()

    def activate(self, member: Member) -> None:
        """``member``'s group made it the active one: ask its client where to
        start (ConsumerUpdate)."""
        if self.conn.closed or member.sub.queue.deleted:
            return
        self._update(member, True)

    def deactivate(self, member: Member) -> None:
        """``member`` steps down (a super stream partition's group moved on):
        it gets nothing more, and its client is told; the group goes on when
        it answers (update_answered) or its time runs out."""
        self._detach(member.sub.subscription_id)
        if self.conn.closed or member.sub.queue.deleted:
            return
        self._update(member, False)

    def _update(self, member: Member, active: bool) -> None:
        self._correlation += 1
        corr = self._correlation
        member.correlation = corr
        self.updates[corr] = member.sub.subscription_id
        self.conn.reply(c.ConsumerUpdate(corr, member.sub.subscription_id, active))

    def update_answered(self, command: c.ConsumerUpdateResponse, start: int | None) -> None:
        """The client answered: its newly active subscription starts at ``start``
        (control.py resolves the answer's offset spec; None: its Subscribe's);
        one stepping down lets its group go on. Answers to earlier updates
        than the member's last are stale."""
        sid = self.updates.pop(command.correlation_id, None)
        if sid is None:
            return
        entry = self.members.get(sid)
        if entry is None or entry[1].correlation != command.correlation_id:
            return
        key, member = entry
        if member.state == DEACTIVATING:
            groups_of(self.conn.node).stepped_down(key, member)
            return
        if member.state != ACTIVE or sid in self.consumers:
            return
        if command.code != ResponseCode.OK:
            log.warning("%s: ConsumerUpdate refused with %d", self.conn.name, command.code)
            return
        sub = member.sub
        if start is not None:
            sub.start = start
        try:
            self._attach(sub)
        except BrokerError as exc:
            log.warning("%s: subscription %d not attached: %s", self.conn.name, sid, exc.text)

    def unsubscribe(self, subscription_id: int) -> None:
        entry = self.members.pop(subscription_id, None)
        self._detach(subscription_id)
        if entry is not None:
            for corr in [k for k, v in self.updates.items() if v == subscription_id]:
                del self.updates[corr]
            groups_of(self.conn.node).leave(*entry)

    def credit(self, subscription_id: int) -> None:
        """Credit came: the queues deliver again (through the delivery stream)."""
        if subscription_id in self.consumers:
            self.deliveries.resume()

    def resume(self) -> None:
        """The socket drained: every subscription's queue delivers again."""
        self.deliveries.resume()

    def gathered(self, consumer: SubscriptionConsumer) -> None:
        if not self._gathered:
            self.conn.on_output()
        self._gathered.append(consumer)

    def cancelled(self, consumer: SubscriptionConsumer) -> None:
        sid = consumer.sub.subscription_id
        if self.consumers.get(sid) is consumer:
            del self.consumers[sid]
            self.deliveries.cancelled(consumer.tag, consumer)
            self.conn.control.stream_gone(consumer.sub.stream)

    def close(self) -> None:
        """The connection is going: the consumers detach, nothing is redelivered."""
        self._gathered.clear()
        for consumer in self.consumers.values():
            consumer.records.clear()
            consumer.chunks = 0
            try:
                self.deliveries.cancel(consumer.tag)
            except BrokerError:  # pragma: no cover - a queue going at the same time
                log.debug("%s: cancelling %s failed", self.conn.name, consumer.tag)
        self.consumers.clear()
        self.deliveries.close()
        members, self.members = self.members, {}
        groups = groups_of(self.conn.node)
        for key, member in members.values():
            groups.leave(key, member)

    def before_output(self) -> None:
        """End of the turn: the gathered records as chunks, one Deliver each,
        written at once; then acknowledged (the queue reads on)."""
        gathered, self._gathered = self._gathered, []
        if not gathered:
            return
        frames: list[bytes] = []
        for consumer in gathered:
            records, consumer.records = consumer.records, []
            consumer.chunks = 0
            if not records or self.consumers.get(consumer.sub.subscription_id) is not consumer:
                continue
            self._chunks(consumer, records, frames)
        if frames:
            self.conn.send(b"".join(frames))
        self._ack()

    def _ack(self) -> None:
        if self.deliveries.consumer_unsettled:
            self.deliveries.ack(0, True)

    def _chunks(
        self,
        consumer: SubscriptionConsumer,
        records: list[tuple[int, int, bytes]],
        out: list[bytes],
    ) -> None:
        sub = consumer.sub
        committed = None
        if self.v2:
            stream = sub.queue.stream
            committed = max(stream.next_offset - 1, 0)
        i, n = 0, len(records)
        while i < n:
            first, timestamp, data = records[i]
            if timestamp < 0:  # a chunk record, sent as it is stored
                count = -timestamp
                send_chunk(out, sub, data, first, count, committed)
                self.conn.stats.deliver += count
                i += 1
                continue
            j = i + 1
            while (
                j < n
                and j - i < CHUNK_RECORDS
                and records[j][0] == first + (j - i)
                and records[j][1] >= 0
            ):
                j += 1
            chunk = build_chunk(
                [simple_entry(r[2]) for r in records[i:j]], first_offset=first, timestamp=timestamp
            ).delivered()
            send_chunk(out, sub, chunk, first, j - i, committed)
            self.conn.stats.deliver += j - i
            i = j
