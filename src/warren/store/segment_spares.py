"""Spare segment files: fully acknowledged segments kept for reuse.

A version-2 segment file is allocated ahead (store/segment_alloc.py), but
blocks that posix_fallocate reserved are *unwritten extents*: the first write
into each makes the next fdatasync commit the file system's journal to mark it
written (ext4: 12 KiB a round; docs/benchmarks.md, "Write amplification").
Blocks written before cost no commit. So a classic queue's store keeps the
files of fully acknowledged segments as *spares* instead of deleting them, and
starts its next segment in one.

**The spare state.** Retiring a segment writes a *spare header* over its
header (segment id 0, store/segment_format.py: no segment has that id), then
renames ``msgs.<id>`` to ``spare.<id>``, then removes ``acks.<id>``. A file is
a spare when its name says so or its header does; it holds no data either
way. A spare is *pending* until a sync round has fdatasynced it (its spare
header durable) and fsynced the directory; only then may it be reused
(*ready*). Reuse renames ``spare.<id>`` to ``msgs.<new id>`` and the first
write-out puts the new life's header (new id, new salt) and data at its start.
What a crash or power cut can leave, and what the next start makes of it:

- ``msgs.<id>`` with its own header and ack file: the retire never reached the
  disk; recovery finds the segment fully acknowledged (or its acks lost to the
  cut, redelivered) and retires it again;
- ``msgs.<id>`` with the spare header: renamed back to ``spare.<id>``, its
  ack file removed;
- ``spare.<id>`` with any header (the old one, the spare header, or a new
  life's whose rename to ``msgs.<new>`` was lost): a spare;
- ``msgs.<new>`` with the spare header (the rename reached the disk, the new
  header did not): a spare again. Nothing in it was confirmed: a confirm waits
  for the fdatasync that writes the new header with the records. It cannot
  hold the old life's header: reuse takes only spares whose spare header is
  durable;
- ``msgs.<new>`` with the new header: a segment; the previous life's records
  lie past its end mark and never check out with the new salt.

**Bounds.** At most MAX_SPARES per store, at most the data directory's
``DiskBudget.spare_limit`` bytes together (disk_budget.py), none larger than
the segment size, and only while the free-disk budget has room for the file
(near ``free_disk_min`` a retired file is deleted, and the next sync round
deletes the spares held). Streams delete what their
retention drops (readers may still map it); transient stores allocate nothing
ahead, so there is nothing to keep. docs/storage.md, "Writing" and "Recovery".
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from warren.store.segment_format import SPARE_ID, encode_header, new_salt

if TYPE_CHECKING:
    from warren.store.segment_log import SegmentLog

__all__ = ["MAX_SPARES", "SPARE_NAME", "Spares"]

log = logging.getLogger("warren.store")

SPARE_NAME = re.compile(r"spare\.(\d{10})")
#: Spare files one store keeps (one covers a consumer keeping up; two, a burst).
MAX_SPARES = 2


class Spares:
    """One segment log's spare files, by id and size: pending (their spare
    header not yet synced), syncing (collected by a sync round in flight) and
    ready (reusable). The owner's thread retires and takes; sync rounds move
    them on (under the log's lock)."""

    def __init__(self, seglog: SegmentLog) -> None:
        self.log = seglog
        self._pending: list[tuple[int, int]] = []
        self._syncing: list[tuple[int, int]] = []
        self._ready: list[tuple[int, int]] = []
        self._held = 0  # bytes counted in the budget's spare_bytes

    def path(self, name_id: int) -> Path:
        return self.log.directory / f"spare.{name_id:010d}"

    def __len__(self) -> int:
        return len(self._pending) + len(self._syncing) + len(self._ready)

    def ready_size(self) -> int:
        """The size of the spare take() would use (0: none ready)."""
        return self._ready[0][1] if self._ready else 0

    def _room(self, size: int) -> bool:
        seglog = self.log
        budget = seglog.budget
        return (
            0 < size <= seglog.segment_size
            and len(self) < MAX_SPARES
            and budget.spare_bytes + size <= budget.spare_limit
            and budget.left > size
        )

    def _hold(self, name_id: int, size: int) -> None:
        self._pending.append((name_id, size))
        self._held += size
        self.log.budget.spare_bytes += size

    # -- retiring ---------------------------------------------------------------------
    def keep(self, segment_id: int) -> bool:
        """Make the fully acknowledged ``msgs.<segment_id>`` a spare (spare header,
        renamed to ``spare.<id>``); False when it is not kept (no room, or a
        step failed): the caller deletes it."""
        seglog = self.log
        path = seglog.msgs_path(segment_id)
        spare = self.path(segment_id)
        try:
            fd = os.open(path, os.O_WRONLY)
        except OSError:
            return False
        try:
            size = os.fstat(fd).st_size
            if not self._room(size) or os.path.lexists(spare):
                return False
            header = encode_header(SPARE_ID, new_salt())
            os.pwrite(fd, header, 0)
        except OSError as exc:
            log.warning("%s: cannot keep %s as a spare: %s", seglog.directory, path.name, exc)
            return False
        finally:
            os.close(fd)
        mirror = seglog.mirror
        if mirror is not None and mirror.wants_data():
            mirror.appended(path, 0, header)
        try:
            os.rename(path, spare)
        except OSError as exc:  # its header says spare: a start takes it as one
            log.warning("%s: cannot keep %s as a spare: %s", seglog.directory, path.name, exc)
            return False
        if mirror is not None:
            mirror.renamed(path, spare)
        self._hold(segment_id, size)
        return True

    # -- reusing ----------------------------------------------------------------------
    def take(self, segment_id: int) -> tuple[int, int]:
        """Rename a ready spare to ``msgs.<segment_id>`` (which must not exist) and
        open it for writing: (descriptor, its size); (-1, 0) when there is none
        (or it could not be renamed: then it is deleted)."""
        seglog = self.log
        target = seglog.msgs_path(segment_id)
        while self._ready:
            name_id, size = self._ready.pop(0)
            self._release(size)
            spare = self.path(name_id)
            try:
                os.rename(spare, target)
            except OSError as exc:
                log.warning("%s: cannot reuse %s: %s", seglog.directory, spare.name, exc)
                seglog.unlink(spare)
                continue
            if seglog.mirror is not None:
                seglog.mirror.renamed(spare, target)
            try:
                fd = os.open(target, os.O_WRONLY)
            except OSError as exc:  # the next write-out creates it: O_EXCL fails there
                log.warning("%s: cannot open %s: %s", seglog.directory, target.name, exc)
                return -1, 0
            # Writes that cover part of a page read it first when it is not cached
            # (written blocks are not known zeros): read the file ahead, off the loop.
            with contextlib.suppress(OSError, AttributeError):
                os.posix_fadvise(fd, 0, size, os.POSIX_FADV_WILLNEED)
            return fd, size
        return -1, 0

    def _release(self, size: int) -> None:
        self._held -= size
        self.log.budget.spare_bytes -= size

    # -- durability -------------------------------------------------------------------
    def collect_locked(self, paths: list[Path]) -> None:
        """A sync round begins (caller holds the log's lock): spares the previous
        round synced are ready; pending ones are added to this round's files
        (the caller's directory fsync covers their renames). Near the free-disk
        limit (the budget has less room than the spares hold) they are deleted:
        spares never keep the disk alarm up."""
        seglog = self.log
        if self._held and seglog.budget.left < self._held:
            for name_id, _size in self._pending + self._syncing + self._ready:
                seglog.unlink(self.path(name_id))
            log.info(
                "%s: disk space is short: %d spare segment files deleted",
                seglog.directory,
                len(self),
            )
            self.release()
            seglog.dir_dirty = True
            return
        if self._syncing:
            self._ready.extend(self._syncing)
            self._syncing = []
        if self._pending:
            paths.extend(self.path(name_id) for name_id, _size in self._pending)
            self._syncing = self._pending
            self._pending = []

    # -- recovery ---------------------------------------------------------------------
    def found(self, name_id: int) -> None:
        """Recovery met ``spare.<name_id>``: keep it or, over the bounds (or when
        its header cannot be written), delete it. Kept, it gets the spare header
        again (a crash may have left its old header, or a new life's whose
        rename was lost: reused with either, and that header's rename durable
        before the new one, it would read as another segment) and is pending
        until a sync round makes that durable."""
        seglog = self.log
        spare = self.path(name_id)
        try:
            size = os.stat(spare).st_size
        except OSError:
            return
        if seglog.recycle and self._room(size):
            header = encode_header(SPARE_ID, new_salt())
            try:
                fd = os.open(spare, os.O_WRONLY)
                try:
                    os.pwrite(fd, header, 0)
                finally:
                    os.close(fd)
            except OSError as exc:
                log.warning("%s: cannot keep %s: %s", seglog.directory, spare.name, exc)
            else:
                if seglog.mirror is not None and seglog.mirror.wants_data():
                    seglog.mirror.appended(spare, 0, header)
                self._hold(name_id, size)
                seglog.dir_dirty = True
                return
        seglog.unlink(spare)

    def adopt(self, segment_id: int) -> None:
        """``msgs.<segment_id>`` has the spare header (a retire or a reuse a crash
        cut short): a spare again, under its spare name, or deleted."""
        seglog = self.log
        path = seglog.msgs_path(segment_id)
        log.warning(
            "%s: %s is a spare segment file (it holds no data)", seglog.directory, path.name
        )
        spare = self.path(segment_id)
        if seglog.recycle and not os.path.lexists(spare):
            try:
                os.rename(path, spare)
            except OSError as exc:
                log.warning("%s: cannot rename %s: %s", seglog.directory, path.name, exc)
            else:
                if seglog.mirror is not None:
                    seglog.mirror.renamed(path, spare)
                seglog.dir_dirty = True
                self.found(segment_id)
                return
        seglog.unlink(path)
        seglog.dir_dirty = True

    def release(self) -> None:
        """The log closes: its spares stay on disk (a start finds them) but no
        longer count against the data directory's limit."""
        self._release(self._held)
        self._pending = []
        self._syncing = []
        self._ready = []
