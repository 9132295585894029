"""The segment log: Warren's one storage primitive, append-only segment files.

Records (warren.store.records) are appended to ``msgs.<id>`` files of at most
``segment_size`` bytes each (a record larger than that gets a file of its own),
written through a small buffer and read back through memory maps or pread, so
the page cache is the only cache and RAM does not grow with the log. A record's
position is ``(segment id << 32) | offset``: position order is append order.

The log knows nothing of consumers. Its owners add what they need on top: the
classic queue's single cursor, acks and requeues (segment_store.SegmentStore),
a stream's offsets and independent readers, a replica's copy. An owner drops
whole segments when it no longer needs them (fully acknowledged, or past a
stream's retention).

Threading: appends, reads and drops belong to the owner's thread (the event
loop). The owner's sync() may run in a worker thread: ``lock`` guards the write
file and the sync bookkeeping, which the owner shares with its own files (ack
files) under the same lock.

A full disk (store/disk_budget.py): every append is charged to the data
directory's budget before it is buffered. A write-out that fails is undone (the
file is cut back to where it ended) and, on the owner's thread, what it held is
dropped: the log closes that segment (later records go to a new one, so no
position is ever reused), remembers the write generations it lost and hands the
dropped records to the owner's ``on_lost`` (outside the lock), which takes them
out of its counters; the publishers waiting for them get nacks.
"""

from __future__ import annotations

import logging
import mmap
import os
import re
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from warren.store.disk_budget import budget_for
from warren.store.layout import make_dirs
from warren.store.mirror import mirror_for
from warren.store.records import (
    FILE_HEADER,
    FILE_HEADER_SIZE,
    MIN_RECORD_SIZE,
    BadFileHeader,
    check_file_header,
)
from warren.store.segment_damage import (
    GAP,
    damage_reason,
    header_damaged,
    keep_aside,
    report,
    torn_tail,
    walk,
)

__all__ = [
    "MAX_SEGMENT_ID",
    "OFFSET_MASK",
    "SEQ_BITS",
    "RecordScan",
    "SegmentLog",
]

log = logging.getLogger("warren.store")

MSGS_NAME = re.compile(r"msgs\.(\d{10})")
OFFSET_MASK = 0xFFFFFFFF
MAX_SEGMENT_ID = 9_999_999_999  # ten digits in the file name
#: Every position in a segment log is below ``1 << SEQ_BITS`` (66).
SEQ_BITS = MAX_SEGMENT_ID.bit_length() + 32
# Bytes appended to the write segment and kept before they are handed to the OS
# (at the end of the loop turn, or once this much is waiting). Small on purpose:
# many queues may be written in one turn.
_WRITE_BUFFER = 32 * 1024


class SegmentLog:
    """The segment files under ``directory``: appending, reading, dropping, syncing.

    Durability: appends reach the OS on flush (and whenever the write buffer
    fills); sync additionally fdatasyncs them. A log reopened after a crash
    finds exactly what reached the disk (scan() cuts torn tails).
    """

    def __init__(self, directory: Path, segment_size: int = 8 * 1024 * 1024) -> None:
        if not FILE_HEADER_SIZE < segment_size <= OFFSET_MASK:
            raise ValueError(f"segment_size must be in ({FILE_HEADER_SIZE}, 2**32)")
        self.directory = Path(directory)
        self.segment_size = segment_size
        #: Guards the write file and the sync bookkeeping (shared with the owner's files).
        self.lock = threading.Lock()
        self.closed = False
        self._next_id = 1
        # The segment appended to (0: none yet); its file is opened on the first write-out.
        self.write_id = 0
        #: End of the write segment, the bytes not yet written out included.
        self.write_pos = 0
        # Appended records not yet handed to the OS, and where the write segment's
        # file ends (what reached the OS). Its descriptor (-1: not open); _create:
        # the file is still to be made (creating it at the start failed).
        self._chunks: list[bytes] = []
        self._flushed = 0
        self._fd = -1
        self._create = False
        self._synced_at = (0, 0)  # (write segment id, position) at the last sync
        self._unsynced: set[int] = set()  # retired segments not yet synced
        self.dir_dirty = False  # files created or deleted since the last sync
        # Directories that got an entry when this log made its own (a new queue's):
        # fsynced by the first sync, or the whole directory can vanish in a power cut.
        self._new_dirs = make_dirs(self.directory)
        #: Clustering's replication (store/mirror.py), told what reaches the files.
        self.mirror = mirror_for(self.directory)
        self._mirrored = (0, 0)  # (write segment id, position) reported so far
        #: The data directory's free-disk budget (store/disk_budget.py).
        self.budget = budget_for(self.directory)
        # The write generation since which the kept records were appended, and the
        # (first, last) generations whose records were dropped.
        self._flushed_gen = self.budget.gen
        self._lost: list[tuple[int, int]] = []
        #: The owner's (segment id, position, records): what a failed write-out
        #: dropped, records from that position on; returns how many it counted.
        self.on_lost: Callable[[int, int, bytes], int] | None = None
        self._losses: list[tuple[int, int, bytes, OSError]] = []  # not yet reported
        self._owner = threading.get_ident()

    def __repr__(self) -> str:
        return f"<SegmentLog {str(self.directory)!r}>"

    def msgs_path(self, segment_id: int) -> Path:
        return self.directory / f"msgs.{segment_id:010d}"

    # -- writing --------------------------------------------------------------------------
    def append(self, rec: bytes) -> int:
        """Append one encoded record (or a run of them); its position. Starts a new
        segment when the record does not fit the current one (an owner notices: a
        new segment id). Never fails for a full disk: a write-out that fails drops
        the records appended before this one (see on_lost), never this one."""
        self.make_room(len(rec))
        return self.put(rec)

    def make_room(self, n: int) -> None:
        """append()'s first half: charge ``n`` bytes to the budget (the broker may
        measure the disk now), write out the buffer if they would overflow it,
        start a new segment if they do not fit. Everything that may drop buffered
        records (and so change the owner's counters) happens here, so an owner
        that writes what it is told into the record (a stream's offset) calls
        this first and put() after."""
        budget = self.budget
        budget.left -= n
        if budget.left < 0:
            budget.spent()
        pos = self.write_pos
        if self._chunks and pos - self._flushed + n > _WRITE_BUFFER:
            self.write_out()
            pos = self.write_pos
        if not self.write_id or (pos + n > self.segment_size and pos > FILE_HEADER_SIZE):
            self._new_segment()

    def put(self, rec: bytes) -> int:
        """append()'s second half, right after make_room(len(rec)): its position."""
        pos = self.write_pos
        self._chunks.append(rec)
        self.write_pos = pos + len(rec)
        return (self.write_id << 32) | pos

    def _new_segment(self) -> None:
        """Close the write segment (written out) and start the next: a new id, its
        file created now (or, if that fails, at the first write-out)."""
        if self.closed:
            raise ValueError(f"{self!r} is closed")
        with self.lock:
            if self.write_id:
                self.retire_locked()
            fd = -1
            while True:
                sid = self._next_id
                if sid > MAX_SEGMENT_ID:
                    raise OverflowError(f"{self.directory}: segment ids exhausted")
                self._next_id = sid + 1
                try:
                    fd = os.open(
                        self.msgs_path(sid),
                        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND,
                        0o644,
                    )
                except FileExistsError:  # a file we could not recover: never reuse its id
                    continue
                except OSError as exc:  # the disk is full: try again when writing out
                    log.warning("%s: cannot create segment %d yet: %s", self.directory, sid, exc)
                break
            self.write_id = sid
            self._fd = fd
            self._create = fd < 0
            self._flushed = 0
            self._chunks = [FILE_HEADER]
            self.write_pos = FILE_HEADER_SIZE
            self._flushed_gen = self.budget.gen
            if fd >= 0:
                self.dir_dirty = True
        self.report_losses()

    def write_out(self) -> None:
        """Hand the buffered appends to the OS (what flush() does for the owner)."""
        if self._chunks:
            with self.lock:
                self._write_out_locked()
            self.report_losses()

    def _write_out_locked(self) -> None:
        """Write the buffered records to the write segment (caller holds ``lock``).

        All or nothing: a write that fails part way is cut off again. On the
        owner's thread the records are then dropped (_drop_unwritten); on another
        thread (a sync from a worker) they stay buffered and the error is raised.
        """
        chunks = self._chunks
        k = len(chunks)
        if not k or not self.write_id:
            return
        data = chunks[0] if k == 1 else b"".join(chunks[:k])
        written = 0
        fd = self._fd
        try:
            if fd < 0:
                fd = self._open_write_file()
            written = os.write(fd, data)
            if written < len(data):
                view = memoryview(data)
                try:
                    while written < len(data):
                        n = os.write(fd, view[written:])
                        written += n
                finally:
                    view.release()
        except OSError as exc:
            if written and fd >= 0:
                try:
                    os.ftruncate(fd, self._flushed)
                except OSError as cut:
                    log.error("%s: cannot cut a failed write back: %s", self.directory, cut)
            if threading.get_ident() != self._owner:
                raise
            self._drop_unwritten(exc)
            return
        del chunks[:k]
        self._flushed += len(data)
        budget = self.budget
        budget.gen += 1
        self._flushed_gen = budget.gen
        if self.mirror is not None:
            self._mirror_locked()

    def _open_write_file(self) -> int:
        path = self.msgs_path(self.write_id)
        if self._create:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
            self._create = False
            self.dir_dirty = True
        else:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        self._fd = fd
        return fd

    def _drop_unwritten(self, exc: OSError) -> None:
        """A write-out failed: forget the records not written and close the
        segment, so that no later record takes their positions. Reported to the
        owner by report_losses(), once the lock is released."""
        sid, start = self.write_id, self._flushed
        data = b"".join(self._chunks)
        self._chunks = []
        self._close_write_file()
        self.write_id = 0
        self.write_pos = start
        if start <= FILE_HEADER_SIZE:  # nothing but (part of) a header: no segment at all
            self._unsynced.discard(sid)
            if not self._create:
                self.unlink(self.msgs_path(sid))
                self.dir_dirty = True
            self._create = False
        elif (sid, start) != self._synced_at:
            self._unsynced.add(sid)
        budget = self.budget
        lost = self._lost
        lost.append((self._flushed_gen, budget.gen))
        if len(lost) > 64:  # a disk full again and again: one wider span (more nacks)
            lost[:] = [(lost[0][0], lost[-1][1])]
        budget.gen += 1
        self._flushed_gen = budget.gen
        if start < FILE_HEADER_SIZE:
            data = data[FILE_HEADER_SIZE - start :]
            start = FILE_HEADER_SIZE
        self._losses.append((sid, start, data, exc))

    def report_losses(self) -> None:
        """Tell the owner (outside the lock) what failed write-outs dropped, log
        it, and have the disk alarm raised (store/disk_budget.py)."""
        if not self._losses or threading.get_ident() != self._owner:
            return
        while self._losses:
            sid, pos, data, exc = self._losses.pop(0)
            counted = self.on_lost(sid, pos, data) if self.on_lost is not None else 0
            log.error(
                "%s: %s: cannot write %d bytes (%s): %d messages dropped, never "
                "confirmed (publishers still waiting for them get nacks)",
                self.directory,
                self.msgs_path(sid).name,
                len(data),
                exc.strerror or exc,
                counted,
            )
            self.budget.write_failed(exc)

    def lost_between(self, first: int, last: int) -> bool:
        """Whether records appended in a write generation from ``first`` to
        ``last`` were dropped by a failed write-out (store/disk_budget.py)."""
        return any(lo <= last and hi >= first for lo, hi in self._lost)

    def _close_write_file(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            try:
                os.close(fd)
            except OSError as exc:
                log.error("%s: closing a segment file: %s", self.directory, exc)

    def retire(self) -> None:
        """Close the write segment; the next append starts a new one."""
        with self.lock:
            self.retire_locked()
        self.report_losses()

    def retire_locked(self) -> None:
        sid = self.write_id
        if not sid:
            return
        self._write_out_locked()
        if not self.write_id:  # the write-out failed: already closed
            return
        self.write_id = 0
        if (sid, self.write_pos) != self._synced_at:
            self._unsynced.add(sid)
        self._close_write_file()

    def continue_segment(self, segment_id: int, size: int) -> None:
        """After recovery: keep appending to ``segment_id``, whose data ends at ``size``."""
        self.write_id = segment_id
        self.write_pos = size
        self._flushed = size
        self._fd = -1
        self._create = False
        self._chunks = []
        self._synced_at = (segment_id, size)
        self._mirrored = (segment_id, size)

    # -- reading --------------------------------------------------------------------------
    def flush_writes(self, segment_id: int) -> None:
        """Push buffered appends of ``segment_id`` to the file before reading it
        (if that fails, the owner has taken the records out before this returns)."""
        if segment_id == self.write_id and self._chunks:
            self.write_out()

    def map(self, segment_id: int) -> mmap.mmap | None:
        """A read-only map of the whole segment file (None when it is empty).
        Raises OSError when the file cannot be opened or mapped."""
        self.flush_writes(segment_id)
        fd = os.open(self.msgs_path(segment_id), os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            if not size:
                return None
            m = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)  # the map keeps its own reference
        if segment_id != self.write_id and hasattr(mmap, "MADV_SEQUENTIAL"):
            m.madvise(mmap.MADV_SEQUENTIAL)
        return m

    def read(self, seq: int) -> bytes | None:
        """The record at position ``seq`` as bytes (pread: random access), or None when
        no whole record can start there (past the data, or a length that overruns)."""
        sid, off = seq >> 32, seq & OFFSET_MASK
        if sid == self.write_id and off >= self.write_pos:
            return None
        self.flush_writes(sid)
        try:
            fd = os.open(self.msgs_path(sid), os.O_RDONLY)
        except OSError:
            return None
        try:
            data = os.pread(fd, 4096, off)
            if len(data) < 4:
                return None
            length = int.from_bytes(data[:4], "big")
            if length < MIN_RECORD_SIZE:
                return data[:4]
            if length > len(data):
                if off + length > os.fstat(fd).st_size:
                    return None  # not a record: its length runs past the file
                data = os.pread(fd, length, off)
            return data[:length]
        except OSError:
            return None
        finally:
            os.close(fd)

    # -- dropping -------------------------------------------------------------------------
    def drop_locked(self, segment_id: int) -> None:
        """Delete a segment file the owner no longer needs (caller holds ``lock``)."""
        if segment_id == self.write_id:
            # Not written out: every record in it is gone anyway.
            self._chunks = []
            self._close_write_file()
            self.write_id = 0
            self._create = False
        self._unsynced.discard(segment_id)
        self.dir_dirty = True
        self.unlink(self.msgs_path(segment_id))

    def unlink(self, path: Path) -> None:
        """Delete a file of this log's directory (and tell the mirror)."""
        try:
            path.unlink()
        except FileNotFoundError:
            return
        except OSError as exc:
            log.warning("%s: cannot delete %s: %s", self.directory, path.name, exc)
            return
        if self.mirror is not None:
            self.mirror.deleted(path)

    # -- durability -----------------------------------------------------------------------
    def flush_locked(self) -> None:
        """Hand buffered appends to the OS (caller holds ``lock``; then calls
        report_losses())."""
        if not self.closed and self._chunks:
            self._write_out_locked()

    def _mirror_locked(self) -> None:
        """Report the write segment's bytes flushed since the last report."""
        sid = self.write_id
        if not sid or self._fd < 0 or self.mirror is None:
            return
        msid, start = self._mirrored
        if msid != sid:
            start = 0  # a new segment: from its header on
        end = self._flushed
        if end > start and self.mirror.wants_data():
            path = self.msgs_path(sid)
            fd = os.open(path, os.O_RDONLY)  # the write file is write-only
            try:
                data = os.pread(fd, end - start, start)
            finally:
                os.close(fd)
            self.mirror.appended(path, start, data)
        self._mirrored = (sid, end)

    def collect_sync_locked(self, fds: list[int], paths: list[Path]) -> None:
        """First half of a sync (caller holds ``lock``): flush the write buffer and add
        what needs an fdatasync: a duplicate descriptor of the write segment when it
        grew since the last sync, and the retired segments not synced yet. A
        write-out that fails drops its records (the caller calls report_losses())."""
        sid = self.write_id
        if sid:
            # Read the position before writing out: bytes appended after this point
            # may still be buffered and must not count as synced.
            mark = (sid, self.write_pos)
            self._write_out_locked()
            if self.write_id == sid and self._fd >= 0 and mark != self._synced_at:
                fds.append(os.dup(self._fd))
                self._synced_at = mark
        paths.extend(self.msgs_path(i) for i in self._unsynced)
        self._unsynced.clear()

    def collect_dirs_locked(self, dirs: list[Path]) -> None:
        """Add the directories a sync must fsync (caller holds ``lock``): this log's
        when a file was created or deleted, and those its creation added to."""
        if self.dir_dirty:
            self.dir_dirty = False
            dirs.append(self.directory)
        if self._new_dirs:
            dirs.extend(self._new_dirs)
            self._new_dirs = []

    def close_locked(self) -> None:
        """Write out and close the write file; caller holds ``lock`` (then calls
        report_losses(): what could not be written is dropped, never confirmed)."""
        try:
            if not self.closed:
                self._write_out_locked()
        finally:
            self.closed = True
            self.write_id = 0  # appending now raises (a closed log starts no segment)
            self._chunks = []
            self._close_write_file()

    def delete(self) -> None:
        """Close everything and remove the directory with every file in it."""
        with self.lock:
            self.closed = True
            self._chunks = []
            self._close_write_file()
        self.write_id = 0
        shutil.rmtree(self.directory, ignore_errors=True)
        if self.mirror is not None:
            self.mirror.deleted(self.directory)

    # -- recovery -------------------------------------------------------------------------
    def reserve_ids(self, highest: int) -> None:
        """Never create a segment with an id up to ``highest`` (files found on disk)."""
        self._next_id = max(self._next_id, highest + 1)

    def scan(self, segment_id: int) -> RecordScan | None:
        """One pass over a segment's records, for recovery (see RecordScan); None
        when the file is not a segment (left untouched) or a torn header (removed).
        A damaged header is read past when the first record checks out (the file
        is ours); a future version's header is left alone."""
        path = self.msgs_path(segment_id)
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            head = os.pread(fd, FILE_HEADER_SIZE, 0)
            m = mmap.mmap(fd, size, access=mmap.ACCESS_READ) if size > FILE_HEADER_SIZE else None
        finally:
            os.close(fd)
        try:
            check_file_header(head)
        except BadFileHeader as exc:
            if size < FILE_HEADER_SIZE and FILE_HEADER.startswith(head):
                log.warning("%s: %s: torn file header; removing it", self.directory, path.name)
                self.unlink(path)
            elif m is not None and header_damaged(m, head):
                try:
                    kept, known = keep_aside(path, 0, head)
                except BaseException:
                    m.close()
                    raise
                (log.warning if known else log.error)(
                    "%s: %s: %s, but its records check out: the header is damaged (kept "
                    "aside as %s); reading the records",
                    self.directory,
                    path.name,
                    exc,
                    kept.name,
                )
                return RecordScan(self, segment_id, m, size)
            else:
                log.warning("%s: %s: %s; leaving it untouched", self.directory, path.name, exc)
            if m is not None:
                m.close()
            return None
        return RecordScan(self, segment_id, m, size)


class RecordScan:
    """The records of one segment, validated as recovery reads them.

    Iterating yields ``(offset, length, properties offset, properties length, body
    length)`` per intact record (structure and CRC checked). Damaged bytes that
    intact records follow come as one item ``(offset, length, GAP, 0, 0)``
    (store/segment_damage.py): they are copied aside first, and reading goes on
    with the next record that checks out, so damage never costs the records
    after it. Damaged bytes with nothing intact after them end the iteration:
    a torn tail (what a crash leaves of the last write) is cut off by close(),
    any other tail is copied aside, then cut. close() logs what was found and
    then knows the file's valid ``size``. ``map`` holds the file's bytes while
    it is open. Raises OSError when damaged bytes cannot be copied aside (the
    owner then leaves the file as it is).
    """

    def __init__(self, segment_log: SegmentLog, segment_id: int, m: mmap.mmap | None, size: int):
        self.log = segment_log
        self.segment_id = segment_id
        self.map = m
        self.size = size
        self._cut: int | None = None
        self._good = 0  # intact records so far
        # Damaged ranges met: (start, end, reason, copy, known already, intact
        # records before it; -1 for a tail that is cut).
        self._damage: list[tuple[int, int, str, Path, bool, int]] = []

    def __iter__(self) -> Iterator[tuple[int, int, int, int, int]]:
        m, size = self.map, self.size
        if m is None:
            return
        directory = self.log.directory
        path = self.log.msgs_path(self.segment_id)
        for item in walk(m, FILE_HEADER_SIZE, size):
            pos = item[0]
            if pos > OFFSET_MASK:
                self._cut = pos
                log.warning("%s: %s: data past 4 GiB; truncating at %d", directory, path.name, pos)
                return
            kind = item[2]
            if kind >= 0:
                self._good += 1
            elif kind == GAP:
                end = pos + item[1]
                kept, known = keep_aside(path, pos, m[pos:end])
                reason = damage_reason(m, pos, size)
                self._damage.append((pos, end, reason, kept, known, self._good))
            else:  # TAIL; cut only once copied (keep_aside raises when it cannot)
                if torn_tail(m, pos, size):
                    log.warning(
                        "%s: %s: torn record at offset %d (the last write, cut short: "
                        "%s); truncating the file there (%d bytes dropped)",
                        directory,
                        path.name,
                        pos,
                        damage_reason(m, pos, size),
                        size - pos,
                    )
                else:
                    kept, known = keep_aside(path, pos, m[pos:size])
                    reason = damage_reason(m, pos, size)
                    self._damage.append((pos, size, reason, kept, known, -1))
                self._cut = pos
                return
            yield item

    def close(self) -> None:
        """Release the map, cut off a torn or copied tail met while iterating, and
        log the damaged ranges with the intact records found after each."""
        if self.map is not None:
            self.map.close()
            self.map = None
        name = self.log.msgs_path(self.segment_id).name
        for start, end, reason, kept, known, before in self._damage:
            after = -1 if before < 0 else self._good - before
            report(self.log.directory, name, start, end, reason, kept, known, after)
        self._damage = []
        if self._cut is not None:
            os.truncate(self.log.msgs_path(self.segment_id), self._cut)
            self.size = self._cut
            self._cut = None
