"""Publisher confirms of one channel: the acks and nacks of a loop turn, coalesced.

A confirm is recorded when its publish is routed, or once the stores it went to
are synced, and all those recorded since the last write go out together before
it. Acks below the oldest publish still waiting for a sync become one ack with
multiple=true; a multiple ack must never cover a publish whose sync is still to
come.

Publishes waiting for a sync wait in batches, one GroupSync callback per batch:
a batch holds the publishes of one write generation (store/disk_budget.py) to
the same stores, so that when a full disk made a store drop what it had not
written yet, exactly those publishes are nacked (GroupSync tells each batch).
With ``sync = false`` a confirm waits only for the stores to be written out at
the end of the turn (AMQPConnection.take_output), batched the same way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from warren.amqp import spec
from warren.amqp.frames import method_frame
from warren.core.channel_counts import ConfirmMarks
from warren.core.store import MessageStore

if TYPE_CHECKING:
    from warren.amqp.channel import Channel
    from warren.store.sync import GroupSync


def _stores_key(stores: list[MessageStore]) -> object:
    """What tells the store sets of publishes apart, cheaply for the usual one store."""
    return id(stores[0]) if len(stores) == 1 else tuple(id(s) for s in stores)


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
        # Batches waiting for a sync, of the write generation _sync_gen, by store set.
        self._sync_batches: dict[object, list[int]] = {}
        self._sync_gen = 0
        # sync = false: batches waiting for the end of the turn's write-out, as
        # (stores, write generation, publish numbers).
        self._flush_batches: list[tuple[list[MessageStore], int, list[int]]] = []
        #: The exchanges the publishes went to, for the confirms by exchange.
        self.marks = ConfirmMarks()

    def routed(self, seq: int, routed: int, durable: list[MessageStore] | None) -> None:
        """The confirm of publish ``seq``, routed to ``routed`` queues (negative: a
        queue refused it, x-overflow reject-publish): after ``durable`` is synced,
        when it holds anything."""
        syncer = self.channel.connection.broker.syncer
        if routed < 0:
            self.confirm(seq, False)
        elif durable and syncer is not None:
            if syncer.enabled:
                self.after_sync(seq, durable, syncer)
            else:
                self.after_write(seq, durable, syncer)
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
        ``base + 1 + (indexes[i] if indexes else i)``), taken at once: after
        ``durable`` is synced, when it holds anything (one batch entry for
        them all).

        ``lost``: indexes of messages that a store took and that a failed
        write-out dropped while the run was being stored (Queue.publish_run;
        a stream writes a run in pieces): those are nacked. The rest join the
        batch of the write generation now, as a single publish would: a
        store's pieces were written out by then, or are still buffered, and a
        later failed write-out of a buffer spans the generation now."""
        syncer = self.channel.connection.broker.syncer
        if lost and any(i < n for i in lost):
            self._run_with_losses(base, indexes, n, durable, set(lost))
            return
        if durable and syncer is not None and syncer.enabled:
            seqs = (
                range(base + 1, base + 1 + n)
                if indexes is None
                else [base + 1 + indexes[i] for i in range(n)]
            )
            self.after_sync_many(seqs, durable, syncer)
            return
        for i in range(n):
            seq = base + 1 + (indexes[i] if indexes is not None else i)
            if not durable or syncer is None:
                self.confirm(seq, True)
            elif syncer.enabled:
                self.after_sync(seq, durable, syncer)
            else:
                self.after_write(seq, durable, syncer)

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

    def after_sync(self, seq: int, stores: list[MessageStore], syncer: GroupSync) -> None:
        """Confirm once the stores are synced, in a batch of this write generation
        and these stores: one GroupSync callback per batch."""
        self.unconfirmed[seq] = None
        self._sync_batch(stores, syncer).append(seq)

    def after_sync_many(
        self, seqs: range | list[int], stores: list[MessageStore], syncer: GroupSync
    ) -> None:
        """after_sync for several publishes at once (a run's)."""
        self.unconfirmed.update(dict.fromkeys(seqs))
        self._sync_batch(stores, syncer).extend(seqs)

    def _sync_batch(self, stores: list[MessageStore], syncer: GroupSync) -> list[int]:
        """The batch of this write generation and these stores."""
        gen = syncer.gen
        if gen != self._sync_gen:
            self._sync_batches = {}
            self._sync_gen = gen
        key = _stores_key(stores)
        batch = self._sync_batches.get(key)
        if batch is None:
            new: list[int] = []
            batch = self._sync_batches[key] = new
            syncer.after_sync(stores, lambda ok: self._confirm_batch(new, ok))
        return batch

    def after_write(self, seq: int, stores: list[MessageStore], syncer: GroupSync) -> None:
        """sync = false: confirm once the stores are written out, at the end of the
        turn (a nack if the write-out failed and dropped the message)."""
        self.unconfirmed[seq] = None
        gen = syncer.gen
        batches = self._flush_batches
        if batches:
            last_stores, last_gen, seqs = batches[-1]
            if last_gen == gen and _stores_key(last_stores) == _stores_key(stores):
                seqs.append(seq)
                return
        else:
            self.channel.connection.mark_dirty(self.channel)
        batches.append((list(stores), gen, [seq]))

    def _confirm_batch(self, seqs: list[int], ok: bool) -> None:
        """confirm() for every publish of a synced batch."""
        channel = self.channel
        if channel.closed:
            return
        unconfirmed = self.unconfirmed
        for seq in seqs:
            unconfirmed.pop(seq, None)
        if not self._recorded:
            channel.connection.mark_dirty(channel)
        if ok:
            self._recorded.extend(seqs)
            channel.stats.confirm += len(seqs)
            self.marks.confirmed(seqs)
        else:
            self._recorded.extend([-seq for seq in seqs])

    def written(self) -> None:
        """The stores were written out (take_output): settle the sync = false
        batches, nacking those whose messages (all of one write generation) a
        failed write-out dropped."""
        batches, self._flush_batches = self._flush_batches, []
        channel = self.channel
        if channel.closed:
            return
        unconfirmed, recorded = self.unconfirmed, self._recorded
        for stores, batch_gen, seqs in batches:
            ok = not any(_lost(s, batch_gen, batch_gen) for s in stores)
            for seq in seqs:
                unconfirmed.pop(seq, None)
                recorded.append(seq if ok else -seq)
            if ok:
                channel.stats.confirm += len(seqs)
                self.marks.confirmed(seqs)

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
        if self._flush_batches:
            self.written()
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


def _lost(store: MessageStore, first: int, last: int) -> bool:
    lost_between = getattr(store, "lost_between", None)
    return lost_between is not None and bool(lost_between(first, last))
