"""A quorum queue's delivery counts on disk (``delivery-counts`` in its directory).

RabbitMQ keeps a quorum queue's delivery counts in its Raft log, so a restart
or a new leader neither resets ``x-delivery-count`` nor lifts the delivery
limit. Warren keeps them next to the queue's segments: an append-only journal
of (message, count) entries, written only when a message comes back (a message
never returned costs nothing), handed to the OS at the end of the loop turn in
which the return happened (as acks are: a killed broker keeps it), fdatasynced
lazily with the ack files, replicated by the file mirror like every file of
the queue's directory (clustering), and rewritten with the live counts alone
once it holds more than twice as many entries plus 1,024.

A series of batches, one per write, integers big-endian::

    u32  0xDC000000 | n   n (1 .. 2**24 - 1) entries follow
    n x  u64  seq >> 32        the message: priority level and segment id
         u32  seq & 0xFFFFFFFF offset of its record in the segment
         u32  returns          every return (x-delivery-count; the limit counts these)
         u32  explicit returns basic.nack/basic.reject ones (kept, not shown)
    u32  CRC32                 zlib.crc32 of the batch's bytes before it

A later entry for a message replaces an earlier one. At open, only entries of
messages that are still ready in the store are kept (``is_ready``: a requeued
message or a live record that checks out), so an entry of a message acked,
purged or lost cannot attach itself to another message; when any were
dropped the file is rewritten durably (temporary file, fsync, rename, fsync
of the directory) before the store appends anything, since a new segment may
reuse an id whose messages are gone. Damage costs counts, never messages: a
batch that does not check out is copied aside (``delivery-counts.damaged-
<offset>``) and skipped (its messages are counted from 0 again), a torn last
batch is dropped with a warning.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import zlib
from collections.abc import Callable
from pathlib import Path

from warren.store.batch_file import MAX_BATCH, scan_batches
from warren.store.disk_budget import UNMETERED, DiskBudget
from warren.store.mirror import FileMirror
from warren.store.segment_damage import keep_aside
from warren.store.sync_files import fsync_directory, sync_files

__all__ = ["FILE_NAME", "DeliveryCounts", "encode_counts", "read_counts"]

log = logging.getLogger("warren.store")

FILE_NAME = "delivery-counts"
_MARK = 0xDC
_MAX_BATCH = MAX_BATCH
_U32 = struct.Struct(">I")
_ENTRY = struct.Struct(">QIII")
_LOW = 0xFFFFFFFF
_COMPACT_SLACK = 1024

#: (seq, packed count): every return in the low 32 bits, the explicit ones above
#: (core/queue.py's _delivery_counts).
Entry = tuple[int, int]


def encode_counts(entries: list[Entry]) -> bytes:
    """Batches holding ``entries`` (one per 2**24 - 1 of them)."""
    out = []
    for i in range(0, len(entries), _MAX_BATCH):
        chunk = entries[i : i + _MAX_BATCH]
        pack = _ENTRY.pack
        body = b"".join(
            pack(seq >> 32, seq & _LOW, packed & _LOW, packed >> 32) for seq, packed in chunk
        )
        batch = _U32.pack(_MARK << 24 | len(chunk)) + body
        out.append(batch + _U32.pack(zlib.crc32(batch)))
    return b"".join(out)


class CountsFile:
    """What a delivery-counts file holds: its intact entries in file order, the
    byte ranges that did not check out, and where a torn last batch starts (-1:
    none)."""

    __slots__ = ("entries", "damaged", "torn_at")

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.damaged: list[tuple[int, int]] = []
        self.torn_at = -1


def read_counts(data: bytes) -> CountsFile:
    """Parse a delivery-counts file's bytes (never raises)."""
    found = CountsFile()
    scan = scan_batches(data, _MARK, _ENTRY.size)
    for start, end in scan.payloads:
        for high, offset, returns, explicit in _ENTRY.iter_unpack(data[start:end]):
            found.entries.append(((high << 32) | offset, (explicit << 32) | returns))
    found.damaged = scan.damaged
    found.torn_at = scan.torn_at
    return found


class DeliveryCounts:
    """One quorum queue's delivery counts: ``counts`` (seq -> packed count) is the
    queue's own dict (Queue._delivery_counts), recovered at open; ``recorded``
    notes a count that changed, ``flush`` writes the notes out.

    Threading: ``recorded``, ``flush`` and ``collect_dirs`` belong to the owning
    thread (the event loop); ``sync`` may run on another (the lazy ack sync).
    ``budget`` and ``mirror``: the data directory's (store/layout.py's DataDir)."""

    def __init__(
        self,
        path: Path,
        is_ready: Callable[[int], bool],
        *,
        budget: DiskBudget = UNMETERED,
        mirror: FileMirror | None = None,
    ) -> None:
        self.path = path
        self.counts: dict[int, int] = {}
        self._pending: list[int] = []
        self._lock = threading.Lock()
        self._mirror = mirror
        self._budget = budget
        self._entries_on_disk = 0
        self._unsynced = False
        self._new_file = False
        self._failing = False
        # Damaged bytes could not be copied aside: the file is never rewritten
        # (only appended to) until a later start can copy them.
        self._keep_file = False
        self._load(is_ready)

    # -- opening --------------------------------------------------------------------------
    def _load(self, is_ready: Callable[[int], bool]) -> None:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        except OSError as exc:
            log.error(
                "%s: cannot be read (%s): delivery counts start from 0; the file is "
                "left as it is",
                self.path,
                exc.strerror or exc,
            )
            self._keep_file = True
            return
        found = read_counts(data)
        rewrite = found.torn_at >= 0 or bool(found.damaged)
        for start, end in found.damaged:
            self._set_aside(data, start, end)
        if found.torn_at >= 0:
            log.warning(
                "%s: a batch cut short at byte %d (a crash mid-write) is dropped: its "
                "counts start again from the earlier ones",
                self.path,
                found.torn_at,
            )
        counts: dict[int, int] = {}
        for seq, packed in found.entries:
            counts[seq] = packed
        for seq, packed in counts.items():
            if packed & _LOW and is_ready(seq):
                self.counts[seq] = packed
        rewrite = rewrite or len(self.counts) < len(counts)
        self._entries_on_disk = len(found.entries)
        if rewrite and not self._keep_file:
            self._rewrite()

    def _set_aside(self, data: bytes, start: int, end: int) -> None:
        try:
            kept, known = keep_aside(self.path, start, data[start:end])
        except OSError as exc:
            self._keep_file = True
            log.error(
                "%s: bytes %d-%d do not check out and cannot be copied aside (%s): the "
                "counts they held are not used; the file is left as it is",
                self.path,
                start,
                end,
                exc.strerror or exc,
            )
            return
        (log.warning if known else log.error)(
            "%s: bytes %d-%d do not check out: %s as %s; the messages whose counts "
            "they held count their deliveries from 0 again (none is lost)",
            self.path,
            start,
            end,
            "kept aside at an earlier start" if known else "kept aside",
            kept.name,
        )

    # -- writing --------------------------------------------------------------------------
    def recorded(self, seq: int) -> None:
        """The count of ``seq`` in ``counts`` changed: write it at the next flush."""
        self._pending.append(seq)

    def flush(self) -> None:
        """Hand the changed counts to the OS (kill -9 keeps them); compact when due."""
        if not self._pending:
            return
        with self._lock:
            pending, self._pending = self._pending, []
            counts = self.counts
            entries = [(seq, counts[seq]) for seq in dict.fromkeys(pending) if seq in counts]
            if not entries:
                return
            if (
                not self._keep_file
                and self._entries_on_disk + len(entries) > 2 * len(counts) + _COMPACT_SLACK
            ):
                self._rewrite()
                return
            data = encode_counts(entries)
            budget = self._budget
            budget.left -= len(data)
            if budget.left < 0:
                budget.spent()
            try:
                new = self._entries_on_disk == 0 and not self.path.exists()
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    offset = os.lseek(fd, 0, os.SEEK_END)
                    written = 0
                    try:
                        while written < len(data):
                            written += os.write(fd, data[written:])
                    except OSError:
                        if written:  # cut back to a whole batch
                            os.ftruncate(fd, offset)
                        raise
                finally:
                    os.close(fd)
            except OSError as exc:
                self._pending = pending + self._pending  # written with the next flush
                if not self._failing:
                    self._failing = True
                    log.error(
                        "%s: delivery counts cannot be written (%s): kept in memory until "
                        "there is room (a restart meanwhile counts from the last written)",
                        self.path,
                        exc.strerror or exc,
                    )
                budget.write_failed(exc)
                return
            if self._failing:
                self._failing = False
                log.info("%s: delivery counts written again", self.path)
            if self._mirror is not None:
                self._mirror.appended(self.path, offset, data)
            self._entries_on_disk += len(entries)
            self._unsynced = True
            self._new_file = self._new_file or new

    def _rewrite(self) -> None:
        """Replace the file with the live counts (temporary file, fsync, rename,
        fsync of the directory), or remove it when there are none."""
        entries = sorted(self.counts.items())
        try:
            if not entries:
                if self.path.exists():
                    os.unlink(self.path)
                    fsync_directory(self.path.parent)
                    if self._mirror is not None:
                        self._mirror.deleted(self.path)
                self._entries_on_disk = 0
                self._unsynced = False
                return
            data = encode_counts(entries)
            tmp = self.path.with_name(self.path.name + ".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
            fsync_directory(self.path.parent)
        except OSError as exc:
            log.error("%s: could not be rewritten (left as it was): %s", self.path, exc)
            return
        if self._mirror is not None:
            self._mirror.replaced(self.path, data)
        self._entries_on_disk = len(entries)
        self._unsynced = False

    # -- durability -----------------------------------------------------------------------
    def collect_dirs(self, dirs: list[Path]) -> None:
        """A new file's directory entry, for a sync round to fsync."""
        if self._new_file:
            self._new_file = False
            dirs.append(self.path.parent)

    def sync(self) -> None:
        """fdatasync what was written since the last call (the lazy ack sync's
        pace: a count lost to a power cut means more deliveries, never a lost
        message)."""
        with self._lock:
            if not self._unsynced:
                return
            self._unsynced = False
        try:
            sync_files([], [self.path], [])
        except BaseException:
            self._unsynced = True
            raise
