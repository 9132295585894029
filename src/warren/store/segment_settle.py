"""A classic queue store's ready messages leaving it other than through its read
cursor or an ack: one taken out wherever it is, and a purge.

A SegmentStore (store/segment_store.py) holds one SegmentRemovals, which its
remove_ready() and purge() call, made with the parts of the store it works on
and what it asks of the store itself (store/segment_parts.py); they are off the delivery path (TTL expiry out of order, overflow,
deduplication, queue.purge). A ready message removed ahead of the cursor is
remembered until the cursor steps over it (store/segment_cursor.py); a purge
drops every ready record, writing acks only where unacknowledged neighbours
keep a file alive. docs/storage.md.
"""

from __future__ import annotations

from warren.core.message import Message
from warren.store.segment_files import SegmentState
from warren.store.segment_log import OFFSET_MASK
from warren.store.segment_shared import SegmentParts

__all__ = ["SegmentRemovals"]

_OFFSET_MASK = OFFSET_MASK
# As the store's: this many pending acks force a batch.
_ACK_BATCH = 4096


class SegmentRemovals:
    """A SegmentStore's ready messages taken out wherever they are, and its purge."""

    def __init__(self, parts: SegmentParts) -> None:
        self._files = parts.files
        self._segs = parts.segs
        self._reader = parts.reader
        self._cursor = parts.reader.cursor
        self._counts = parts.ready
        self._transient = parts.transient
        self._requeued = parts.requeued
        self._owner = parts.owner

    def remove_ready(self, seq: int) -> Message | None:
        """Take a ready message out wherever it is, acking it (durable like any ack).

        A requeued message leaves the requeued set. A record at the cursor moves the
        cursor past it; one further on is remembered in its segment's ``removed`` set
        until the cursor steps over it. O(1) apart from reading the record (from the
        read map when it covers it, else one pread). None when ``seq`` is not ready.
        """
        owner = self._owner
        counts = self._counts
        if self._requeued.by_seq:
            msg = self._requeued.take(seq)
            if msg is not None:
                counts.take(1, len(msg.body))
                owner.ack(seq)
                return msg
        seg = self._segs.get(seq >> 32)
        off = seq & _OFFSET_MASK
        if seg is None or not seg.unread or off < self._files.log.data_start(seg.id):
            return None
        cursor = self._cursor
        if cursor.passed(seg, off):
            return None  # shifted (acked or not), or purged
        if cursor.is_dead(seg, off):
            return None
        peeked = self._reader.take_peeked(seq)
        if peeked is not None:
            msg = peeked[0]
            cursor.pos = off + peeked[1]
        else:
            found = cursor.read_at(seg, off)
            if found is None:
                return None
            msg, length = found
            cursor.take_out(seg, off, length)
        b = len(msg.body)
        seg.unread -= 1
        seg.unread_bytes -= b
        counts.take(1, b)
        if seg.transient_unread:
            self._transient.read(seg, seq, msg.properties, b, False)
        if seg is cursor.seg:
            self._reader.reread()
        elif not seg.unread and seg is not owner.write_segment():
            # Nothing left to read there and nothing will be appended: the cursor
            # never enters it again.
            seg.removed = None
        owner.ack(seq)
        return msg

    def purge(self) -> int:
        """Drop every ready message (requeued ones too); unacked ones stay. Returns
        how many were dropped."""
        counts = self._counts
        n = counts.count
        if not n:
            return 0
        owner = self._owner
        for seq, msg in self._requeued.clear().items():
            counts.take(1, len(msg.body))
            owner.ack(seq)
        cursor = self._cursor
        rseg = cursor.seg
        segs = self._segs
        for seg in list(segs.values()):
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
        counts.reset()
        cursor.close_map()
        cursor.skip = None
        self._reader.forget_reading()  # nothing below the mark is left to read
        for seg in list(segs.values()):
            if seg.dead >= seg.records:
                owner.drop_segment(seg)  # the write segment too: dropped unwritten
        wseg = owner.write_segment()
        files = self._files
        cursor.reset(wseg, files.log.write_pos if wseg is not None else 0)
        files.dirty = True
        if len(files.acks) >= _ACK_BATCH:
            with files.lock:
                files.write_acks_locked()
        return n

    def _ack_unread(self, seg: SegmentState) -> None:
        """Ack every unread record of the read segment (purge with unacked neighbours)."""
        base = seg.id << 32
        acks = self._files.acks
        for off in self._cursor.live_ahead(seg.unread):
            acks.append(base | off)
        seg.dead += seg.unread  # the file disagreeing with the counters included
