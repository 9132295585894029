"""Where a classic queue store (store/segment_store.py) reads next: its read side.

A SegmentStore holds one SegmentReader, the part that hands out its ready
messages in order: the messages given back first (store/requeued.py), then
the log's records from the cursor on (store/segment_cursor.py), one at a time
(shift) or a span of them framed at once (span, take_span). It keeps what
decides whether shift() may take its fast path (a record peek() decoded,
records taken out or dead ahead, records delivered before the store opened:
redelivered), and it reads without moving (peek, is_ready, scan_ready). A
record that does not check out or a segment that cannot be mapped is
SegmentFaults' (store/segment_faults.py) to deal with.
"""

from __future__ import annotations

import logging
import mmap
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from warren.core.message import Message
from warren.core.store import StoredRun, StoreSpan
from warren.store.records import CorruptRecord, decode_record
from warren.store.requeued import RequeuedMessages
from warren.store.segment_cursor import SegmentCursor, log_end
from warren.store.segment_files import SegmentState
from warren.store.segment_log import OFFSET_MASK, SegmentLog
from warren.store.segment_parts import ReadyCounts
from warren.store.segment_recovery import scan_segment
from warren.store.transient_counts import TransientCounts

if TYPE_CHECKING:
    from warren.store.segment_faults import SegmentFaults

__all__ = ["SegmentReader"]

log = logging.getLogger("warren.store")

_OFFSET_MASK = OFFSET_MASK


class SegmentReader:
    """A SegmentStore's reads in order: its cursor, a peeked record, and whether
    shift() may keep to its fast path."""

    #: The store's failure handling (set by the store once it made it).
    faults: SegmentFaults

    def __init__(
        self,
        log: SegmentLog,
        segs: dict[int, SegmentState],
        requeued: RequeuedMessages,
        counts: ReadyCounts,
        transient: TransientCounts,
        delivered_mark: int | None,
    ) -> None:
        """``delivered_mark``: the store's (SegmentStore's docstring); ``counts``
        already count what recovery found."""
        self._log = log
        self._segs = segs
        self._requeued = requeued
        self._ready = counts
        self._transient = transient
        #: Where the store reads next (segment, position, map).
        self.cursor = self._cursor = SegmentCursor(log)
        # A record peek() decoded at the cursor, for the next shift(): (seq, message,
        # record length).
        self._peeked: tuple[int, Message, int] | None = None
        # shift() must leave its fast path: a skip list, removed records or a peeked
        # record in the cursor's segment (kept by set_detour()), or records
        # delivered before the store opened ahead (_shift_redelivering).
        self.detour = False
        # Records below this seq were delivered before the store opened: shift()
        # and peek() say redelivered for them (those appended from now on sit above).
        # While the cursor may meet such records, shift() leaves its fast path
        # (_shift_redelivering), which then needs no check of its own.
        end = log_end(log, segs)
        self._redelivered_below = end if delivered_mark is None else min(delivered_mark, end)
        self._redelivering = counts.count > 0 and self._redelivered_below > 0
        self.set_detour()

    def behind_write(self, seg: SegmentState) -> None:
        """Records just appended to ``seg`` (the write segment) were handed out at
        once: the cursor moves to their end, so they are never read back."""
        cursor = self._cursor
        if cursor.seg is not seg:
            self.enter(seg)
        cursor.pos = self._log.write_pos

    def left(self, seg: SegmentState) -> None:
        """``seg`` is being dropped: the cursor leaves it if it is there."""
        if seg is self._cursor.seg:
            self._cursor.leave()
            self._peeked = None
            self.set_detour()

    def clear(self) -> None:
        """The store is deleted: nothing to read."""
        self._cursor.leave()
        self._peeked = None
        self._redelivering = self.detour = False

    def shift(self) -> tuple[int, Message, bool] | None:
        requeued = self._requeued
        if requeued.by_seq:
            seq, msg = requeued.pop()
            ready = self._ready
            ready.count -= 1
            ready.bytes -= len(msg.body)
            return seq, msg, True
        cursor = self._cursor
        while self._ready.count:
            m = cursor.map
            pos = cursor.pos
            if m is None or pos >= cursor.end or self.detour:
                if self._peeked is not None:
                    return self._take_peeked()
                if self._redelivering:
                    return self._shift_redelivering()
                m, pos = self._locate()
                if m is None:
                    continue  # the segment turned out unreadable; counts were adjusted
            seg = cursor.seg
            assert seg is not None
            try:
                msg, length = decode_record(m, pos, cursor.end, True, cursor.seed)
            except CorruptRecord:
                self.faults.damaged(seg, pos)
                continue
            cursor.pos = pos + length
            b = len(msg.body)
            seg.unread -= 1
            seg.unread_bytes -= b
            ready = self._ready
            ready.count -= 1
            ready.bytes -= b
            seq = (seg.id << 32) | pos
            if seg.transient_unread:
                self._transient.read(seg, seq, msg.properties, b, True)
            if not seg.unread:
                cursor.close_map()  # fully read for now: hold no map while idle
            return seq, msg, False
        return None

    def span(self) -> StoreSpan | None:
        """The ready records from the cursor on, in its segment's map, up to the
        next dead record the cursor would step over (recovery's skip list) and,
        while records delivered before the store opened lie ahead, up to the
        delivered mark (those are redelivered, the rest not). None while
        messages given back wait (they go first), a peeked record sits at the
        cursor or records taken out ahead are in the way: shift() then."""
        if self._requeued.by_seq or self._peeked is not None or not self._ready.count:
            return None
        cursor = self._cursor
        m = cursor.map
        if m is None or cursor.pos >= cursor.end or self.detour:
            m, _pos = self._locate()
            if m is None:
                return None
        seg = cursor.seg
        assert seg is not None
        if seg.removed is not None:
            return None
        pos = cursor.pos
        limit = cursor.end
        skip = cursor.skip
        if skip is not None and cursor.skip_i < len(skip):
            limit = min(limit, skip[cursor.skip_i])
        redelivered = False
        if self._redelivering:
            mark = self._redelivered_below
            if (seg.id << 32) | pos < mark:
                redelivered = True
                if mark >> 32 == seg.id:
                    limit = min(limit, mark & _OFFSET_MASK)
            else:
                self._redelivering = False  # past the mark: nothing below it is left
                self.set_detour()
        return StoreSpan(m, pos, limit, cursor.seed, seg.id, seg.unread, redelivered)

    def take_span(self, span: StoreSpan, taken: StoredRun, acked: bool) -> None:
        cursor = self._cursor
        seg = cursor.seg
        n = len(taken)
        if seg is None or span.segment != seg.id or span.pos != cursor.pos or n > seg.unread:
            raise ValueError(f"{self._log.directory}: a span taken after the store changed")
        body_bytes = sum(taken.sizes)
        cursor.pos = span.end
        seg.unread -= n
        seg.unread_bytes -= body_bytes
        ready = self._ready
        ready.count -= n
        ready.bytes -= body_bytes
        if seg.transient_unread:
            self._transient.span_taken(seg, span.buf, taken, body_bytes, acked)
        if not seg.unread:
            cursor.close_map()  # fully read for now: hold no map while idle

    def _shift_redelivering(self) -> tuple[int, Message, bool] | None:
        """shift() of the next record while records below the delivered mark may be
        ahead: redelivered for those; once the cursor is past the mark, shift()
        keeps to its fast path again."""
        self._redelivering = False
        self.set_detour()
        item = self.shift()
        if item is not None and item[0] < self._redelivered_below:
            self._redelivering = True
            self.set_detour()
            return item[0], item[1], True
        return item

    def peek(self) -> tuple[int, Message, bool] | None:
        """The message shift() returns next, left in place. A record read from the
        file is kept for that shift(), which then does not decode it again."""
        requeued = self._requeued
        if requeued.by_seq:
            seq, msg = requeued.first()
            return seq, msg, True
        peeked = self._peeked
        if peeked is not None:
            return peeked[0], peeked[1], peeked[0] < self._redelivered_below
        while self._ready.count:
            m, pos = self._locate()
            if m is None:
                continue
            seg = self._cursor.seg
            assert seg is not None
            try:
                msg, length = decode_record(m, pos, self._cursor.end, True, self._cursor.seed)
            except CorruptRecord:
                self.faults.damaged(seg, pos)
                continue
            seq = (seg.id << 32) | pos
            self._peeked = (seq, msg, length)
            self.detour = True
            return seq, msg, seq < self._redelivered_below
        return None

    def _take_peeked(self) -> tuple[int, Message, bool]:
        """shift() of the record peek() decoded: it sits at the cursor."""
        peeked = self._peeked
        cursor = self._cursor
        seg = cursor.seg
        assert peeked is not None and seg is not None
        seq, msg, length = peeked
        self._peeked = None
        cursor.pos = (seq & _OFFSET_MASK) + length
        b = len(msg.body)
        seg.unread -= 1
        seg.unread_bytes -= b
        ready = self._ready
        ready.count -= 1
        ready.bytes -= b
        if seg.transient_unread:
            self._transient.read(seg, seq, msg.properties, b, True)
        self.set_detour()
        if not seg.unread:
            cursor.close_map()
        return seq, msg, seq < self._redelivered_below

    def is_ready(self, seq: int) -> bool:
        """Whether ``seq``, a number kept from before (a quorum queue's delivery
        counts, store/delivery_counts.py), names a ready message of this store: a
        requeued one, or a live record ahead of the cursor that checks out
        (structure and CRC with its segment's salt), so that a number from an
        earlier life of a segment id never matches. Reads one record; changes
        nothing."""
        if seq in self._requeued.by_seq:
            return True
        seg = self._segs.get(seq >> 32)
        off = seq & _OFFSET_MASK
        if seg is None or not seg.unread or off < self._log.data_start(seg.id):
            return False
        cursor = self._cursor
        if cursor.passed(seg, off) or cursor.is_dead(seg, off):
            return False
        return cursor.read_at(seg, off) is not None

    def scan_ready(self, exchange: str | None = None) -> Iterator[tuple[int, int, bytes]]:
        """(seq, timestamp, raw properties) of each ready message, in shift order
        (only those published to ``exchange`` when it is given).

        Requeued messages first, then the records from the cursor on, read through
        maps of its own (the read cursor and its map are not touched) and without
        building Message objects or checking CRCs (recovery did). Do not change the
        store while iterating.
        """
        for seq, msg in self._requeued.in_order():
            if exchange is None or msg.exchange == exchange:
                yield seq, msg.timestamp, msg.properties
        cursor = self._cursor
        name = None if exchange is None else exchange.encode("utf-8", "surrogateescape")
        for seg in list(self._segs.values()):
            start = cursor.ready_from(seg)
            if seg.unread and start <= OFFSET_MASK:  # not behind the cursor
                first = max(start, self._log.data_start(seg.id))
                yield from scan_segment(self._log, seg, first, name)

    def delivered_marks(self) -> dict[Path, int]:
        """{directory: mark}: every record below the mark that is still here was
        delivered, in this run (below the read cursor: records go out in log
        order, and requeued ones sit there too) or before (below the mark the
        store opened with). Nothing for a store without records."""
        if not self._segs:
            return {}
        peeked = self._peeked  # a peeked record is where the cursor stands
        cursor_seq = peeked[0] if peeked is not None else self._cursor.next_seq(self._segs)
        return {self._log.directory: max(cursor_seq, self._redelivered_below)}

    def reread(self) -> None:
        """The cursor moved or its segment changed under it: a peeked record is
        decoded again, and shift() checks whether it may keep to its fast path."""
        self._peeked = None
        self.set_detour()

    def take_peeked(self, seq: int) -> tuple[Message, int] | None:
        """The message and record length of ``seq`` when peek() decoded it, no
        longer peeked (the caller moves the cursor past it); else None."""
        peeked = self._peeked
        if peeked is None or peeked[0] != seq:
            return None
        self._peeked = None
        return peeked[1], peeked[2]

    def forget_reading(self) -> None:
        """Nothing is left to read (a purge): no record peeked, none below the
        delivered mark ahead."""
        self._peeked = None
        self._redelivering = False
        self.set_detour()

    def enter(self, seg: SegmentState) -> None:
        self._cursor.enter(seg)
        self.set_detour()

    def set_detour(self) -> None:
        cursor = self._cursor
        seg = cursor.seg
        self.detour = (
            self._peeked is not None
            or cursor.skip is not None
            or (seg is not None and seg.removed is not None)
            or self._redelivering
        )

    def _locate(self) -> tuple[mmap.mmap | None, int]:
        """Map the next unread record, moving through segments and past dead records.

        Only called while some record on disk is unread. Returns (None, 0) after
        giving up on an unreadable segment (the ready counters are adjusted then).
        """
        if self._log.closed:
            raise ValueError(f"store {self._log.directory} is closed")
        cursor = self._cursor
        while True:
            seg = cursor.seg
            if seg is None or not seg.unread or seg.id not in self._segs:
                nxt = None
                for s in self._segs.values():
                    if s.unread and (seg is None or s.id > seg.id):
                        nxt = s
                        break
                if nxt is None:
                    # Counters claim unread records that no segment has: repair them.
                    log.error(
                        "%s: ready count %d but nothing to read", self._log.directory, self._ready.count
                    )
                    self._ready.count = len(self._requeued.by_seq)
                    self._ready.bytes = self._requeued.body_bytes()
                    for s in self._segs.values():  # nothing unread: none transient
                        self._transient.unread_gone(s)
                    return None, 0
                self.enter(nxt)
                seg = nxt
            m = cursor.map
            if m is None or cursor.pos >= cursor.end:
                try:
                    cursor.map_segment(seg)
                except OSError as exc:
                    if seg is cursor.seg and seg.unread:  # not a failed write-out's drop
                        self.faults.abandon(seg, f"cannot map: {exc}")
                    return None, 0
                m = cursor.map
                if m is None or cursor.pos >= cursor.end:
                    if seg is cursor.seg and seg.unread:
                        self.faults.abandon(seg, "file shorter than its records")
                    return None, 0
            if cursor.skip is None and seg.removed is None:
                self.detour = self._redelivering  # callers hold no peeked record
                return m, cursor.pos
            if not cursor.step_over_dead():
                self.faults.damaged(seg, cursor.pos)
                continue
            self.set_detour()
            if cursor.pos < cursor.end:
                return m, cursor.pos
