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
"""

from __future__ import annotations

import contextlib
import io
import logging
import mmap
import os
import re
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import warren
from warren.store.layout import make_dirs
from warren.store.mirror import mirror_for
from warren.store.records import (
    FILE_HEADER,
    FILE_HEADER_SIZE,
    MIN_RECORD_SIZE,
    BadFileHeader,
    CorruptRecord,
    check_file_header,
    inspect_record,
)

__all__ = [
    "MAX_SEGMENT_ID",
    "OFFSET_MASK",
    "SEQ_BITS",
    "RecordScan",
    "SegmentLog",
    "sync_collected",
    "sync_files",
]

log = logging.getLogger("warren.store")

MSGS_NAME = re.compile(r"msgs\.(\d{10})")
OFFSET_MASK = 0xFFFFFFFF
MAX_SEGMENT_ID = 9_999_999_999  # ten digits in the file name
#: Every position in a segment log is below ``1 << SEQ_BITS`` (66).
SEQ_BITS = MAX_SEGMENT_ID.bit_length() + 32
# Python-side write buffer of the write segment. Small on purpose: an idle queue
# keeps its write file (and so this buffer) open.
_WRITE_BUFFER = 32 * 1024


_native = warren.native_module("_syncworker")
#: The C version of sync_files below (None: not built).
_native_sync: Callable[[list[int], list[bytes], list[bytes]], None] | None = (
    None if _native is None else _native.sync_files
)


def sync_files(fds: list[int], paths: list[Path], dirs: list[Path]) -> None:
    """fdatasync the descriptors (closing them) and the files, then fsync the
    directories: the slow half of a sync, run outside the lock. In C when
    built: one call that never takes the GIL back in between (a sync thread
    waiting for the GIL behind a busy event loop delays the round)."""
    if _native_sync is not None:
        _native_sync(fds, [os.fsencode(p) for p in paths], [os.fsencode(d) for d in dirs])
    else:
        sync_files_python(fds, paths, dirs)


def sync_collected(collect: Callable[[list[int], list[Path], list[Path]], None]) -> None:
    """A store's whole sync: ``collect`` (its collect_sync, under its lock) names
    what to fdatasync, sync_files does it; what was collected is synced (and
    its descriptors closed) even when ``collect`` raises part way."""
    fds: list[int] = []
    paths: list[Path] = []
    dirs: list[Path] = []
    try:
        collect(fds, paths, dirs)
    finally:
        sync_files(fds, paths, dirs)


def sync_files_python(fds: list[int], paths: list[Path], dirs: list[Path]) -> None:
    """sync_files without the C extension (and its reference)."""
    try:
        for fd in fds:
            os.fdatasync(fd)
        for path in paths:
            _fdatasync_path(path)
        for directory in dirs:
            try:
                dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
            except FileNotFoundError:  # deleted meanwhile
                continue
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
    finally:
        for fd in fds:
            with contextlib.suppress(OSError):  # one bad descriptor must not leak the rest
                os.close(fd)


def _fdatasync_path(path: Path) -> None:
    """fdatasync through a fresh descriptor: it flushes the inode, whoever wrote it."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:  # deleted since (no longer needed): nothing to keep
        return
    try:
        os.fdatasync(fd)
    finally:
        os.close(fd)


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
        # The segment appended to (0: none yet), opened lazily on the first append.
        self.write_id = 0
        self._wfile: io.BufferedWriter[io.FileIO] | None = None
        #: End of the write segment, Python buffer included.
        self.write_pos = 0
        self._synced_at = (0, 0)  # (write segment id, position) at the last sync
        self._unsynced: set[int] = set()  # retired segments not yet synced
        self.dir_dirty = False  # files created or deleted since the last sync
        # Directories that got an entry when this log made its own (a new queue's):
        # fsynced by the first sync, or the whole directory can vanish in a power cut.
        self._new_dirs = make_dirs(self.directory)
        #: Clustering's replication (store/mirror.py), told what reaches the files.
        self.mirror = mirror_for(self.directory)
        self._mirrored = (0, 0)  # (write segment id, position) reported so far

    def __repr__(self) -> str:
        return f"<SegmentLog {str(self.directory)!r}>"

    def msgs_path(self, segment_id: int) -> Path:
        return self.directory / f"msgs.{segment_id:010d}"

    # -- writing --------------------------------------------------------------------------
    def append(self, rec: bytes) -> int:
        """Append one encoded record; its position. Starts a new segment when the
        record does not fit the current one (an owner notices: a new segment id)."""
        n = len(rec)
        pos = self.write_pos
        wfile = self._wfile
        if wfile is None or (pos + n > self.segment_size and pos > FILE_HEADER_SIZE):
            wfile = self._prepare_write(n)
            pos = self.write_pos
        wfile.write(rec)
        self.write_pos = pos + n
        return (self.write_id << 32) | pos

    def _prepare_write(self, n: int) -> io.BufferedWriter[io.FileIO]:
        """Open the write segment, or start a new one when ``n`` more bytes do not fit."""
        if self.closed:
            raise ValueError(f"{self!r} is closed")
        with self.lock:
            sid = self.write_id
            if (
                sid
                and self._wfile is None
                and (self.write_pos + n <= self.segment_size or self.write_pos <= FILE_HEADER_SIZE)
            ):
                fd = os.open(self.msgs_path(sid), os.O_WRONLY | os.O_APPEND)
                self._wfile = wfile = io.BufferedWriter(io.FileIO(fd, "w"), _WRITE_BUFFER)
                return wfile
            if sid:
                self.retire_locked()
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
                break
            wfile = io.BufferedWriter(io.FileIO(fd, "w"), _WRITE_BUFFER)
            wfile.write(FILE_HEADER)
            self.write_id = sid
            self._wfile = wfile
            self.write_pos = FILE_HEADER_SIZE
            self.dir_dirty = True
        return wfile

    def retire(self) -> None:
        """Close the write segment; the next append starts a new one."""
        with self.lock:
            self.retire_locked()

    def retire_locked(self) -> None:
        sid = self.write_id
        if not sid:
            return
        if self.mirror is not None and self._wfile is not None:
            self._wfile.flush()
            self._mirror_locked()
        # Never append to this file again, even if the final flush fails (disk full):
        # the lost buffer would misalign every later offset.
        self.write_id = 0
        if (sid, self.write_pos) != self._synced_at:
            self._unsynced.add(sid)
        if self._wfile is not None:
            wfile, self._wfile = self._wfile, None
            wfile.close()  # flushes

    def continue_segment(self, segment_id: int, size: int) -> None:
        """After recovery: keep appending to ``segment_id``, whose data ends at ``size``."""
        self.write_id = segment_id
        self.write_pos = size
        self._synced_at = (segment_id, size)
        self._mirrored = (segment_id, size)

    # -- reading --------------------------------------------------------------------------
    def flush_writes(self, segment_id: int) -> None:
        """Push buffered appends of ``segment_id`` to the file before reading it."""
        if segment_id == self.write_id and self._wfile is not None:
            self._wfile.flush()
            if self.mirror is not None:
                self._mirror_locked()

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
            self.retire_locked()
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
        """Hand buffered appends to the OS (caller holds ``lock``)."""
        if not self.closed and self._wfile is not None:
            self._wfile.flush()
            if self.mirror is not None:
                self._mirror_locked()

    def _mirror_locked(self) -> None:
        """Report the write segment's bytes flushed since the last report."""
        sid = self.write_id
        wfile = self._wfile
        if not sid or wfile is None or self.mirror is None:
            return
        msid, start = self._mirrored
        if msid != sid:
            start = 0  # a new segment: from its header on
        end = self.write_pos
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
        grew since the last sync, and the retired segments not synced yet."""
        sid = self.write_id
        if self._wfile is not None and sid:
            # Read the position before flushing: bytes appended after this point may
            # still be buffered and must not count as synced.
            mark = (sid, self.write_pos)
            self._wfile.flush()
            if self.mirror is not None:
                self._mirror_locked()
            if mark != self._synced_at:
                fds.append(os.dup(self._wfile.fileno()))
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
        """Close the write file (flushing it); caller holds ``lock``."""
        self.closed = True
        if self._wfile is not None:
            try:
                if self.mirror is not None:
                    self._wfile.flush()
                    self._mirror_locked()
                self._wfile.close()
            finally:
                self._wfile = None

    def delete(self) -> None:
        """Close everything and remove the directory with every file in it."""
        with self.lock:
            self.closed = True
            wfile, self._wfile = self._wfile, None
        if wfile is not None:
            with contextlib.suppress(OSError):  # about to be deleted anyway
                wfile.close()
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
        when the file is not a segment (left untouched) or a torn header (removed)."""
        path = self.msgs_path(segment_id)
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            head = os.pread(fd, FILE_HEADER_SIZE, 0)
            try:
                check_file_header(head)
            except BadFileHeader as exc:
                if size < FILE_HEADER_SIZE and FILE_HEADER.startswith(head):
                    log.warning("%s: %s: torn file header; removing it", self.directory, path.name)
                    self.unlink(path)
                else:
                    log.warning("%s: %s: %s; leaving it untouched", self.directory, path.name, exc)
                return None
            m = mmap.mmap(fd, size, access=mmap.ACCESS_READ) if size > FILE_HEADER_SIZE else None
        finally:
            os.close(fd)
        return RecordScan(self, segment_id, m, size)


class RecordScan:
    """The records of one segment, validated as recovery reads them.

    Iterating yields ``(offset, length, properties offset, properties length, body
    length)`` per record; a corrupt record that a sound record follows yields
    ``(offset, length, -1, 0, 0)`` (its owner counts it as dead). A torn or corrupt
    tail ends the iteration and is cut off the file by close(), which then knows
    the file's valid ``size``. ``map`` holds the file's bytes while it is open.
    """

    def __init__(self, segment_log: SegmentLog, segment_id: int, m: mmap.mmap | None, size: int):
        self.log = segment_log
        self.segment_id = segment_id
        self.map = m
        self.size = size
        self._cut: int | None = None

    def __iter__(self) -> Iterator[tuple[int, int, int, int, int]]:
        m, size = self.map, self.size
        if m is None:
            return
        directory, name = self.log.directory, self.log.msgs_path(self.segment_id).name
        pos = FILE_HEADER_SIZE
        while pos < size:
            if pos > OFFSET_MASK:
                self._cut = pos
                log.warning("%s: %s: data past 4 GiB; truncating at %d", directory, name, pos)
                return
            try:
                length, p_off, p_len, b_len = inspect_record(m, pos, size)
            except CorruptRecord as corrupt:
                nxt = pos + corrupt.length if corrupt.length is not None else size
                if nxt < size and _plausible(m, nxt, size):
                    log.warning(
                        "%s: %s: corrupt record at offset %d (%s); dropped it",
                        directory,
                        name,
                        pos,
                        corrupt.reason,
                    )
                    yield pos, nxt - pos, -1, 0, 0
                    pos = nxt
                    continue
                self._cut = pos
                log.warning(
                    "%s: %s: torn or corrupt record at offset %d (%s); "
                    "truncating the file there (%d bytes dropped)",
                    directory,
                    name,
                    pos,
                    corrupt.reason,
                    size - pos,
                )
                return
            yield pos, length, p_off, p_len, b_len
            pos += length

    def close(self) -> None:
        """Release the map and cut off a torn tail met while iterating."""
        if self.map is not None:
            self.map.close()
            self.map = None
        if self._cut is not None:
            os.truncate(self.log.msgs_path(self.segment_id), self._cut)
            self.size = self._cut
            self._cut = None


def _plausible(m: mmap.mmap, pos: int, size: int) -> bool:
    """Whether a structurally sound record starts at ``pos`` (resynchronisation check)."""
    try:
        inspect_record(m, pos, size, verify_crc=False)
    except CorruptRecord:
        return False
    return True
