"""Recovery of a classic queue's store: its segment files against their ack files.

When a store opens, each segment the log's scan validates (store/segment_log.py,
CRC per record; damaged bytes kept aside and stepped over, never counted) is
matched with its ack file (store/ack_files.py): acked and (unless asked
otherwise) transient records become dead, damaged ack batches are kept aside
and skipped (their messages come back), an ack file with entries past the data,
at damaged bytes or torn is pruned and rewritten atomically (temp file +
rename), a segment with nothing left is kept as a spare or deleted
(store/segment_spares.py: so is a file whose header says spare, and spare files
are counted), an ack file without its segment is deleted. A segment that cannot be read is left untouched and unserved; a
failure to list the directory starts the queue empty. Also step_over_damage,
what the read path does with a record that stopped checking out, and
scan_segment, which reads ready records' timestamps and properties for the
expiry index after a restart. docs/storage.md has the rules.
"""

from __future__ import annotations

import bisect
import logging
import mmap
import os
import re
import struct
from array import array
from collections.abc import Iterator

from warren.core.message import Message
from warren.core.properties import is_persistent
from warren.store.ack_files import AckFile, encode_acks, read_acks
from warren.store.layout import fsync_directory
from warren.store.records import MIN_RECORD_SIZE, CorruptRecord, decode_record
from warren.store.segment_damage import damage_reason, keep_aside, report, survey
from warren.store.segment_files import NO_SKIP, SegmentState, acks_path
from warren.store.segment_log import MSGS_NAME, RecordScan, SegmentLog
from warren.store.segment_spares import SPARE_NAME

log = logging.getLogger("warren.store")

_ACKS_NAME = re.compile(r"acks\.(\d{10})")
_TMP_NAME = re.compile(r"acks\.\d{10}\.tmp")
# u32 record length, u64 timestamp, u8 exchange length: what scan_segment reads first.
_SCAN_HEAD = struct.Struct(">IQB")
_U32 = struct.Struct(">I")


def recover(
    seglog: SegmentLog, persistent_only: bool, count_transient: bool = False
) -> tuple[dict[int, SegmentState], SegmentState | None]:
    """Rebuild counters from the files; never raises (a broken queue starts empty).

    Returns the segments with records left, by ascending id, and the one to keep
    appending to (None: the next append starts a new segment). With
    ``persistent_only`` transient messages are dropped (acked in the ack file);
    otherwise, with ``count_transient``, those kept are counted
    (SegmentState.transient, store/transient_counts.py).
    """
    directory = seglog.directory
    segs: dict[int, SegmentState] = {}
    where = "directory listing"
    try:
        seg_ids: set[int] = set()
        ack_ids: set[int] = set()
        spare_ids: list[int] = []
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
                continue
            match = SPARE_NAME.fullmatch(name)
            if match is not None:
                spare_ids.append(int(match.group(1)))
        seglog.reserve_ids(max(seg_ids | ack_ids | set(spare_ids), default=0))
        for sid in sorted(spare_ids):
            seglog.spares.found(sid)
        last: RecordScan | None = None
        for sid in sorted(seg_ids):
            where = seglog.msgs_path(sid).name
            try:
                found = _recover_segment(
                    seglog, sid, sid in ack_ids, persistent_only, count_transient
                )
            except Exception:
                log.exception(
                    "%s: cannot recover %s; leaving it untouched, its messages are not served",
                    directory,
                    where,
                )
                continue
            if found is not None:
                seg, last = found
                segs[sid] = seg
        for sid in ack_ids - seg_ids:  # messages deleted, crash before the acks were
            seglog.unlink(acks_path(directory, sid))
        for sid in ack_ids & seg_ids:  # a spare (by its header) or never written: no data
            if sid not in segs and not os.path.lexists(seglog.msgs_path(sid)):
                seglog.unlink(acks_path(directory, sid))
        if seg_ids and max(seg_ids) in segs and last is not None and last.clean:
            # Keep appending to the last segment, after its end mark (a file whose
            # data did not end cleanly, or of version 1, is never written again);
            # opened on the first append.
            wseg = segs[max(seg_ids)]
            seglog.continue_segment(wseg.id, last.end, last.size)
            return segs, wseg
        return segs, None
    except Exception:
        log.exception("%s: recovery failed at %s; the queue starts empty", directory, where)
        seglog.continue_segment(0, 0, 0)
        return {}, None


def _recover_segment(
    seglog: SegmentLog, sid: int, has_acks: bool, persistent_only: bool, count: bool
) -> tuple[SegmentState, RecordScan] | None:
    """Validate one segment (the log's scan) against its ack file; returns (segment,
    the closed scan: where its data ends) or None when the segment is gone (fully
    dead, empty) or left alone (not ours)."""
    scan = seglog.scan(sid)
    if scan is None:
        return None
    size = scan.size
    # Acked offsets as a bitmap over the file's bytes (size/8 bytes, freed after
    # this segment): no Python int per entry, duplicates merge for free.
    acked = bytearray((size >> 3) + 1) if has_acks else bytearray()
    ack_data = b""
    ack_file = AckFile()
    if has_acks:
        ack_data = acks_path(seglog.directory, sid).read_bytes()
        ack_file = read_acks(ack_data)
        for o in ack_file.offsets:
            if o < size:
                acked[o >> 3] |= 1 << (o & 7)

    seg = SegmentState(sid)
    skip: array[int] = array("I")
    gaps: dict[int, int] = {}
    valid_acks: list[int] = []
    dropped: list[int] = []  # transient records: acked now
    try:
        m = scan.map
        for pos, length, p_off, p_len, b_len in scan:
            if p_off < 0:  # damaged bytes, kept aside: stepped over, not a record
                skip.append(pos)
                gaps[pos] = pos + length
                continue
            seg.records += 1
            if acked and acked[pos >> 3] >> (pos & 7) & 1:
                seg.dead += 1
                skip.append(pos)
                valid_acks.append(pos)
            elif persistent_only and m is not None and not is_persistent(m[p_off : p_off + p_len]):
                seg.dead += 1
                skip.append(pos)
                dropped.append(pos)
            else:
                seg.unread += 1
                seg.unread_bytes += b_len
                if (
                    count
                    and not persistent_only
                    and m is not None
                    and not is_persistent(m[p_off : p_off + p_len])
                ):
                    seg.transient_unread += 1
                    seg.transient_unread_bytes += b_len
    finally:
        scan.close()
    del acked

    if seg.dead >= seg.records:  # nothing left to deliver (or an empty segment)
        _unlink_pair(seglog, sid)
        return None

    seg.has_acks = has_acks
    stale = len(ack_file.offsets) - len(valid_acks)
    torn = ack_file.torn_at >= 0
    if stale or torn or ack_file.damaged or ack_file.legacy or dropped:
        path = acks_path(seglog.directory, sid)
        for start, end in ack_file.damaged:
            kept, known = keep_aside(path, start, ack_data[start:end])
            log.error(
                "%s: %s: bytes %d-%d do not check out: kept aside as %s; the acks "
                "they held are lost, so those messages are delivered again",
                seglog.directory,
                path.name,
                start,
                end,
                kept.name,
            )
        if stale or torn:
            log.warning(
                "%s: %s: pruned %d ack entries (past the data, not at a record "
                "boundary, or duplicates)%s",
                seglog.directory,
                path.name,
                stale,
                " (and a torn last entry)" if torn else "",
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
    seg.gaps = gaps if gaps else None
    return seg, scan


def step_over_damage(
    seglog: SegmentLog, seg: SegmentState, m: mmap.mmap, pos: int, end: int, skip: array[int] | None
) -> tuple[tuple[int, int], tuple[int, int]]:
    """The read path met a record that does not check out at ``pos`` of ``seg``
    (mapped as ``m``, its data ending at ``end``; ``skip`` the dead offsets the
    cursor still has to step over): keep the damaged bytes aside, record them as
    gaps in the skip list, count the records left to read. Returns the ready
    messages and bytes the damage took, and the transient records (and their
    bytes) left to read."""
    seed = seglog.file(seg.id).seed
    found = survey(m, pos, end, skip, seg.removed, seed)
    path = seglog.msgs_path(seg.id)
    gaps = seg.gaps if seg.gaps is not None else {}
    for start, stop, before in found.gaps:
        gaps[start] = stop
        reason = damage_reason(m, start, end, seed)
        try:
            kept, known = keep_aside(path, start, m[start:stop])
        except OSError as exc:
            log.error(
                "%s: %s: bytes %d-%d are damaged (%s) and cannot be kept aside (%s): "
                "never delivered, and the file is kept until a restart copies them",
                seglog.directory,
                path.name,
                start,
                stop,
                reason,
                exc,
            )
            seg.records += 1  # never all dead: the file is not deleted
            continue
        report(
            seglog.directory, path.name, start, stop, reason, kept, known, found.records - before
        )
    seg.gaps = gaps
    lost = seg.unread - found.unread
    lost_bytes = seg.unread_bytes - found.unread_bytes
    if lost >= 0:
        seg.dead += lost  # the records the damage took: gone, as if acked
    else:
        seg.records -= lost
    seg.unread = found.unread
    seg.unread_bytes = found.unread_bytes
    seg.skip = found.skip if found.skip else None
    return (lost, lost_bytes), (found.transient, found.transient_bytes)


def keep_unreadable(seglog: SegmentLog, seq: int, data: bytes, reason: str) -> None:
    """A record read back at random (read_message) does not check out: keep
    its bytes aside and say so."""
    path = seglog.msgs_path(seq >> 32)
    off = seq & 0xFFFFFFFF
    try:
        kept, known = keep_aside(path, off, data)
    except OSError as exc:
        log.error(
            "%s: %s: record at offset %d is damaged (%s) and cannot be kept aside: %s",
            seglog.directory,
            path.name,
            off,
            reason,
            exc,
        )
        return
    report(seglog.directory, path.name, off, off + len(data), reason, kept, known, 0)


def read_message(seglog: SegmentLog, segs: dict[int, SegmentState], seq: int) -> Message:
    """The message appended at ``seq`` in a store's log (``segs``: its segments),
    read back at random. KeyError for a segment that is gone; CorruptRecord for
    a record that does not read back, its bytes kept aside first."""
    if seq >> 32 not in segs:
        raise KeyError(seq)
    data = seglog.read(seq)
    if data is None:
        raise CorruptRecord("no record there", seq & 0xFFFFFFFF, None)
    try:
        msg, _ = decode_record(data, 0, len(data), True, seglog.file(seq >> 32).seed)
    except CorruptRecord as exc:
        keep_unreadable(seglog, seq, data, exc.reason)
        raise
    return msg


def read_messages(
    seglog: SegmentLog, segs: dict[int, SegmentState], seqs: list[int]
) -> list[Message | None]:
    """read_message() of each, the log's files opened once per segment
    (SegmentLog.read_many). None where read_message would raise: the caller
    reads that one with it, which sets a damaged record aside, reports it and
    raises as it always does."""
    out: list[Message | None] = []
    sid = -1
    seed = 0
    for i, data in enumerate(seglog.read_many(seqs)):
        seq = seqs[i]
        if data is None or seq >> 32 not in segs:
            out.append(None)
            continue
        if seq >> 32 != sid:
            sid = seq >> 32
            seed = seglog.file(sid).seed
        try:
            msg, _ = decode_record(data, 0, len(data), True, seed)
        except CorruptRecord:
            out.append(None)
            continue
        out.append(msg)
    return out


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
    content = encode_acks(array("I", offsets))
    with open(tmp, "wb") as f:
        f.write(content)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_directory(seglog.directory)
    if seglog.mirror is not None:
        seglog.mirror.replaced(path, content)


def _unlink_pair(seglog: SegmentLog, sid: int) -> None:
    # Messages first (kept as a spare, or deleted): a crash in between leaves an
    # orphan ack file (removed on recovery), never a message file whose acks are gone.
    seglog.retire_file(sid)
    seglog.unlink(acks_path(seglog.directory, sid))


def scan_segment(
    seglog: SegmentLog, seg: SegmentState, pos: int, exchange: bytes | None = None
) -> Iterator[tuple[int, int, bytes]]:
    """(seq, timestamp, raw properties) of ``seg``'s ready records from ``pos`` on
    (only those published to ``exchange`` when given), through a map of its own,
    no Message built and no CRC checked (recovery did): what a queue rebuilds its
    expiry index and deduplication keys from after a restart (scan_ready)."""
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
        gaps = seg.gaps
        removed = seg.removed
        i = bisect.bisect_left(skip, pos)
        n = len(skip)
        check = n > i or removed is not None
        while left and pos + MIN_RECORD_SIZE <= size:
            if check:
                while i < n and skip[i] < pos:
                    i += 1
                if i < n and skip[i] == pos and gaps is not None and pos in gaps:
                    pos = gaps[pos]  # damaged bytes: no length field to trust
                    continue
            length, timestamp, ex_len = head(m, pos)
            if length < MIN_RECORD_SIZE:
                break  # validated data never has this; stop rather than spin
            if check and ((i < n and skip[i] == pos) or (removed is not None and pos in removed)):
                pos += length
                continue
            left -= 1
            if exchange is not None and m[pos + 13 : pos + 13 + ex_len] != exchange:
                pos += length
                continue
            o = pos + 14 + ex_len + m[pos + 13 + ex_len]
            p_len = u32(m, o)[0]
            yield base | pos, timestamp, m[o + 4 : o + 4 + p_len]
            pos += length
    finally:
        m.close()
