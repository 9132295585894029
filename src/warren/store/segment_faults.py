"""A classic queue store's counters and read cursor, and what becomes of them when
its files fail it.

SegmentStore (store/segment_store.py) reads and writes, SegmentSettle
(store/segment_settle.py) acks, requeues and removes; this, their base class,
holds what its counters and cursor are and the paths off its hot path that
change them: records a failed write-out dropped (a full disk), a record
damaged on disk met by the read path (kept aside and stepped over, store/
segment_recovery.py), a segment whose file cannot be read any more, and a
segment dropped once every record in it is dead. The ready counts and the
transient counts (store/transient_counts.py) follow each of them.
docs/storage.md has the rules.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from warren.core.message import Message
from warren.store.disk_budget import DiskBudget
from warren.store.mirror import FileMirror
from warren.store.records import decode_records
from warren.store.requeued import RequeuedMessages
from warren.store.segment_cursor import SegmentCursor
from warren.store.segment_files import SegmentFiles, SegmentState
from warren.store.segment_recovery import step_over_damage
from warren.store.transient_counts import TransientCounts, lost_records

__all__ = ["SegmentFaults"]

log = logging.getLogger("warren.store")


class SegmentFaults(SegmentFiles):
    """SegmentStore's state: segment counters, read cursor, ready and transient
    totals; and what failed writes, damage and unreadable files do to them."""

    def __init__(
        self,
        directory: Path,
        segment_size: int,
        preallocate: bool,
        format_version: int,
        count_transient: bool,
        budget: DiskBudget,
        mirror: FileMirror | None,
    ) -> None:
        super().__init__(directory, segment_size, preallocate, format_version, budget, mirror)
        # The segment the log appends to (its counters), None until the first append.
        self._wseg: SegmentState | None = None
        # Reading: a cursor into the oldest segment with unread records.
        self._cursor = SegmentCursor(self._log)
        # A record peek() decoded at the cursor, for the next shift(): (seq, message,
        # record length).
        self._peeked: tuple[int, Message, int] | None = None
        # shift() must leave its fast path: a skip list, removed records or a peeked
        # record in the cursor's segment (kept by _set_detour()), or records
        # delivered before the store opened ahead (SegmentStore._shift_redelivering).
        self._detour = False
        self._redelivering = False
        # Messages given back by consumers, ready again ahead of the log's.
        self._requeued = RequeuedMessages()
        self._ready_count = 0
        self._ready_bytes = 0
        # Where failed write-outs cut segments off (segment id -> first lost offset):
        # a message from there on that a consumer gives back is dropped, not requeued.
        self._lost_from: dict[int, int] = {}
        #: Told (count, bytes) when ready messages are dropped by a failed write-out
        #: (a PriorityStore keeps running totals of its levels).
        self.on_ready_lost: Callable[[int, int], None] | None = None
        #: Told the messages whose records a failed write-out dropped: their
        #: queue forgets their deduplication keys (Queue._keys_dropped).
        self.on_dropped: Callable[[list[Message]], None] | None = None
        self._log.on_lost = self._records_lost
        # Whether live transient records are counted, and their counts.
        self._count = count_transient
        self._transient = TransientCounts()

    # -- writing --------------------------------------------------------------------------
    def _records_lost(self, segment_id: int, start: int, data: bytes) -> int:
        """The log's on_lost: a write-out failed (a full disk), so the records from
        ``start`` on in ``segment_id`` (``data``) never reached the file, and the
        log closed that segment. Those still ready are no longer counted (their
        publishers get nacks); those a consumer already has (append_shifted,
        append_run) stay counted until acked (a requeue drops them); ``on_dropped``
        is told. Returns how many records there were."""
        if self.on_dropped is not None and data:
            self.on_dropped(decode_records(data))
        seg = self._segs.get(segment_id)
        if seg is None:
            return 0
        found = lost_records(data, start, self._cursor.ready_from(seg), seg.removed, self._count)
        records, ready, ready_bytes = found.records, found.ready, found.ready_bytes
        if ready > seg.unread:  # a purged or abandoned segment: nothing ready to take out
            ready, ready_bytes = seg.unread, seg.unread_bytes
        if seg.transient_unread:  # a consumer's (held) stay counted until acked
            t = self._transient
            t.unread_found(
                seg,
                max(0, seg.transient_unread - found.transient),
                max(0, seg.transient_unread_bytes - found.transient_bytes),
            )
        self._lost_from[segment_id] = start
        seg.records -= ready
        seg.unread -= ready
        seg.unread_bytes -= ready_bytes
        self._ready_count -= ready
        self._ready_bytes -= ready_bytes
        if seg is self._wseg:
            self._wseg = None
        if ready and self.on_ready_lost is not None:
            self.on_ready_lost(ready, ready_bytes)
        if seg.dead >= seg.records:
            self._drop_segment(seg)
        return records

    def _retire_write_segment(self) -> None:
        """Close the write segment; the next append starts a new one."""
        self._log.retire()
        self._wseg = None

    def _drop_segment(self, seg: SegmentState) -> None:
        """Delete a fully acknowledged segment (messages first, so acks never go missing)."""
        if seg is self._cursor.seg:
            self._cursor.leave()
            self._peeked = None
            self._set_detour()
        with self._lock:
            if self._log.closed or self._segs.pop(seg.id, None) is None:
                return
            if seg is self._wseg:
                self._wseg = None
            self._unsynced_acks.discard(seg.id)
            # Messages first: a crash in between leaves an orphan ack file (removed
            # on recovery), never a message file whose acks are gone.
            self._log.drop_locked(seg.id)
            self._log.unlink(self._acks_path(seg.id))
        self._lost_from.pop(seg.id, None)
        if seg.transient_unread:  # never expected (every record is dead)
            self._transient.unread_gone(seg)

    # -- reading (the cursor: store/segment_cursor.py) ------------------------------------
    def _enter(self, seg: SegmentState) -> None:
        self._cursor.enter(seg)
        self._set_detour()

    def _set_detour(self) -> None:
        cursor = self._cursor
        seg = cursor.seg
        self._detour = (
            self._peeked is not None
            or cursor.skip is not None
            or (seg is not None and seg.removed is not None)
            or self._redelivering
        )

    def _abandon_segment(self, seg: SegmentState, reason: str) -> None:
        """Give up on the unread rest of a segment that cannot be read (never expected:
        recovery validated it). Its ready messages are lost; the store keeps working."""
        log.error(
            "%s: %s unreadable (%s): dropping its %d unread messages",
            self._dir,
            self._log.msgs_path(seg.id).name,
            reason,
            seg.unread,
        )
        self._ready_count -= seg.unread
        self._ready_bytes -= seg.unread_bytes
        seg.dead += seg.unread
        seg.unread = 0
        seg.unread_bytes = 0
        seg.removed = None
        if seg.transient_unread:
            self._transient.unread_gone(seg)
        if seg is self._cursor.seg:
            self._peeked = None
            self._set_detour()
        self._cursor.close_map()
        if seg is self._wseg:
            self._retire_write_segment()  # do not append after damage
        if seg.dead >= seg.records:
            self._drop_segment(seg)

    def _damaged(self, seg: SegmentState, pos: int) -> None:
        """The record at ``pos``, where the cursor stands, does not check out: it
        was damaged on disk after it was written or recovered. Its bytes are kept
        aside and never served, the cursor steps over them to the next record
        that checks out, and what is left to read is counted again."""
        self._peeked = None
        cursor = self._cursor
        try:
            cursor.map_segment(seg)  # the whole file, appends flushed
        except OSError as exc:
            self._abandon_segment(seg, f"cannot map: {exc}")
            return
        m = cursor.map
        if m is None or pos >= cursor.end:
            self._abandon_segment(seg, "file shorter than its records")
            return
        (lost, lost_bytes), left = step_over_damage(self._log, seg, m, pos, cursor.end, cursor.skip)
        self._ready_count -= lost
        self._ready_bytes -= lost_bytes
        if self._count:
            self._transient.unread_found(seg, left[0], left[1])
        if seg.gaps is None or pos not in seg.gaps:  # never expected: do not loop on it
            self._abandon_segment(seg, f"record at offset {pos} does not read back")
            return
        cursor.restart_at(pos)
        self._set_detour()
        if not seg.unread:
            cursor.close_map()
            if seg.dead >= seg.records and seg is not self._wseg:
                self._drop_segment(seg)
