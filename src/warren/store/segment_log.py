"""The segment log: Warren's one storage primitive, segment files of records.

Records (warren.store.records) are written to ``msgs.<id>`` files of at most
``segment_size`` bytes each (a record larger than that gets a file of its own),
through a small buffer, and read back through memory maps or pread, so the page
cache is the only cache and RAM does not grow with the log. A record's position
is ``(segment id << 32) | offset``: position order is append order.

Files are written in place, in format version 2 (store/segment_format.py):
allocated ahead of their data (store/segment_alloc.py), every write-out ended
by an end mark, records' CRCs seeded with the file's salt. The file's size is
not where its data ends: the log keeps each segment's end, and readers map
and read only up to it. Version-1 files (appended) are read, never written.

The log knows nothing of consumers. Its owners add what they need on top: the
classic queue's single cursor, acks and requeues (segment_store.SegmentStore),
a stream's offsets and independent readers, a replica's copy. An owner drops
whole segments when it no longer needs them (fully acknowledged, or past a
stream's retention). A classic queue's log keeps dropped files as spares and
starts new segments in them (``recycle``: store/segment_spares.py).

Threading: appends, reads and drops belong to the owner's thread (the event
loop). The owner's sync() may run in a worker thread: ``lock`` guards the write
file and the sync bookkeeping, which the owner shares with its own files (ack
files) under the same lock.

A full disk (store/disk_budget.py): the disk space a segment takes is charged
to the data directory's budget when it is allocated, before anything is
written into it. A write-out that fails is undone (the data ends where it
ended before) and, on the owner's thread, what it held is dropped: the log
closes that segment (later records go to a new one, so no position is ever
reused), remembers the write generations it lost and hands the dropped records
to the owner's ``on_lost`` (outside the lock), which takes them out of its
counters; the publishers waiting for them get nacks (that bookkeeping is
store/segment_losses.py's).
"""

from __future__ import annotations

import logging
import mmap
import os
import re
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

from warren.store.disk_budget import UNMETERED, DiskBudget
from warren.store.layout import make_dirs
from warren.store.mirror import FileMirror
from warren.store.segment_alloc import fallocate, target_size
from warren.store.segment_format import (
    MARK_SIZE,
    V1,
    V1_HEADER_SIZE,
    V2,
    V2_HEADER_SIZE,
    SegmentFile,
    encode_header,
    mark,
    new_salt,
    parse_header,
)
from warren.store.segment_losses import WriteLosses, undo_write
from warren.store.segment_reads import read_many, record_at
from warren.store.segment_scan import RecordScan
from warren.store.segment_scan import scan as scan_segment
from warren.store.segment_spares import Spares

__all__ = [
    "MAX_SEGMENT_ID",
    "OFFSET_MASK",
    "SEQ_BITS",
    "RecordScan",
    "SegmentFile",
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
_V1_HEADER = b"WSEG" + V1.to_bytes(4, "big")


class SegmentLog:
    """The segment files under ``directory``: appending, reading, dropping, syncing.

    Durability: appends reach the OS on flush (and whenever the write buffer
    fills); sync additionally fdatasyncs them. A log reopened after a crash
    finds exactly what reached the disk (scan() finds where each file's data
    ends). ``preallocate`` False: files grow as they are written (transient
    stores, which are never synced, need no allocation ahead).
    ``format_version`` 1 writes the old format: only for tests of reading it.
    ``recycle``: dropped segment files are kept as spares and reused.
    ``budget`` and ``mirror``: the data directory's (store/layout.py's DataDir).
    """

    def __init__(
        self,
        directory: Path,
        segment_size: int = 8 * 1024 * 1024,
        preallocate: bool = True,
        format_version: int = V2,
        recycle: bool = False,
        *,
        budget: DiskBudget = UNMETERED,
        mirror: FileMirror | None = None,
    ) -> None:
        if not V2_HEADER_SIZE + MARK_SIZE < segment_size <= OFFSET_MASK:
            raise ValueError(f"segment_size must be in ({V2_HEADER_SIZE + MARK_SIZE}, 2**32)")
        if format_version not in (V1, V2):
            raise ValueError(f"cannot write segment format version {format_version}")
        self.directory = Path(directory)
        self.segment_size = segment_size
        self.preallocate = preallocate and format_version == V2
        self.version = format_version
        self.recycle = recycle and self.preallocate
        #: Guards the write file and the sync bookkeeping (shared with the owner's files).
        self.lock = threading.Lock()
        self.closed = False
        self._next_id = 1
        # What the log knows of each segment file (created, recovered or adopted).
        self._files: dict[int, SegmentFile] = {}
        # The segment appended to (0: none yet); its file is opened on the first write-out.
        self.write_id = 0
        #: End of the write segment, the bytes not yet written out included.
        self.write_pos = 0
        #: The write segment's CRC seed (its salt), and where its records start.
        self.seed = 0
        self._start = 0
        self._wfile = SegmentFile(0, 0, 0)
        # Bytes the write segment's file has allocated (the budget is charged for
        # more before anything is written past them).
        self._allocated = 0
        # Appended records not yet handed to the OS, and where the write segment's
        # data ends in the file (what reached the OS). Its descriptor (-1: not
        # open); _create: the file is still to be made (creating it at the start
        # failed).
        self._chunks: list[bytes] = []
        self._flushed = 0
        self._fd = -1
        self._create = False
        self._synced_at = (0, 0)  # (write segment id, position) at the last sync
        self._sealed_at = (0, 0)  # (write segment id, position) of its close mark
        self._unsynced: set[int] = set()  # retired segments not yet synced
        self.dir_dirty = False  # files created or deleted since the last sync
        # Directories that got an entry when this log made its own (a new queue's):
        # fsynced by the first sync, or the whole directory can vanish in a power cut.
        self._new_dirs = make_dirs(self.directory)
        #: Clustering's replication (store/mirror.py), told what reaches the files.
        self.mirror = mirror
        self._mirrored = (0, 0)  # (write segment id, position) reported so far
        #: The data directory's free-disk budget (store/disk_budget.py).
        self.budget = budget
        # The write generation since which the kept records were appended.
        self._flushed_gen = self.budget.gen
        #: The owner's (segment id, position, records): what a failed write-out
        #: dropped, records from that position on; returns how many it counted.
        self.on_lost: Callable[[int, int, bytes], int] | None = None
        #: What failed write-outs dropped (store/segment_losses.py).
        self.losses = WriteLosses()
        #: Dropped segment files kept for reuse (store/segment_spares.py).
        self.spares = Spares(self)

    def __repr__(self) -> str:
        return f"<SegmentLog {str(self.directory)!r}>"

    def msgs_path(self, segment_id: int) -> Path:
        return self.directory / f"msgs.{segment_id:010d}"

    # -- what the log knows of its files --------------------------------------------------
    def file(self, segment_id: int) -> SegmentFile:
        """The seed, first record and end of data of a segment (read from its
        header, with the file's size as its end, if the log has not met it:
        a replica's file another process writes). Raises OSError."""
        known = self._files.get(segment_id)
        if known is not None:
            return known
        with open(self.msgs_path(segment_id), "rb") as f:
            header = parse_header(f.read(V2_HEADER_SIZE))
            size = os.fstat(f.fileno()).st_size
        start = header.start or V1_HEADER_SIZE
        return SegmentFile(header.seed, start, size)

    def data_start(self, segment_id: int) -> int:
        """Where the records of a segment start (its header's size)."""
        known = self._files.get(segment_id)
        return known.start if known is not None else self.file(segment_id).start

    def adopt(self, segment_id: int, seed: int, start: int, end: int) -> None:
        """The log now knows a segment's seed, first record and end of data
        (recovery's scan, a replica's reading of its copy)."""
        self._files[segment_id] = SegmentFile(seed, start, end)

    def forget(self, segment_id: int) -> None:
        """A segment file another process removed (a replica's copy)."""
        self._files.pop(segment_id, None)

    # -- writing --------------------------------------------------------------------------
    def append(self, rec: bytes) -> int:
        """Append one encoded record (or a run of them) whose CRC is seeded with
        ``self.seed``; its position. The caller encodes again (make_room and put)
        when a new segment begins with another seed. Never fails for a full disk:
        a write-out that fails drops the records appended before this one (see
        on_lost), never this one."""
        self.make_room(len(rec))
        return self.put(rec)

    def make_room(self, n: int) -> bool:
        """append()'s first half: charge the budget for the space ``n`` more bytes
        need (a new segment's first allocation, or the next one of the write
        segment; nothing when they fit what it has: the broker may measure the
        disk now), write out the buffer if they would overflow it, start a new
        segment if they do not fit the current one. Returns True when a new
        segment began: its seed is another, so the caller encodes the record
        again. Everything that may drop buffered records (and so change the
        owner's counters) happens here, so an owner that writes what it is told
        into the record (a stream's offset) calls this first and put() after."""
        pos = self.write_pos
        tail = MARK_SIZE if self.version == V2 else 0
        new = not self.write_id or (pos + n + tail > self.segment_size and pos > self._start)
        have = (self.spares.ready_size() if self.recycle else 0) if new else self._allocated
        needed = V2_HEADER_SIZE + n + tail if new else pos + n + tail
        target = target_size(self, needed, have)
        if target > have:
            budget = self.budget
            budget.left -= target - have
            if budget.left < 0:
                budget.spent()
            pos = self.write_pos
        if self._chunks and pos - self._flushed + n > _WRITE_BUFFER:
            self.write_out()
            pos = self.write_pos
        if (
            new
            or not self.write_id
            or (pos + n + tail > self.segment_size and pos > self._start)
        ):
            self._new_segment(n, target if new else 0)
            return True
        if pos + n + tail > self._allocated:
            self._allocate(max(target, pos + n + tail), pos + n + tail)
        return False

    def _allocate(self, target: int, needed: int) -> None:
        """Allocate the write segment's file up to ``target`` (no file yet: at its
        creation), ahead of the ``needed`` bytes. A file system that cannot
        allocate ahead (or a full disk: the write-out will say) grows the file
        as it is written."""
        if self.preallocate and target > needed and target > self._allocated and self._fd >= 0:
            target = fallocate(self, self._fd, self._allocated, target, needed)
        self._allocated = max(self._allocated, target)

    def room(self) -> int:
        """How many bytes of records the write segment still takes before
        make_room starts a new one (a segment not begun yet, or empty: its
        whole size; any one record fits an empty segment)."""
        tail = MARK_SIZE if self.version == V2 else 0
        if not self.write_id or self.write_pos <= self._start:
            start = V2_HEADER_SIZE if self.version == V2 else V1_HEADER_SIZE
            return max(0, self.segment_size - start - tail)
        return max(0, self.segment_size - self.write_pos - tail)

    def put(self, rec: bytes) -> int:
        """append()'s second half, right after make_room(len(rec)): its position."""
        pos = self.write_pos
        self._chunks.append(rec)
        self.write_pos = pos + len(rec)
        return (self.write_id << 32) | pos

    def _new_segment(self, n: int, target: int) -> None:
        """Close the write segment (written out) and start the next for a record
        of ``n`` bytes: a new id, a new salt, its file created and allocated (to
        ``target``, as charged; 0: as _target says) now, or, if that fails, at the
        first write-out. A ready spare is taken instead when there is one."""
        if self.closed:
            raise ValueError(f"{self!r} is closed")
        with self.lock:
            if self.write_id:
                self.retire_locked()
            v2 = self.version == V2
            start = V2_HEADER_SIZE if v2 else V1_HEADER_SIZE
            fd = -1
            allocated = 0
            while True:
                sid = self._next_id
                if sid > MAX_SEGMENT_ID:
                    raise OverflowError(f"{self.directory}: segment ids exhausted")
                self._next_id = sid + 1
                if self.recycle and self.spares.ready_size():
                    if os.path.lexists(self.msgs_path(sid)):
                        continue  # a file we could not recover: never reuse its id
                    fd, allocated = self.spares.take(sid)
                    if fd >= 0:
                        break
                try:
                    fd = os.open(self.msgs_path(sid), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                except FileExistsError:  # a file we could not recover: never reuse its id
                    continue
                except OSError as exc:  # the disk is full: try again when writing out
                    log.warning("%s: cannot create segment %d yet: %s", self.directory, sid, exc)
                break
            salt = new_salt() if v2 else 0
            self.write_id = sid
            self.seed = salt
            self._start = start
            self._wfile = self._files[sid] = SegmentFile(salt, start, 0)
            self._fd = fd
            self._create = fd < 0
            self._flushed = 0
            self._allocated = allocated
            self._chunks = [encode_header(sid, salt) if v2 else _V1_HEADER]
            self.write_pos = start
            self._flushed_gen = self.budget.gen
            if fd >= 0:
                self.dir_dirty = True
            needed = start + n + (MARK_SIZE if v2 else 0)
            self._allocate(max(target or target_size(self, needed, 0), needed), needed)
        self.report_losses()

    def write_out(self) -> None:
        """Hand the buffered appends to the OS (what flush() does for the owner)."""
        if self._chunks:
            with self.lock:
                self._write_out_locked()
            self.report_losses()

    def _write_out_locked(self) -> None:
        """Write the buffered records to the write segment where its data ends,
        and (version 2) the end mark after them (caller holds ``lock``).

        All or nothing: a write that fails part way is undone (the old end mark
        written again, the file cut after it). On the owner's thread the records
        are then dropped (_drop_unwritten); on another thread (a sync from a
        worker) they stay buffered and the error is raised.
        """
        chunks = self._chunks
        k = len(chunks)
        if not k or not self.write_id:
            return
        data = chunks[0] if k == 1 else b"".join(chunks[:k])
        at = self._flushed
        v2 = self.version == V2
        parts = [data, mark(at + len(data), self.seed)] if v2 else [data]
        total = len(data) + (MARK_SIZE if v2 else 0)
        written = 0
        fd = self._fd
        try:
            if fd < 0:
                fd = self._open_write_file()
            written = os.pwritev(fd, parts, at)
            if written < total:
                whole = b"".join(parts)
                while written < total:
                    written += os.pwrite(fd, whole[written:], at + written)
        except OSError as exc:
            if written and fd >= 0:
                undo_write(fd, at, v2, self.seed, self.directory)
            if threading.get_ident() != self.losses.owner:
                raise
            self._drop_unwritten(exc)
            return
        del chunks[:k]
        self._flushed = at + len(data)
        self._wfile.end = self._flushed
        budget = self.budget
        budget.gen += 1
        self._flushed_gen = budget.gen
        if self.mirror is not None:
            self._mirror_locked()

    def _open_write_file(self) -> int:
        path = self.msgs_path(self.write_id)
        if self._create:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            self._create = False
            self.dir_dirty = True
            self._fd = fd
            if self.preallocate and self._allocated > self.write_pos:
                tail = MARK_SIZE if self.version == V2 else 0
                self._allocated = fallocate(self, fd, 0, self._allocated, self.write_pos + tail)
        else:
            fd = os.open(path, os.O_WRONLY)
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
        header = self._start
        if start <= header:  # nothing but (part of) a header: no segment at all
            self._unsynced.discard(sid)
            if not self._create:
                self.unlink(self.msgs_path(sid))
                self.dir_dirty = True
            self._create = False
        elif (sid, start) != self._synced_at:
            self._unsynced.add(sid)
        budget = self.budget
        first = self._flushed_gen
        last = budget.gen
        budget.gen += 1
        self._flushed_gen = budget.gen
        if start < header:
            data = data[header - start :]
            start = header
        self.losses.dropped(first, last, sid, start, data, exc)

    def report_losses(self) -> None:
        """Tell the owner (outside the lock) what failed write-outs dropped
        (store/segment_losses.py)."""
        if self.losses.pending:
            self.losses.report(self)

    def lost_between(self, first: int, last: int) -> bool:
        """Whether records appended in a write generation from ``first`` to
        ``last`` were dropped by a failed write-out (store/disk_budget.py)."""
        return self.losses.between(first, last)

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

    def seal(self) -> None:
        """A clean close is coming: the write segment's data ends with a close mark
        (written to the OS now, made durable by the close's sync), so the next
        start appends after it. Nothing to do when nothing was written since the
        segment was opened or sealed."""
        with self.lock:
            if self.closed or self.version != V2 or not self.write_id:
                return
            self._write_out_locked()
            sid, at = self.write_id, self._flushed
            if not sid or self._sealed_at == (sid, at):
                return
            fd = self._fd
            if fd < 0:
                return  # its file could not be made: nothing in it to seal
            closing = mark(at, self.seed, closed=True)
            try:
                os.pwrite(fd, closing, at)
            except OSError as exc:  # the next start begins a new segment: nothing lost
                log.warning("%s: cannot mark %s closed: %s", self.directory, sid, exc)
                return
            self._sealed_at = (sid, at)
            self._synced_at = (0, 0)  # the next sync covers the mark
            if self.mirror is not None and self.mirror.wants_data():
                self.mirror.appended(self.msgs_path(sid), at, closing)
        self.report_losses()

    def continue_segment(self, segment_id: int, end: int, allocated: int) -> None:
        """After recovery: keep appending to ``segment_id`` (version 2, its data
        ending at the close mark a clean close left at ``end``; its file
        ``allocated`` bytes)."""
        self.write_id = segment_id
        self.write_pos = end
        self._flushed = end
        self._fd = -1
        self._create = False
        self._chunks = []
        self._synced_at = (segment_id, end)
        self._mirrored = (segment_id, end)
        self._sealed_at = (segment_id, end)
        if segment_id:
            known = self._files[segment_id]
            self._wfile = known
            self.seed = known.seed
            self._start = known.start
            self._allocated = allocated

    # -- reading --------------------------------------------------------------------------
    def flush_writes(self, segment_id: int) -> None:
        """Push buffered appends of ``segment_id`` to the file before reading it
        (if that fails, the owner has taken the records out before this returns)."""
        if segment_id == self.write_id and self._chunks:
            self.write_out()

    def end_of(self, segment_id: int) -> int:
        """Where the data of a segment ends (what reached the file of the write
        segment). Raises OSError for a file the log has not met and cannot read."""
        known = self._files.get(segment_id)
        return known.end if known is not None else self.file(segment_id).end

    def map(self, segment_id: int) -> mmap.mmap | None:
        """A read-only map of a segment file up to the end of its data (None when
        there is none): no reader ever sees what lies past it (zeros, or writes a
        crash cut short). Raises OSError when the file cannot be
        opened or mapped."""
        self.flush_writes(segment_id)
        end = self.end_of(segment_id)
        fd = os.open(self.msgs_path(segment_id), os.O_RDONLY)
        try:
            end = min(end, os.fstat(fd).st_size)
            if end <= 0:
                return None
            m = mmap.mmap(fd, end, access=mmap.ACCESS_READ)
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
            end = self.end_of(sid)
            if off >= end:
                return None
            fd = os.open(self.msgs_path(sid), os.O_RDONLY)
        except OSError:
            return None
        try:
            return record_at(fd, os.pread(fd, min(4096, end - off), off), off, end)
        except OSError:
            return None
        finally:
            os.close(fd)

    def read_many(self, seqs: list[int]) -> list[bytes | None]:
        """read() of each position, each segment file opened once for the positions
        of it in a row (store/segment_reads.py)."""
        return read_many(self, seqs)

    # -- dropping -------------------------------------------------------------------------
    def drop_locked(self, segment_id: int) -> None:
        """Delete a segment file the owner no longer needs, or keep it as a spare
        (caller holds ``lock``)."""
        if segment_id == self.write_id:
            # Not written out: every record in it is gone anyway.
            self._chunks = []
            self._close_write_file()
            self.write_id = 0
            self._create = False
        self._unsynced.discard(segment_id)
        self._files.pop(segment_id, None)
        self.retire_file(segment_id)

    def retire_file(self, segment_id: int) -> None:
        """A segment file with nothing left in it: a spare, or deleted."""
        self.dir_dirty = True
        if not (self.recycle and self.spares.keep(segment_id)):
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
        """Report the write segment's bytes flushed since the last report, with
        the end mark after them (a follower's copy ends as the file does)."""
        sid = self.write_id
        if not sid or self._fd < 0 or self.mirror is None:
            return
        msid, start = self._mirrored
        if msid != sid:
            start = 0  # a new segment: from its header on
        end = self._flushed
        if end > start and self.mirror.wants_data():
            path = self.msgs_path(sid)
            tail = MARK_SIZE if self.version == V2 else 0
            fd = os.open(path, os.O_RDONLY)  # the write file is write-only
            try:
                data = os.pread(fd, end + tail - start, start)
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
        self.spares.collect_locked(paths)

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
            self.spares.release()

    def delete(self) -> None:
        """Close everything and remove the directory with every file in it."""
        with self.lock:
            self.closed = True
            self._chunks = []
            self._close_write_file()
            self.spares.release()
        self.write_id = 0
        self._files.clear()
        shutil.rmtree(self.directory, ignore_errors=True)
        if self.mirror is not None:
            self.mirror.deleted(self.directory)

    # -- recovery -------------------------------------------------------------------------
    def reserve_ids(self, highest: int) -> None:
        """Never create a segment with an id up to ``highest`` (files found on disk)."""
        self._next_id = max(self._next_id, highest + 1)

    def scan(self, segment_id: int) -> RecordScan | None:
        """One pass over a segment's records, for recovery (store/segment_scan.py):
        None when the file is not a segment, was never written or its header
        names another segment. Closing the scan tells the log where the data ends."""
        return scan_segment(self, segment_id)
