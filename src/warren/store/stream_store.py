"""A stream's messages in a segment log: appended with an offset, read by many cursors.

A stream never removes a message because it was consumed. Every message gets
the next 64-bit offset (the first is 0) and is stored with its offset and
publish time already in its headers (store/stream_records.py): deliveries send
the stored properties as they are, and any reader of the data directory (the
Spark connector, a replica) sees offsets without the broker. Retention drops
whole segments from the front.

Per segment the store keeps its first offset, record count, bytes and first
and last timestamps (a few ints, not one object per message), so finding an
offset or a time is a binary search over segments and a walk over the records
of one segment. Cursors (StreamCursor) read through a memory map of their own,
so any number of consumers read independently.

A record is one message, or a chunk of them (``append_chunk``: the stream
protocol's Publish stored as it came, store/stream_records.py's chunk
record): it then holds as many consecutive offsets as the chunk has
messages (a sub-entry batch, stored closed, one per record in it), and
every count here is in offsets. Its trailer (each publisher's
reference and last publishing id) is read back at recovery
(``publisher_sequence``), so a deduplicating publisher's sequence survives
a crash that lost the tracking file's last write. Counting the segments
at open is store/stream_recovery.py's.
"""

from __future__ import annotations

import bisect
import logging
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path

from warren.core.clock import Clock, TimerHandle
from warren.core.message import Message, MessageRun
from warren.store.disk_budget import UNMETERED, DiskBudget
from warren.store.mirror import FileMirror
from warren.store.records import CorruptRecord, decode_records, inspect_record
from warren.store.segment_damage import (
    damage_reason,
    keep_aside,
    report,
    resume_after,
    structure_length,
)
from warren.store.segment_log import SegmentLog
from warren.store.stream_cursor import StreamCursor, last_message_offset
from warren.store.stream_records import (
    RECORD_TS,
    SHARED_DECODER,
    EntryDecoder,
    chunk_count,
    chunk_record,
    chunk_trailers,
    record_offsets,
    run_records,
    stream_record,
)
from warren.store.stream_recovery import recover_stream
from warren.store.stream_segment import StreamSegment
from warren.store.stream_tracking import TRACKING_WRITE_MS, TrackedOffsets
from warren.store.sync_files import sync_collected

__all__ = ["StreamCursor", "StreamStore"]

log = logging.getLogger("warren.store")


def _take_dropped(pieces: list[tuple[int, int]], dropped: int, lost: list[int]) -> None:
    """The newest ``dropped`` records were dropped: take them off the end of
    ``pieces`` (a run's, as put) and add the run indexes of those that were the
    run's to ``lost`` (the rest were older records)."""
    while dropped > 0 and pieces:
        start, count = pieces[-1]
        k = min(count, dropped)
        lost.extend(range(start + count - k, start + count))
        dropped -= k
        if k == count:
            pieces.pop()
        else:
            pieces[-1] = (start, count - k)


class StreamStore:
    """The messages of one stream queue, under ``directory``.

    Durability as for any segment log: appends reach the OS on flush() and the
    disk on sync(); confirms wait for sync(). Tracked consumer offsets live in
    the file ``offsets`` next to the segments (store/stream_tracking.py):
    with a ``clock`` (the broker's), written TRACKING_WRITE_MS after a change
    at the latest and at most that often, and at close; without one, at every
    flush that follows a change. Synced with the segments. ``budget`` and
    ``mirror``: the data directory's (store/layout.py's DataDir), given by the
    StoreFactory.
    """

    def __init__(
        self,
        directory: Path,
        segment_size: int = 8 * 1024 * 1024,
        format_version: int = 2,
        *,
        budget: DiskBudget = UNMETERED,
        mirror: FileMirror | None = None,
        clock: Clock | None = None,
        decoder: EntryDecoder | None = None,
    ) -> None:
        self._clock = clock
        #: The pending write of changed tracked offsets (with a clock).
        self._tracking_timer: TimerHandle | None = None
        self._log = SegmentLog(
            Path(directory), segment_size, True, format_version, budget=budget, mirror=mirror
        )
        self._dir = self._log.directory
        self._segs: list[StreamSegment] = []
        self._firsts: list[int] = []  # first offsets of _segs, for bisect
        self._next_offset = 0
        self._bytes = 0
        self._dirty = False
        self._tracking = TrackedOffsets(self._log)
        #: Told the messages whose records a failed write-out dropped: their
        #: queue forgets their deduplication keys (Queue._keys_dropped).
        self.on_dropped: Callable[[list[Message]], None] | None = None
        #: The last publishing id of each publisher reference, from the trailers
        #: of the chunk records (recovered and appended): publisher_sequence.
        self._sequences: dict[str, int] = {}
        #: Turns a chunk entry's bytes into a message's parts (the StoreFactory's,
        #: shared by every stream: store/stream_records.py's EntryDecoder).
        self.decoder = decoder if decoder is not None else SHARED_DECODER
        #: The routing key of a message read from a chunk record (the stream's name).
        self.chunk_routing_key = ""
        #: A reader stepped over a sub-entry batch it cannot open (said once:
        #: stream_cursor.py).
        self.closed_batch_logged = False
        self._recover()
        self._log.on_lost = self._records_lost

    def __repr__(self) -> str:
        return f"<StreamStore {str(self._dir)!r} {self.first_offset}..{self._next_offset}>"

    # -- bounds ---------------------------------------------------------------------------
    @property
    def first_offset(self) -> int:
        """The oldest offset still stored (next_offset when the stream is empty)."""
        return self._segs[0].first_offset if self._segs else self._next_offset

    @property
    def next_offset(self) -> int:
        """The offset the next message will get."""
        return self._next_offset

    @property
    def ready_count(self) -> int:
        """Messages stored (retention has not removed)."""
        return self._next_offset - self.first_offset

    @property
    def ready_bytes(self) -> int:
        """Bytes of the stored records."""
        return self._bytes

    @property
    def segment_count(self) -> int:
        """Segment files held (the metrics' rabbitmq_stream_segments)."""
        return len(self._segs)

    @property
    def first_timestamp(self) -> int | None:
        """Publish time (ms) of the oldest stored message, None when empty."""
        return self._segs[0].first_ts if self._segs else None

    @property
    def last_timestamp(self) -> int | None:
        """Publish time (ms) of the newest message, None when empty."""
        return self._segs[-1].last_ts if self._segs else None

    @property
    def dirty(self) -> bool:
        return self._dirty

    @property
    def directory(self) -> Path:
        return self._dir

    # -- appending ------------------------------------------------------------------------
    def append(self, msg: Message) -> int:
        """Store ``msg`` with the next offset; returns the offset."""
        offset = self._next_offset
        ts = msg.timestamp
        log = self._log
        rec = stream_record(msg, offset, ts, log.seed)
        # Room first: a failed write-out there drops the newest records and hands
        # their offsets out again (_records_lost), so this one's may change; a
        # new segment has another salt.
        if log.make_room(len(rec)) or self._next_offset != offset:
            offset = self._next_offset
            rec = stream_record(msg, offset, ts, log.seed)
        self._written(log.put(rec), offset, ts, 1, len(rec))
        return offset

    def append_chunk(
        self,
        data: bytes | memoryview,
        num_entries: int,
        ts: int,
        reference: str = "",
        last_id: int = 0,
        data_crc: int = -1,
        num_records: int = -1,
        sequences: Mapping[str, int] | None = None,
    ) -> int:
        """Store ``num_entries`` data entries (``data``, as Publish frames
        carry them, holding ``num_records`` messages: -1, every entry simple)
        as one chunk record with the next offsets, one per message; returns
        the first. ``reference`` and ``last_id``: the publisher's, kept in the
        record's trailer (publisher_sequence); ``sequences``: those of every
        publisher whose entries the record holds (Publish frames merged).
        ``data_crc``: zlib.crc32 of ``data`` when the caller has it."""
        offset = self._next_offset
        log = self._log
        lasts = {**sequences, reference: last_id} if sequences else {reference: last_id}
        lasts.pop("", None)
        trailer = chunk_trailers(lasts)
        if data_crc < 0:
            data_crc = zlib.crc32(data)
        if num_records < 0:
            num_records = num_entries
        seed = log.seed
        rec = chunk_record(data, num_entries, offset, ts, trailer, seed, data_crc, num_records)
        if log.make_room(len(rec)) or self._next_offset != offset:
            offset = self._next_offset
            seed = log.seed
            rec = chunk_record(data, num_entries, offset, ts, trailer, seed, data_crc, num_records)
        self._written(log.put(rec), offset, ts, num_records, len(rec))
        known = self._sequences
        for ref, last in lasts.items():
            if last > known.get(ref, 0):
                known[ref] = last
        return offset

    def last_message_offset(self) -> int:
        """x-stream-offset "last" for a reader of one message at a time: the
        last offset it gets a message for (stream_cursor.last_message_offset)."""
        return last_message_offset(self)

    def publisher_sequence(self, reference: str) -> int:
        """The last publishing id a chunk record's trailer holds for
        ``reference`` (0: none): what the tracking file says may be older
        after a crash."""
        return self._sequences.get(reference, 0)

    def _written(self, seq: int, offset: int, ts: int, count: int, size: int) -> None:
        """Count ``count`` records of ``size`` bytes from ``offset`` on, just put at
        ``seq``: in the write segment, or a new one when the log began one."""
        segs = self._segs
        if not segs or segs[-1].id != seq >> 32:
            seg = StreamSegment(seq >> 32, offset, ts)
            segs.append(seg)
            self._firsts.append(offset)
        else:
            seg = segs[-1]
        seg.count += count
        seg.bytes += size
        if ts > seg.last_ts:
            seg.last_ts = ts
        self._bytes += size
        self._next_offset = offset + count
        self._dirty = True

    def append_run(
        self, run: MessageRun, start: int, stop: int, lost: list[int] | None = None
    ) -> int:
        """Store messages ``start .. stop - 1`` of a run of publishes with the next
        offsets, as ``append`` would one by one (the same records, byte for
        byte, with the run's one timestamp), encoded together (in C for the C
        run type) and written in as few pieces as segments they fill; returns
        the first offset. ``lost`` gets the indexes of the messages a failed
        write-out dropped meanwhile (append_stretches)."""
        first = self._next_offset
        self.append_stretches(run, ((start, stop),), lost)
        return first

    def append_stretches(
        self,
        run: MessageRun,
        stretches: Iterable[tuple[int, int]],
        lost: list[int] | None = None,
    ) -> None:
        """append_run for several stretches of one run (``(start, stop)`` each, in
        order: what a deduplicating stream lets in), as one unit.

        A stretch is written in pieces, one per segment it fills, and the room
        the next piece makes may write out the buffer holding the earlier ones.
        When that write-out fails (a full disk) they are dropped, and their
        offsets handed out again (_records_lost): ``lost`` gets the indexes of
        the run's messages dropped so (the newest records go first, so they are
        the last pieces put). What is left of the run then is written, or still
        buffered at the write generation of the call's end: a sync's lost check
        from there covers it (store/sync.py), so a confirm needs no more."""
        ts = run.timestamp
        log = self._log
        pieces: list[tuple[int, int]] = []  # (start, count) of each piece put, in order
        for start, stop in stretches:
            while start < stop:
                offset = self._next_offset
                recs, ends = run_records(run, start, stop, offset, ts, log.seed)
                # What fits the write segment goes there, the rest into the next
                # ones, as one message after the other would go (at least one
                # record: it begins a new segment when it does not fit).
                room = log.room()
                if len(recs) > room:
                    k = max(1, bisect.bisect_right(ends, room))
                    recs, ends = recs[: ends[k - 1]], ends[:k]
                count = len(ends)
                if log.make_room(len(recs)) or self._next_offset != offset:
                    dropped = offset - self._next_offset
                    if dropped and pieces and lost is not None:
                        _take_dropped(pieces, dropped, lost)
                    offset = self._next_offset  # a new segment, or records lost: again
                    recs, ends = run_records(run, start, start + count, offset, ts, log.seed)
                self._written(log.put(recs), offset, ts, count, len(recs))
                pieces.append((start, count))
                start += count

    def _records_lost(self, segment_id: int, start: int, data: bytes) -> int:
        """The log's on_lost: a write-out failed (a full disk) and the newest
        records, ``data`` from ``start`` on in the write segment, never reached the
        file. No reader has seen them (readers read the file), so their offsets
        are handed out again; the log starts a new segment for them, and
        ``on_dropped`` is told (their publishers get nacks, and a retry must
        not be taken for a duplicate of them)."""
        if self.on_dropped is not None and data:
            self.on_dropped(decode_records(data))
        segs = self._segs
        if not segs or segs[-1].id != segment_id:
            return 0
        seg = segs[-1]
        count = pos = 0
        while pos < len(data):
            try:
                length = inspect_record(data, pos, len(data), False)[0]
            except CorruptRecord:
                break  # not what this process encoded: cannot happen
            count += chunk_count(data, pos) or 1
            pos += length
        count = min(count, seg.count)
        seg.count -= count
        seg.bytes -= pos
        self._bytes -= pos
        self._next_offset -= count
        if not seg.count:
            segs.pop()
            self._firsts.pop()
            with self._log.lock:
                self._log.drop_locked(segment_id)
        return count

    def lost_between(self, first: int, last: int) -> bool:
        """Whether appends of those write generations were dropped (store/sync.py)."""
        return self._log.lost_between(first, last)

    # -- finding --------------------------------------------------------------------------
    def offset_at(self, timestamp_ms: int) -> int:
        """The first offset published at or after ``timestamp_ms`` (next_offset when
        none is): a binary search over segments, then a walk over one segment."""
        segs = self._segs
        lo, hi = 0, len(segs)
        while lo < hi:  # the first segment whose newest message is late enough
            mid = (lo + hi) // 2
            if segs[mid].last_ts < timestamp_ms:
                lo = mid + 1
            else:
                hi = mid
        if lo == len(segs):
            return self._next_offset
        seg = segs[lo]
        if seg.first_ts >= timestamp_ms:
            return seg.first_offset
        for offset, _pos, ts, _count in self._walk(seg):
            if ts >= timestamp_ms:
                return offset
        return seg.first_offset + seg.count

    def _segment_of(self, offset: int) -> int:
        """Index in _segs of the segment holding ``offset`` (first_offset <= offset)."""
        return max(0, bisect.bisect_right(self._firsts, offset) - 1)

    def _walk(self, seg: StreamSegment) -> Iterator[tuple[int, int, int, int]]:
        """(first offset, position, timestamp, offsets held) of each intact record
        of ``seg``, from its start, stepping over damaged ranges (found here if
        need be)."""
        m = self._log.map(seg.id)
        if m is None:
            return
        try:
            pos = self._log.data_start(seg.id)
            size = len(m)
            offset = seg.first_offset
            end = seg.first_offset + seg.count
            while offset < end and pos < size:
                gaps = seg.gaps
                if gaps is not None and pos in gaps:
                    pos, lost = gaps[pos]
                    offset += lost
                    continue
                length = structure_length(m, pos, size)
                if not length:
                    pos, lost = self.damaged_at(seg, pos, offset)
                    offset += lost
                    continue
                count = chunk_count(m, pos) or 1
                yield offset, pos, RECORD_TS.unpack_from(m, pos + 4)[0], count
                offset += count
                pos += length
        finally:
            m.close()

    def position_of(self, offset: int) -> tuple[int, int, int]:
        """(segment id, file position, offset) of the first intact record at or
        after ``offset`` (first_offset <= offset < next_offset): the record
        with that offset unless damage took it (a chunk record's position when
        the offset is inside it: the offset's index in it is the offset less
        the chunk's first). Segment id 0 when no record is left from there on
        (the offset is then next_offset)."""
        i = self._segment_of(offset)
        while i < len(self._segs):
            seg = self._segs[i]
            if offset <= seg.first_offset and not seg.gaps:
                return seg.id, self._log.data_start(seg.id), seg.first_offset
            for found, pos, _ts, count in self._walk(seg):
                if found + count > offset:
                    return seg.id, pos, max(found, offset)
            i += 1
        return 0, 0, self._next_offset

    def damaged_at(self, seg: StreamSegment, pos: int, offset: int) -> tuple[int, int]:
        """A reader met a record that does not check out at ``pos`` of ``seg``,
        where it expected ``offset``: (where intact records resume, how many
        offsets the damage took). The damaged bytes are kept aside and never
        served; every reader steps over them from then on."""
        gaps = seg.gaps
        if gaps is not None and pos in gaps:
            return gaps[pos]
        remaining = seg.first_offset + seg.count - offset
        path = self._log.msgs_path(seg.id)
        m = self._log.map(seg.id)  # a fresh map up to the end of data: appends flushed
        if m is None:
            return pos + 1, 0
        try:
            size = len(m)
            seed = self._log.file(seg.id).seed
            nxt = resume_after(m, pos, size, seed)
            stop, lost = size, remaining
            if nxt >= 0:
                stop = nxt
                _len, p_off, p_len, _b = inspect_record(m, nxt, size, True, seed)
                stored = record_offsets(m, p_off, p_len)[0]
                lost = stored - offset if offset <= stored <= offset + remaining else 1
                lost = min(lost, remaining)
            reason = damage_reason(m, pos, size, seed)
            self._set_aside(path, pos, m[pos:stop], reason, remaining - lost)
        finally:
            m.close()
        if seg.gaps is None:
            seg.gaps = {}
        seg.gaps[pos] = (stop, lost)
        return stop, lost

    def cursor(self, offset: int) -> StreamCursor:
        """A reader starting at ``offset``: the oldest stored offset if retention took
        it, and nothing until the stream gets there if it is in the future."""
        return StreamCursor(self, max(offset, self.first_offset))

    def _set_aside(self, path: Path, start: int, data: bytes, reason: str, after: int) -> None:
        """Keep damaged bytes met on the read path next to their segment, and say so."""
        try:
            kept, known = keep_aside(path, start, data)
        except OSError as exc:
            log.error(
                "%s: %s: bytes %d-%d are damaged (%s) and cannot be kept aside (%s); "
                "never delivered",
                self._dir,
                path.name,
                start,
                start + len(data),
                reason,
                exc,
            )
            return
        report(self._dir, path.name, start, start + len(data), reason, kept, known, after)

    # -- retention ------------------------------------------------------------------------
    def apply_retention(
        self, max_length: int | None, max_bytes: int | None, max_age_ms: int | None, now_ms: int
    ) -> int:
        """Drop whole segments from the front while the stream is over a limit (or,
        for max-age, while a segment's newest message is older than allowed); the
        segment being written is never dropped. Returns the messages dropped."""
        dropped = 0
        segs = self._segs
        while len(segs) > 1:
            seg = segs[0]
            over = (
                (max_length is not None and self.ready_count - seg.count >= max_length)
                or (max_bytes is not None and self._bytes - seg.bytes >= max_bytes)
                or (max_age_ms is not None and seg.last_ts < now_ms - max_age_ms)
            )
            if not over:
                break
            segs.pop(0)
            self._firsts.pop(0)
            self._bytes -= seg.bytes
            dropped += seg.count
            with self._log.lock:
                self._log.drop_locked(seg.id)
        if dropped:
            self._dirty = True
            log.debug("%s: retention dropped %d messages", self._dir, dropped)
        return dropped

    # -- tracked consumer offsets (store/stream_tracking.py) ------------------------------
    def tracked(self, name: str) -> int | None:
        """The stored offset of the consumer ``name``: the next one it should read."""
        return self._tracking.get(name)

    def track(self, name: str, next_offset: int, at_once: bool = False) -> None:
        """Remember where consumer ``name`` resumes: written by the timer this
        sets (with a clock), else, or ``at_once`` (the consumer is gone), on the
        next flush. An ack moves it, and rewriting the file per loop turn with
        acks cost a rename each (2,907 in a 16.8 s test, 5 s of it)."""
        changed = self._tracking.set(name, next_offset)
        if at_once and self._tracking_timer is not None:
            self._cancel_tracking_timer()  # the flush writes what the timer would have
            self._dirty = True
        if not changed:
            return
        clock = self._clock
        if clock is None or at_once:
            self._dirty = True
        elif self._tracking_timer is None:
            self._tracking_timer = clock.call_later(TRACKING_WRITE_MS, self._tracking_due)

    def _tracking_due(self) -> None:
        """The timer: write the changed offsets; the next sync makes them durable."""
        self._tracking_timer = None
        try:
            with self._log.lock:
                if self._log.closed:
                    return
                self._tracking.write()
        finally:
            self._log.report_losses()
        self._dirty = True

    def _cancel_tracking_timer(self) -> None:
        timer = self._tracking_timer
        if timer is not None:
            self._tracking_timer = None
            timer.cancel()

    # -- durability -----------------------------------------------------------------------
    def flush(self) -> None:
        """Hand buffered appends and changed tracked offsets to the OS."""
        try:
            with self._log.lock:
                if self._log.closed:
                    return
                self._log.flush_locked()
                if self._tracking_timer is None:
                    self._tracking.write()
        finally:
            self._log.report_losses()

    def sync(self) -> None:
        """Make everything appended before this call durable (see SegmentLog)."""
        try:
            sync_collected(self.collect_sync)
        except BaseException:
            self._dirty = True
            raise

    def collect_sync(self, fds: list[int], paths: list[Path], dirs: list[Path]) -> None:
        """sync()'s first half (store/sync.py's Syncable): write the buffered appends
        and tracked offsets to the OS and add what the slow half must fdatasync."""
        try:
            with self._log.lock:
                if self._log.closed:
                    return
                self._dirty = False
                try:
                    self._log.collect_sync_locked(fds, paths)
                    if self._tracking_timer is None:
                        self._tracking.write()
                    self._tracking.collect_sync(paths)
                except BaseException:
                    self._dirty = True
                    raise
                finally:
                    self._log.collect_dirs_locked(dirs)
        finally:
            self._log.report_losses()

    def seal(self) -> None:
        """A clean close is coming: end the write segment's data with a close mark
        (store/segment_log.py), so that the next start appends after it."""
        self._log.seal()

    def close(self, sync: bool = True) -> None:
        if self._log.closed:
            return
        self._cancel_tracking_timer()  # the flush or sync below writes the offsets
        try:
            self._log.seal()
            if sync:
                self.sync()
            else:
                self.flush()
        finally:
            with self._log.lock:
                self._log.close_locked()
            self._log.report_losses()

    def delete(self) -> None:
        """Forget every message and remove the stream's directory."""
        self._cancel_tracking_timer()
        self._segs.clear()
        self._firsts.clear()
        self._bytes = 0
        self._log.delete()

    # -- recovery (store/stream_recovery.py) ---------------------------------------------
    def _recover(self) -> None:
        """Rebuild the segment index from the files; never raises."""
        segs, self._next_offset, self._bytes = recover_stream(
            self._log, self._tracking, self._sequences
        )
        self._segs.extend(segs)
        self._firsts.extend(seg.first_offset for seg in segs)
