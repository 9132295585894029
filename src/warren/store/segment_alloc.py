"""How far ahead of its data a segment file is allocated (store/segment_log.py).

An fdatasync after a write that grows a file commits the file system's journal
(ext4: 12-20 KiB a round, docs/benchmarks.md, "Write amplification"); after a
write into space already allocated it does not. So a version-2 segment file is
allocated ahead (posix_fallocate): 64 KiB at its creation, then, whenever its
data would pass what it has, double that but at most 1 MiB past the data, and
never past the segment size: a queue that holds a few messages does not hold a
whole segment, and space allocated and not yet used counts as used for the
free-disk alarm, so many queues must not each hold megabytes of it (an
allocation per MiB costs one journal commit per MiB written: under 2%). Space
allocated counts against the free-disk budget (store/disk_budget.py) when it
is allocated; near the limit only what the records need is.
"""

from __future__ import annotations

import errno
import logging
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from warren.store.segment_log import SegmentLog

__all__ = ["FIRST_ALLOCATION", "fallocate", "target_size"]

log = logging.getLogger("warren.store")

#: A new file's first allocation; each further one doubles what it has...
FIRST_ALLOCATION = 64 * 1024
#: ...but goes at most this far past the data it must hold.
MAX_AHEAD = 1024 * 1024


def target_size(seglog: SegmentLog, needed: int, have: int) -> int:
    """What a file with ``have`` bytes allocated allocates to hold ``needed``:
    ahead of the data, 64 KiB at first, then double what it has but at most
    MAX_AHEAD past ``needed``, and at most the segment size (unless a record
    needs more); only what it needs
    when the log's files grow as they are written, or when the disk is nearly
    full (what is allocated ahead counts as used: it must not raise the alarm)."""
    if needed <= have:
        return have
    if not seglog.preallocate:
        return needed
    ahead = min(max(FIRST_ALLOCATION, 2 * have), needed + MAX_AHEAD)
    want = max(needed, min(seglog.segment_size, ahead))
    if want - have > seglog.budget.left:
        return needed
    return want


def fallocate(seglog: SegmentLog, fd: int, start: int, size: int, needed: int) -> int:
    """Allocate bytes ``start`` to ``size`` of the write segment's file (and tell
    the mirror); returns where the file's allocation ends now. On a full disk
    only the ``needed`` bytes are tried: an allocation ahead that failed halfway
    would otherwise hold the very space the records need (ext4 keeps what it
    got), so it is given back first; when even that fails the file is left at
    ``start`` and the write-out reports the full disk. A file system that cannot
    allocate ahead makes the log stop trying (logged once): its files grow as
    they are written."""
    # The file may already reach past ``start``: written to after an earlier
    # allocation failed. Nothing before its end is ever given back.
    start = max(start, os.fstat(fd).st_size)
    if size <= start:
        return start
    try:
        os.posix_fallocate(fd, start, size - start)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            seglog.preallocate = False
            log.warning(
                "%s: %s: cannot allocate %d bytes ahead (%s): its files grow as they are written",
                seglog.directory,
                seglog.msgs_path(seglog.write_id).name,
                size - start,
                exc.strerror or exc,
            )
            return start
        _give_back(fd, start)
        if not start < needed < size:
            return start
        try:
            os.posix_fallocate(fd, start, needed - start)
        except OSError:
            _give_back(fd, start)
            return start
        size = needed
    mirror = seglog.mirror
    if mirror is not None and mirror.wants_data():
        mirror.allocated(seglog.msgs_path(seglog.write_id), size)
    return size


def _give_back(fd: int, start: int) -> None:
    """Cut what a failed allocation got past ``start`` (no data lies there)."""
    try:
        os.ftruncate(fd, start)
    except OSError as exc:
        log.error("cannot give back a failed allocation: %s", exc.strerror or exc)
