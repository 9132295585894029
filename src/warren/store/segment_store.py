"""A classic queue's view of a segment log: one read cursor, acks and requeues.

Messages are appended as records to the queue's segment log
(warren.store.segment_log) and read back sequentially through a memory map by
one cursor (store/segment_cursor.py), so the broker keeps no Python object per
ready message: RAM stays flat however long the queue grows, and the kernel
decides what stays cached. Every record's CRC is checked as it is read: one
damaged on disk is kept aside and stepped over, never served
(store/segment_damage.py). Messages that consumers give back wait in memory
(store/requeued.py). Acknowledgements are appended as u32 record offsets to
``acks.<id>`` next to the log's ``msgs.<id>``, in checksummed batches
(store/ack_files.py); a segment whose records are all acknowledged is dropped
from the log.

The store is one class made of parts that each hold one idea: the files and
their durability (SegmentFiles, store/segment_files.py), the read side (the
cursor, a peeked record, redelivered records ahead: SegmentReader,
store/segment_reader.py, over store/segment_cursor.py), what failed writes and
damage do to the counters and the cursor (SegmentFaults,
store/segment_faults.py), ready messages taken out other than by the cursor
(SegmentRemovals, store/segment_settle.py), the messages given back
(store/requeued.py) and, for a durable queue's persistent counts, its live
transient messages (store/transient_counts.py). The store itself appends,
acks, requeues and keeps the segment table. The ready counts are an object
the store shares with the parts that change them (ReadyCounts), and what
those parts ask of the store itself is a narrow interface it implements
(SegmentOwner; both store/segment_parts.py). What a store finds when it
opens, and a message read back at random, are store/segment_recovery.py's.
docs/storage.md describes the formats, recovery and durability in full.

Threading: everything except sync() and flush() belongs to one thread (the event
loop). sync() may run in a worker thread while that thread keeps appending; the
log's lock guards only what the two share (file handles, pending acks, the sync
bookkeeping), so the per-message append/shift/ack paths take no lock.
"""

from __future__ import annotations

import logging
from array import array
from collections.abc import Callable, Iterator
from pathlib import Path

from warren.core.message import Message, MessageRun
from warren.core.store import StoredRun, StoreSpan
from warren.store.disk_budget import UNMETERED, DiskBudget
from warren.store.mirror import FileMirror
from warren.store.records import (
    encode_message_record,
    encode_run,
)
from warren.store.requeued import RequeuedMessages
from warren.store.segment_faults import SegmentFaults
from warren.store.segment_files import SegmentFiles, SegmentState
from warren.store.segment_log import OFFSET_MASK, SEQ_BITS
from warren.store.segment_parts import ReadyCounts
from warren.store.segment_reader import SegmentReader
from warren.store.segment_recovery import read_message, read_messages, recover
from warren.store.segment_settle import SegmentRemovals
from warren.store.segment_shared import SegmentParts
from warren.store.transient_counts import (
    PERSISTENT_PROPERTIES,
    TransientCounts,
    is_persistent,
    is_transient,
)

__all__ = ["SEQ_BITS", "SegmentStore"]

log = logging.getLogger("warren.store")

_OFFSET_MASK = OFFSET_MASK
# Acks are queued in memory and written to their ack files in batches; this many
# pending acks force a batch without waiting for flush()/sync().
_ACK_BATCH = 4096


class SegmentStore:
    """MessageStore for one queue, kept in segment files under ``directory``.

    ``seq`` is ``(segment id << 32) | offset of the record``, so sequence order is
    file order and a requeued message sorts back into its original position.

    Durability: appends and acks reach the OS on flush() (and whenever the write
    buffer or the ack batch fills); sync() additionally fdatasyncs them. A store
    reopened after a crash recovers exactly what reached the disk.
    """

    def __init__(
        self,
        directory: Path,
        segment_size: int = 8 * 1024 * 1024,
        persistent_only_on_recovery: bool = True,
        delivered_mark: int | None = None,
        preallocate: bool = True,
        format_version: int = 2,
        count_transient: bool = True,
        *,
        budget: DiskBudget = UNMETERED,
        mirror: FileMirror | None = None,
    ) -> None:
        """``delivered_mark``: delivered_mark() as a clean shutdown recorded it (the
        records below it that are still here were delivered before); None after a
        crash, when any recovered record may have been: all of them come back
        redelivered, as RabbitMQ's do. ``preallocate`` and ``format_version``:
        the segment log's (store/segment_log.py). ``count_transient``: count the
        live transient messages (``transient()``; store/transient_counts.py),
        for a durable queue's persistent counts. ``budget`` and ``mirror``: the
        data directory's (store/layout.py's DataDir), given by the StoreFactory."""
        files = self._files = SegmentFiles(
            directory, segment_size, preallocate, format_version, budget, mirror
        )
        # The parts the hot paths use, held directly (the same objects as files').
        self._log = files.log
        self._dir = files.directory
        self._acks = files.acks
        self._lock = files.lock
        self._segs, self._wseg = recover(self._log, persistent_only_on_recovery, count_transient)
        files.segs = self._segs
        # Messages given back by consumers, ready again ahead of the log's.
        self._requeued = RequeuedMessages()
        #: The ready messages and their body bytes (shared with the parts below).
        self._ready = ReadyCounts()
        #: Told (count, bytes) when ready messages are dropped by a failed write-out
        #: (a PriorityStore keeps running totals of its levels).
        self.on_ready_lost: Callable[[int, int], None] | None = None
        #: Told the messages whose records a failed write-out dropped: their
        #: queue forgets their deduplication keys (Queue._keys_dropped).
        self.on_dropped: Callable[[list[Message]], None] | None = None
        # Whether live transient records are counted, and their counts.
        self._count = count_transient
        self._transient = TransientCounts()
        ready = self._ready
        for seg in self._segs.values():
            ready.count += seg.unread
            ready.bytes += seg.unread_bytes
            self._transient.recovered(seg)
        # The read side: the cursor, a peeked record, redelivered records ahead.
        reader = self._reader = SegmentReader(
            self._log, self._segs, self._requeued, ready, self._transient, delivered_mark
        )
        # Failed write-outs and damage, and ready messages taken out other than
        # by the cursor (off the hot paths): parts given what they work on.
        parts = SegmentParts(
            files, self._segs, reader, ready, self._transient, self._requeued, count_transient, self
        )
        self._faults = reader.faults = SegmentFaults(parts)
        self._log.on_lost = self._faults.records_lost
        self._removals = SegmentRemovals(parts)

    def __repr__(self) -> str:
        return f"<SegmentStore {str(self._dir)!r} ready={self._ready.count}>"

    # -- MessageStore ---------------------------------------------------------------------
    @property
    def ready_count(self) -> int:
        return self._ready.count

    @property
    def ready_bytes(self) -> int:
        return self._ready.bytes

    @property
    def dirty(self) -> bool:
        """Whether anything was appended, acked or purged since the last sync()."""
        return self._files.dirty

    def transient(self) -> tuple[int, int]:
        """Live transient messages (ready and unacknowledged) and their body bytes;
        (0, 0) when the store does not count them."""
        return self._transient.total()

    @property
    def directory(self) -> Path:
        return self._dir

    def append(self, msg: Message) -> int:
        body = msg.body
        log = self._log
        rec = encode_message_record(msg, log.seed)
        if log.make_room(len(rec)):  # a new segment: another salt
            rec = encode_message_record(msg, log.seed)
        seq = log.put(rec)
        seg = self._wseg
        if seg is None or seg.id != seq >> 32:
            seg = self._start_segment(seq >> 32)
        b = len(body)
        seg.records += 1
        seg.unread += 1
        seg.unread_bytes += b
        ready = self._ready
        ready.count += 1
        ready.bytes += b
        if self._count:
            props = msg.properties
            if props != PERSISTENT_PROPERTIES and not is_persistent(props):
                self._transient.appended(seg, b)
        self._files.dirty = True  # after the write: sync() clears it before flushing
        return seq

    def _start_segment(self, segment_id: int) -> SegmentState:
        """The log began a new segment: count it, and let the one before go if done."""
        old = self._wseg
        seg = self._wseg = SegmentState(segment_id)
        self._segs[segment_id] = seg
        if old is not None and old.dead >= old.records:
            self.drop_segment(old)
        return seg

    def append_shifted(self, msg: Message) -> int:
        """Append a message that is handed to a consumer at once.

        It is written like any other (a requeue puts it back in its place, a restart
        finds it unless acked) but lands behind the read cursor, so it is never read
        back from the file. Only while nothing is ready: otherwise it would overtake.
        """
        if self._ready.count:
            raise ValueError("append_shifted needs an empty backlog")
        seq = self.append(msg)
        seg = self._wseg
        assert seg is not None
        self._reader.behind_write(seg)
        b = len(msg.body)
        seg.unread -= 1
        seg.unread_bytes -= b
        ready = self._ready
        ready.count -= 1
        ready.bytes -= b
        if seg.transient_unread:  # this message (nothing else was ready): transient
            t = self._transient
            t.unread_gone(seg)
            t.handed_out(seq, b)
        return seq

    def append_run(self, run: MessageRun, start: int, stop: int) -> StoredRun | None:
        """Messages ``start .. stop - 1`` of a run, handed to a consumer at once:
        append_shifted for all of them, encoded together (in C for the C run
        type) and written in one piece, so they share one segment."""
        if self._ready.count:
            raise ValueError("append_run needs an empty backlog")
        seg, stored = self._put_run(run, start, stop)
        if self._count and stored.persistent != stop - start:  # transient: held from now on
            t = self._transient
            base = stored.segment << 32
            for k in _transient_in_run(run, start, stored):
                t.handed_out(base | stored.offsets[k], stored.sizes[k])
        self._reader.behind_write(seg)
        return stored

    def append_ready_run(self, run: MessageRun, start: int, stop: int) -> StoredRun | None:
        """Messages ``start .. stop - 1`` of a run appended as append() would one by
        one (ready, behind whatever waits), in one write."""
        seg, stored = self._put_run(run, start, stop)
        n = stop - start
        size = sum(stored.sizes)
        seg.unread += n
        seg.unread_bytes += size
        ready = self._ready
        ready.count += n
        ready.bytes += size
        if self._count and stored.persistent != n:  # transient: unread in the segment
            for k in _transient_in_run(run, start, stored):
                self._transient.appended(seg, stored.sizes[k])
        return stored

    def _put_run(
        self, run: MessageRun, start: int, stop: int
    ) -> tuple[SegmentState, StoredRun]:
        """The records of a run's messages, encoded together and written in one
        piece (one segment), counted in their segment."""
        log = self._log
        timestamp = run.timestamp
        recs, offsets, sizes, persistent = encode_run(
            run.raw, start, stop, run.ex_rk, timestamp, log.write_pos, log.seed
        )
        if log.make_room(len(recs)):  # a new segment: another salt, other offsets
            recs, offsets, sizes, persistent = encode_run(
                run.raw, start, stop, run.ex_rk, timestamp, log.write_pos, log.seed
            )
        seq = log.put(recs)
        sid = seq >> 32
        seg = self._wseg
        if seg is None or seg.id != sid:
            seg = self._start_segment(sid)
        seg.records += stop - start
        self._files.dirty = True
        return seg, StoredRun(sid, offsets, sizes, persistent)

    # -- reading in order (SegmentReader, store/segment_reader.py) ------------------------
    def shift(self) -> tuple[int, Message, bool] | None:
        return self._reader.shift()

    def span(self) -> StoreSpan | None:
        """The ready records from the cursor on, framed at once (SegmentReader.span)."""
        return self._reader.span()

    def take_span(self, span: StoreSpan, taken: StoredRun, acked: bool) -> None:
        self._reader.take_span(span, taken, acked)

    def peek(self) -> tuple[int, Message, bool] | None:
        """The message shift() returns next, left in place (SegmentReader.peek)."""
        return self._reader.peek()

    def is_ready(self, seq: int) -> bool:
        """Whether ``seq`` names a ready message (SegmentReader.is_ready)."""
        return self._reader.is_ready(seq)

    def scan_ready(self, exchange: str | None = None) -> Iterator[tuple[int, int, bytes]]:
        """(seq, timestamp, raw properties) of each ready message, in shift order
        (SegmentReader.scan_ready)."""
        return self._reader.scan_ready(exchange)

    def delivered_marks(self) -> dict[Path, int]:
        """{directory: mark} below which every record still here was delivered
        (SegmentReader.delivered_marks)."""
        return self._reader.delivered_marks()

    # -- reading at random ----------------------------------------------------------------
    def read(self, seq: int) -> Message:
        """The message appended at ``seq``, read from its segment file (random
        access: store/segment_recovery.py's read_message). For a delayed exchange
        and for messages a run or span handed out; KeyError for a segment that is
        gone, CorruptRecord (the bytes kept aside) for a record that does not read back."""
        return read_message(self._log, self._segs, seq)

    def read_many(self, seqs: list[int]) -> list[Message | None]:
        """read() of each message, each segment file opened once (read_messages);
        None where read() would raise: the caller reads that one with read()."""
        return read_messages(self._log, self._segs, seqs)

    def close(self, sync: bool = True) -> None:
        """Write everything out, the write segment's data ended by a close mark (and
        fdatasync it unless ``sync`` is False), release files."""
        if self._log.closed:
            return
        try:
            self._log.seal()
            if sync:
                self.sync()
                self.sync_acks()
            else:
                self.flush()
        finally:
            with self._lock:
                self._log.close_locked()
            self._log.report_losses()
            self._reader.cursor.close_map()
            if self._acks:
                log.error(
                    "%s: %d acks could not be written: those messages will be "
                    "delivered again after a restart",
                    self._dir,
                    len(self._acks),
                )

    def delete(self) -> None:
        """Forget every message and remove the queue's directory."""
        with self._lock:
            self._acks.clear()
        self._log.delete()
        self._reader.clear()
        self._segs.clear()
        self._requeued.clear()
        self._wseg = None
        self._ready.reset()
        self._transient.reset()

    # -- settling: acks, requeues, removals, purge ----------------------------------------
    def ack(self, seq: int) -> None:
        seg = self._segs.get(seq >> 32)
        if seg is None:
            return
        t = self._transient
        if t.held:
            t.dead(seq)
        self._acks.append(seq)
        self._files.dirty = True
        seg.dead += 1
        if seg.dead >= seg.records and seg is not self._wseg:
            self.drop_segment(seg)
        elif len(self._acks) >= _ACK_BATCH:
            with self._lock:
                self._files.write_acks_locked()

    def ack_run(self, segment: int, offsets: array[int]) -> None:
        seg = self._segs.get(segment)
        if seg is None or not offsets:
            return
        t = self._transient
        if t.held:
            t.dead_run(segment << 32, offsets)
        self._acks.append((segment, offsets))
        self._files.dirty = True
        seg.dead += len(offsets)
        if seg.dead >= seg.records and seg is not self._wseg:
            self.drop_segment(seg)
        elif len(self._acks) >= _ACK_BATCH:
            with self._lock:
                self._files.write_acks_locked()

    def requeue(self, seq: int, msg: Message) -> None:
        if self._faults.lost_from and self._faults.cut_off(seq):
            self.ack(seq)  # never stored (its publisher got a nack): gone
            return
        self._requeued.add(seq, msg)
        ready = self._ready
        ready.count += 1
        ready.bytes += len(msg.body)

    def remove_ready(self, seq: int) -> Message | None:
        """Take a ready message out wherever it is, acking it (durable like any ack):
        store/segment_settle.py's SegmentRemovals."""
        return self._removals.remove_ready(seq)

    def purge(self) -> int:
        """Drop every ready message (store/segment_settle.py's purge)."""
        return self._removals.purge()

    # -- for its parts (store/segment_parts.py's SegmentOwner) ----------------------------
    def write_segment(self) -> SegmentState | None:
        """The segment appends go to, or None before the next append."""
        return self._wseg

    def forget_write_segment(self) -> None:
        """The log closed the write segment itself (a failed write-out)."""
        self._wseg = None

    def retire_write_segment(self) -> None:
        """Close the write segment; the next append starts a new one."""
        self._log.retire()
        self._wseg = None

    def drop_segment(self, seg: SegmentState) -> None:
        """Delete a fully acknowledged segment (messages first, so acks never go missing)."""
        self._reader.left(seg)
        with self._lock:
            if self._log.closed or self._segs.pop(seg.id, None) is None:
                return
            if seg is self._wseg:
                self._wseg = None
            self._files.drop_locked(seg.id)
        self._faults.lost_from.pop(seg.id, None)
        if seg.transient_unread:  # never expected (every record is dead)
            self._transient.unread_gone(seg)

    # -- files and durability (SegmentFiles) ----------------------------------------------
    def flush(self) -> None:
        """Hand buffered appends and acks to the OS (no fsync): the sync=false mode."""
        self._files.flush()

    def seal(self) -> None:
        """A clean close is coming: end the write segment's data with a close mark."""
        self._files.seal()

    def sync(self) -> None:
        """Make everything appended before this call durable (SegmentFiles.sync)."""
        self._files.sync()

    def collect_sync(self, fds: list[int], paths: list[Path], dirs: list[Path]) -> None:
        """sync()'s first half, for the group commit (SegmentFiles.collect_sync)."""
        self._files.collect_sync(fds, paths, dirs)

    def sync_acks(self) -> None:
        """fdatasync the ack files written since the last call (off the confirm path)."""
        self._files.sync_acks()

    def lost_between(self, first: int, last: int) -> bool:
        """Whether appends of those write generations were dropped by a failed
        write-out (store/disk_budget.py; GroupSync asks before a confirm)."""
        return self._files.lost_between(first, last)


def _transient_in_run(run: MessageRun, start: int, stored: StoredRun) -> list[int]:
    """The indexes (from ``start``) of a stored run's transient messages."""
    n = len(stored)
    if not stored.persistent:
        return list(range(n))
    raw = run.raw
    return [k for k in range(n) if is_transient(raw.properties(start + k))]
