"""A stream's segments counted at open, from its files (StreamStore._recover).

The segment log scans each file (damaged bytes kept aside); here its records
become offsets: a segment's first offset is the stored x-stream-offset of its
first record, and the first record after damaged bytes tells how many offsets
the damage took. A chunk record's trailer gives its publishers' last
publishing ids (StreamStore.publisher_sequence). Run once per open, so not
compiled: the per-message path (append, cursors) never comes here.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from warren.store.records import chunk_at
from warren.store.segment_log import MSGS_NAME, RecordScan, SegmentLog
from warren.store.stream_records import RECORD_TS, chunk_count, parse_trailers, record_offsets
from warren.store.stream_segment import StreamSegment
from warren.store.stream_tracking import TrackedOffsets

__all__ = ["recover_stream"]

log = logging.getLogger("warren.store")


def recover_stream(
    seglog: SegmentLog, tracking: TrackedOffsets, sequences: dict[str, int]
) -> tuple[list[StreamSegment], int, int]:
    """(segments, next offset, bytes) of the stream in ``seglog``'s directory,
    its tracked offsets read and ``sequences`` given the trailers' last ids.
    Never raises: a stream whose files cannot be read starts empty, and its
    files are left alone."""
    directory = seglog.directory
    segs: list[StreamSegment] = []
    next_offset = total = 0
    try:
        ids = sorted(
            int(match.group(1))
            for match in map(MSGS_NAME.fullmatch, os.listdir(directory))
            if match is not None
        )
        seglog.reserve_ids(ids[-1] if ids else 0)
        tracking.read()
        last: RecordScan | None = None
        for sid in ids:
            try:
                found = _recover_segment(seglog, sid, bool(segs), next_offset, sequences)
            except Exception:
                log.exception("%s: cannot recover segment %d; left untouched", directory, sid)
                continue
            if found is None:
                continue
            seg, last = found
            if segs and seg.first_offset < next_offset:
                log.warning(
                    "%s: segment %d starts at offset %d, before %d; skipped",
                    directory,
                    sid,
                    seg.first_offset,
                    next_offset,
                )
                continue
            segs.append(seg)
            total += seg.bytes
            next_offset = seg.first_offset + seg.count
        if segs and ids and segs[-1].id == ids[-1] and last and last.clean:
            # Appends go on after the last segment's end mark (a file whose
            # data did not end cleanly, or of version 1, is never written again).
            seglog.continue_segment(ids[-1], last.end, last.size)
    except Exception:
        log.exception("%s: stream recovery failed; it starts empty", directory)
        return [], next_offset, 0
    return segs, next_offset, total


def _recover_segment(
    seglog: SegmentLog, sid: int, after: bool, next_offset: int, sequences: dict[str, int]
) -> tuple[StreamSegment, RecordScan] | None:
    """The log's scan of one segment, counted (``after``: segments before it
    were recovered, up to ``next_offset``); None for an empty one (dropped)."""
    scan = seglog.scan(sid)
    if scan is None:
        return None
    seg: StreamSegment | None = None
    gap = (0, 0)  # damaged bytes (start, end) waiting for the record after them
    try:
        m = scan.map
        for pos, length, p_off, p_len, b_len in scan:
            assert m is not None
            if p_off < 0:  # damaged bytes, kept aside
                gap = (pos, pos + length)
                continue
            ts = RECORD_TS.unpack_from(m, pos + 4)[0]
            count = 1
            if chunk_at(m, p_off, p_len):
                count = chunk_count(m, pos)
                _recover_trailer(sequences, m, p_off + p_len + 8 + b_len + 4, pos + length - 4)
            stored = record_offsets(m, p_off, p_len)[0] if seg is None or gap[1] else -1
            if seg is None:
                first = stored if stored >= 0 else next_offset
                if gap[1] and after and next_offset <= first:
                    first = next_offset  # the damage took the offsets up to it
                seg = StreamSegment(sid, first, ts)
            if gap[1]:
                expected = seg.first_offset + seg.count
                lost = stored - expected if stored >= expected else 1
                if seg.gaps is None:
                    seg.gaps = {}
                seg.gaps[gap[0]] = (gap[1], lost)
                seg.count += lost
                seg.bytes += gap[1] - gap[0]
                gap = (0, 0)
            seg.count += count
            seg.bytes += length
            if ts > seg.last_ts:
                seg.last_ts = ts
    finally:
        scan.close()
    if seg is None:  # an empty segment
        with seglog.lock:
            seglog.drop_locked(sid)
        return None
    return seg, scan


def _recover_trailer(sequences: dict[str, int], m: Any, start: int, end: int) -> None:
    """A chunk record's trailer (``m[start:end]``) met at recovery: its
    publishers' last publishing ids."""
    for reference, last_id in parse_trailers(m[start:end]) or ():
        if last_id > sequences.get(reference, 0):
            sequences[reference] = last_id
