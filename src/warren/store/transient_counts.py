"""How many transient messages (delivery mode other than 2) a durable queue's
segment store holds, and their body bytes.

The management API's ``messages_persistent`` and ``message_bytes_persistent``
(and the Prometheus families of the same name) are a durable queue's live
messages, ready and unacknowledged, minus its live transient ones
(Queue.persistent_counts). The store counts those in two parts:

- the transient records still unread in its segment files: per segment
  (SegmentState's ``transient_unread`` and ``transient_unread_bytes``), so that
  a purge, damage stepped over, a failed write-out or an unreadable file take
  out exactly theirs, with a total;
- the transient messages read or handed out and not yet dead (unacked, or
  requeued): their body sizes by seq (``held``). A consumer's channel holds
  each of those messages anyway; ready messages cost nothing in RAM.

A message's delivery mode is looked at when it is appended (a comparison for
the commonest persistent property list) and, while its segment has transient
records unread, when it is read; an ack only pops ``held`` when it is not
empty. A queue whose messages are all persistent pays that comparison per
append and nothing else. docs/storage.md has the rules.
"""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING, Any

from warren.core.properties import PERSISTENT_PROPERTIES, is_persistent, is_transient
from warren.store.records import CorruptRecord, inspect_record

if TYPE_CHECKING:
    from warren.core.store import StoredRun
    from warren.store.segment_files import SegmentState

__all__ = [
    "PERSISTENT_PROPERTIES",
    "LostRecords",
    "TransientCounts",
    "is_persistent",
    "is_transient",
    "lost_records",
]


class TransientCounts:
    """A segment store's live transient messages: ``unread`` (and its bytes),
    the sum of its segments' ``transient_unread``, and ``held``, seq -> body
    size of those read or handed out and not dead yet.

    The store calls these where a record changes state, behind its own cheap
    checks (a segment without transient records unread, an empty ``held``)."""

    __slots__ = ("unread", "unread_bytes", "held", "held_bytes")

    def __init__(self) -> None:
        self.unread = 0
        self.unread_bytes = 0
        self.held: dict[int, int] = {}
        self.held_bytes = 0

    def total(self) -> tuple[int, int]:
        """The live transient messages and their body bytes."""
        return self.unread + len(self.held), self.unread_bytes + self.held_bytes

    def recovered(self, seg: SegmentState) -> None:
        self.unread += seg.transient_unread
        self.unread_bytes += seg.transient_unread_bytes

    def appended(self, seg: SegmentState, b: int) -> None:
        """A transient record of ``b`` body bytes was appended to ``seg`` (unread)."""
        seg.transient_unread += 1
        seg.transient_unread_bytes += b
        self.unread += 1
        self.unread_bytes += b

    def handed_out(self, seq: int, b: int) -> None:
        """The transient message ``seq`` (``b`` body bytes) went to a consumer at
        once (append_shifted, append_run)."""
        self.held[seq] = b
        self.held_bytes += b

    def read(self, seg: SegmentState, seq: int, props: bytes, b: int, held: bool) -> None:
        """The record ``seq`` of ``seg`` (properties ``props``, ``b`` body bytes)
        is no longer unread (``seg.unread`` counts it no more), while ``seg`` has
        transient records unread: one of them if it is transient (certainly when
        all those unread were). ``held``: it was shifted (not taken out)."""
        if seg.transient_unread > seg.unread or is_transient(props):
            seg.transient_unread -= 1
            seg.transient_unread_bytes -= b
            self.unread -= 1
            self.unread_bytes -= b
            if held:
                self.held[seq] = b
                self.held_bytes += b

    def read_many(self, seg: SegmentState, count: int, b: int) -> None:
        """``count`` transient records of ``seg`` (``b`` body bytes) are no longer
        unread: a span of records taken at once (SegmentStore.take_span, which
        hands out the held ones)."""
        seg.transient_unread -= count
        seg.transient_unread_bytes -= b
        self.unread -= count
        self.unread_bytes -= b

    def span_taken(
        self, seg: SegmentState, buf: Any, taken: StoredRun, body_bytes: int, acked: bool
    ) -> None:
        """A span's records ``taken`` (SegmentStore.take_span, ``seg.unread`` no
        longer counting them; ``buf`` their segment's map) while ``seg`` has
        transient records unread: its transient ones are no longer unread, and
        held until acked (none when ``acked``: a no-ack consumer's, acked at
        once). All of them when every unread record was transient; else each
        record's properties are looked at where it lies."""
        n = len(taken)
        offsets, sizes = taken.offsets, taken.sizes
        if seg.transient_unread >= seg.unread + n:
            which: range | list[int] = range(n)
            self.read_many(seg, n, body_bytes)
        else:
            which = []
            b = 0
            for k in range(n):
                off = offsets[k]
                pl = off + 14 + buf[off + 12]  # past the exchange: the routing key's
                pl += buf[pl - 1]  # past the routing key: the properties' length
                p_len = int.from_bytes(buf[pl : pl + 4], "big")
                if is_transient(buf[pl + 4 : pl + 4 + p_len]):
                    which.append(k)
                    b += sizes[k]
            self.read_many(seg, len(which), b)
        if not acked:
            self.hand_out(seg.id << 32, offsets, sizes, which)

    def hand_out(
        self, base: int, offsets: array[int], sizes: array[int], which: range | list[int]
    ) -> None:
        """handed_out for records ``which`` of a span (seqs ``base | offsets[k]``)."""
        held = self.held
        b = 0
        for k in which:
            size = sizes[k]
            held[base | offsets[k]] = size
            b += size
        self.held_bytes += b

    def dead_run(self, base: int, offsets: array[int]) -> None:
        """dead() for the seqs ``base | offset`` of a run's acks."""
        held = self.held
        b = 0
        for off in offsets:
            size = held.pop(base | off, -1)
            if size >= 0:
                b += size
        self.held_bytes -= b

    def dead(self, seq: int) -> None:
        """``seq``, held, is acked (or otherwise gone): counted no more if transient."""
        b = self.held.pop(seq, -1)
        if b >= 0:
            self.held_bytes -= b

    def unread_gone(self, seg: SegmentState) -> None:
        """Every unread record of ``seg`` is dead (purged, lost, or its file
        unreadable), or was counted again (damage)."""
        self.unread -= seg.transient_unread
        self.unread_bytes -= seg.transient_unread_bytes
        seg.transient_unread = seg.transient_unread_bytes = 0

    def unread_found(self, seg: SegmentState, count: int, b: int) -> None:
        """``seg``'s unread transient records are ``count`` of ``b`` bytes now
        (what damage left of them)."""
        self.unread_gone(seg)
        seg.transient_unread = count
        seg.transient_unread_bytes = b
        self.unread += count
        self.unread_bytes += b

    def reset(self) -> None:
        self.unread = self.unread_bytes = self.held_bytes = 0
        self.held.clear()


class LostRecords:
    """What a failed write-out dropped (records from offset ``start`` of a
    segment): how many, how many of them (and their body bytes) were still
    ready, and the transient ones among those."""

    __slots__ = ("records", "ready", "ready_bytes", "transient", "transient_bytes")

    def __init__(self) -> None:
        self.records = 0
        self.ready = 0
        self.ready_bytes = 0
        self.transient = 0
        self.transient_bytes = 0


def lost_records(
    data: bytes, start: int, ready_from: int, removed: set[int] | None, count: bool
) -> LostRecords:
    """The records of ``data`` (from offset ``start`` of its segment): ready are
    those at or past ``ready_from`` and not taken out by remove_ready; with
    ``count``, which of those are transient."""
    lost = LostRecords()
    pos = 0
    size = len(data)
    while pos < size:
        try:
            length, p_off, p_len, b_len = inspect_record(data, pos, size, False)
        except CorruptRecord:
            break  # not what this process encoded: cannot happen
        off = start + pos
        lost.records += 1
        if off >= ready_from and (removed is None or off not in removed):
            lost.ready += 1
            lost.ready_bytes += b_len
            if count and not is_persistent(data[p_off : p_off + p_len]):
                lost.transient += 1
                lost.transient_bytes += b_len
        pos += length
    return lost
