"""How a channel's unacked deliveries are settled: basic.ack, nack, reject and
recover, the acks a transaction holds until its commit, and what a closing
channel gives back.

The channel keeps the deliveries (its `UnackedDeliveries`, amqp/unacked.py)
and the prefetch counts its consumers read; `Settlement` takes deliveries out
of it, gives their prefetch capacity back, hands them to their queues (acked,
requeued or dead-lettered) and refills the consumers once after them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from warren.amqp.ack_scan import REJECT_IDS
from warren.amqp.unacked import Unacked, UnackedRun
from warren.core.errors import BrokerError

if TYPE_CHECKING:
    from warren.amqp.channel import Channel
    from warren.core.message import Message
    from warren.core.queue import Queue

_ACK_IDS = b"\x00\x3c\x00\x50"  # basic.ack: class 60, method 80

#: An ack, nack or reject a transaction holds until commit: (tag, delivery,
#: "ack" or "reject", requeue).
TxAck = tuple[int, Unacked, str, bool]


class Settlement:
    """One channel's acknowledgements: what settles which deliveries, and how."""

    __slots__ = ("channel", "tx_acks")

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        #: In a transaction: the acks, nacks and rejects waiting for tx.commit.
        self.tx_acks: list[TxAck] = []

    # -- basic.ack, nack, reject, recover -----------------------------------------------
    def ack_like(self, tag: int, multiple: bool, requeue: bool | None) -> None:
        """basic.ack (requeue None), basic.nack or basic.reject of ``tag``."""
        ch = self.channel
        if requeue is not None:
            self.check_reject(tag, multiple)
        # In a transaction the deliveries keep their prefetch slots until commit,
        # as in RabbitMQ.
        taken, runs = ch.unacked.take(tag, multiple)
        if ch.tx:
            kind = "ack" if requeue is None else "reject"
            for run in runs:
                taken.extend(run.entries())
            taken.sort(key=lambda item: item[0])
            for t, entry in taken:
                self.tx_acks.append((t, entry, kind, bool(requeue)))
            return
        self.credit(taken, runs)
        self.settle(taken, runs, requeue)

    def check_reject(self, tag: int, multiple: bool) -> None:
        """Let the queues of the deliveries a nack or reject names refuse it (streams
        do, with 540) before anything is settled."""
        unacked = self.channel.unacked
        if multiple:
            queues = [e[0] for t, e in unacked.singles.items() if tag == 0 or t <= tag]
            queues += [r.queue for r in unacked.runs if tag == 0 or r.first <= tag]
        else:
            entry = unacked.singles.get(tag)
            if entry is not None:
                queues = [entry[0]]
            else:
                queues = [r.queue for r in unacked.runs if r.first <= tag <= r.last]
        checked: set[int] = set()
        for queue in queues:
            if id(queue) not in checked:
                checked.add(id(queue))
                queue.settler.check_reject()

    def ack_range(self, first: int, n: int) -> None:
        """basic.ack of tags ``first .. first + n - 1`` (n frames, multiple=false,
        one after the other in a read): settled together, with one refill of
        the consumers after them, when one run of deliveries or single
        deliveries alone hold every tag; else frame by frame, exactly as the
        frames would have gone (an unknown tag closes the channel there)."""
        ch = self.channel
        found = ch.unacked.take_range(first, first + n - 1)
        if found is None:
            for tag in range(first, first + n):
                ch.on_method_frame(_ACK_IDS + tag.to_bytes(8, "big") + b"\x00")
            return
        taken, runs = found
        self.credit(taken, runs)
        self.settle(taken, runs, None)

    def reject_range(self, first: int, n: int, ids: bytes, bits: int) -> None:
        """basic.reject (``ids`` REJECT_IDS) or basic.nack with multiple clear
        (NACK_IDS) of tags ``first .. first + n - 1``, n frames with the flags
        octet ``bits``, one after the other in a read: settled together as
        ack_range settles acks, when no queue of theirs refuses rejects (a
        stream's) and one run or single deliveries alone hold every tag; else
        frame by frame, exactly as the frames would have gone."""
        ch = self.channel
        last = first + n - 1
        found = None if self._refused(first, last) else ch.unacked.take_range(first, last)
        if found is None:
            flags = bytes((bits,))
            for tag in range(first, first + n):
                ch.on_method_frame(ids + tag.to_bytes(8, "big") + flags)
            return
        taken, runs = found
        self.credit(taken, runs)
        self.settle(taken, runs, bool(bits & (1 if ids == REJECT_IDS else 2)))

    def _refused(self, first: int, last: int) -> bool:
        """Whether a queue of the deliveries tagged ``first .. last`` refuses
        basic.nack and basic.reject (check_reject raises)."""
        unacked = self.channel.unacked
        queues: dict[int, Queue] = {}
        for run in unacked.runs:
            if run.first <= last and run.last >= first:
                queues[id(run.queue)] = run.queue
        singles = unacked.singles
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

    def recover(self) -> None:
        """basic.recover requeue=true: every unacked delivery goes back to its queue."""
        taken, runs = self.channel.unacked.take(0, True)
        self.credit(taken, runs)
        self.settle(taken, runs, True, explicit=False)

    # -- the settling itself ------------------------------------------------------------
    def credit(self, taken: list[tuple[int, Unacked]], runs: list[UnackedRun]) -> None:
        """Give the prefetch capacity these deliveries held back to their consumers."""
        ch = self.channel
        for _, entry in taken:
            size = entry[4]
            ch.unacked_bytes -= size
            consumer = entry[3]
            if consumer is not None:
                ch.consumer_unacked -= 1
                consumer.unacked_count -= 1
                consumer.unacked_bytes -= size
        for run in runs:
            n = len(run)
            size = sum(run.sizes)
            ch.unacked_bytes -= size
            consumer = run.consumer
            if consumer is not None:
                ch.consumer_unacked -= n
                consumer.unacked_count -= n
                consumer.unacked_bytes -= size

    def settle(
        self,
        taken: list[tuple[int, Unacked]],
        runs: list[UnackedRun],
        requeue: bool | None,
        explicit: bool = True,
    ) -> None:
        """Ack (requeue None) or reject the taken deliveries, then refill consumers."""
        ch = self.channel
        queues: dict[int, Queue] = {}
        if requeue is None:
            # One store call and one flush registration per queue (or run), not
            # per message.
            seqs: dict[int, list[int]] = {}
            sizes: dict[int, int] = {}
            for _, (queue, seq, _msg, _consumer, size) in taken:
                key = id(queue)
                if key in queues:
                    seqs[key].append(seq)
                    sizes[key] += size
                else:
                    queues[key] = queue
                    seqs[key] = [seq]
                    sizes[key] = size
            acked = len(taken)
            counts = ch.counts
            for key, queue in queues.items():
                n = len(seqs[key])
                queue.stats.ack += n
                counts.queue(queue).ack += n
                queue.settler.ack_many(seqs[key], sizes[key])
            for run in runs:
                queue = run.queue
                n = len(run)
                acked += n
                queue.stats.ack += n
                counts.queue(queue).ack += n
                queue.settler.ack_run(run.segment, run.offsets, sum(run.sizes))
                queues[id(queue)] = queue
            ch.stats.ack += acked
        elif not taken:
            # Runs alone: disjoint, in tag order already; each goes to its queue
            # whole.
            for run in runs:
                queue = run.queue
                queue.settler.reject_run(run.segment, run.offsets, run.sizes, requeue, explicit)
                queues[id(queue)] = queue
        else:
            if runs:
                taken = sorted(
                    [*taken, *(item for run in runs for item in run.entries())],
                    key=lambda item: item[0],
                )
            self._reject_in_spans(taken, requeue, explicit, queues)
        if ch.global_prefetch_count or ch.global_prefetch_size:
            ch.resume_delivery()
        else:
            for q in queues.values():
                q.schedule_delivery()

    @staticmethod
    def _reject_in_spans(
        taken: list[tuple[int, Unacked]], requeue: bool, explicit: bool, queues: dict[int, Queue]
    ) -> None:
        """Reject deliveries in tag order, each stretch of one queue's in one call
        (Queue.reject_many): the queues see them in the order they would one by
        one, across queues too (their dead-letter copies keep that order)."""
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

    # -- transactions and closing -------------------------------------------------------
    def commit(self, acks: list[TxAck]) -> None:
        """tx.commit: settle the acks the transaction held, in the order they came."""
        self.credit([(tag, entry) for tag, entry, _kind, _requeue in acks], [])
        for tag, entry, kind, requeue in acks:
            self.settle([(tag, entry)], [], None if kind == "ack" else requeue)

    def rollback(self) -> None:
        """tx.rollback: the acks held make those deliveries unacked again, in tag
        order. Their prefetch slots were never given back (see ack_like)."""
        acks, self.tx_acks = self.tx_acks, []
        if acks:
            self.channel.unacked.restore([(tag, entry) for tag, entry, _kind, _requeue in acks])

    def give_back(self) -> None:
        """A closing channel: every unacked delivery (and every one a transaction
        held) goes back to its queue, in sequence order; each stretch of one
        queue's deliveries in one reject_many, as reject() one by one would go
        (the messages of its runs read back together)."""
        ch = self.channel
        unacked = [e for _, e in ch.unacked.entries()] + [e for _, e, _, _ in self.tx_acks]
        ch.unacked.clear()
        ch.consumer_unacked = 0
        self.tx_acks.clear()
        unacked.sort(key=lambda e: e[1])
        self._reject_in_spans([(0, e) for e in unacked], True, False, {})
