"""Publisher confirms of one channel: the acks and nacks of a loop turn, coalesced.

A confirm is recorded when its publish is routed, or once the stores it went to
are synced (one GroupSync callback per channel per sync round), and all those
recorded since the last write go out together before it. Acks below the oldest
publish still waiting for a sync become one ack with multiple=true; a multiple
ack must never cover a publish whose sync is still to come.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from warren.amqp import spec
from warren.amqp.frames import method_frame
from warren.core.store import MessageStore

if TYPE_CHECKING:
    from warren.amqp.channel import Channel
    from warren.store.sync import GroupSync


class PublisherConfirms:
    """A confirm-mode channel's confirms: recorded, waiting for a sync, flushed."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        # Recorded since the last write: (publish number, ack or nack).
        self._recorded: list[tuple[int, bool]] = []
        # Confirms still waiting for a disk sync, in publish order (a dict as an
        # ordered set): a multiple ack must never cover one of them.
        self.unconfirmed: dict[int, None] = {}
        # Whether unconfirmed's order is publish order (its first key the oldest):
        # a keyed run's routing keys may add their numbers out of order.
        self._in_order = True
        self._sync_batch: list[int] | None = None
        self._sync_round = 0

    def routed(self, seq: int, routed: int, durable: list[MessageStore] | None) -> None:
        """The confirm of publish ``seq``, routed to ``routed`` queues (negative: a
        queue refused it, x-overflow reject-publish): after ``durable`` is synced,
        when it holds anything."""
        syncer = self.channel.connection.broker.syncer
        if routed < 0:
            self.confirm(seq, False)
        elif durable and syncer is not None and syncer.enabled:
            self.after_sync(seq, durable, syncer)
        else:
            self.confirm(seq, True)

    def run(
        self, base: int, indexes: list[int] | None, n: int, durable: list[MessageStore]
    ) -> None:
        """Confirms for a run's first ``n`` messages (message ``i`` is publish
        ``base + 1 + (indexes[i] if indexes else i)``), taken at once: after
        ``durable`` is synced, when it holds anything."""
        syncer = self.channel.connection.broker.syncer
        wait = bool(durable) and syncer is not None and syncer.enabled
        for i in range(n):
            seq = base + 1 + (indexes[i] if indexes is not None else i)
            if wait:
                assert syncer is not None
                self.after_sync(seq, durable, syncer)
            else:
                self.confirm(seq, True)

    def reordered(self) -> None:
        """A keyed run may have left confirms waiting out of publish order: the
        oldest is then the minimum, until none waits."""
        if self.unconfirmed:
            self._in_order = False

    def after_sync(self, seq: int, stores: list[MessageStore], syncer: GroupSync) -> None:
        """Confirm once the stores are synced; one callback per channel per sync round."""
        self.unconfirmed[seq] = None
        round_id = syncer.next_round
        if self._sync_batch is None or self._sync_round != round_id:
            batch: list[int] = []
            self._sync_batch = batch
            self._sync_round = round_id
            syncer.after_sync(stores, lambda ok: self._confirm_batch(batch, ok))
        else:
            syncer.add(stores)
        self._sync_batch.append(seq)

    def _confirm_batch(self, seqs: list[int], ok: bool) -> None:
        if self._sync_batch is seqs:
            self._sync_batch = None
        for seq in seqs:
            self.confirm(seq, ok)

    def confirm(self, seq: int, ok: bool) -> None:
        """Record an ack (or a nack) of publish ``seq``, sent with the next write."""
        channel = self.channel
        if channel.closed:
            return
        self.unconfirmed.pop(seq, None)
        if not self._recorded:
            channel.connection.mark_dirty(channel)
        self._recorded.append((seq, ok))
        if ok:
            channel.stats.confirm += 1

    def flush(self) -> None:
        """Send the confirms recorded since the last write, acks coalesced.

        Acks below the oldest confirm still waiting for a sync become one ack with
        multiple=true (nothing unconfirmed lies below them); acks above it go out
        one by one, and nacks always individually, before the coalesced ack.
        """
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
        channel_id = channel.id
        out: list[bytes] = []
        below: list[int] = []
        for seq, ok in results:
            if not ok:
                out.append(
                    method_frame(
                        channel_id, spec.BasicNack(delivery_tag=seq, multiple=False, requeue=False)
                    )
                )
            elif floor is None or seq < floor:
                below.append(seq)
            else:
                out.append(
                    method_frame(channel_id, spec.BasicAck(delivery_tag=seq, multiple=False))
                )
        if below:
            top = max(below)
            out.append(
                method_frame(channel_id, spec.BasicAck(delivery_tag=top, multiple=len(below) > 1))
            )
        if out:
            channel.connection.send_many(out)
