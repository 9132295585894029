"""Reading a run of records back from a segment log at random: one open per segment.

SegmentLog.read() opens the segment file, preads the record and closes the
file again, which is right for one record but dominates when a consumer gives
a whole span back (a nack of a prefetch window, to requeue or dead-letter it):
every message is read back, and most of the time went to open() and close().
read_many() gives, for each position, exactly what read() would (the same
bytes, or None), but opens each segment file once for the positions of it
that come in a row and preads a window that covers the records close ahead,
so records side by side come from one system call. No descriptor outlives the
call: a dropped or recycled segment is never read through a stale one.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from warren.store.records import MIN_RECORD_SIZE

if TYPE_CHECKING:
    from warren.store.segment_log import SegmentLog

__all__ = ["read_many", "record_at"]

_OFFSET_MASK = 0xFFFFFFFF
# A window preads at least what read() does for one record, and reaches for
# the records ahead only as far as this: a sparse run costs no large reads.
_MIN_WINDOW = 4096
_MAX_WINDOW = 256 * 1024


def read_many(log: SegmentLog, seqs: Sequence[int]) -> list[bytes | None]:
    """log.read(seq) for every position of ``seqs``, in order."""
    out: list[bytes | None] = []
    n = len(seqs)
    i = 0
    while i < n:
        sid = seqs[i] >> 32
        j = i + 1
        while j < n and seqs[j] >> 32 == sid:
            j += 1
        _read_segment(log, sid, seqs, i, j, out)
        i = j
    return out


def _read_segment(
    log: SegmentLog, sid: int, seqs: Sequence[int], start: int, stop: int, out: list[bytes | None]
) -> None:
    """Append the records at ``seqs[start:stop]``, all of segment ``sid``."""
    log.flush_writes(sid)
    write_pos = log.write_pos if sid == log.write_id else -1
    fd = -1
    try:
        end = log.end_of(sid)
        fd = os.open(log.msgs_path(sid), os.O_RDONLY)
    except OSError:
        out.extend([None] * (stop - start))
        return
    try:
        buf = b""
        at = 0  # the file offset buf starts at
        for k in range(start, stop):
            off = seqs[k] & _OFFSET_MASK
            if (write_pos >= 0 and off >= write_pos) or off >= end:
                out.append(None)
                continue
            rel = off - at
            if rel >= 0 and rel + 4 <= len(buf):
                length = int.from_bytes(buf[rel : rel + 4], "big")
                if length < MIN_RECORD_SIZE:
                    out.append(buf[rel : rel + 4])
                    continue
                if rel + length <= len(buf):
                    out.append(buf[rel : rel + length])
                    continue
            # Not in the window: a new one from here, as far as the records
            # of this segment close ahead reach (within _MAX_WINDOW).
            reach = off + _MIN_WINDOW
            m = k + 1
            while m < stop:
                ahead = seqs[m] & _OFFSET_MASK
                if ahead < off or ahead + _MIN_WINDOW - off > _MAX_WINDOW:
                    break
                if ahead + _MIN_WINDOW > reach:
                    reach = ahead + _MIN_WINDOW
                m += 1
            try:
                buf = os.pread(fd, min(reach, end) - off, off)
            except OSError:
                buf = b""
                out.append(None)
                continue
            at = off
            out.append(record_at(fd, buf, off, end))
    finally:
        os.close(fd)


def record_at(fd: int, data: bytes, off: int, end: int) -> bytes | None:
    """The record at the start of ``data`` (preaded from ``off`` of ``fd``, a
    segment file whose data ends at ``end``): its bytes, the 4 length bytes of a
    length too small to be a record, or None (no whole record starts there)."""
    if len(data) < 4:
        return None
    length = int.from_bytes(data[:4], "big")
    if length < MIN_RECORD_SIZE:
        return data[:4]
    if length > len(data):
        if off + length > end:
            return None  # not a record: its length runs past the data
        try:
            data = os.pread(fd, length, off)
        except OSError:
            return None
    return data[:length]
