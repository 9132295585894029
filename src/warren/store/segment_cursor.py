"""A classic queue's read cursor: where its store reads next in the segment log.

SegmentStore (store/segment_store.py) reads its ready records in log order
through one cursor: a segment, the position of the next record in its file,
and a read-only map of that file while something is left to read there (no
map is held while the queue is idle). Dead records still ahead of the cursor
are stepped over, never read: after a restart the skip list recovery found
(acknowledged, purged or transient records, and damaged byte ranges kept
aside, which end where ``gaps`` says rather than where a length field would),
and the records remove_ready() took out of the middle (``removed``).

The cursor knows files and positions; the store keeps the counters (what is
ready) and decides what damage costs (store/segment_recovery.py steps over it).
"""

from __future__ import annotations

import bisect
import contextlib
import mmap
from array import array

from warren.core.message import Message
from warren.store.records import MIN_RECORD_SIZE, CorruptRecord, decode_record
from warren.store.segment_damage import structure_length
from warren.store.segment_files import NO_SKIP, SegmentState
from warren.store.segment_log import OFFSET_MASK, SegmentLog

__all__ = ["SegmentCursor", "log_end"]


def log_end(seglog: SegmentLog, segs: dict[int, SegmentState]) -> int:
    """The seq the next append to ``seglog`` gets at the earliest: above every
    record of ``segs``, its segments."""
    if seglog.write_id:
        return (seglog.write_id << 32) | seglog.write_pos
    highest = max(segs, default=0)
    return (highest + 1) << 32


class SegmentCursor:
    """The read position of one SegmentStore in its log."""

    def __init__(self, seglog: SegmentLog) -> None:
        self.log = seglog
        #: The segment read (None: none yet), the position of its next record,
        #: the map of its file up to its end of data and that end (0 while none
        #: is open), and the CRC seed of its records.
        self.seg: SegmentState | None = None
        self.pos = 0
        self.map: mmap.mmap | None = None
        self.end = 0
        self.seed = 0
        #: The segment's skip list while dead recovered records lie ahead, and
        #: the index in it of the first one not behind the cursor.
        self.skip: array[int] | None = None
        self.skip_i = 0

    def close_map(self) -> None:
        m, self.map = self.map, None
        self.end = 0
        if m is not None:
            m.close()  # no views into it survive a read: see records.decode_record

    def map_segment(self, seg: SegmentState) -> None:
        """Map ``seg`` in full (after pushing buffered appends to the file).
        Raises OSError when its file cannot be opened or mapped."""
        self.close_map()
        m = self.log.map(seg.id)
        self.seed = self.log.file(seg.id).seed
        if m is not None:
            self.map = m
            self.end = len(m)

    def enter(self, seg: SegmentState) -> None:
        """Start reading ``seg`` from its first record; the segment left behind
        forgets its dead records (the cursor never goes back)."""
        self.close_map()
        old = self.seg
        if old is not None:
            old.skip = None
            old.gaps = None
            old.removed = None
        self.seg = seg
        self.pos = self.log.data_start(seg.id)
        self.skip = seg.skip
        self.skip_i = 0

    def leave(self) -> None:
        """The segment read is gone (dropped): no segment, no map."""
        self.close_map()
        self.seg = None
        self.skip = None

    def reset(self, seg: SegmentState | None, pos: int) -> None:
        """Stand at ``pos`` of ``seg`` (purge: nothing is left to read before the
        end of the log), no map and no skip list."""
        self.close_map()
        self.seg = seg
        self.pos = pos
        self.skip = None

    def next_seq(self, segs: dict[int, SegmentState]) -> int:
        """The seq of the next record the cursor reads (a record is a seq: its
        segment id << 32 | its offset), or the log's end when nothing is left."""
        seg = self.seg
        if seg is not None and seg.unread and seg.id in segs:
            return (seg.id << 32) | self.pos
        after = seg.id if seg is not None else 0
        for s in segs.values():  # by ascending id
            if s.unread and s.id > after:
                return s.id << 32
        return log_end(self.log, segs)

    def ready_from(self, seg: SegmentState) -> int:
        """Where the records of ``seg`` not yet read start: the cursor's position
        in its own segment, the first record of one it has not reached, past the
        end of one it is past."""
        cseg = self.seg
        if seg is cseg:
            return self.pos
        if cseg is None or cseg.id < seg.id:
            return self.log.data_start(seg.id)
        return OFFSET_MASK + 1

    def restart_at(self, pos: int) -> None:
        """Read on from ``pos`` of the segment, whose skip list changed (damage
        found there was added to it)."""
        seg = self.seg
        assert seg is not None
        self.pos = pos
        self.skip = seg.skip
        self.skip_i = 0

    def step_over_dead(self) -> bool:
        """Step over the dead records at the cursor, in the mapped segment: True
        when it then stands at a live record or at the map's end, False at a
        dead record that no longer checks out (damaged since; the cursor stays
        there). Dead records no longer ahead are forgotten."""
        seg = self.seg
        m = self.map
        assert seg is not None and m is not None
        removed = seg.removed
        skip = self.skip if self.skip is not None else NO_SKIP
        gaps = seg.gaps
        pos = self.pos
        end = self.end
        i = self.skip_i
        n = len(skip)
        step = 1
        while pos < end:
            while i < n and skip[i] < pos:
                i += 1
            if i < n and skip[i] == pos:
                step = gaps[pos] - pos if gaps is not None and pos in gaps else 0
                if not step:
                    step = structure_length(m, pos, end)
            elif removed is not None and pos in removed:
                removed.discard(pos)
                step = structure_length(m, pos, end)
            else:
                break
            if not step:  # a dead record damaged since: step over it as over any
                break
            pos += step
        self.pos = pos
        if pos < end and not step:
            return False
        self.skip_i = i
        if i >= n:
            self.skip = seg.skip = None
        if removed is not None and (not removed or pos > seg.removed_max):
            seg.removed = None  # every removed record is behind the cursor now
        return True

    def live_ahead(self, count: int) -> list[int]:
        """Offsets of the first ``count`` live records from the cursor on, in its
        segment (mapped for this, unmapped after); fewer when the file disagrees
        with the count. Raises OSError when the file cannot be mapped."""
        seg = self.seg
        assert seg is not None
        self.map_segment(seg)
        m = self.map
        found: list[int] = []
        if m is None:
            return found
        pos = self.pos
        skip = self.skip
        gaps = seg.gaps
        removed = seg.removed
        i = self.skip_i
        while len(found) < count and pos < self.end:
            if gaps is not None and pos in gaps:
                pos = gaps[pos]  # damaged bytes, kept aside: no record there
                continue
            length = int.from_bytes(m[pos : pos + 4], "big")
            if length < MIN_RECORD_SIZE:
                break  # cannot happen for validated data; stop rather than spin
            while skip is not None and i < len(skip) and skip[i] < pos:
                i += 1
            if (skip is None or i >= len(skip) or skip[i] != pos) and (
                removed is None or pos not in removed
            ):
                found.append(pos)
            pos += length
        self.close_map()
        return found

    # -- records out of order (remove_ready) ----------------------------------------------
    def passed(self, seg: SegmentState, off: int) -> bool:
        """Whether the record at ``off`` of ``seg`` is behind the cursor."""
        cseg = self.seg
        return cseg is not None and (seg.id < cseg.id or (seg is cseg and off < self.pos))

    @staticmethod
    def is_dead(seg: SegmentState, off: int) -> bool:
        """Whether the record at ``off`` of ``seg``, ahead of the cursor, is dead:
        taken out already, or dead since before the last restart."""
        removed = seg.removed
        if removed is not None and off in removed:
            return True
        skip = seg.skip
        if skip is not None:
            i = bisect.bisect_left(skip, off)
            if i < len(skip) and skip[i] == off:
                return True
        return False

    def read_at(self, seg: SegmentState, off: int) -> tuple[Message, int] | None:
        """Decode the record at ``off`` of ``seg``, CRC included (through the
        cursor's map when it covers it); None if there is none."""
        m = self.map
        if seg is self.seg and m is not None and off < self.end:
            with contextlib.suppress(CorruptRecord):
                return decode_record(m, off, self.end, True, self.seed)
        data = self.log.read((seg.id << 32) | off)
        if data is None:
            return None
        try:
            return decode_record(data, 0, len(data), True, self.log.file(seg.id).seed)
        except CorruptRecord:
            return None

    def take_out(self, seg: SegmentState, off: int, length: int) -> None:
        """The record at ``off`` of ``seg`` (``length`` bytes), ahead of the
        cursor, is dead now: the cursor moves past it when it stands there, else
        steps over it when it gets there."""
        if seg is self.seg and off == self.pos:
            self.pos = off + length
            return
        removed = seg.removed
        if removed is None:
            removed = seg.removed = set()
            seg.removed_max = 0
        removed.add(off)
        if off > seg.removed_max:
            seg.removed_max = off
