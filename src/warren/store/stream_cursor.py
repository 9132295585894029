"""A stream reader's position: StreamStore.cursor() hands them out.

A cursor reads through a memory map of its own, one record at a time
(:meth:`StreamCursor.next`, a Message each) or, for the backlog path of
core/stream_queue.py, as a span of records a consumer frames in one pass
(:meth:`StreamCursor.span` and :meth:`StreamCursor.skip`).
"""

from __future__ import annotations

import logging
import mmap
from typing import TYPE_CHECKING

from warren.core.message import Message
from warren.store.records import CorruptRecord, decode_record

if TYPE_CHECKING:
    from warren.store.stream_store import StreamStore, _StreamSegment

__all__ = ["StreamCursor"]

log = logging.getLogger("warren.store")


class StreamCursor:
    """One reader's position in a stream: the offset it reads next, and where that
    record sits. Reads through a memory map of its own, remapped as the stream
    grows; a cursor whose segment retention removed jumps to the oldest offset."""

    def __init__(self, store: StreamStore, offset: int) -> None:
        self._store = store
        self.offset = offset
        self._sid = 0
        self._pos = 0
        self._map: mmap.mmap | None = None  # up to the segment's end of data
        self._seed = 0  # the CRC seed of its records
        self._seg: _StreamSegment | None = None  # the segment holding ``offset``
        self._seek(offset)

    def _seek(self, offset: int) -> None:
        """Go to ``offset``, or to the first intact record after it."""
        self._close_map()
        self._seg = None
        store = self._store
        self.offset = offset
        if offset >= store.next_offset or not store._segs:
            self._sid = 0  # caught up: located when a message arrives
            return
        self._sid, self._pos, self.offset = store.position_of(offset)

    def _close_map(self) -> None:
        m, self._map = self._map, None
        if m is not None:
            m.close()

    def close(self) -> None:
        self._close_map()

    @property
    def caught_up(self) -> bool:
        return self.offset >= self._store.next_offset

    def next(self) -> tuple[int, Message] | None:
        """The next message and its offset, or None when the cursor is caught up."""
        store = self._store
        while True:
            seg = self._ready()
            if seg is None:
                return None
            m = self._map
            assert m is not None
            offset = self.offset
            try:
                msg, length = decode_record(m, self._pos, len(m), True, self._seed)
            except CorruptRecord:
                # Damaged on disk: never served; on with the next record that checks out.
                self._pos, lost = store.damaged_at(seg, self._pos, offset)
                self.offset = offset + lost
                continue
            self._advance(seg, 1, self._pos + length)
            return offset, msg

    def span(self) -> tuple[mmap.mmap, int, int, int] | None:
        """Where the next records lie, for reading several at once: (map, position,
        CRC seed, how many records of this segment are left from there); None when
        caught up. The caller checks each record (deliver_records does) and calls
        :meth:`skip` with how many it took."""
        seg = self._ready()
        if seg is None:
            return None
        assert self._map is not None
        return self._map, self._pos, self._seed, seg.first_offset + seg.count - self.offset

    def skip(self, n: int, end: int) -> None:
        """``n`` records from :meth:`span`'s position were read; the next starts at ``end``."""
        seg = self._seg
        assert seg is not None
        self._advance(seg, n, end)

    def _advance(self, seg: _StreamSegment, n: int, end: int) -> None:
        self._pos = end
        self.offset += n
        if self.offset == seg.first_offset + seg.count and seg is not self._store._segs[-1]:
            self._close_map()  # done with this segment

    def _ready(self) -> _StreamSegment | None:
        """The segment holding the next offset, its map open at the next record; None
        when the cursor is caught up."""
        store = self._store
        while True:
            offset = self.offset
            if offset >= store.next_offset:
                return None
            if offset < store.first_offset:
                self._seek(store.first_offset)  # retention removed what we had not read
                continue
            segs = store._segs
            if not self._sid:
                self._seek(offset)
                if not self._sid or self.offset != offset:
                    continue  # caught up, or damage took that offset: from the next
            seg = self._seg
            if seg is None or not seg.first_offset <= offset < seg.first_offset + seg.count:
                seg = self._seg = segs[store._segment_of(offset)]
                if offset >= seg.first_offset + seg.count:
                    self._seek(offset)  # between segments: damage took those offsets
                    continue
            if seg.id != self._sid:
                # The cursor's segment is done (or gone): start the one holding offset.
                self._close_map()
                self._sid, self._pos = seg.id, store._log.data_start(seg.id)
                if offset != seg.first_offset:
                    self._seek(offset)
                    continue
            m = self._map
            if m is None or self._pos >= len(m):
                self._close_map()
                try:
                    m = store._log.map(self._sid)
                except OSError as exc:
                    log.error("%s: cannot map segment %d: %s", store._dir, self._sid, exc)
                    self._skip_segment(seg)
                    continue
                self._map = m
                self._seed = store._log.file(self._sid).seed
                if m is None or self._pos >= len(m):
                    log.error("%s: segment %d shorter than its records", store._dir, self._sid)
                    self._skip_segment(seg)
                    continue
            return seg

    def _skip_segment(self, seg: _StreamSegment) -> None:
        """Give up on the rest of a segment that cannot be read (never expected)."""
        self._close_map()
        self.offset = seg.first_offset + seg.count
        self._sid = 0
