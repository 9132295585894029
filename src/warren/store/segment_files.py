"""The files under a classic queue's store, and what makes them durable.

A store keeps its messages in a segment log (store/segment_log.py) and, next to
each segment file ``msgs.<id>``, an ack file ``acks.<id>``: the u32 offsets
(big-endian) of the records acknowledged, appended in batches. SegmentFiles
holds the log, the segments' counters (SegmentState) and the acks queued for
their files, and writes them out: flush() to the OS, sync() and sync_acks() to
the disk for the group commit (store/sync.py). SegmentStore builds on it;
docs/storage.md has the formats.
"""

from __future__ import annotations

import os
import sys
from array import array
from collections import deque
from pathlib import Path

from warren.store.segment_log import OFFSET_MASK, SegmentLog, sync_collected, sync_files

_OFFSET_MASK = OFFSET_MASK
_BIG_ENDIAN = sys.byteorder == "big"
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
        "removed",
        "removed_max",
        "has_acks",
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
        # Offsets of records taken out by remove_ready() ahead of the read cursor
        # (dead, acked, but still in the cursor's way), and the highest of them ever
        # added: once the cursor is past it the set is stale and dropped.
        self.removed: set[int] | None = None
        self.removed_max = 0
        self.has_acks = False


def acks_path(directory: Path, segment_id: int) -> Path:
    """The ack file of segment ``segment_id``."""
    return directory / f"acks.{segment_id:010d}"


def offsets_to_bytes(offsets: list[int] | array[int]) -> bytes:
    arr = array("I", offsets)
    if not _BIG_ENDIAN:
        arr.byteswap()
    return arr.tobytes()


def offsets_from_bytes(data: bytes) -> array[int]:
    arr = array("I")
    arr.frombytes(data[: len(data) - len(data) % 4])
    if not _BIG_ENDIAN:
        arr.byteswap()
    return arr


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    try:
        while view:
            # Not `view[os.write(fd, view) :]`: mypyc (2.4) evaluates a call in a
            # memoryview's slice bound twice, writing the data twice.
            written = os.write(fd, view)
            view = view[written:]
    finally:
        view.release()


class SegmentFiles:
    """A store's segment log and ack files: acks queued, flushed and synced.

    Threading: sync() and flush() may run in a worker thread while the owning
    thread keeps appending and acking; the log's lock guards what the two share.
    """

    def __init__(self, directory: Path, segment_size: int) -> None:
        self._log = SegmentLog(Path(directory), segment_size)
        self._dir = self._log.directory
        self._segs: dict[int, SegmentState] = {}  # ascending id (insertion order)
        # Shared with sync() in a worker thread: deque.append/popleft are atomic, the
        # rest is guarded by _lock. A seq, or (segment id, offsets) for ack_run.
        self._acks: deque[int | tuple[int, array[int]]] = deque()
        self._lock = self._log.lock
        self._dirty = False
        self._unsynced_acks: set[int] = set()

    def _acks_path(self, segment_id: int) -> Path:
        return acks_path(self._dir, segment_id)

    def flush(self) -> None:
        """Hand buffered appends and acks to the OS (no fsync): the sync=false mode."""
        with self._lock:
            if self._log.closed:
                return
            self._log.flush_locked()
            self._write_acks_locked()

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
            self._dirty = True
            raise

    def collect_sync(self, fds: list[int], paths: list[Path], dirs: list[Path]) -> None:
        """sync()'s first half (store/sync.py's Syncable): write the buffered appends
        and acks to the OS and add what the slow half must fdatasync. What was
        added stays added when this raises (the caller syncs and closes it)."""
        with self._lock:
            if self._log.closed:
                return
            self._dirty = False  # before flushing: a concurrent append sets it again
            self._log.collect_dirs_locked(dirs)
            try:
                self._log.collect_sync_locked(fds, paths)
                self._write_acks_locked()
            except BaseException:
                self._dirty = True
                raise

    def sync_acks(self) -> None:
        """fdatasync the ack files that sync() or flush() wrote since the last call."""
        with self._lock:
            if self._log.closed or not self._unsynced_acks:
                return
            ids = self._unsynced_acks
            self._unsynced_acks = set()
        try:
            sync_files([], [self._acks_path(i) for i in ids], [])
        except BaseException:
            with self._lock:
                self._unsynced_acks |= ids
            raise

    def _write_acks_locked(self) -> None:
        """Append the queued acks to their segments' ack files (caller holds _lock)."""
        acks = self._acks
        n = len(acks)
        if not n or self._log.closed:
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
        for i, (sid, offsets) in enumerate(items):
            seg = self._segs.get(sid)
            if seg is None:  # deleted since: its acks died with it
                continue
            try:
                fd = os.open(self._acks_path(sid), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    data = offsets_to_bytes(offsets)
                    _write_all(fd, data)
                    if self._log.mirror is not None:  # clustering: at the offset it got
                        end = os.lseek(fd, 0, os.SEEK_CUR)
                        self._log.mirror.appended(self._acks_path(sid), end - len(data), data)
                finally:
                    os.close(fd)
            except BaseException:
                # Keep what was not written for the next attempt; a torn entry at the
                # end of the ack file is pruned on recovery.
                for sid2, offs in items[i:]:
                    acks.extend((sid2 << 32) | o for o in offs)
                raise
            if not seg.has_acks:
                seg.has_acks = True
                self._log.dir_dirty = True
            self._unsynced_acks.add(sid)
