"""A classic queue store's messages leaving it other than through its read
cursor, or coming back: acks, requeues, a ready message taken out wherever it
is, a purge.

SegmentStore (store/segment_store.py) appends and reads; this, its base
class, settles. An ack is queued for the segment's ack file (written in
batches by SegmentFiles, store/segment_files.py) and counted in its segment,
which is dropped once every record in it is dead; a requeued message waits in
memory (store/requeued.py) unless a failed write-out dropped it; a ready
message removed ahead of the cursor is remembered until the cursor steps over
it (store/segment_cursor.py); a purge drops every ready record, writing acks
only where unacknowledged neighbours keep a file alive. docs/storage.md.
"""

from __future__ import annotations

from array import array

from warren.core.message import Message
from warren.store.segment_faults import SegmentFaults
from warren.store.segment_files import SegmentState
from warren.store.segment_log import OFFSET_MASK

__all__ = ["SegmentSettle"]

_OFFSET_MASK = OFFSET_MASK
# Acks are queued in memory and written to their ack files in batches; this many
# pending acks force a batch without waiting for flush()/sync().
_ACK_BATCH = 4096


class SegmentSettle(SegmentFaults):
    """SegmentStore's acks, requeues, removals and purge (its base class)."""

    def ack(self, seq: int) -> None:
        seg = self._segs.get(seq >> 32)
        if seg is None:
            return
        t = self._transient
        if t.held:
            t.dead(seq)
        self._acks.append(seq)
        self._dirty = True
        seg.dead += 1
        if seg.dead >= seg.records and seg is not self._wseg:
            self._drop_segment(seg)
        elif len(self._acks) >= _ACK_BATCH:
            with self._lock:
                self._write_acks_locked()

    def ack_run(self, segment: int, offsets: array[int]) -> None:
        seg = self._segs.get(segment)
        if seg is None or not offsets:
            return
        t = self._transient
        if t.held:
            t.dead_run(segment << 32, offsets)
        self._acks.append((segment, offsets))
        self._dirty = True
        seg.dead += len(offsets)
        if seg.dead >= seg.records and seg is not self._wseg:
            self._drop_segment(seg)
        elif len(self._acks) >= _ACK_BATCH:
            with self._lock:
                self._write_acks_locked()

    def requeue(self, seq: int, msg: Message) -> None:
        lost = self._lost_from
        if lost:
            start = lost.get(seq >> 32)
            if start is not None and seq & _OFFSET_MASK >= start:
                self.ack(seq)  # never stored (its publisher got a nack): gone
                return
        self._requeued.add(seq, msg)
        self._ready_count += 1
        self._ready_bytes += len(msg.body)

    def remove_ready(self, seq: int) -> Message | None:
        """Take a ready message out wherever it is, acking it (durable like any ack).

        A requeued message leaves the requeued set. A record at the cursor moves the
        cursor past it; one further on is remembered in its segment's ``removed`` set
        until the cursor steps over it. O(1) apart from reading the record (from the
        read map when it covers it, else one pread). None when ``seq`` is not ready.
        """
        if self._requeued.by_seq:
            msg = self._requeued.take(seq)
            if msg is not None:
                self._ready_count -= 1
                self._ready_bytes -= len(msg.body)
                self.ack(seq)
                return msg
        seg = self._segs.get(seq >> 32)
        off = seq & _OFFSET_MASK
        if seg is None or not seg.unread or off < self._log.data_start(seg.id):
            return None
        cursor = self._cursor
        if cursor.passed(seg, off):
            return None  # shifted (acked or not), or purged
        if cursor.is_dead(seg, off):
            return None
        peeked = self._peeked
        if peeked is not None and peeked[0] == seq:
            self._peeked = None
            msg = peeked[1]
            cursor.pos = off + peeked[2]
        else:
            found = cursor.read_at(seg, off)
            if found is None:
                return None
            msg, length = found
            cursor.take_out(seg, off, length)
        b = len(msg.body)
        seg.unread -= 1
        seg.unread_bytes -= b
        self._ready_count -= 1
        self._ready_bytes -= b
        if seg.transient_unread:
            self._transient.read(seg, seq, msg.properties, b, False)
        if seg is cursor.seg:
            self._set_detour()
        elif not seg.unread and seg is not self._wseg:
            # Nothing left to read there and nothing will be appended: the cursor
            # never enters it again.
            seg.removed = None
        self.ack(seq)
        return msg

    def purge(self) -> int:
        n = self._ready_count
        if not n:
            return 0
        for seq, msg in self._requeued.clear().items():
            self._ready_count -= 1
            self._ready_bytes -= len(msg.body)
            self.ack(seq)
        self._peeked = None
        cursor = self._cursor
        rseg = cursor.seg
        for seg in list(self._segs.values()):
            if seg.unread:
                if seg is rseg and seg.records - seg.dead - seg.unread > 0:
                    # Unacked messages keep this file alive: the purged records need
                    # ack entries so that they stay gone after a restart.
                    self._ack_unread(seg)
                else:
                    seg.dead += seg.unread
                seg.unread = 0
                seg.unread_bytes = 0
                if seg.transient_unread:
                    self._transient.unread_gone(seg)
            seg.skip = None
            seg.removed = None
        self._ready_count = 0
        self._ready_bytes = 0
        cursor.close_map()
        cursor.skip = None
        self._redelivering = False  # nothing below the mark is left to read
        self._detour = False
        for seg in list(self._segs.values()):
            if seg.dead >= seg.records:
                self._drop_segment(seg)  # the write segment too: dropped unwritten
        cursor.reset(self._wseg, self._log.write_pos if self._wseg is not None else 0)
        self._dirty = True
        if len(self._acks) >= _ACK_BATCH:
            with self._lock:
                self._write_acks_locked()
        return n

    def _ack_unread(self, seg: SegmentState) -> None:
        """Ack every unread record of the read segment (purge with unacked neighbours)."""
        base = seg.id << 32
        acks = self._acks
        for off in self._cursor.live_ahead(seg.unread):
            acks.append(base | off)
        seg.dead += seg.unread  # the file disagreeing with the counters included
