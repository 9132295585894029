"""Publisher confirms of one channel: the acks and nacks of a loop turn, coalesced.

A confirm is recorded when its publish is routed, or once the stores it went to
are settled, and all those recorded since the last write go out together before
it. Acks below the oldest publish still waiting become one ack with
multiple=true; a multiple ack must never cover a publish still to be settled.

When a publish is settled (synced, held by the followers; written out with
``sync = false``; refused when a full disk dropped it) is the core's rule
(core/session.py's Settlements): this module only encodes the answers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from warren.amqp import spec
from warren.amqp.frames import method_frame
from warren.core.channel_counts import ConfirmMarks
from warren.core.session import Settlements
from warren.core.store import MessageStore

if TYPE_CHECKING:
    from warren.amqp.channel import Channel


class PublisherConfirms:
    """A confirm-mode channel's confirms: recorded, waiting for a sync, flushed."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        # Recorded since the last write: the publish number of an ack, minus
        # that of a nack (no tuple per confirm: a run's confirms are many).
        self._recorded: list[int] = []
        # Confirms still waiting for a disk sync, in publish order (a dict as an
        # ordered set): a multiple ack must never cover one of them.
        self.unconfirmed: dict[int, None] = {}
        # Whether unconfirmed's order is publish order (its first key the oldest):
        # a keyed run's routing keys may add their numbers out of order.
        self._in_order = True
        # Publishes waiting to be settled, by publish number.
        self._waiting: Settlements[int] = channel.connection.client_session.settlements(
            self._confirm_batch, self._wake, ordered=False
        )
        self._flushing = False
        #: The exchanges the publishes went to, for the confirms by exchange.
        self.marks = ConfirmMarks()

    def routed(self, seq: int, routed: int, durable: list[MessageStore] | None) -> None:
        """The confirm of publish ``seq``, routed to ``routed`` queues (negative: a
        queue refused it, x-overflow reject-publish): once ``durable`` is
        settled, when it holds anything."""
        if routed < 0:
            self.confirm(seq, False)
        elif self._waiting.add(seq, durable):
            self.unconfirmed[seq] = None
        else:
            self.confirm(seq, True)

    def run(
        self,
        base: int,
        indexes: list[int] | None,
        n: int,
        durable: list[MessageStore],
        lost: list[int] | None = None,
    ) -> None:
        """Confirms for a run's first ``n`` messages (message ``i`` is publish
        ``base + 1 + (indexes[i] if indexes else i)``), taken at once: once
        ``durable`` is settled, when it holds anything (one batch entry for
        them all).

        ``lost``: indexes of messages that a store took and that a failed
        write-out dropped while the run was being stored (Queue.publish_run;
        a stream writes a run in pieces): those are nacked. The rest join the
        batch of the write generation now, as a single publish would: a
        store's pieces were written out by then, or are still buffered, and a
        later failed write-out of a buffer spans the generation now."""
        if lost and any(i < n for i in lost):
            self._run_with_losses(base, indexes, n, durable, set(lost))
            return
        seqs = (
            range(base + 1, base + 1 + n)
            if indexes is None
            else [base + 1 + indexes[i] for i in range(n)]
        )
        if self._waiting.add_many(seqs, durable):
            self.unconfirmed.update(dict.fromkeys(seqs))
            return
        for seq in seqs:
            self.confirm(seq, True)

    def _run_with_losses(
        self,
        base: int,
        indexes: list[int] | None,
        n: int,
        durable: list[MessageStore],
        lost: set[int],
    ) -> None:
        """run() when a store lost some of the run's messages: a nack for each of
        those, the others one by one as routed() would take them."""
        for i in range(n):
            seq = base + 1 + (indexes[i] if indexes is not None else i)
            self.routed(seq, -1 if i in lost else 1, durable)

    def reordered(self) -> None:
        """A keyed run may have left confirms waiting out of publish order: the
        oldest is then the minimum, until none waits."""
        if self.unconfirmed:
            self._in_order = False

    def _wake(self) -> None:
        """sync = false: flush() at the end of this turn settles what waits."""
        self.channel.connection.mark_dirty(self.channel)

    def _confirm_batch(self, seqs: list[int], ok: bool) -> None:
        """confirm() for every publish of a synced batch."""
        channel = self.channel
        if channel.closed:
            return
        unconfirmed = self.unconfirmed
        for seq in seqs:
            unconfirmed.pop(seq, None)
        if not self._recorded and not self._flushing:
            channel.connection.mark_dirty(channel)
        if ok:
            self._recorded.extend(seqs)
            channel.stats.confirm += len(seqs)
            self.marks.confirmed(seqs)
        else:
            self._recorded.extend([-seq for seq in seqs])

    def confirm(self, seq: int, ok: bool) -> None:
        """Record an ack (or a nack) of publish ``seq``, sent with the next write."""
        channel = self.channel
        if channel.closed:
            return
        self.unconfirmed.pop(seq, None)
        if not self._recorded:
            channel.connection.mark_dirty(channel)
        self._recorded.append(seq if ok else -seq)
        if ok:
            channel.stats.confirm += 1
            self.marks.confirmed_one(seq)

    def flush(self) -> None:
        """Send the confirms recorded since the last write, acks coalesced (first
        settling the sync = false batches: the stores were written out before).

        Acks below the oldest confirm still waiting for a sync become one ack with
        multiple=true (nothing unconfirmed lies below them); acks above it go out
        one by one, and nacks always individually, before the coalesced ack.
        """
        self._flushing = True  # what written() settles goes out now, not next turn
        try:
            self._waiting.written()
        finally:
            self._flushing = False
        results, self._recorded = self._recorded, []
        channel = self.channel
        if channel.closing or channel.closed:
            return
        unconfirmed = self.unconfirmed
        if self._in_order:
            floor = next(iter(unconfirmed), None)
        else:
            floor = min(unconfirmed, default=None)
            if floor is None:
                self._in_order = True
        self.marks.settled_below(floor)
        channel_id = channel.id
        out: list[bytes] = []
        top = below = 0  # the highest ack below the floor, and how many there are
        for seq in results:
            if seq < 0:
                out.append(
                    method_frame(
                        channel_id,
                        spec.BasicNack(delivery_tag=-seq, multiple=False, requeue=False),
                    )
                )
            elif floor is None or seq < floor:
                below += 1
                if seq > top:
                    top = seq
            else:
                out.append(
                    method_frame(channel_id, spec.BasicAck(delivery_tag=seq, multiple=False))
                )
        if below:
            out.append(
                method_frame(channel_id, spec.BasicAck(delivery_tag=top, multiple=below > 1))
            )
        if out:
            channel.connection.send_many(out)

