"""Recovery of a classic queue's store: its segment files against their ack files.

When a store opens, each segment the log's scan validates (store/segment_log.py,
CRC per record) is matched with its ack file: acked, corrupt and (unless asked
otherwise) transient records become dead, an ack file with entries past the data
or torn is pruned and rewritten atomically (temp file + rename), a segment with
nothing left is deleted, an ack file without its segment too. A segment that
cannot be read is left untouched and unserved; a failure to list the directory
starts the queue empty. Also scan_segment, which reads ready records' timestamps
and properties for the expiry index after a restart. docs/storage.md has the
rules.
"""

from __future__ import annotations

import bisect
import logging
import os
import re
import struct
from array import array
from collections.abc import Iterator

from warren.core.properties import peek_delivery_mode
from warren.store.layout import fsync_directory
from warren.store.records import MIN_RECORD_SIZE
from warren.store.segment_files import (
    NO_SKIP,
    SegmentState,
    acks_path,
    offsets_from_bytes,
    offsets_to_bytes,
)
from warren.store.segment_log import MSGS_NAME, SegmentLog

log = logging.getLogger("warren.store")

_ACKS_NAME = re.compile(r"acks\.(\d{10})")
_TMP_NAME = re.compile(r"acks\.\d{10}\.tmp")
# u32 record length, u64 timestamp, u8 exchange length: what scan_segment reads first.
_SCAN_HEAD = struct.Struct(">IQB")
_U32 = struct.Struct(">I")


def recover(
    seglog: SegmentLog, persistent_only: bool
) -> tuple[dict[int, SegmentState], SegmentState | None]:
    """Rebuild counters from the files; never raises (a broken queue starts empty).

    Returns the segments with records left, by ascending id, and the one to keep
    appending to (None: the next append starts a new segment). With
    ``persistent_only`` transient messages are dropped (acked in the ack file).
    """
    directory = seglog.directory
    segs: dict[int, SegmentState] = {}
    where = "directory listing"
    try:
        seg_ids: set[int] = set()
        ack_ids: set[int] = set()
        for name in os.listdir(directory):
            if _TMP_NAME.fullmatch(name):
                seglog.unlink(directory / name)  # an interrupted ack-file rewrite
                continue
            match = MSGS_NAME.fullmatch(name)
            if match is not None:
                seg_ids.add(int(match.group(1)))
                continue
            match = _ACKS_NAME.fullmatch(name)
            if match is not None:
                ack_ids.add(int(match.group(1)))
        seglog.reserve_ids(max(seg_ids | ack_ids, default=0))
        last_size = 0
        for sid in sorted(seg_ids):
            where = seglog.msgs_path(sid).name
            try:
                found = _recover_segment(seglog, sid, sid in ack_ids, persistent_only)
            except Exception:
                log.exception(
                    "%s: cannot recover %s; leaving it untouched, its messages are not served",
                    directory,
                    where,
                )
                continue
            if found is not None:
                seg, last_size = found
                segs[sid] = seg
        for sid in ack_ids - seg_ids:  # messages deleted, crash before the acks were
            seglog.unlink(acks_path(directory, sid))
        if seg_ids and max(seg_ids) in segs:
            # Keep appending to the last segment; opened on the first append.
            wseg = segs[max(seg_ids)]
            seglog.continue_segment(wseg.id, last_size)
            return segs, wseg
        return segs, None
    except Exception:
        log.exception("%s: recovery failed at %s; the queue starts empty", directory, where)
        seglog.continue_segment(0, 0)
        return {}, None


def _recover_segment(
    seglog: SegmentLog, sid: int, has_acks: bool, persistent_only: bool
) -> tuple[SegmentState, int] | None:
    """Validate one segment (the log's scan) against its ack file; returns (segment,
    data size) or None when the segment is gone (fully dead, empty) or left alone
    (not ours)."""
    scan = seglog.scan(sid)
    if scan is None:
        return None
    size = scan.size
    # Acked offsets as a bitmap over the file's bytes (size/8 bytes, freed after
    # this segment): no Python int per entry, duplicates merge for free.
    acked = bytearray((size >> 3) + 1) if has_acks else bytearray()
    ack_entries = 0
    ack_torn = False
    if has_acks:
        data = acks_path(seglog.directory, sid).read_bytes()
        ack_torn = len(data) % 4 != 0
        offsets = offsets_from_bytes(data)
        ack_entries = len(offsets)
        for o in offsets:
            if o < size:
                acked[o >> 3] |= 1 << (o & 7)
        del offsets, data

    seg = SegmentState(sid)
    skip: array[int] = array("I")
    valid_acks: list[int] = []
    dropped: list[int] = []  # transient records: acked now
    try:
        m = scan.map
        for pos, _length, p_off, p_len, b_len in scan:
            seg.records += 1
            if acked and acked[pos >> 3] >> (pos & 7) & 1:
                seg.dead += 1
                skip.append(pos)
                valid_acks.append(pos)
            elif p_off < 0:  # corrupt, stepped over
                seg.dead += 1
                skip.append(pos)
            elif persistent_only and m is not None and not is_persistent(m[p_off : p_off + p_len]):
                seg.dead += 1
                skip.append(pos)
                dropped.append(pos)
            else:
                seg.unread += 1
                seg.unread_bytes += b_len
    finally:
        scan.close()
    size = scan.size

    if seg.dead >= seg.records:  # nothing left to deliver (or an empty segment)
        _unlink_pair(seglog, sid)
        return None

    seg.has_acks = has_acks
    stale = ack_entries - len(valid_acks)
    if stale or ack_torn or dropped:
        if stale or ack_torn:
            log.warning(
                "%s: %s: pruned %d ack entries (past the data, not at a record "
                "boundary, or duplicates)%s",
                seglog.directory,
                acks_path(seglog.directory, sid).name,
                stale,
                " (and a torn last entry)" if ack_torn else "",
            )
        if dropped:
            log.info(
                "%s: %s: dropped %d transient messages",
                seglog.directory,
                seglog.msgs_path(sid).name,
                len(dropped),
            )
        _rewrite_acks(seglog, sid, sorted(valid_acks + dropped))
        seg.has_acks = bool(valid_acks or dropped)
    seg.skip = skip if skip else None
    return seg, size


def is_persistent(raw_properties: bytes) -> bool:
    """Whether a record's properties say delivery-mode 2 (unreadable ones: yes)."""
    # Fast path: one flags word and delivery-mode is the first property present
    # (no content-type, content-encoding or headers): it follows the flags word.
    if len(raw_properties) >= 3 and raw_properties[0] & 0xF0 == 0x10 and not raw_properties[1] & 1:
        return raw_properties[2] == 2
    try:
        return peek_delivery_mode(raw_properties) == 2
    except Exception:  # unreadable properties: keep the message rather than lose it
        return True


def _rewrite_acks(seglog: SegmentLog, sid: int, offsets: list[int]) -> None:
    """Replace an ack file atomically (temp file + rename), durably before the store
    appends anything: a pruned entry points past the data, where the next appends
    go, and if a power cut brought it back it would hide a confirmed message."""
    path = acks_path(seglog.directory, sid)
    if not offsets:
        seglog.unlink(path)
        fsync_directory(seglog.directory)
        return
    tmp = path.with_name(path.name + ".tmp")
    content = offsets_to_bytes(offsets)
    with open(tmp, "wb") as f:
        f.write(content)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_directory(seglog.directory)
    if seglog.mirror is not None:
        seglog.mirror.replaced(path, content)


def _unlink_pair(seglog: SegmentLog, sid: int) -> None:
    # Messages first: a crash in between leaves an orphan ack file (removed on
    # recovery), never a message file whose acks are gone.
    seglog.unlink(seglog.msgs_path(sid))
    seglog.unlink(acks_path(seglog.directory, sid))


def scan_segment(
    seglog: SegmentLog, seg: SegmentState, pos: int
) -> Iterator[tuple[int, int, bytes]]:
    """(seq, timestamp, raw properties) of ``seg``'s ready records from ``pos`` on,
    through a map of its own, no Message built and no CRC checked (recovery did):
    what a queue rebuilds its expiry index from after a restart (scan_ready)."""
    m = seglog.map(seg.id)
    if m is None:
        return
    size = len(m)
    try:
        left = seg.unread
        base = seg.id << 32
        head = _SCAN_HEAD.unpack_from
        u32 = _U32.unpack_from
        skip = seg.skip if seg.skip is not None else NO_SKIP
        removed = seg.removed
        i = bisect.bisect_left(skip, pos)
        n = len(skip)
        check = n > i or removed is not None
        while left and pos + MIN_RECORD_SIZE <= size:
            length, timestamp, ex_len = head(m, pos)
            if length < MIN_RECORD_SIZE:
                break  # validated data never has this; stop rather than spin
            if check:
                while i < n and skip[i] < pos:
                    i += 1
                if (i < n and skip[i] == pos) or (removed is not None and pos in removed):
                    pos += length
                    continue
            o = pos + 14 + ex_len + m[pos + 13 + ex_len]
            p_len = u32(m, o)[0]
            yield base | pos, timestamp, m[o + 4 : o + 4 + p_len]
            left -= 1
            pos += length
    finally:
        m.close()
