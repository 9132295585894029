"""A client session's delivery streams: consuming, and settling what was delivered.

A delivery stream is where a session's consumers deliver and its client
settles: an AMQP channel, an MQTT connection's outgoing half, an HTTP API get.
`Deliveries` (made by `ClientSession.deliveries`) holds the rules once:

- **consume**: a consumer (the protocol's `Consumer`: prefetch, exclusive,
  priority, arguments) is attached to its queue (which may refuse it: an
  exclusive consumer, a stream's arguments) and cancelled again;
- **deliver**: deliveries are numbered (delivery tags) and the unsettled ones
  kept (core/unsettled.py), counted against the consumer's prefetch and the
  stream's own (AMQP's global qos): `Consumer.has_credit`;
- **settle**: by one tag, by every tag up to one (``multiple``), or by a range
  of tags read at once: acked, requeued (refused past the TTL or the delivery
  limit: dropped instead), or dropped (dead-lettered where the queue says so).
  The credit goes back, each queue (or run) gets one call (QueueSettlement),
  acks are counted, and the queues deliver again, once;
- **close**: the consumers are cancelled, every unsettled delivery goes back
  to its queue in queue order (not an explicit return: no delivery-limit
  count of its own), and the stream's counters go to the vhost's.

What a protocol keeps is its encoding (basic.deliver and basic.ack, PUBLISH
and PUBACK), what else holds delivery back (AMQP's channel.flow, MQTT's
Receive Maximum, a full socket buffer) and AMQP's transactions, which hold
settlements until tx.commit (`take` now, `settle` then).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from warren.core.errors import BrokerError
from warren.core.unsettled import Unsettled, UnsettledDeliveries, UnsettledRun

if TYPE_CHECKING:
    from warren.core.channel_counts import ChannelCounts
    from warren.core.consumer import Consumer
    from warren.core.message import Message
    from warren.core.queue import Queue
    from warren.core.stats import MessageStats
    from warren.core.store import StoredRun

__all__ = ["Deliveries", "Taken"]

#: What a settlement takes out of the unsettled deliveries: single deliveries as
#: (tag, Unsettled), and runs.
Taken = tuple[list[tuple[int, Unsettled]], list[UnsettledRun]]


class Deliveries:
    """One delivery stream of a client session (see the module docstring)."""

    __slots__ = (
        "closed",
        "consumer_unsettled",
        "consumers",
        "counts",
        "last_tag",
        "prefetch_count",
        "prefetch_size",
        "stats",
        "unsettled",
        "unsettled_bytes",
        "_on_close",
        "_retire",
    )

    def __init__(
        self,
        stats: MessageStats,
        counts: ChannelCounts | None,
        retire: MessageStats | None,
        on_close: Callable[[Deliveries], None],
    ) -> None:
        """``stats``: the stream's counters (acks are counted there); ``counts``:
        its counts by queue, when it keeps them (AMQP's per-channel series);
        ``retire``: where its counters go when it closes (None: the vhost's
        once its session's connection is open in one, retire_into)."""
        self.stats = stats
        self.counts = counts
        self._retire = retire
        self._on_close = on_close
        #: The consumers delivering here, by the protocol's key (AMQP: the tag).
        self.consumers: dict[str, Consumer] = {}
        self.unsettled = UnsettledDeliveries()
        #: Body bytes of the unsettled deliveries (basic.get's too).
        self.unsettled_bytes = 0
        #: Unsettled consumer deliveries: what the stream's prefetch limits
        #: (basic.get's are not counted, as in RabbitMQ).
        self.consumer_unsettled = 0
        #: The stream's own prefetch over all its consumers (AMQP's global qos; 0: none).
        self.prefetch_count = 0
        self.prefetch_size = 0
        #: The last delivery tag given out.
        self.last_tag = 0
        self.closed = False

    # -- consuming ----------------------------------------------------------------------
    def consume(self, key: str, consumer: Consumer) -> None:
        """Attach ``consumer`` to its queue (which may refuse it: a BrokerError)
        and deliver here under ``key``."""
        consumer.queue.add_consumer(consumer)
        self.consumers[key] = consumer
        _consumer_event("consumer.created", consumer)

    def cancel(self, key: str) -> Consumer | None:
        """Detach the consumer under ``key`` (None: no such consumer). What it
        was delivered stays unsettled until settled or the stream closes."""
        consumer = self.consumers.pop(key, None)
        if consumer is not None:
            # Told first: an auto-delete queue goes with its last consumer.
            _consumer_event("consumer.deleted", consumer)
            consumer.queue.remove_consumer(consumer)
        return consumer

    def cancelled(self, key: str, consumer: Consumer) -> bool:
        """The queue let ``consumer`` go (it was deleted): forget it, if it is
        still the one under ``key``; whether it was."""
        if self.consumers.get(key) is not consumer:
            return False
        del self.consumers[key]
        return True

    def resume(self) -> None:
        """Room opened for every consumer (a qos, flow, a writable socket):
        each queue delivers again."""
        for consumer in self.consumers.values():
            consumer.queue.schedule_delivery()

    def pull(self, queue: Queue, no_ack: bool) -> tuple[int, Message, bool] | None:
        """One message from ``queue`` (basic.get), as (delivery tag, message,
        redelivered); kept unsettled unless ``no_ack``. None: the queue is empty."""
        item = queue.pull_next(no_ack)
        if item is None:
            return None
        seq, msg, redelivered = item
        tag = self.last_tag = self.last_tag + 1
        if not no_ack:
            self.track(tag, queue, seq, msg, None)
        return tag, msg, redelivered

    # -- delivering ---------------------------------------------------------------------
    def next_tag(self) -> int:
        self.last_tag += 1
        return self.last_tag

    def next_tags(self, n: int) -> int:
        """Reserve ``n`` delivery tags; the first of them."""
        first = self.last_tag + 1
        self.last_tag += n
        return first

    def has_room(self) -> bool:
        """Whether the stream's own prefetch allows another consumer delivery."""
        count = self.prefetch_count
        if count and self.consumer_unsettled >= count:
            return False
        size = self.prefetch_size
        return not (size and self.unsettled_bytes >= size)

    def track(
        self, tag: int, queue: Queue, seq: int, msg: Message, consumer: Consumer | None
    ) -> None:
        """Delivery ``tag`` of ``queue``'s message ``seq`` awaits its settlement
        (``consumer`` None: a pull's)."""
        size = len(msg.body)
        self.unsettled.add(tag, (queue, seq, msg, consumer, size))
        self.unsettled_bytes += size
        if consumer is not None:
            self.consumer_unsettled += 1
            consumer.unacked_count += 1
            consumer.unacked_bytes += size

    def track_run(
        self, first: int, queue: Queue, stored: StoredRun, consumer: Consumer, size: int
    ) -> None:
        """A run's deliveries, tags ``first ..``, ``size`` body bytes in all."""
        n = len(stored)
        self.unsettled.add_run(
            UnsettledRun(first, queue, consumer, stored.segment, stored.offsets, stored.sizes)
        )
        self.unsettled_bytes += size
        self.consumer_unsettled += n
        consumer.unacked_count += n
        consumer.unacked_bytes += size

    # -- settling -----------------------------------------------------------------------
    def ack(self, tag: int, multiple: bool) -> None:
        """Ack delivery ``tag`` (``multiple``: every one up to it; tag 0: all).
        An unknown tag raises PreconditionFailed (406), as in RabbitMQ."""
        taken, runs = self.unsettled.take(tag, multiple)
        self.settle(taken, runs, None)

    def reject(self, tag: int, multiple: bool, requeue: bool, explicit: bool = True) -> None:
        """Requeue or drop delivery ``tag`` (``multiple`` as ack()), once every
        queue concerned allows it (check_reject). ``explicit``: the client's own
        nack or reject (counted apart for the delivery limit)."""
        self.check_reject(tag, multiple)
        taken, runs = self.unsettled.take(tag, multiple)
        self.settle(taken, runs, requeue, explicit)

    def take(self, tag: int, multiple: bool) -> Taken:
        """Take out what ack() would settle, to settle later (a transaction's)."""
        return self.unsettled.take(tag, multiple)

    def take_one(self, tag: int) -> tuple[int, Unsettled]:
        """Take out the single delivery ``tag`` (one a protocol knows is
        unsettled: an MQTT connection's in flight), to settle later."""
        return tag, self.unsettled.singles.pop(tag)

    def ack_range(self, first: int, n: int) -> bool:
        """Ack tags ``first .. first + n - 1`` together (n single acks in a read),
        with one refill after them, when one run of deliveries, or single
        deliveries alone, hold every tag. False, and nothing settled, otherwise:
        the protocol settles them one by one."""
        found = self.unsettled.take_range(first, first + n - 1)
        if found is None:
            return False
        self.settle(found[0], found[1], None)
        return True

    def reject_range(self, first: int, n: int, requeue: bool) -> bool:
        """reject() of tags ``first .. first + n - 1`` together, as ack_range acks
        them, when no queue of theirs refuses rejects either; else False."""
        last = first + n - 1
        if self._refused(first, last):
            return False
        found = self.unsettled.take_range(first, last)
        if found is None:
            return False
        self.settle(found[0], found[1], requeue)
        return True

    def recover(self) -> None:
        """Every unsettled delivery back to its queue (basic.recover requeue=true)."""
        taken, runs = self.unsettled.take(0, True)
        self.settle(taken, runs, True, explicit=False)

    def check_reject(self, tag: int, multiple: bool) -> None:
        """Let the queues of the deliveries a reject names refuse it (streams do,
        with 540) before anything is settled."""
        unsettled = self.unsettled
        if multiple:
            queues = [e[0] for t, e in unsettled.singles.items() if tag == 0 or t <= tag]
            queues += [r.queue for r in unsettled.runs if tag == 0 or r.first <= tag]
        else:
            entry = unsettled.singles.get(tag)
            if entry is not None:
                queues = [entry[0]]
            else:
                queues = [r.queue for r in unsettled.runs if r.first <= tag <= r.last]
        checked: set[int] = set()
        for queue in queues:
            if id(queue) not in checked:
                checked.add(id(queue))
                queue.settler.check_reject()

    def _refused(self, first: int, last: int) -> bool:
        """Whether a queue of the deliveries tagged ``first .. last`` refuses
        rejects (check_reject raises)."""
        unsettled = self.unsettled
        queues: dict[int, Queue] = {}
        for run in unsettled.runs:
            if run.first <= last and run.last >= first:
                queues[id(run.queue)] = run.queue
        singles = unsettled.singles
        if singles:
            for tag in range(first, last + 1):
                entry = singles.get(tag)
                if entry is not None:
                    queues[id(entry[0])] = entry[0]
        for queue in queues.values():
            try:
                queue.settler.check_reject()
            except BrokerError:
                return True
        return False

    def settle(
        self,
        taken: list[tuple[int, Unsettled]],
        runs: list[UnsettledRun],
        requeue: bool | None,
        explicit: bool = True,
        refill: bool = True,
    ) -> None:
        """Settle deliveries taken out: acked (``requeue`` None), requeued or
        dropped; their credit goes back, then (``refill``) their queues deliver
        again, or every consumer's when the stream's own prefetch held them."""
        if requeue is None:
            queues = self._ack(taken, runs)
        else:
            self._credit(taken, runs)
            queues = {}
            if not taken:
                # Runs alone: disjoint, in tag order already; each goes to its
                # queue whole.
                for run in runs:
                    queue = run.queue
                    queue.settler.reject_run(
                        run.segment, run.offsets, run.sizes, requeue, explicit
                    )
                    queues[id(queue)] = queue
            else:
                if runs:
                    taken = sorted(
                        [*taken, *(item for run in runs for item in run.entries())],
                        key=lambda item: item[0],
                    )
                _reject_in_spans(taken, requeue, explicit, queues)
        if not refill:
            return
        if self.prefetch_count or self.prefetch_size:
            self.resume()
        else:
            for q in queues.values():
                q.schedule_delivery()

    def take_entry(self, tag: int) -> Unsettled | None:
        """Take out the single delivery ``tag`` if it is unsettled (None: it is
        not), to settle later with ack_entries: no (tag, entry) pair made, for a
        protocol that settles one delivery at a time (MQTT's PUBACK)."""
        return self.unsettled.singles.pop(tag, None)

    def ack_entries(self, entries: list[Unsettled]) -> None:
        """Ack single deliveries taken out (take_entry), one call per queue, with
        no refill: the protocol lets the queues deliver when its own window
        allows (resume)."""
        if entries:
            self._ack_singles(entries, {})

    def _ack(
        self, taken: list[tuple[int, Unsettled]], runs: list[UnsettledRun]
    ) -> dict[int, Queue]:
        """Ack deliveries taken out, their credit given back on the way: one store
        call and one flush registration per queue (or run), not per message; the
        queues they came from."""
        queues: dict[int, Queue] = {}
        if taken:
            self._ack_singles([entry for _, entry in taken], queues)
        if not runs:
            return queues
        freed = 0  # consumer deliveries (not pulls)
        total = 0  # body bytes
        acked = 0
        counts = self.counts
        for run in runs:
            queue = run.queue
            n = len(run)
            size = sum(run.sizes)
            total += size
            run_consumer = run.consumer
            if run_consumer is not None:
                freed += n
                run_consumer.unacked_count -= n
                run_consumer.unacked_bytes -= size
            acked += n
            queue.stats.ack += n
            if counts is not None:
                counts.queue(queue).ack += n
            queue.settler.ack_run(run.segment, run.offsets, size)
            queues[id(queue)] = queue
        self.unsettled_bytes -= total
        self.consumer_unsettled -= freed
        self.stats.ack += acked
        return queues

    def _ack_singles(self, entries: list[Unsettled], queues: dict[int, Queue]) -> None:
        """Ack single deliveries taken out: one store call per queue; the queues
        go into ``queues`` (empty when called)."""
        seqs: dict[int, list[int]] = {}
        sizes: dict[int, int] = {}
        freed = 0  # consumer deliveries (not pulls)
        total = 0  # body bytes
        # Entries mostly come a queue at a time: the dicts are touched when the
        # queue changes, not per entry.
        last: Queue | None = None
        last_seqs: list[int] = []
        last_size = 0
        for queue, seq, _msg, consumer, size in entries:
            total += size
            if consumer is not None:
                freed += 1
                consumer.unacked_count -= 1
                consumer.unacked_bytes -= size
            if queue is not last:
                if last is not None:
                    sizes[id(last)] += last_size
                last = queue
                key = id(queue)
                found = seqs.get(key)
                if found is None:
                    queues[key] = queue
                    found = seqs[key] = []
                    sizes[key] = 0
                last_seqs = found
                last_size = 0
            last_seqs.append(seq)
            last_size += size
        if last is not None:
            sizes[id(last)] += last_size
        counts = self.counts
        for key, queue in queues.items():
            n = len(seqs[key])
            queue.stats.ack += n
            if counts is not None:
                counts.queue(queue).ack += n
            queue.settler.ack_many(seqs[key], sizes[key])
        self.unsettled_bytes -= total
        self.consumer_unsettled -= freed
        self.stats.ack += len(entries)

    def _credit(self, taken: list[tuple[int, Unsettled]], runs: list[UnsettledRun]) -> None:
        """Give the prefetch credit these deliveries held back."""
        for _, entry in taken:
            size = entry[4]
            self.unsettled_bytes -= size
            consumer = entry[3]
            if consumer is not None:
                self.consumer_unsettled -= 1
                consumer.unacked_count -= 1
                consumer.unacked_bytes -= size
        for run in runs:
            n = len(run)
            size = sum(run.sizes)
            self.unsettled_bytes -= size
            consumer = run.consumer
            if consumer is not None:
                self.consumer_unsettled -= n
                consumer.unacked_count -= n
                consumer.unacked_bytes -= size

    # -- closing ------------------------------------------------------------------------
    def retire_into(self, target: MessageStats) -> None:
        """Where its counters go when it closes, unless it was told already."""
        if self._retire is None:
            self._retire = target

    def close(self, held: Iterable[Unsettled] = ()) -> None:
        """The stream ends (a channel's close, a connection's end): its consumers
        are cancelled, then every unsettled delivery, and ``held`` (deliveries
        taken out and not yet settled: a transaction's), goes back to its queue
        in sequence order, each stretch of one queue's in one call, as not an
        explicit return; its counters go to the vhost's. Once; later calls do
        nothing."""
        if self.closed:
            return
        self.closed = True
        for consumer in list(self.consumers.values()):
            _consumer_event("consumer.deleted", consumer)
            consumer.queue.remove_consumer(consumer)
        self.consumers.clear()
        back = [e for _, e in self.unsettled.entries()]
        back.extend(held)
        self.unsettled.clear()
        self.consumer_unsettled = 0
        self.unsettled_bytes = 0
        back.sort(key=lambda e: e[1])
        _reject_in_spans([(0, e) for e in back], True, False, {})
        if self._retire is not None:
            self._retire.add(self.stats)
        self._on_close(self)


def _reject_in_spans(
    taken: list[tuple[int, Unsettled]], requeue: bool, explicit: bool, queues: dict[int, Queue]
) -> None:
    """Reject deliveries in tag order, each stretch of one queue's in one call
    (QueueSettlement.reject_many): the queues see them in the order they would
    one by one, across queues too (their dead-letter copies keep that order)."""
    i = 0
    n = len(taken)
    while i < n:
        queue = taken[i][1][0]
        j = i + 1
        while j < n and taken[j][1][0] is queue:
            j += 1
        seqs: list[int] = []
        msgs: list[Message | None] = []
        sizes: list[int] = []
        for k in range(i, j):
            entry = taken[k][1]
            seqs.append(entry[1])
            msgs.append(entry[2])
            sizes.append(entry[4])
        queue.settler.reject_many(seqs, msgs, sizes, requeue, explicit)
        queues[id(queue)] = queue
        i = j


def _consumer_event(name: str, consumer: Consumer) -> None:
    """consumer.created or consumer.deleted, to the vhost's event observers
    (core/events.py): once per consume and cancel, never per delivery."""
    vhost = consumer.queue.vhost
    events = getattr(vhost, "events", None)
    if events:
        props = {
            "vhost": vhost.name,
            "queue": consumer.queue.name,
            "consumer_tag": consumer.tag,
            "exclusive": consumer.exclusive,
            "ack_required": not consumer.no_ack,
        }
        events.emit(name, props)
