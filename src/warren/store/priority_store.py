"""A priority queue's messages: one inner store per priority level, highest served first.

RabbitMQ's classic priority queues, as a MessageStore: a queue declared with
``x-max-priority`` N takes priorities 0..N from each message's basic properties
(none = 0, above N = N). shift() returns the highest priority first and, within
a priority, the oldest first; a requeued message goes back to its place within
its priority, because its own level's store puts it there.

Each level is a whole MessageStore of its own, made on first use by
``make_level(level)``; on disk, level ``p`` lives in ``<queue dir>/p<ppp>``
(:func:`level_name`) and is reopened at start when that directory exists. The
level is in the sequence number, above the inner store's bits, so ack, requeue
and remove_ready go straight to the right level.
"""

from __future__ import annotations

import logging
import re
import shutil
from array import array
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

from warren.core.codec_errors import DecodeError
from warren.core.message import Message, MessageRun
from warren.core.properties import peek_priority
from warren.core.store import MessageStore, StoredRun, StoreSpan
from warren.store.layout import make_dirs
from warren.store.mirror import FileMirror
from warren.store.segment_store import SEQ_BITS, SegmentStore
from warren.store.sync_files import sync_files

__all__ = [
    "INNER_MASK",
    "LevelStore",
    "LEVEL_SHIFT",
    "MAX_PRIORITY",
    "SEGMENT_LEVEL_SHIFT",
    "PriorityStore",
    "level_name",
]

log = logging.getLogger("warren.store")

#: x-max-priority is at most 255, as in RabbitMQ.
MAX_PRIORITY = 255
#: seq = level << LEVEL_SHIFT | inner seq. Inner seqs must stay below 2**LEVEL_SHIFT:
#: a SegmentStore's do (SEQ_BITS), a MemoryStore's counter never gets there.
LEVEL_SHIFT = SEQ_BITS
INNER_MASK = (1 << LEVEL_SHIFT) - 1
#: A span's and a run's segment (seq >> 32) holds the level above this many bits.
SEGMENT_LEVEL_SHIFT = LEVEL_SHIFT - 32
_INNER_SEGMENT_MASK = (1 << SEGMENT_LEVEL_SHIFT) - 1
_LEVEL_DIR = re.compile(r"p(\d{3})")


class LevelStore(MessageStore, Protocol):
    """What a PriorityStore needs of each level: a queue's store, plus what the
    PriorityStore itself offers as a disk store (core/store.py's DiskStore:
    a full sync, the lazy ack sync and the clean stop's marks), each passed
    on to every level. SegmentStore and MemoryStore both are one."""

    def sync(self) -> None: ...

    def sync_acks(self) -> None: ...

    def delivered_marks(self) -> dict[Path, int]: ...


def level_name(level: int) -> str:
    """The subdirectory of a priority queue's directory that holds ``level``."""
    return f"p{level:03d}"


class PriorityStore:
    """MessageStore of a priority queue over one lazily created store per level.

    ``directory`` is where ``make_level`` puts the levels (``directory /
    level_name(level)``): the levels found there are reopened at once, and
    delete() removes it. Without it (levels in RAM) nothing is recovered.
    ``mirror``: the data directory's (store/layout.py), told of that removal
    (each level reports its own files).
    """

    def __init__(
        self,
        max_priority: int,
        make_level: Callable[[int], LevelStore],
        directory: Path | None = None,
        mirror: FileMirror | None = None,
    ) -> None:
        if not 1 <= max_priority <= MAX_PRIORITY:
            raise ValueError(f"max_priority must be in 1..{MAX_PRIORITY}, not {max_priority}")
        self.max_priority = max_priority
        self._make_level = make_level
        self._dir = directory
        self._mirror = mirror
        self._levels: list[LevelStore | None] = [None] * (MAX_PRIORITY + 1)
        # Every level made, for flush() and sync(): replaced, never mutated, so that
        # sync() in a worker thread iterates a consistent tuple.
        self._stores: tuple[LevelStore, ...] = ()
        self._ready_mask = 0  # bit p set while level p has ready messages
        self._ready_count = 0
        self._ready_bytes = 0
        # A level dropped ready messages (a failed write-out): the totals are
        # counted again from the levels before they are next used.
        self._lost = False
        #: Told the messages a level's failed write-out dropped (SegmentStore's).
        self.on_dropped: Callable[[list[Message]], None] | None = None
        self._closed = False
        # Directories that got an entry when the queue's directory was made: the
        # first sync fsyncs them (a level's log fsyncs only its own parent).
        self._new_dirs: list[Path] = []
        if directory is not None:
            self._new_dirs = make_dirs(directory)
            for level in sorted(self._levels_on_disk(directory)):
                self._open(level)

    def __repr__(self) -> str:
        levels = [p for p, s in enumerate(self._levels) if s is not None]
        return f"<PriorityStore max={self.max_priority} levels={levels} ready={self._ready_count}>"

    @staticmethod
    def _levels_on_disk(directory: Path) -> list[int]:
        found = []
        for entry in directory.iterdir():
            match = _LEVEL_DIR.fullmatch(entry.name)
            if match is None or not entry.is_dir():
                continue
            level = int(match.group(1))
            if level > MAX_PRIORITY:
                log.warning("%s: ignoring %s (priority above %d)", directory, entry, MAX_PRIORITY)
                continue
            found.append(level)
        return found

    def _level_dropped(self, msgs: list[Message]) -> None:
        if self.on_dropped is not None:
            self.on_dropped(msgs)

    def _open(self, level: int) -> LevelStore:
        if self._closed:
            raise ValueError(f"{self!r} is closed")
        store = self._make_level(level)
        if isinstance(store, SegmentStore):
            store.on_ready_lost = self._level_lost
            store.on_dropped = self._level_dropped
        self._levels[level] = store
        self._stores = (*self._stores, store)
        if store.ready_count:
            self._ready_count += store.ready_count
            self._ready_bytes += store.ready_bytes
            self._ready_mask |= 1 << level
        return store

    def _level_lost(self, count: int, size: int) -> None:
        self._lost = True

    def _recount(self) -> None:
        """The running totals and the ready mask again, from the levels."""
        self._lost = False
        count = size = mask = 0
        for level, store in enumerate(self._levels):
            if store is not None and store.ready_count:
                count += store.ready_count
                size += store.ready_bytes
                mask |= 1 << level
        self._ready_count, self._ready_bytes, self._ready_mask = count, size, mask

    def lost_between(self, first: int, last: int) -> bool:
        """Whether any level dropped appends of those write generations (store/sync.py)."""
        return any(
            isinstance(s, SegmentStore) and s.lost_between(first, last) for s in self._stores
        )

    def _level_of(self, msg: Message) -> int:
        try:
            priority = peek_priority(msg.properties)
        except DecodeError:
            return 0
        if priority is None:
            return 0
        return priority if priority < self.max_priority else self.max_priority

    def _level(self, seq: int) -> LevelStore | None:
        level = seq >> LEVEL_SHIFT
        return self._levels[level] if 0 <= level <= MAX_PRIORITY else None

    # -- MessageStore ---------------------------------------------------------------------
    @property
    def ready_count(self) -> int:
        if self._lost:
            self._recount()
        return self._ready_count

    @property
    def ready_bytes(self) -> int:
        if self._lost:
            self._recount()
        return self._ready_bytes

    @property
    def dirty(self) -> bool:
        """Whether any level has writes not yet synced (levels without the notion: no)."""
        return any(getattr(s, "dirty", False) for s in self._stores)

    @property
    def directory(self) -> Path | None:
        return self._dir

    def append(self, msg: Message) -> int:
        level = self._level_of(msg)
        store = self._levels[level] or self._open(level)
        seq = store.append(msg)
        self._ready_count += 1
        self._ready_bytes += len(msg.body)
        self._ready_mask |= 1 << level
        return (level << LEVEL_SHIFT) | seq

    def append_shifted(self, msg: Message) -> int:
        """Valid only while nothing at all is ready (no level has a backlog)."""
        if self.ready_count:
            raise ValueError("append_shifted needs an empty backlog")
        level = self._level_of(msg)
        store = self._levels[level] or self._open(level)
        return (level << LEVEL_SHIFT) | store.append_shifted(msg)

    def _take(self, peek: bool) -> tuple[int, Message, bool] | None:
        if self._lost:
            self._recount()
        mask = self._ready_mask
        while mask:
            level = mask.bit_length() - 1
            store = self._levels[level]
            assert store is not None
            count, size = store.ready_count, store.ready_bytes
            item = store.peek() if peek else store.shift()
            # Deltas, not +-1: an inner store may also give up unreadable messages.
            self._ready_count += store.ready_count - count
            self._ready_bytes += store.ready_bytes - size
            if not store.ready_count:
                mask &= ~(1 << level)
                self._ready_mask = mask
            if item is not None:
                return (level << LEVEL_SHIFT) | item[0], item[1], item[2]
        return None

    def shift(self) -> tuple[int, Message, bool] | None:
        return self._take(False)

    def peek(self) -> tuple[int, Message, bool] | None:
        return self._take(True)

    def remove_ready(self, seq: int) -> Message | None:
        store = self._level(seq)
        if store is None:
            return None
        count, size = store.ready_count, store.ready_bytes
        msg = store.remove_ready(seq & INNER_MASK)
        self._ready_count += store.ready_count - count
        self._ready_bytes += store.ready_bytes - size
        if not store.ready_count:
            self._ready_mask &= ~(1 << (seq >> LEVEL_SHIFT))
        return msg

    def scan_ready(self, exchange: str | None = None) -> Iterator[tuple[int, int, bytes]]:
        """Every ready message in shift order: level by level, highest first."""
        for level in range(MAX_PRIORITY, -1, -1):
            store = self._levels[level]
            if store is not None and store.ready_count:
                base = level << LEVEL_SHIFT
                for seq, timestamp, properties in store.scan_ready(exchange):
                    yield base | seq, timestamp, properties

    def append_run(self, run: MessageRun, start: int, stop: int) -> StoredRun | None:
        return None  # each message goes to its own priority's level

    def append_ready_run(self, run: MessageRun, start: int, stop: int) -> StoredRun | None:
        return None

    def ack_run(self, segment: int, offsets: array[int]) -> None:
        """A run's or a span's acks (its segment carries the level): one call to
        the level's store."""
        level = segment >> SEGMENT_LEVEL_SHIFT
        store = self._levels[level] if 0 <= level <= MAX_PRIORITY else None
        if store is not None:
            store.ack_run(segment & _INNER_SEGMENT_MASK, offsets)

    def span(self) -> StoreSpan | None:
        """The highest ready level's span (its segment carrying the level)."""
        if self._lost:
            self._recount()
        mask = self._ready_mask
        if not mask:
            return None
        level = mask.bit_length() - 1
        return self._level_span(level)

    def _level_span(self, level: int) -> StoreSpan | None:
        store = self._levels[level]
        assert store is not None
        span = store.span()
        if span is not None:
            span.segment |= level << SEGMENT_LEVEL_SHIFT
        return span

    def take_span(self, span: StoreSpan, taken: StoredRun, acked: bool) -> None:
        level = span.segment >> SEGMENT_LEVEL_SHIFT
        store = self._levels[level]
        assert store is not None
        span.segment &= _INNER_SEGMENT_MASK
        try:
            store.take_span(span, taken, acked)
        finally:
            span.segment |= level << SEGMENT_LEVEL_SHIFT
        self._ready_count -= len(taken)
        self._ready_bytes -= sum(taken.sizes)
        if not store.ready_count:
            self._ready_mask &= ~(1 << level)

    def read(self, seq: int) -> Message:
        store = self._level(seq)
        if store is None:
            raise KeyError(seq)
        return store.read(seq & INNER_MASK)

    def read_many(self, seqs: list[int]) -> list[Message | None]:
        """Each level's stretch of ``seqs`` read by that level's read_many."""
        out: list[Message | None] = []
        n = len(seqs)
        i = 0
        while i < n:
            level = seqs[i] >> LEVEL_SHIFT
            j = i + 1
            while j < n and seqs[j] >> LEVEL_SHIFT == level:
                j += 1
            store = self._level(seqs[i])
            if store is None:
                out.extend([None] * (j - i))
            else:
                out.extend(store.read_many([seq & INNER_MASK for seq in seqs[i:j]]))
            i = j
        return out

    def ack(self, seq: int) -> None:
        store = self._level(seq)
        if store is not None:
            store.ack(seq & INNER_MASK)

    def requeue(self, seq: int, msg: Message) -> None:
        level = seq >> LEVEL_SHIFT
        store = self._level(seq)
        if store is None:
            raise ValueError(f"requeue of seq {seq}: no priority level {level} in {self!r}")
        store.requeue(seq & INNER_MASK, msg)
        self._ready_count += 1
        self._ready_bytes += len(msg.body)
        self._ready_mask |= 1 << level

    def purge(self) -> int:
        n = 0
        for store in self._stores:
            n += store.purge()
        self._ready_count = self._ready_bytes = self._ready_mask = 0
        return n

    def transient(self) -> tuple[int, int]:
        """The levels' transient messages and bytes, summed (read by the API and
        metrics only: no running total)."""
        count = size = 0
        for store in self._stores:
            c, b = store.transient()
            count += c
            size += b
        return count, size

    # -- files ----------------------------------------------------------------------------
    def flush(self) -> None:
        self._each(lambda s: s.flush())

    def sync(self) -> None:
        """Sync every level (safe from a worker thread, as each level's sync is)."""
        self._each(lambda s: s.sync())
        new_dirs, self._new_dirs = self._new_dirs, []
        sync_files([], [], new_dirs)

    def seal(self) -> None:
        """Every segment level's close mark (a clean stop: SegmentFiles.seal)."""
        self._each(lambda s: s.seal() if isinstance(s, SegmentStore) else None)

    def sync_acks(self) -> None:
        """Sync every level's ack files (segment_store.SegmentStore.sync_acks)."""
        self._each(lambda s: s.sync_acks())

    def collect_sync(self, fds: list[int], paths: list[Path], dirs: list[Path]) -> None:
        """Every level's first half of a sync."""
        self._each(lambda s: s.collect_sync(fds, paths, dirs))
        new_dirs, self._new_dirs = self._new_dirs, []
        dirs.extend(new_dirs)

    def close(self, sync: bool = True) -> None:
        """Close every level; with ``sync`` False, segment levels only flush."""
        self._closed = True

        def close(store: LevelStore) -> None:
            if isinstance(store, SegmentStore):
                store.close(sync=sync)
            else:
                store.close()

        self._each(close)

    def delivered_marks(self) -> dict[Path, int]:
        """Every level's (each has its own log and read cursor)."""
        marks: dict[Path, int] = {}
        for store in self._stores:
            marks.update(store.delivered_marks())
        return marks

    def delete(self) -> None:
        """Delete every level, then the directory that held them."""
        self._closed = True
        self._each(lambda s: s.delete())
        self._levels = [None] * (MAX_PRIORITY + 1)
        self._stores = ()
        self._ready_count = self._ready_bytes = self._ready_mask = 0
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            if self._mirror is not None:
                self._mirror.deleted(self._dir)

    def _each(self, fn: Callable[[LevelStore], None]) -> None:
        """Apply ``fn`` to every level; the first error is raised once all were tried."""
        error: BaseException | None = None
        for store in self._stores:
            try:
                fn(store)
            except Exception as exc:
                if error is None:
                    error = exc
        if error is not None:
            raise error
