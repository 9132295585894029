"""A quorum queue's store: RabbitMQ 4.x's two message priorities over a
PriorityStore, the messages held for at-least-once dead-lettering, and the
queue's delivery counts.

Priorities 0-4 (or none) are normal (level ``p000``), 5 and above high
(``p001``); while both levels have messages, two high ones go for each normal
one (RabbitMQ's "fair share"). A third level, ``p002``, holds the dead-letter
copies that at-least-once dead-lettering could not hand to a target yet
(RabbitMQ's "discards"): never served to consumers, not counted as ready,
retried by the queue (core/quorum_queue.py). Every message survives a restart
whatever its delivery-mode (the levels recover transient messages too,
store_factory.py). The delivery counts are store/delivery_counts.py's
``delivery-counts``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

from warren.core.codec_errors import DecodeError
from warren.core.message import Message
from warren.core.properties import peek_priority
from warren.core.store import StoredRun, StoreSpan
from warren.store.delivery_counts import FILE_NAME as COUNTS_FILE
from warren.store.delivery_counts import DeliveryCounts
from warren.store.disk_budget import UNMETERED, DiskBudget
from warren.store.mirror import FileMirror
from warren.store.priority_store import (
    INNER_MASK,
    LEVEL_SHIFT,
    SEGMENT_LEVEL_SHIFT,
    LevelStore,
    PriorityStore,
)
from warren.store.segment_store import SegmentStore

__all__ = ["HELD", "QUORUM_HIGH", "QuorumPriorityStore"]

#: A quorum queue's message priority levels (RabbitMQ 4.x): 0 normal, 1 high.
QUORUM_HIGH = 1
#: Priorities above this are high in a quorum queue; none and 0..4 are normal.
QUORUM_NORMAL_MAX = 4
# The priority property's bit (1 << 11 of the flags) in their first byte.
_PRIORITY_FLAG_BYTE = 0x08
#: High-priority messages delivered for each normal one while both wait.
QUORUM_HIGH_PER_NORMAL = 2
#: The level of the dead-letter copies held for at-least-once dead-lettering.
HELD = 2


class QuorumPriorityStore(PriorityStore):
    """A quorum queue's messages: RabbitMQ 4.x's two priorities, served fairly.

    Priorities 0-4 (or none) are normal, 5 and above high. While both levels
    have messages, two high ones go for each normal one, so normal messages
    always progress (RabbitMQ's "fair share", not a classic queue's strict
    order). No x-max-priority is needed: every quorum queue has the two levels,
    the high one made on first use. ``budget`` and ``mirror``: the data
    directory's (store/layout.py), for the delivery counts and the directory.
    """

    def __init__(
        self,
        make_level: Callable[[int], LevelStore],
        directory: Path | None = None,
        *,
        budget: DiskBudget = UNMETERED,
        mirror: FileMirror | None = None,
    ) -> None:
        super().__init__(QUORUM_HIGH, make_level, directory, mirror)
        # High-priority messages shifted since the last normal one.
        self._high_streak = 0
        #: The queue's delivery counts, kept next to its levels (None in RAM).
        self.delivery_counts: DeliveryCounts | None = None
        if directory is not None:
            self.delivery_counts = DeliveryCounts(
                directory / COUNTS_FILE, self.is_ready, budget=budget, mirror=mirror
            )

    # -- held dead-letters --------------------------------------------------------------
    @property
    def held_count(self) -> int:
        """Dead-letter copies held (RabbitMQ's messages_dlx)."""
        held = self._levels[HELD]
        return held.ready_count if held is not None else 0

    @property
    def held_bytes(self) -> int:
        held = self._levels[HELD]
        return held.ready_bytes if held is not None else 0

    def hold(self, msg: Message) -> int:
        """Keep a dead-letter copy no target took yet; written before anything
        else of the store (the original's ack) at the next flush."""
        store = self._levels[HELD] or self._open(HELD)
        return (HELD << LEVEL_SHIFT) | store.append(msg)

    def next_held(self) -> tuple[int, Message] | None:
        """The oldest held copy, taken out until release_held or keep_held."""
        store = self._levels[HELD]
        item = store.shift() if store is not None else None
        return None if item is None else ((HELD << LEVEL_SHIFT) | item[0], item[1])

    def release_held(self, seq: int) -> None:
        """A target took the copy (or it is given up): gone for good."""
        store = self._levels[HELD]
        if store is not None:
            store.ack(seq & INNER_MASK)

    def keep_held(self, seq: int, msg: Message) -> None:
        """Not taken this time: held again, at its place."""
        store = self._levels[HELD]
        if store is not None:
            store.requeue(seq & INNER_MASK, msg)

    def _open(self, level: int) -> LevelStore:
        store = super()._open(level)
        if level == HELD:
            # Not ready for consumers: out of the totals; first in every pass over
            # the levels, so that a held copy reaches the OS before the original's ack.
            self._uncount_held()
            self._stores = (store, *(s for s in self._stores if s is not store))
        return store

    def _recount(self) -> None:
        super()._recount()
        self._uncount_held()

    def _uncount_held(self) -> None:
        held = self._levels[HELD]
        if held is not None and self._ready_mask & (1 << HELD):
            self._ready_count -= held.ready_count
            self._ready_bytes -= held.ready_bytes
            self._ready_mask &= ~(1 << HELD)

    def purge(self) -> int:
        """The ready messages of both priorities; held copies stay."""
        n = 0
        for level in (0, QUORUM_HIGH):
            store = self._levels[level]
            if store is not None:
                n += store.purge()
        self._ready_count = self._ready_bytes = self._ready_mask = 0
        return n

    def scan_ready(self, exchange: str | None = None) -> Iterator[tuple[int, int, bytes]]:
        """Every ready message, high then normal (held copies are not ready)."""
        for level in (QUORUM_HIGH, 0):
            store = self._levels[level]
            if store is not None and store.ready_count:
                base = level << LEVEL_SHIFT
                for seq, timestamp, properties in store.scan_ready(exchange):
                    yield base | seq, timestamp, properties

    def is_ready(self, seq: int) -> bool:
        """Whether ``seq`` names a ready message (SegmentStore.is_ready)."""
        store = self._level(seq)
        return isinstance(store, SegmentStore) and store.is_ready(seq & INNER_MASK)

    def flush(self) -> None:
        super().flush()
        if self.delivery_counts is not None:
            self.delivery_counts.flush()

    def sync_acks(self) -> None:
        """The levels' ack files and the delivery counts: both lazily durable."""
        super().sync_acks()
        if self.delivery_counts is not None:
            self.delivery_counts.sync()

    def collect_sync(self, fds: list[int], paths: list[Path], dirs: list[Path]) -> None:
        super().collect_sync(fds, paths, dirs)
        counts = self.delivery_counts
        if counts is not None:
            counts.flush()
            counts.collect_dirs(dirs)

    def close(self, sync: bool = True) -> None:
        counts = self.delivery_counts
        if counts is not None:
            counts.flush()
            if sync:
                counts.sync()
        super().close(sync)

    def delete(self) -> None:
        """The counts go with the directory (nothing more is written there)."""
        self.delivery_counts = None
        super().delete()

    def _level_of(self, msg: Message) -> int:
        props = msg.properties
        if not props or not props[0] & _PRIORITY_FLAG_BYTE:
            return 0  # no priority property: normal, without parsing the flags
        try:
            priority = peek_priority(props)
        except DecodeError:
            return 0
        return QUORUM_HIGH if priority is not None and priority > QUORUM_NORMAL_MAX else 0

    def span(self) -> StoreSpan | None:
        """A span only while one level alone has messages: with both, two high
        go for each normal one, message by message."""
        if self._lost:
            self._recount()
        mask = self._ready_mask
        if mask not in (1, 1 << QUORUM_HIGH):
            return None
        return self._level_span(mask.bit_length() - 1)

    def take_span(self, span: StoreSpan, taken: StoredRun, acked: bool) -> None:
        super().take_span(span, taken, acked)
        high = span.segment >> SEGMENT_LEVEL_SHIFT
        self._high_streak = self._high_streak + len(taken) if high else 0

    def _take(self, peek: bool) -> tuple[int, Message, bool] | None:
        if self._lost:
            self._recount()
        order = (1, 0) if self._high_streak < QUORUM_HIGH_PER_NORMAL else (0, 1)
        for level in order:
            if not self._ready_mask & (1 << level):
                continue
            store = self._levels[level]
            assert store is not None
            count, size = store.ready_count, store.ready_bytes
            item = store.peek() if peek else store.shift()
            self._ready_count += store.ready_count - count
            self._ready_bytes += store.ready_bytes - size
            if not store.ready_count:
                self._ready_mask &= ~(1 << level)
            if item is not None:
                if not peek:
                    self._high_streak = self._high_streak + 1 if level else 0
                return (level << LEVEL_SHIFT) | item[0], item[1], item[2]
        return None
