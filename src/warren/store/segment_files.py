"""The files under a classic queue's store, and what makes them durable.

A store keeps its messages in a segment log (store/segment_log.py) and, next to
each segment file ``msgs.<id>``, an ack file ``acks.<id>``: the u32 offsets
of the records acknowledged, appended in checksummed batches
(store/ack_files.py). SegmentFiles holds the log, the segments' counters
(SegmentState, the table the store counts in) and the acks queued for their
files, and writes them out: flush() to the OS, sync() and sync_acks() to the
disk for the group commit (store/sync.py), a fully acknowledged segment's
files dropped. A SegmentStore holds one (composition: the store never reaches
into the ack files or the log's lock but through it); docs/storage.md has the
formats.
"""

from __future__ import annotations

import logging
import os
from array import array
from collections import deque
from pathlib import Path

from warren.store.ack_files import encode_acks
from warren.store.disk_budget import UNMETERED, DiskBudget
from warren.store.mirror import FileMirror
from warren.store.segment_log import OFFSET_MASK, SegmentLog
from warren.store.sync_files import sync_collected, sync_files

log = logging.getLogger("warren.store")

_OFFSET_MASK = OFFSET_MASK
#: An empty skip list.
NO_SKIP: array[int] = array("I")


class SegmentState:
    """Counters for one segment file; nothing per message except the dead records
    still ahead of the read cursor (recovery's skip list, remove_ready's set)."""

    __slots__ = (
        "id",
        "records",
        "dead",
        "unread",
        "unread_bytes",
        "skip",
        "gaps",
        "removed",
        "removed_max",
        "has_acks",
        "transient_unread",
        "transient_unread_bytes",
    )

    def __init__(self, segment_id: int) -> None:
        self.id = segment_id
        self.records = 0  # records in the file
        self.dead = 0  # acknowledged, purged, dropped as transient or corrupt
        self.unread = 0  # ready records not yet shifted
        self.unread_bytes = 0  # their body bytes
        # Offsets of dead records ahead of the read cursor (only after recovery:
        # at runtime every ack is for a record behind the cursor). Sorted.
        self.skip: array[int] | None = None
        # Damaged byte ranges (start -> end) among the skip list's offsets: the
        # cursor steps to the end, not by a length field it cannot trust.
        self.gaps: dict[int, int] | None = None
        # Offsets of records taken out by remove_ready() ahead of the read cursor
        # (dead, acked, but still in the cursor's way), and the highest of them ever
        # added: once the cursor is past it the set is stale and dropped.
        self.removed: set[int] | None = None
        self.removed_max = 0
        self.has_acks = False
        # The transient records among the unread ones and their body bytes, when
        # the store counts them (store/transient_counts.py).
        self.transient_unread = 0
        self.transient_unread_bytes = 0


def acks_path(directory: Path, segment_id: int) -> Path:
    """The ack file of segment ``segment_id``."""
    return directory / f"acks.{segment_id:010d}"


def _append_all(fd: int, data: bytes) -> None:
    """Append ``data`` to the end of ``fd`` whole, or not at all: a write that fails
    part way (a full disk) is cut off again, so the next attempt stays aligned."""
    view = memoryview(data)
    written = 0
    try:
        while written < len(data):
            # Not `view[os.write(fd, view) :]`: mypyc (2.4) evaluates a call in a
            # memoryview's slice bound twice, writing the data twice.
            n = os.write(fd, view[written:])
            written += n
    except OSError:
        if written:
            try:
                os.ftruncate(fd, os.lseek(fd, 0, os.SEEK_END) - written)
            except OSError as exc:  # a torn entry at the end is pruned on recovery
                log.error("cannot cut a failed ack write back: %s", exc)
        raise
    finally:
        view.release()


class SegmentFiles:
    """A store's segment log and ack files: acks queued, flushed and synced.

    The owning store appends to ``log``, counts in ``segs`` and queues acks on
    ``acks`` (a seq, or (segment id, offsets) for a run) and sets ``dirty``;
    everything that writes the ack files or drops files is here.

    Threading: sync() and flush() may run in a worker thread while the owning
    thread keeps appending and acking; the log's lock guards what the two share.
    """

    def __init__(
        self,
        directory: Path,
        segment_size: int,
        preallocate: bool = True,
        format_version: int = 2,
        budget: DiskBudget = UNMETERED,
        mirror: FileMirror | None = None,
    ) -> None:
        # A classic queue's fully acknowledged segment files are kept for reuse
        # (store/segment_spares.py).
        self.log = SegmentLog(
            Path(directory),
            segment_size,
            preallocate,
            format_version,
            recycle=True,
            budget=budget,
            mirror=mirror,
        )
        self.directory = self.log.directory
        #: The segments' counters by id, ascending (insertion order): the store's
        #: table, set from recovery; its own while the store counts in it.
        self.segs: dict[int, SegmentState] = {}
        #: Acks queued for the ack files. Shared with sync() in a worker thread:
        #: deque.append/popleft are atomic, the rest is guarded by ``lock``.
        self.acks: deque[int | tuple[int, array[int]]] = deque()
        self.lock = self.log.lock
        #: Whether anything was appended, acked or purged since the last sync().
        self.dirty = False
        self._unsynced_acks: set[int] = set()
        # Whether the last ack write failed (a full disk): logged once, kept queued.
        self._acks_failing = False

    def acks_path(self, segment_id: int) -> Path:
        return acks_path(self.directory, segment_id)

    def flush(self) -> None:
        """Hand buffered appends and acks to the OS (no fsync): the sync=false mode."""
        try:
            with self.lock:
                if self.log.closed:
                    return
                self.log.flush_locked()
                self.write_acks_locked()
        finally:
            self.log.report_losses()

    def seal(self) -> None:
        """A clean close is coming: end the write segment's data with a close mark
        (store/segment_log.py), so that the next start appends after it."""
        self.log.seal()

    def sync(self) -> None:
        """Make everything appended before this call durable; acks go to the OS only.

        This is what a publisher confirm waits for. Ack and purge records are
        written (they survive a killed broker) but their fdatasync is left to
        sync_acks(), which the group commit runs about once a second off the
        confirm path: an ack lost to a power cut means a redelivery, never a
        lost message, and recovery prunes an ack that outlived its data.

        Safe to call from a worker thread while the owning thread keeps appending:
        the buffers are flushed and the descriptors captured under the lock, the
        slow fdatasync calls run outside it. Writes made after the call started may
        or may not be covered. If fdatasync fails, the error is raised and dirty is
        set again, but the kernel may already have dropped the failed pages: treat
        a failed sync as fatal for the data written since the previous one.
        """
        try:
            sync_collected(self.collect_sync)
        except BaseException:
            self.dirty = True
            raise

    def collect_sync(self, fds: list[int], paths: list[Path], dirs: list[Path]) -> None:
        """sync()'s first half (store/sync.py's Syncable): write the buffered appends
        and acks to the OS and add what the slow half must fdatasync. What was
        added stays added when this raises (the caller syncs and closes it)."""
        try:
            with self.lock:
                if self.log.closed:
                    return
                self.dirty = False  # before flushing: a concurrent append sets it again
                try:
                    self.log.collect_sync_locked(fds, paths)
                    self.write_acks_locked()
                except BaseException:
                    self.dirty = True
                    raise
                finally:
                    # After: a failed write-out may delete a file. With the log's
                    # own directory, those its creation added to (power cuts).
                    self.log.collect_dirs_locked(dirs)
        finally:
            self.log.report_losses()

    def sync_acks(self) -> None:
        """fdatasync the ack files that sync() or flush() wrote since the last call."""
        with self.lock:
            if self.log.closed or not self._unsynced_acks:
                return
            ids = self._unsynced_acks
            self._unsynced_acks = set()
        try:
            sync_files([], [self.acks_path(i) for i in ids], [])
        except BaseException:
            with self.lock:
                self._unsynced_acks |= ids
            raise

    def drop_locked(self, segment_id: int) -> None:
        """Delete a fully acknowledged segment's files (caller holds ``lock``):
        messages first, so that a crash in between leaves an orphan ack file
        (removed on recovery), never a message file whose acks are gone."""
        self._unsynced_acks.discard(segment_id)
        self.log.drop_locked(segment_id)
        self.log.unlink(self.acks_path(segment_id))

    def lost_between(self, first: int, last: int) -> bool:
        """Whether messages appended in those write generations were dropped by a
        failed write-out (store/disk_budget.py; GroupSync asks before a confirm)."""
        return self.log.lost_between(first, last)

    def write_acks_locked(self) -> None:
        """Append the queued acks to their segments' ack files (caller holds _lock).

        Never raises for a full disk: what could not be written stays queued for
        the next flush (until then a restart would deliver those messages again),
        the failure is logged once and the disk alarm raised."""
        acks = self.acks
        n = len(acks)
        if not n or self.log.closed:
            return
        groups: dict[int, array[int]] = {}
        for _ in range(n):
            item = acks.popleft()
            if isinstance(item, int):
                sid = item >> 32
                offsets = groups.get(sid)
                if offsets is None:
                    offsets = groups[sid] = array("I")
                offsets.append(item & _OFFSET_MASK)
            else:
                sid, run_offsets = item
                offsets = groups.get(sid)
                if offsets is None:
                    offsets = groups[sid] = array("I")
                offsets.extend(run_offsets)
        items = list(groups.items())
        budget = self.log.budget
        for i, (sid, offsets) in enumerate(items):
            seg = self.segs.get(sid)
            if seg is None:  # deleted since: its acks died with it
                continue
            data = encode_acks(offsets)
            budget.left -= len(data)  # spent() is the next append's to call: not under a lock
            try:
                fd = os.open(self.acks_path(sid), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    _append_all(fd, data)
                    if self.log.mirror is not None:  # clustering: at the offset it got
                        end = os.lseek(fd, 0, os.SEEK_CUR)
                        self.log.mirror.appended(self.acks_path(sid), end - len(data), data)
                finally:
                    os.close(fd)
            except BaseException as exc:
                # Keep what was not written for the next attempt.
                for sid2, offs in items[i:]:
                    acks.extend((sid2 << 32) | o for o in offs)
                if not isinstance(exc, OSError):
                    raise
                if not self._acks_failing:
                    self._acks_failing = True
                    log.error(
                        "%s: cannot write acks (%s): %d kept in memory until there is "
                        "room (a restart meanwhile delivers those messages again)",
                        self.directory,
                        exc.strerror or exc,
                        len(acks),
                    )
                budget.write_failed(exc)
                return
            if not seg.has_acks:
                seg.has_acks = True
                self.log.dir_dirty = True
            self._unsynced_acks.add(sid)
        if self._acks_failing:
            self._acks_failing = False
            log.info("%s: acks written again", self.directory)
