"""How a queue takes back the messages it delivered: a part of every Queue.

A delivery a consumer settles comes back to its queue here (``queue.settler``):
acked, it leaves the store; requeued, it goes back to its old place unless its
time is up or it is past the delivery limit, when it is dropped instead;
dropped, it is dead-lettered (rejected, expired, over the limit) or, when no
copy can be made, put back and kept (core/queue_features.py's ``stuck``).
The returns of a message are counted here for the delivery limit (every return
in the low 32 bits, the explicit ones above: queue_delivery.py's RETURNS).

Only the core calls it: a protocol settles through its client session's
delivery streams (core/deliveries.py), never the queue's settler itself
(tests/core/test_layering.py). A stream's (core/stream_queue.py) and a quorum
queue's (core/quorum_queue.py) settle their own way, by subclasses.
"""

from __future__ import annotations

import logging
from array import array
from typing import TYPE_CHECKING

from warren.core import dead_letter as dl
from warren.core.message import Message
from warren.core.queue_delivery import RETURNS
from warren.core.store import read_ahead

if TYPE_CHECKING:
    from warren.core.queue import Queue

__all__ = ["QueueSettlement"]

log = logging.getLogger("warren.queue")

# A message's returns (_delivery_counts): all of them, and above, the explicit ones.
_RETURNS, _EXPLICIT_RETURN = RETURNS, 1 << 32


class QueueSettlement:
    """One queue's acks, requeues and drops of delivered (unacked) messages."""

    __slots__ = ("queue",)

    def __init__(self, queue: Queue) -> None:
        self.queue = queue

    def check_reject(self) -> None:
        """Raise when this kind of queue refuses basic.nack and basic.reject (streams)."""

    def ack_many(self, seqs: list[int], size: int) -> None:
        """Acknowledge unacked messages: ``seqs``, of ``size`` body bytes in all."""
        q = self.queue
        if q.deleted:
            return
        q.unacked -= len(seqs)
        q.unacked_bytes -= size
        store = q.store
        ack = store.ack
        for seq in seqs:
            ack(seq)
        counts = q.delivery_counts
        if counts:
            for seq in seqs:
                counts.pop(seq, None)
        q.vhost.store_written(store)

    def ack_run(self, segment: int, offsets: array[int], size: int) -> None:
        """ack_many for deliveries of a run (StoredRun's segment and offsets)."""
        q = self.queue
        if q.deleted:
            return
        q.unacked -= len(offsets)
        q.unacked_bytes -= size
        store = q.store
        store.ack_run(segment, offsets)
        counts = q.delivery_counts
        if counts:
            for offset in offsets:
                counts.pop((segment << 32) | offset, None)
        q.vhost.store_written(store)

    def reject_run(
        self, segment: int, offsets: array[int], sizes: array[int], requeue: bool, explicit: bool
    ) -> None:
        """reject_many of a run's deliveries (StoredRun's segment, offsets and
        body sizes). Dropped with no dead-letter exchange to copy them to, they
        are settled as an ack_run is, nothing read back."""
        if not requeue and self.queue.dead_letter_exchange is None:
            self.ack_run(segment, offsets, sum(sizes))
            return
        base = segment << 32
        self.reject_many(
            [base | offset for offset in offsets], [None] * len(offsets), sizes, requeue, explicit
        )

    def reject_many(
        self,
        seqs: list[int],
        msgs: list[Message | None],
        sizes: list[int] | array[int],
        requeue: bool,
        explicit: bool,
    ) -> None:
        """Messages a consumer gave back, in delivery order, ``sizes`` their body
        bytes: requeued (to their old place), or dropped and dead-lettered
        (rejected; expired or over the delivery limit when they could not go
        back). A ``msgs`` entry None: a delivery of a run, read back from the
        store. ``explicit``: by basic.nack or basic.reject (not a channel's
        close or basic.recover). The store's flush and the next delivery pass
        are asked for once, when first needed."""
        q = self.queue
        if q.deleted:
            return
        store = q.store
        if not requeue and q.dead_letter_exchange is None:
            # Dropped, no copy to make: the messages need not be read back.
            ack = store.ack
            counts = q.delivery_counts
            for i, seq in enumerate(seqs):
                msg = msgs[i]
                q.unacked -= 1
                q.unacked_bytes -= sizes[i] if msg is None else len(msg.body)
                ack(seq)
                if counts:
                    counts.pop(seq, None)
            q.vhost.store_written(store)
            return
        requeued = written = False
        # The messages to read back, read a bounded stretch ahead at a time.
        ahead: list[Message | None] = []
        taken = 0
        for i, seq in enumerate(seqs):
            msg = msgs[i]
            if msg is None:
                if taken == len(ahead):
                    ahead = read_ahead(store, seqs, msgs, i)
                    taken = 0
                msg = ahead[taken]
                taken += 1
            if msg is None:
                try:
                    msg = store.read(seq)
                except (KeyError, ValueError) as exc:
                    q.unacked -= 1
                    q.unacked_bytes -= sizes[i]
                    log.error(
                        "queue '%s' in vhost '%s': a returned message (seq %d) does not read "
                        "back from the store (%s); it is dropped",
                        q.name,
                        q.vhost.name,
                        seq,
                        exc,
                    )
                    store.ack(seq)
                    continue
            q.unacked -= 1
            q.unacked_bytes -= len(msg.body)
            now = 0
            reason = dl.REJECTED
            if requeue:
                refusal = None
                if not q.plain or q.features.delivery_limit is not None:
                    now = q.clock.now_ms()
                    refusal = self.requeue_refusal(seq, msg, now, explicit)
                if refusal is None:
                    store.requeue(seq, msg)
                    if not requeued:  # later calls would change nothing
                        requeued = True
                        q.delivery.schedule()
                    continue
                reason = refusal
            if not q.features.dead_letter(seq, msg, reason, now or q.clock.now_ms()):
                # No copy could be made: the message goes back to where it was.
                q.features.stuck.add(seq)
                store.requeue(seq, msg)
                if not requeued:
                    requeued = True
                    q.delivery.schedule()
                continue
            store.ack(seq)
            q.delivery_counts.pop(seq, None)
            if not written:
                written = True
                q.vhost.store_written(store)

    def requeue_refusal(self, seq: int, msg: Message, now: int, explicit: bool) -> str | None:
        """Why a returned message may not go back (its time is up, or it is past the
        delivery limit), or None; counts the delivery attempt: every return in the
        low 32 bits, the explicit ones above."""
        q = self.queue
        deadline = q.features.deadline(msg)
        if deadline is not None and deadline <= now:
            return dl.EXPIRED
        limit = q.features.delivery_limit
        if limit is not None:
            counts = q.delivery_counts
            packed = counts.get(seq, 0)
            if (packed & _RETURNS) + 1 > limit:
                return dl.DELIVERY_LIMIT
            counts[seq] = packed + (_EXPLICIT_RETURN + 1 if explicit else 1)
            q.plain = False  # redeliveries carry their count (QueueDelivery.take)
        return None
