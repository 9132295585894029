"""A quorum queue's store: RabbitMQ 4.x's two message priorities over a
PriorityStore, and the queue's delivery counts next to them.

Priorities 0-4 (or none) are normal (level ``p000``), 5 and above high
(``p001``); while both levels have messages, two high ones go for each normal
one (RabbitMQ's "fair share"). Every message survives a restart whatever its
delivery-mode (the levels recover transient messages too, store_factory.py).
The delivery counts are store/delivery_counts.py's ``delivery-counts``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from warren.core.codec_errors import DecodeError
from warren.core.message import Message
from warren.core.properties import peek_priority
from warren.core.store import MessageStore
from warren.store.delivery_counts import FILE_NAME as COUNTS_FILE
from warren.store.delivery_counts import DeliveryCounts
from warren.store.priority_store import INNER_MASK, LEVEL_SHIFT, PriorityStore
from warren.store.segment_store import SegmentStore

__all__ = ["QUORUM_HIGH", "QuorumPriorityStore"]

#: A quorum queue's message priority levels (RabbitMQ 4.x): 0 normal, 1 high.
QUORUM_HIGH = 1
#: Priorities above this are high in a quorum queue; none and 0..4 are normal.
QUORUM_NORMAL_MAX = 4
# The priority property's bit (1 << 11 of the flags) in their first byte.
_PRIORITY_FLAG_BYTE = 0x08
#: High-priority messages delivered for each normal one while both wait.
QUORUM_HIGH_PER_NORMAL = 2


class QuorumPriorityStore(PriorityStore):
    """A quorum queue's messages: RabbitMQ 4.x's two priorities, served fairly.

    Priorities 0-4 (or none) are normal, 5 and above high. While both levels
    have messages, two high ones go for each normal one, so normal messages
    always progress (RabbitMQ's "fair share", not a classic queue's strict
    order). No x-max-priority is needed: every quorum queue has the two levels,
    the high one made on first use.
    """

    def __init__(
        self, make_level: Callable[[int], MessageStore], directory: Path | None = None
    ) -> None:
        super().__init__(QUORUM_HIGH, make_level, directory)
        # High-priority messages shifted since the last normal one.
        self._high_streak = 0
        #: The queue's delivery counts, kept next to its levels (None in RAM).
        self.delivery_counts: DeliveryCounts | None = None
        if directory is not None:
            self.delivery_counts = DeliveryCounts(directory / COUNTS_FILE, self.is_ready)

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
