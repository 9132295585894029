"""Recovery's validating pass over one segment file (store/segment_log.py's scan).

A version-1 file (appended) ends where the file does: a torn tail is cut off,
any other damaged tail copied aside, then cut. A version-2 file (allocated
ahead, written in place: store/segment_format.py) ends at its end mark; past
it lie zeros (or writes a crash cut short), which are neither damage nor
data: never read, never copied, never cut. Damaged bytes
in the middle of either are copied aside and stepped over to the next record
that checks out (store/segment_damage.py); in version 2 only a record of this
life (its CRC seeded with the salt) or this life's end mark is such a record.
docs/storage.md, "Recovery" and "Damage to message files", has the rules.
"""

from __future__ import annotations

import logging
import mmap
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from warren.store.records import CorruptRecord, inspect_record
from warren.store.segment_damage import (
    CLOSED,
    GAP,
    TAIL,
    damage_reason,
    header_damaged,
    keep_aside,
    next_record,
    report,
    torn_tail,
    walk,
)
from warren.store.segment_format import (
    FILE_MAGIC,
    MARK_SIZE,
    SPARE_ID,
    V1,
    V1_HEADER_SIZE,
    V2,
    V2_HEADER_SIZE,
    Header,
    mark,
    mark_at,
    parse_header,
    recover_seed,
)

if TYPE_CHECKING:
    from warren.store.segment_log import SegmentLog

__all__ = ["RecordScan", "scan"]

log = logging.getLogger("warren.store")

_OFFSET_MASK = 0xFFFFFFFF
_V1_HEADER = FILE_MAGIC + V1.to_bytes(4, "big")
_V2_HEADER = FILE_MAGIC + V2.to_bytes(4, "big")
_NONZERO = re.compile(b"[^\x00]")


def scan(seglog: SegmentLog, segment_id: int) -> RecordScan | None:
    """One pass over a segment's records, for recovery (see RecordScan); None
    when the file is not a segment (left untouched), is a spare (its header
    says so: store/segment_spares.py), was never written (a torn
    header, a file of zeros: removed), or its intact
    header names another segment (not read, left untouched). A damaged header
    is read past when records check out after it (the file is ours); another
    version's header is left alone."""
    path = seglog.msgs_path(segment_id)
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        head = os.pread(fd, V2_HEADER_SIZE, 0)
        m = mmap.mmap(fd, size, access=mmap.ACCESS_READ) if size > V1_HEADER_SIZE else None
    finally:
        os.close(fd)
    header = parse_header(head)
    if not header.problem:
        if header.version == V2 and header.segment_id == SPARE_ID:
            if m is not None:
                m.close()
            seglog.spares.adopt(segment_id)  # no data: a retire or reuse cut short
            return None
        if header.version == V2 and header.segment_id != segment_id:
            if m is not None:
                m.close()
            log.warning(
                "%s: %s holds segment %d by its header (a file renamed by hand?): "
                "not read as this segment; leaving it untouched",
                seglog.directory,
                path.name,
                header.segment_id,
            )
            return None
        return RecordScan(seglog, segment_id, m, size, header)
    # Shorter than its header, and what is there is the start of one: no record.
    torn = size < V2_HEADER_SIZE and (
        _V1_HEADER.startswith(head[:V1_HEADER_SIZE]) or _V2_HEADER.startswith(head[:V1_HEADER_SIZE])
    )
    found = None if m is None or torn else _read_past(m, head, header, segment_id)
    if found is None:
        # Never written: a version-1 header torn at its creation, or a file
        # allocated whose first write never reached the disk (zeros throughout).
        # Anything else is left as it is: it may be ours, damaged.
        unused = torn or (m is not None and _NONZERO.search(m) is None)
        if m is not None:
            m.close()
        if unused:
            log.warning(
                "%s: %s: never written (torn header); removing it", seglog.directory, path.name
            )
            seglog.unlink(path)
        else:
            log.warning(
                "%s: %s: %s; leaving it untouched", seglog.directory, path.name, header.problem
            )
        return None
    assert m is not None
    try:
        kept, known = keep_aside(path, 0, head[: found.start])
    except BaseException:
        m.close()
        raise
    (log.warning if known else log.error)(
        "%s: %s: %s, but its records check out: the header is damaged (kept aside as %s); "
        "reading the records",
        seglog.directory,
        path.name,
        header.problem,
        kept.name,
    )
    scan = RecordScan(seglog, segment_id, m, size, found)
    scan.damaged_header = True  # read, never written again
    return scan


def _read_past(m: mmap.mmap, head: bytes, header: Header, segment_id: int) -> Header | None:
    """How to read a segment whose header is damaged, if records check out after
    it: as version 1 when its first record does (unseeded), as version 2 when
    the first two (the second may be the end mark) check out with the header's
    salt or, if that was hit, with the salt the first record's CRC gives back.
    None when neither: not ours to read. A header of another version (b"WSEG"
    and a number more than one bit from 1 and 2) is never read past."""
    if head[:4] == FILE_MAGIC and header.version not in (V1, V2):
        version = header.version
        if min((version ^ V1).bit_count(), (version ^ V2).bit_count()) > 1:
            return None
    if header.version != V2 and header_damaged(m, head[:V1_HEADER_SIZE]):
        return Header(V1, 0, V1_HEADER_SIZE, segment_id)
    size = len(m)
    start = V2_HEADER_SIZE
    try:
        length = inspect_record(m, start, size, False)[0]
    except CorruptRecord:
        return None
    for seed in (header.seed, -1):
        if seed == -1:
            crc_at = start + length - 4
            seed = recover_seed(m[start:crc_at], int.from_bytes(m[crc_at : crc_at + 4], "big"))
        if not seed:
            continue
        try:
            inspect_record(m, start, size, True, seed)
        except CorruptRecord:
            continue
        nxt = start + length
        if mark_at(m, nxt, size, seed):
            return Header(V2, seed, start, segment_id)
        try:
            inspect_record(m, nxt, size, True, seed)
        except CorruptRecord:
            continue
        return Header(V2, seed, start, segment_id)
    return None


class RecordScan:
    """The records of one segment, validated as recovery reads them.

    Iterating yields ``(offset, length, properties offset, properties length, body
    length)`` per intact record (structure and CRC checked). Damaged bytes that
    intact records follow come as one item ``(offset, length, GAP, 0, 0)``
    (store/segment_damage.py): they are copied aside first, and reading goes on
    with the next record that checks out, so damage never costs the records
    after it.

    Where the data ends: in version 1, damaged bytes with nothing intact after
    them end the iteration: a torn tail (what a crash leaves of the last write)
    is cut off by close(), any other tail is copied aside, then cut. In version
    2, this life's mark ends it: a close mark (``clean``: the owner may append
    after it) or an end mark (a crash came after it: writes that did not reach
    the disk whole may have left records of this life further on, so the owner
    starts a new segment rather than append); where records stop checking out
    and no mark follows (the writes after the last sync cut short by a crash),
    the data ends there, the rest of the file is left as it is (it is not this
    life's) and not written again either. close() logs what was found and then
    knows the data's ``end``. ``map`` holds the file's bytes while it is open.
    Raises OSError when damaged bytes cannot be copied aside (the owner then
    leaves the file as it is).
    """

    def __init__(
        self, segment_log: SegmentLog, segment_id: int, m: mmap.mmap | None, size: int, header: Header
    ) -> None:
        self.log = segment_log
        self.segment_id = segment_id
        self.map = m
        #: The file's size, and (after close) where its data ends.
        self.size = size
        self.end = size if header.version == V1 else header.start
        self.header = header
        #: Version 2: the data ended at a close mark (a clean close) and the header
        #: is intact: the owner may append after it.
        self.clean = False
        self.damaged_header = False
        self._cut: int | None = None
        self._open_end = -1  # version 2: where the data ended without an end mark
        self._good = 0  # intact records so far
        # Damaged ranges met: (start, end, reason, copy, known already, intact
        # records before it; -1 for a tail that is cut).
        self._damage: list[tuple[int, int, str, Path, bool, int]] = []

    def __iter__(self) -> Iterator[tuple[int, int, int, int, int]]:
        m, size = self.map, self.size
        if m is None:
            return
        directory = self.log.directory
        path = self.log.msgs_path(self.segment_id)
        header = self.header
        seed = header.seed
        marks = header.version == V2
        for item in walk(m, header.start, size, seed, marks):
            pos = item[0]
            if pos > _OFFSET_MASK:
                self._cut = pos
                log.warning("%s: %s: data past 4 GiB; truncating at %d", directory, path.name, pos)
                return
            kind = item[2]
            if kind >= 0:
                self._good += 1
            elif kind == GAP:
                end = pos + item[1]
                kept, known = keep_aside(path, pos, m[pos:end])
                reason = damage_reason(m, pos, size, seed)
                self._damage.append((pos, end, reason, kept, known, self._good))
            elif marks:  # a mark, or TAIL: where this life's data ends
                self.end = pos
                # A close mark ends the data cleanly only with nothing of this life
                # after it: a power cut after a restart appended past it can keep
                # its page as it was and later pages as written.
                self.clean = (
                    kind == CLOSED
                    and not self.damaged_header
                    and next_record(m, pos + MARK_SIZE, size, seed, True) < 0
                )
                if kind == TAIL:
                    self._open_end = pos
                return
            else:  # TAIL; cut only once copied (keep_aside raises when it cannot)
                if torn_tail(m, pos, size):
                    log.warning(
                        "%s: %s: torn record at offset %d (the last write, cut short: "
                        "%s); truncating the file there (%d bytes dropped)",
                        directory,
                        path.name,
                        pos,
                        damage_reason(m, pos, size),
                        size - pos,
                    )
                else:
                    kept, known = keep_aside(path, pos, m[pos:size])
                    reason = damage_reason(m, pos, size)
                    self._damage.append((pos, size, reason, kept, known, -1))
                self._cut = pos
                return
            yield item

    def close(self) -> None:
        """Release the map, cut off a torn or copied tail met while iterating
        (version 1), log what was found, and tell the log where the data ends."""
        if self.map is not None:
            self.map.close()
            self.map = None
        name = self.log.msgs_path(self.segment_id).name
        for start, end, reason, kept, known, before in self._damage:
            after = -1 if before < 0 else self._good - before
            report(self.log.directory, name, start, end, reason, kept, known, after)
        self._damage = []
        if self._open_end >= 0:
            log.warning(
                "%s: %s: the data ends at offset %d without an end mark: the writes after "
                "the last sync were cut short by a crash (or the bytes there are damaged); "
                "nothing after it is read, and new messages go to a new segment",
                self.log.directory,
                name,
                self._open_end,
            )
            # Mark the end found, so that later starts find it as usual (nothing
            # after it checks out: no record of this life is covered).
            mark_end(self.log, self.segment_id, self._open_end, self.header.seed)
            self._open_end = -1
        if self._cut is not None:
            os.truncate(self.log.msgs_path(self.segment_id), self._cut)
            self.size = self.end = self._cut
            self._cut = None
        self.log.adopt(self.segment_id, self.header.seed, self.header.start, self.end)


def mark_end(seglog: SegmentLog, segment_id: int, end: int, seed: int) -> None:
    """Write an end mark at ``end`` of a segment recovery found ending there
    without one (best effort: without it, the next start finds the same)."""
    path = seglog.msgs_path(segment_id)
    data = mark(end, seed)
    try:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.pwrite(fd, data, end)
        finally:
            os.close(fd)
    except OSError as exc:
        log.warning("%s: cannot mark the end of %s: %s", seglog.directory, path.name, exc)
        return
    if seglog.mirror is not None and seglog.mirror.wants_data():
        seglog.mirror.appended(path, end, data)
