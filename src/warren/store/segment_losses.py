"""What a segment log's failed write-outs dropped (a full disk), and telling its owner.

A write-out that fails is undone in the file (undo_write: the data ends where
it ended before, its end mark written back) and, on the owner's thread, the
log closes the write segment and drops the records it held
(SegmentLog._drop_unwritten). WriteLosses keeps what those drops mean to the
rest of the broker: the write generations whose records were lost (the group
commit asks before a confirm: store/disk_budget.py, ``lost_between``), and the
dropped records not yet reported to the owner's ``on_lost``, which is called
outside the log's lock, followed by a log line and the disk alarm.
docs/storage.md, "A full disk".
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from warren.store.segment_format import MARK_SIZE, mark

if TYPE_CHECKING:
    from warren.store.segment_log import SegmentLog

__all__ = ["WriteLosses", "undo_write"]

log = logging.getLogger("warren.store")

# Lost generation spans kept before they are merged into one wider span.
_MAX_SPANS = 64


def undo_write(fd: int, at: int, v2: bool, seed: int, directory: Path) -> None:
    """A write at ``at`` failed part way: the data ends at ``at`` again (its
    end mark written back, nothing of the failed write left after it)."""
    try:
        if v2:
            os.pwrite(fd, mark(at, seed), at)
            os.ftruncate(fd, at + MARK_SIZE)
        else:
            os.ftruncate(fd, at)
    except OSError:
        try:
            os.ftruncate(fd, at)
        except OSError as cut:
            log.error("%s: cannot cut a failed write back: %s", directory, cut)


class WriteLosses:
    """One segment log's dropped write generations and unreported drops."""

    def __init__(self) -> None:
        # The (first, last) write generations whose records were dropped.
        self.spans: list[tuple[int, int]] = []
        #: Drops not yet reported: (segment id, position, records, error).
        self.pending: list[tuple[int, int, bytes, OSError]] = []
        #: The owner's thread: only there are drops made and reported.
        self.owner = threading.get_ident()

    def dropped(
        self, first: int, last: int, segment_id: int, pos: int, data: bytes, exc: OSError
    ) -> None:
        """Records appended in generations ``first`` to ``last`` (``data``, from
        ``pos`` in ``segment_id``) never reached the file."""
        spans = self.spans
        spans.append((first, last))
        if len(spans) > _MAX_SPANS:  # a disk full again and again: one wider span (more nacks)
            spans[:] = [(spans[0][0], spans[-1][1])]
        self.pending.append((segment_id, pos, data, exc))

    def between(self, first: int, last: int) -> bool:
        """Whether records appended in a write generation from ``first`` to
        ``last`` were dropped."""
        return any(lo <= last and hi >= first for lo, hi in self.spans)

    def report(self, seglog: SegmentLog) -> None:
        """Tell the log's owner (outside the lock) what was dropped, log it, and
        have the disk alarm raised (store/disk_budget.py). Only on the owner's
        thread: a worker's sync leaves it to the owner's next call."""
        pending = self.pending
        if not pending or threading.get_ident() != self.owner:
            return
        while pending:
            sid, pos, data, exc = pending.pop(0)
            on_lost = seglog.on_lost
            counted = on_lost(sid, pos, data) if on_lost is not None else 0
            log.error(
                "%s: %s: cannot write %d bytes (%s): %d messages dropped, never "
                "confirmed (publishers still waiting for them get nacks)",
                seglog.directory,
                seglog.msgs_path(sid).name,
                len(data),
                exc.strerror or exc,
                counted,
            )
            seglog.budget.write_failed(exc)
