"""A stream reader's position: StreamStore.cursor() hands them out.

A cursor reads through a memory map of its own, one record at a time
(:meth:`StreamCursor.next`, a Message each) or, for the backlog path of
core/stream_queue.py, as a span of records a consumer frames in one pass
(:meth:`StreamCursor.span` and :meth:`StreamCursor.skip`).

A chunk record (many messages: store/stream_records.py) is read a message at
a time by ``next`` (the cursor keeps its place inside it), or whole by
``chunk`` for a consumer that sends chunks as they are (the stream protocol's),
or several simple entries at once by :meth:`StreamCursor.entries` (a consumer
frames them in C: the span path's twin); ``span`` stops before one. ``next``
opens a sub-entry batch (none, gzip) into its messages, one offset each, and
steps over one it cannot open (snappy, lz4, zstd), its offsets counted, saying
so once per stream: RabbitMQ's AMQP readers skip compressed batches too, and
only stream protocol consumers, which get the chunk as it is, open them.
"""

from __future__ import annotations

import logging
import mmap
import struct
from typing import TYPE_CHECKING

from warren.core.message import Message
from warren.store.records import CorruptRecord, decode_record, inspect_record
from warren.store.stream_records import (
    CHUNK_BODY_AT,
    CHUNK_HEADER,
    RECORD_TS,
    EntryDecoder,
    chunk_count,
    entry_span,
    open_batch,
    stamp_properties,
)

if TYPE_CHECKING:
    from warren.store.stream_segment import StreamSegment
    from warren.store.stream_store import StreamStore

__all__ = ["StreamCursor", "last_message_offset"]

log = logging.getLogger("warren.store")

_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_ENTRIES_AT = CHUNK_BODY_AT + CHUNK_HEADER.size
#: Chunk records last_message_offset looks back over for a message it can read.
_LAST_LOOKBACK = 64


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
        self._seg: StreamSegment | None = None  # the segment holding ``offset``
        # Inside a chunk record (read by next): where its next entry and the
        # record end, and the messages left; 0 left: at a record's start.
        self._entry = 0
        self._chunk_end = 0
        self._chunk_left = 0
        self._chunk_ts = 0
        # Inside a sub-entry batch: its opened records and the next one's index;
        # before one: its records to pass over (the offset is inside it).
        self._batch: list[bytes] | None = None
        self._batch_at = 0
        self._batch_skip = 0
        self._chunk_data_end = 0  # where its entries end
        self._seek(offset)

    def _seek(self, offset: int) -> None:
        """Go to ``offset``, or to the first intact record after it."""
        self._close_map()
        self._seg = None
        self._chunk_left = 0
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
            if self._chunk_left or self._enter_chunk(seg, m):
                msg = self._chunk_message(seg, m, offset)
                if msg is None:
                    continue  # a batch it cannot open stepped over
                return offset, msg
            if self.offset != offset:
                continue  # a damaged chunk record stepped over
            try:
                msg, length = decode_record(m, self._pos, len(m), True, self._seed)
            except CorruptRecord:
                # Damaged on disk: never served; on with the next record that checks out.
                self._pos, lost = store.damaged_at(seg, self._pos, offset)
                self.offset = offset + lost
                continue
            self._advance(seg, 1, self._pos + length)
            return offset, msg

    def _enter_chunk(self, seg: StreamSegment, m: mmap.mmap) -> bool:
        """Whether the record at the cursor's position is a chunk record, checked
        (a damaged one is stepped over as any record, and False): then the
        cursor is at the entry holding its offset."""
        pos = self._pos
        if len(m) - pos < _ENTRIES_AT or not chunk_count(m, pos):
            return False
        offset = self.offset
        try:
            length = inspect_record(m, pos, len(m), True, self._seed)[0]
        except CorruptRecord:
            self._pos, lost = self._store.damaged_at(seg, pos, offset)
            self.offset = offset + lost
            return False
        head = CHUNK_HEADER.unpack_from(m, pos + CHUNK_BODY_AT)
        count, first = head[3], head[6]
        index = offset - first
        if not 0 <= index < count:  # cannot be: the store counted this record so
            self._pos, lost = self._store.damaged_at(seg, pos, offset)
            self.offset = offset + lost
            return False
        self._chunk_left = count - index
        entry = pos + _ENTRIES_AT
        data_end = entry + head[8]
        while True:  # to the entry holding the offset (index messages in)
            end, held = entry_span(m, entry)
            if index < held:
                break
            index -= held
            entry = end
            if entry >= data_end:  # cannot be: the CRC held and the counts did not
                self._chunk_left = 0
                self._pos, lost = self._store.damaged_at(seg, pos, offset)
                self.offset = offset + lost
                return False
        self._entry = entry
        self._batch = None
        self._batch_skip = index
        self._chunk_end = pos + length
        self._chunk_ts = RECORD_TS.unpack_from(m, pos + 4)[0]
        self._chunk_data_end = pos + _ENTRIES_AT + head[8]
        return True

    def _chunk_message(self, seg: StreamSegment, m: mmap.mmap, offset: int) -> Message | None:
        """The message of the chunk entry at the cursor (``offset``), as a record
        of its own would give it: the entry's AMQP 1.0 message through the
        store's native_decoder, stamped with its offset and timestamp. None
        when the entry is a sub-entry batch that cannot be opened: the cursor
        is then past its offsets."""
        store = self._store
        batch = self._batch
        if batch is not None:
            data = batch[self._batch_at]
            self._batch_at += 1
            if self._batch_at == len(batch):
                self._batch = None
        else:
            entry = self._entry
            if m[entry] & 0x80:
                end, held = entry_span(m, entry)
                self._entry = end
                skip, self._batch_skip = self._batch_skip, 0
                records, codec = open_batch(m, entry)
                if records is None or not records:
                    if records is None:
                        _kept_closed(store, codec, offset, held - skip)
                    self._chunk_left -= held - skip
                    self._advance(
                        seg, held - skip, self._chunk_end if not self._chunk_left else self._pos
                    )
                    return None
                data = records[skip]
                if skip + 1 < len(records):
                    self._batch, self._batch_at = records, skip + 1
            else:
                size = _U32.unpack_from(m, entry)[0]
                data = m[entry + 4 : entry + 4 + size]
                self._entry = entry + 4 + size
        ts = self._chunk_ts
        decoder = store.decoder.decode
        if decoder is not None:
            props, body, native = decoder(data)
        else:
            props, body, native = b"\x00\x00", data, None
        msg = Message(
            "", store.chunk_routing_key, stamp_properties(props, offset, ts), body, ts, native
        )
        self._chunk_left -= 1
        self._advance(seg, 1, self._chunk_end if not self._chunk_left else self._pos)
        return msg

    def chunk(self) -> tuple[int, int, mmap.mmap, int, int] | None:
        """The whole chunk record at the cursor, for a consumer that sends chunks
        as they are: (first offset, offsets it holds, map, where the chunk
        (header and data) starts and ends); the cursor then moves past it,
        also when it was inside it (the client skips what it did not ask
        for). None when caught up or the next record is a single message
        (``next`` reads it). The map stays valid until the cursor's next call."""
        while True:
            seg = self._ready()
            if seg is None:
                return None
            m = self._map
            assert m is not None
            offset = self.offset
            if not self._chunk_left and not self._enter_chunk(seg, m):
                if self.offset != offset:
                    continue  # a damaged chunk record stepped over
                return None
            pos = self._pos
            first = CHUNK_HEADER.unpack_from(m, pos + CHUNK_BODY_AT)[6]
            end = self._chunk_end
            n = self._chunk_left
            self._chunk_left = 0
            # Not _advance: the map stays open for the caller (the next call's
            # _ready closes it if the segment is done).
            self._pos = end
            self.offset = offset + n
            # The chunk is the record's body: after its head, up to its trailer.
            body_len = _U64.unpack_from(m, pos + 18)[0] & 0x3FFFFFFFFFFFFFFF
            start = pos + CHUNK_BODY_AT
            return first, offset + n - first, m, start, start + body_len

    def entries(self) -> tuple[mmap.mmap, int, int, int, int, str, EntryDecoder] | None:
        """Where the next entries of the chunk record at the cursor lie, for framing
        several at once: (map, position of the next entry, where the entries
        end, how many are left, the chunk's timestamp, the routing key and
        EntryDecoder of its messages); None when caught up, the next record
        is a single message or the cursor is inside a sub-entry batch. The
        entries are those ``next`` would read (the record checked); the caller
        calls :meth:`skip_entries` with how many it took."""
        store = self._store
        while True:
            seg = self._ready()
            if seg is None:
                return None
            m = self._map
            assert m is not None
            if self._chunk_left:
                if self._batch is not None or self._batch_skip:
                    return None  # inside a sub-entry batch: next() reads it
                return (
                    m, self._entry, self._chunk_data_end, self._chunk_left, self._chunk_ts,
                    store.chunk_routing_key, store.decoder,
                )  # fmt: skip
            offset = self.offset
            if not self._enter_chunk(seg, m):
                if self.offset != offset:
                    continue  # a damaged chunk record stepped over
                return None

    def skip_entries(self, n: int, entry: int) -> None:
        """``n`` entries from :meth:`entries`' position were read; the next starts at ``entry``."""
        seg = self._seg
        assert seg is not None
        self._entry = entry
        self._chunk_left -= n
        self._advance(seg, n, self._chunk_end if not self._chunk_left else self._pos)

    def span(self) -> tuple[mmap.mmap, int, int, int] | None:
        """Where the next records lie, for reading several at once: (map, position,
        CRC seed, how many records of this segment are left from there); None when
        caught up. The caller checks each record (deliver_records does) and calls
        :meth:`skip` with how many it took."""
        seg = self._ready()
        if seg is None or self._chunk_left:
            return None
        m = self._map
        assert m is not None
        if len(m) - self._pos >= _ENTRIES_AT and chunk_count(m, self._pos):
            return None  # a chunk record: next() or chunk() reads it
        return m, self._pos, self._seed, seg.first_offset + seg.count - self.offset

    def skip(self, n: int, end: int) -> None:
        """``n`` records from :meth:`span`'s position were read; the next starts at ``end``."""
        seg = self._seg
        assert seg is not None
        self._advance(seg, n, end)

    def _advance(self, seg: StreamSegment, n: int, end: int) -> None:
        self._pos = end
        self.offset += n
        if self.offset == seg.first_offset + seg.count and seg is not self._store._segs[-1]:
            self._close_map()  # done with this segment

    def _ready(self) -> StreamSegment | None:
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

    def _skip_segment(self, seg: StreamSegment) -> None:
        """Give up on the rest of a segment that cannot be read (never expected)."""
        self._close_map()
        self.offset = seg.first_offset + seg.count
        self._sid = 0


def _kept_closed(store: StreamStore, codec: str, offset: int, count: int) -> None:
    """A reader of one message at a time stepped over a sub-entry batch it
    cannot open (``count`` offsets from ``offset``): said once per stream
    (RabbitMQ's AMQP readers skip such batches without a word)."""
    if count <= 0 or store.closed_batch_logged:
        return
    store.closed_batch_logged = True
    log.warning(
        "stream '%s' (%s): offsets %d-%d are a sub-entry batch (%s) that AMQP and Spark "
        "readers cannot open: skipped (stream protocol consumers get it; said once per stream)",
        store.chunk_routing_key,
        store.directory,
        offset,
        offset + count - 1,
        codec,
    )


def last_message_offset(store: StreamStore) -> int:
    """The offset of the last message a reader of one message at a time
    (``next``) gets: next_offset - 1, unless the stream ends with sub-entry
    batches it steps over (snappy, lz4, zstd); then the last offset before
    them it can read, looked for over at most _LAST_LOOKBACK chunk records
    (past those, next_offset - 1). So x-stream-offset "last" over AMQP (the
    Spark planner's probe) finds a message, as RabbitMQ's last chunk would."""
    last = max(store.first_offset, store.next_offset - 1)
    offset = last
    for _ in range(_LAST_LOOKBACK):
        if offset < store.first_offset:
            break
        sid, pos, found = store.position_of(offset)
        if not sid or found != offset:
            break  # damage took it: the cursor sorts that out
        m = store._log.map(sid)
        if m is None:
            break
        try:
            if len(m) - pos < _ENTRIES_AT or not chunk_count(m, pos):
                return offset  # a message stored alone
            head = CHUNK_HEADER.unpack_from(m, pos + CHUNK_BODY_AT)
            first, entry = head[6], pos + _ENTRIES_AT
            at, readable = first, -1
            for _ in range(head[2]):
                end, held = entry_span(m, entry)
                if held and (not m[entry] & 0x80 or (m[entry] >> 4) & 0x07 <= 1):
                    readable = at + held - 1
                at += held
                entry = end
        finally:
            m.close()
        if readable >= 0:
            return min(readable, offset)
        offset = first - 1
    return last
