"""What becomes of a classic queue store's counters and read cursor when its
files fail it.

A SegmentStore (store/segment_store.py) holds one SegmentFaults, the part of
it that handles failure, off the hot path: records a failed write-out
dropped (a full disk), a record damaged on disk met by the read path (kept
aside and stepped over, store/segment_recovery.py), and a segment whose file
cannot be read any more. The ready counts and the transient counts
(store/transient_counts.py) follow each of them, and it remembers where
failed write-outs cut segments off, so that a message from there on that a
consumer gives back is dropped, not requeued. docs/storage.md has the rules.
"""

from __future__ import annotations

import logging

from warren.store.records import decode_records
from warren.store.segment_files import SegmentState
from warren.store.segment_recovery import step_over_damage
from warren.store.segment_shared import SegmentParts
from warren.store.transient_counts import lost_records

__all__ = ["SegmentFaults"]

log = logging.getLogger("warren.store")

_OFFSET_MASK = 0xFFFFFFFF


class SegmentFaults:
    """A SegmentStore's failure handling: made by the store, for it alone, with
    the parts of the store it changes (its ready counts, segment table, cursor
    and transient counts) as the store itself would; what only the store does
    it asks of it (``owner``: store/segment_parts.py's SegmentOwner). The store
    calls it where a read or a write-out fails, the log (``on_lost``) where a
    write-out dropped records."""

    def __init__(self, parts: SegmentParts) -> None:
        self._files = parts.files
        self._segs = parts.segs
        self._reader = parts.reader
        self._cursor = parts.reader.cursor
        self._counts = parts.ready
        self._transient = parts.transient
        self._count_transient = parts.count_transient
        self._owner = parts.owner
        #: Where failed write-outs cut segments off (segment id -> first lost offset).
        self.lost_from: dict[int, int] = {}

    def cut_off(self, seq: int) -> bool:
        """Whether ``seq`` is a record a failed write-out dropped: it never
        reached the file (its publisher got a nack), so it cannot come back."""
        start = self.lost_from.get(seq >> 32)
        return start is not None and seq & _OFFSET_MASK >= start

    def records_lost(self, segment_id: int, start: int, data: bytes) -> int:
        """The log's on_lost: a write-out failed (a full disk), so the records from
        ``start`` on in ``segment_id`` (``data``) never reached the file, and the
        log closed that segment. Those still ready are no longer counted (their
        publishers get nacks); those a consumer already has (append_shifted,
        append_run) stay counted until acked (a requeue drops them); the store's
        ``on_dropped`` is told. Returns how many records there were."""
        owner = self._owner
        if owner.on_dropped is not None and data:
            owner.on_dropped(decode_records(data))
        seg = self._segs.get(segment_id)
        if seg is None:
            return 0
        found = lost_records(
            data, start, self._cursor.ready_from(seg), seg.removed, self._count_transient
        )
        records, ready, ready_bytes = found.records, found.ready, found.ready_bytes
        if ready > seg.unread:  # a purged or abandoned segment: nothing ready to take out
            ready, ready_bytes = seg.unread, seg.unread_bytes
        if seg.transient_unread:  # a consumer's (held) stay counted until acked
            self._transient.unread_found(
                seg,
                max(0, seg.transient_unread - found.transient),
                max(0, seg.transient_unread_bytes - found.transient_bytes),
            )
        self.lost_from[segment_id] = start
        seg.records -= ready
        seg.unread -= ready
        seg.unread_bytes -= ready_bytes
        self._counts.take(ready, ready_bytes)
        if seg is owner.write_segment():
            owner.forget_write_segment()
        if ready and owner.on_ready_lost is not None:
            owner.on_ready_lost(ready, ready_bytes)
        if seg.dead >= seg.records:
            owner.drop_segment(seg)
        return records

    def abandon(self, seg: SegmentState, reason: str) -> None:
        """Give up on the unread rest of a segment that cannot be read (never expected:
        recovery validated it). Its ready messages are lost; the store keeps working."""
        owner = self._owner
        log.error(
            "%s: %s unreadable (%s): dropping its %d unread messages",
            self._files.directory,
            self._files.log.msgs_path(seg.id).name,
            reason,
            seg.unread,
        )
        self._counts.take(seg.unread, seg.unread_bytes)
        seg.dead += seg.unread
        seg.unread = 0
        seg.unread_bytes = 0
        seg.removed = None
        if seg.transient_unread:
            self._transient.unread_gone(seg)
        if seg is self._cursor.seg:
            self._reader.reread()
        self._cursor.close_map()
        if seg is owner.write_segment():
            owner.retire_write_segment()  # do not append after damage
        if seg.dead >= seg.records:
            owner.drop_segment(seg)

    def damaged(self, seg: SegmentState, pos: int) -> None:
        """The record at ``pos``, where the cursor stands, does not check out: it
        was damaged on disk after it was written or recovered. Its bytes are kept
        aside and never served, the cursor steps over them to the next record
        that checks out, and what is left to read is counted again."""
        owner = self._owner
        self._reader.reread()
        cursor = self._cursor
        try:
            cursor.map_segment(seg)  # the whole file, appends flushed
        except OSError as exc:
            self.abandon(seg, f"cannot map: {exc}")
            return
        m = cursor.map
        if m is None or pos >= cursor.end:
            self.abandon(seg, "file shorter than its records")
            return
        (lost, lost_bytes), left = step_over_damage(
            self._files.log, seg, m, pos, cursor.end, cursor.skip
        )
        self._counts.take(lost, lost_bytes)
        if self._count_transient:
            self._transient.unread_found(seg, left[0], left[1])
        if seg.gaps is None or pos not in seg.gaps:  # never expected: do not loop on it
            self.abandon(seg, f"record at offset {pos} does not read back")
            return
        cursor.restart_at(pos)
        self._reader.reread()
        if not seg.unread:
            cursor.close_map()
            if seg.dead >= seg.records and seg is not owner.write_segment():
                owner.drop_segment(seg)
