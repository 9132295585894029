"""The stores the broker's vhosts get: where they live and what they start with.

A queue's store is a SegmentStore in its directory under the data directory
(durable queues under vhosts/, the others under transient/), one per priority
level used for a priority queue (PriorityStore); a stream's a StreamStore; a
delayed exchange's a SegmentStore under exchanges/. While the vhosts are
restored at start, each queue store also gets what the last clean shutdown
recorded as delivered in it (its delivered mark, docs/storage.md), so that
only those messages come back redelivered.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from warren.config import Config
from warren.core.store import MessageStore
from warren.core.stream import StreamLog
from warren.core.vhost import QUORUM, VHost
from warren.store.layout import DataDir
from warren.store.priority_store import PriorityStore, level_name
from warren.store.quorum_store import QuorumPriorityStore
from warren.store.segment_store import SegmentStore
from warren.store.stream_store import StreamStore

__all__ = ["StoreFactory"]


class StoreFactory:
    """VHost's store factories for one data directory and configuration."""

    def __init__(self, layout: DataDir, config: Config) -> None:
        self.layout = layout
        self.config = config
        #: What the last clean shutdown recorded as delivered, by store directory,
        #: while the vhosts are restored (None after a crash: everything may
        #: have been); empty afterwards, as stores made then are new.
        self.delivered_marks: dict[Path, int] | None = {}

    def queue_store(
        self, vhost: VHost, queue: str, persistent: bool, max_priority: int
    ) -> MessageStore:
        """A queue's store (VHost's store_factory; max_priority QUORUM: a quorum
        queue's, whose every message survives a restart, whatever its
        delivery-mode, in two priority levels)."""
        layout = self.layout
        directory = (
            layout.queue_dir(vhost.name, queue)
            if persistent
            else layout.transient_queue_dir(vhost.name, queue)
        )
        segment_size = self.config.segment_size
        if max_priority == QUORUM:
            return QuorumPriorityStore(
                lambda level: SegmentStore(
                    directory / level_name(level),
                    segment_size,
                    persistent_only_on_recovery=False,
                    delivered_mark=self._delivered_mark(directory / level_name(level)),
                    count_transient=False,  # every message of a quorum queue counts
                ),
                directory,
            )
        if max_priority:
            # One segment store per priority level used, in <queue dir>/p<level>.
            return PriorityStore(
                max_priority,
                lambda level: SegmentStore(
                    directory / level_name(level),
                    segment_size,
                    delivered_mark=self._delivered_mark(directory / level_name(level)),
                    preallocate=persistent,
                    count_transient=persistent,
                ),
                directory,
            )
        # A transient queue's files are never synced: nothing to allocate ahead for
        # (docs/storage.md, "Writing").
        # Only a durable queue reports persistent counts (a transient one: 0).
        return SegmentStore(
            directory,
            segment_size,
            delivered_mark=self._delivered_mark(directory),
            preallocate=persistent,
            count_transient=persistent,
        )

    def _delivered_mark(self, directory: Path) -> int | None:
        """What the last clean shutdown recorded as delivered in this store (0: none
        of it); None after a crash: all it recovers may have been delivered."""
        marks = self.delivered_marks
        return None if marks is None else marks.get(directory, 0)

    def stream_store(self, vhost: VHost, queue: str, arguments: dict[str, Any]) -> StreamLog:
        """A stream's segment log, in its queue directory; segments of
        x-stream-max-segment-size-bytes when given, else [main] segment_size."""
        size = arguments.get("x-stream-max-segment-size-bytes")
        if not isinstance(size, int) or isinstance(size, bool) or size <= 64:
            size = self.config.segment_size
        return StreamStore(self.layout.queue_dir(vhost.name, queue), min(size, 0xFFFFFFFF))

    def exchange_store(self, vhost: VHost, exchange: str, persistent: bool) -> MessageStore:
        """A delayed exchange's store of held messages."""
        directory = (
            self.layout.exchange_dir(vhost.name, exchange)
            if persistent
            else self.layout.transient_exchange_dir(vhost.name, exchange)
        )
        return SegmentStore(
            directory, self.config.segment_size, preallocate=persistent, count_transient=False
        )
