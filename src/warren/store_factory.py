"""Every store and log the broker's vhosts get: where they live, what they start with.

Made from the data directory (store/layout.py's DataDir), the one object that
owns the disk budget and clustering's mirror, and the one place that hands
them on: each store and log receives them in its constructor, so no writer
looks anything up by path. Replication reaches the files only through the
mirror given here.

A queue's store is a SegmentStore in its directory under the data directory
(durable queues under vhosts/, the others under transient/), one per priority
level used for a priority queue (PriorityStore) or a quorum queue
(QuorumPriorityStore, with its delivery counts); a stream's a StreamStore; a
delayed exchange's a SegmentStore under exchanges/. A vhost's definitions log
and the deduplication key journals of its durable queues and exchanges are
made here too. While the vhosts are restored at start, each queue store also
gets what the last clean shutdown recorded as delivered in it (its delivered
mark, docs/storage.md), so that only those messages come back redelivered.

Transient stores get no mirror: the transient area is never replicated.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from warren.config import Config
from warren.core.dedup import Deduplicator
from warren.core.store import MessageStore
from warren.core.stream import StreamLog
from warren.core.vhost import QUORUM, VHost
from warren.store.dedup_journal import FILE_NAME as KEYS_FILE
from warren.store.dedup_journal import DedupJournal
from warren.store.definitions import DefinitionsLog
from warren.store.layout import DataDir, make_dirs_durably
from warren.store.mirror import FileMirror
from warren.store.priority_store import PriorityStore, level_name
from warren.store.quorum_store import QuorumPriorityStore
from warren.store.segment_store import SegmentStore
from warren.store.stream_records import SHARED_DECODER, EntryDecoder
from warren.store.stream_store import StreamStore
from warren.store.sync import GroupSync

__all__ = ["StoreFactory"]


class StoreFactory:
    """The stores and logs of one data directory and configuration.

    ``syncer`` returns the broker's group commit (None before the start or
    without one): the key journals look it up at each use, a definitions log
    is told of its writes when it is made.
    """

    def __init__(
        self,
        data: DataDir,
        config: Config,
        syncer: Callable[[], GroupSync | None] = lambda: None,
    ) -> None:
        self.data = data
        self.config = config
        self._syncer = syncer
        #: What the last clean shutdown recorded as delivered, by store directory,
        #: while the vhosts are restored (None after a crash: everything may
        #: have been); empty afterwards, as stores made then are new.
        self.delivered_marks: dict[Path, int] | None = {}
        #: How a stream's chunk records become messages for AMQP readers: the
        #: process's (warren.app sets it to AMQP 1.0's mapping).
        self.stream_decoder: EntryDecoder = SHARED_DECODER

    def _mirror(self, persistent: bool) -> FileMirror | None:
        """The data directory's mirror, as it is now, for a store made now."""
        return self.data.mirror if persistent else None

    # -- queues and exchanges (VHost's store factories) -----------------------------------
    def queue_store(
        self, vhost: VHost, queue: str, persistent: bool, max_priority: int
    ) -> MessageStore:
        """A queue's store (VHost's store_factory; max_priority QUORUM: a quorum
        queue's, whose every message survives a restart, whatever its
        delivery-mode, in two priority levels)."""
        data = self.data
        directory = (
            data.queue_dir(vhost.name, queue)
            if persistent
            else data.transient_queue_dir(vhost.name, queue)
        )
        budget, mirror = data.budget, self._mirror(persistent)
        segment_size = self.config.segment_size
        if max_priority == QUORUM:
            return QuorumPriorityStore(
                lambda level: SegmentStore(
                    directory / level_name(level),
                    segment_size,
                    persistent_only_on_recovery=False,
                    delivered_mark=self._delivered_mark(directory / level_name(level)),
                    count_transient=False,  # every message of a quorum queue counts
                    budget=budget,
                    mirror=mirror,
                ),
                directory,
                budget=budget,
                mirror=mirror,
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
                    budget=budget,
                    mirror=mirror,
                ),
                directory,
                mirror,
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
            budget=budget,
            mirror=mirror,
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
        store = StreamStore(
            self.data.queue_dir(vhost.name, queue),
            min(size, 0xFFFFFFFF),
            budget=self.data.budget,
            mirror=self._mirror(True),
            clock=vhost.clock,
            decoder=self.stream_decoder,
        )
        store.chunk_routing_key = queue  # as the stream protocol's messages had
        return store

    def exchange_store(self, vhost: VHost, exchange: str, persistent: bool) -> MessageStore:
        """A delayed exchange's store of held messages."""
        directory = (
            self.data.exchange_dir(vhost.name, exchange)
            if persistent
            else self.data.transient_exchange_dir(vhost.name, exchange)
        )
        return SegmentStore(
            directory,
            self.config.segment_size,
            preallocate=persistent,
            count_transient=False,
            budget=self.data.budget,
            mirror=self._mirror(persistent),
        )

    # -- a vhost's logs -------------------------------------------------------------------
    def definitions_log(self, vhost: str) -> DefinitionsLog:
        """A vhost's definitions log ([main] damaged_metadata says what a damaged
        line does); with a group commit its writes are synced by the rounds."""
        definitions = DefinitionsLog(
            self.data.definitions_file(vhost),
            self.config.sync,
            on_damage=self.config.damaged_metadata,
            object_dirs=True,
            budget=self.data.budget,
            mirror=self._mirror(True),
        )
        syncer = self._syncer()
        if syncer is not None and syncer.enabled:
            definitions.on_write = syncer.definitions_written
        return definitions

    def key_log(self, queue: Any, dedup: Deduplicator) -> DedupJournal:
        """VHost's ``key_logs``: a durable queue's key journal, in its directory."""
        directory = self.data.queue_dir(queue.vhost.name, queue.name)
        return DedupJournal(directory / KEYS_FILE, dedup, self._syncer, self._mirror(True))

    def exchange_key_log(self, exchange: Any, dedup: Deduplicator) -> DedupJournal:
        """VHost's ``exchange_key_logs``: a durable exchange's key journal, in its
        directory, made (durably) when the exchange is, so that its
        definition.json lands there too."""
        directory = self.data.exchange_dir(exchange.vhost_name, exchange.name)
        make_dirs_durably(directory)  # a follower makes it with the first append
        return DedupJournal(directory / KEYS_FILE, dedup, self._syncer, self._mirror(True))
