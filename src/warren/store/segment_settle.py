"""A classic queue store's ready messages leaving it other than through its read
cursor or an ack: one taken out wherever it is, and a purge.

SegmentStore (store/segment_store.py) calls these for its remove_ready() and
purge(); they are off the delivery path (TTL expiry out of order, overflow,
deduplication, queue.purge). A ready message removed ahead of the cursor is
remembered until the cursor steps over it (store/segment_cursor.py); a purge
drops every ready record, writing acks only where unacknowledged neighbours
keep a file alive. docs/storage.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from warren.core.message import Message
from warren.store.segment_files import SegmentState
from warren.store.segment_log import OFFSET_MASK

if TYPE_CHECKING:
    from warren.store.segment_store import SegmentStore

__all__ = ["purge", "remove_ready"]

_OFFSET_MASK = OFFSET_MASK
# As the store's: this many pending acks force a batch.
_ACK_BATCH = 4096


def remove_ready(store: SegmentStore, seq: int) -> Message | None:
    """Take a ready message out wherever it is, acking it (durable like any ack).

    A requeued message leaves the requeued set. A record at the cursor moves the
    cursor past it; one further on is remembered in its segment's ``removed`` set
    until the cursor steps over it. O(1) apart from reading the record (from the
    read map when it covers it, else one pread). None when ``seq`` is not ready.
    """
    if store._requeued.by_seq:
        msg = store._requeued.take(seq)
        if msg is not None:
            store._ready_count -= 1
            store._ready_bytes -= len(msg.body)
            store.ack(seq)
            return msg
    seg = store._segs.get(seq >> 32)
    off = seq & _OFFSET_MASK
    if seg is None or not seg.unread or off < store._log.data_start(seg.id):
        return None
    cursor = store._cursor
    if cursor.passed(seg, off):
        return None  # shifted (acked or not), or purged
    if cursor.is_dead(seg, off):
        return None
    peeked = store._peeked
    if peeked is not None and peeked[0] == seq:
        store._peeked = None
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
    store._ready_count -= 1
    store._ready_bytes -= b
    if seg.transient_unread:
        store._transient.read(seg, seq, msg.properties, b, False)
    if seg is cursor.seg:
        store._set_detour()
    elif not seg.unread and seg is not store._wseg:
        # Nothing left to read there and nothing will be appended: the cursor
        # never enters it again.
        seg.removed = None
    store.ack(seq)
    return msg


def purge(store: SegmentStore) -> int:
    """Drop every ready message (requeued ones too); unacked ones stay. Returns
    how many were dropped."""
    n = store._ready_count
    if not n:
        return 0
    for seq, msg in store._requeued.clear().items():
        store._ready_count -= 1
        store._ready_bytes -= len(msg.body)
        store.ack(seq)
    store._peeked = None
    cursor = store._cursor
    rseg = cursor.seg
    for seg in list(store._segs.values()):
        if seg.unread:
            if seg is rseg and seg.records - seg.dead - seg.unread > 0:
                # Unacked messages keep this file alive: the purged records need
                # ack entries so that they stay gone after a restart.
                _ack_unread(store, seg)
            else:
                seg.dead += seg.unread
            seg.unread = 0
            seg.unread_bytes = 0
            if seg.transient_unread:
                store._transient.unread_gone(seg)
        seg.skip = None
        seg.removed = None
    store._ready_count = 0
    store._ready_bytes = 0
    cursor.close_map()
    cursor.skip = None
    store._redelivering = False  # nothing below the mark is left to read
    store._detour = False
    for seg in list(store._segs.values()):
        if seg.dead >= seg.records:
            store._drop_segment(seg)  # the write segment too: dropped unwritten
    cursor.reset(store._wseg, store._log.write_pos if store._wseg is not None else 0)
    store._files.dirty = True
    if len(store._acks) >= _ACK_BATCH:
        with store._lock:
            store._files.write_acks_locked()
    return n


def _ack_unread(store: SegmentStore, seg: SegmentState) -> None:
    """Ack every unread record of the read segment (purge with unacked neighbours)."""
    base = seg.id << 32
    acks = store._acks
    for off in store._cursor.live_ahead(seg.unread):
        acks.append(base | off)
    seg.dead += seg.unread  # the file disagreeing with the counters included
