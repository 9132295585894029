"""Damaged bytes in a segment file: finding where the intact records resume, and
keeping what cannot be read aside.

A record starts with its u32 length, its inner lengths add up to it and it ends
with a CRC32 (store/records.py), so after a damaged record the next intact one
can be found by trying each following byte: the first offset where a whole
record checks out, structure and CRC, is where reading resumes. The bytes in
between are never served, never deleted unseen: they are copied next to the
segment as ``msgs.<id>.damaged-<offset>`` (written, fsynced, renamed) before
anything may remove them. Only a torn tail, what a crash leaves of the last
write (a prefix of a record, or zeros), is cut off without a copy.

In a version-2 segment (store/segment_format.py) the CRC is seeded with the
file's salt and the data ends at an end mark: the search for the next record
takes only records of this life (and this life's end mark, where the data
ends), so it never steps into a record copied from another file.
docs/storage.md, "Damage", has the rules.
"""

from __future__ import annotations

import bisect
import logging
import mmap
import os
import re
import struct
from array import array
from collections.abc import Callable, Iterator
from pathlib import Path

import warren
from warren.core.properties import is_persistent
from warren.store.records import (
    CHUNK_FLAG,
    FILE_HEADER_SIZE,
    FILE_MAGIC,
    FORMAT_VERSION,
    MIN_RECORD_SIZE,
    NATIVE_FLAG,
    CorruptRecord,
    inspect_record,
)
from warren.store.segment_format import CLOSE_MARK, MARK_SIZE, V2, mark_at
from warren.store.sync_files import fsync_directory

__all__ = [
    "CLOSED",
    "END",
    "GAP",
    "TAIL",
    "Survey",
    "aside_path",
    "damage_reason",
    "header_damaged",
    "keep_aside",
    "next_record",
    "next_record_python",
    "report",
    "resume_after",
    "structure_length",
    "survey",
    "torn_tail",
    "walk",
]

log = logging.getLogger("warren.store")

#: walk()'s properties offset for damaged bytes that intact records follow.
GAP = -1
#: walk()'s properties offset for damaged bytes that run to the end of the data
#: (version 2: where the data ends without an end mark, length 0 or more).
TAIL = -2
#: walk()'s properties offset for this life's end mark (version 2): the data ends.
END = -3
#: The same for its close mark: the data ends, and was closed cleanly.
CLOSED = -4

_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")

_Buffer = bytes | mmap.mmap

_native = warren.native_module("_fastpath")
#: The C search of next_record (None: not built).
_find_record: Callable[[_Buffer, int, int, int, bool], int] | None = (
    None if _native is None else _native.find_record
)
# A byte that is not zero: where a run of zeros ends (no record and no end mark
# lies wholly in zeros).
_NONZERO = re.compile(b"[^\x00]")


def _checks_out(buf: _Buffer, pos: int, limit: int, seed: int = 0) -> bool:
    """Whether a whole record, structure and CRC (seeded), starts at ``pos``."""
    if pos + MIN_RECORD_SIZE > limit:
        return False
    length = _U32.unpack_from(buf, pos)[0]
    if length < MIN_RECORD_SIZE or length > limit - pos:
        return False
    try:
        inspect_record(buf, pos, limit, True, seed)
    except CorruptRecord:
        return False
    return True


def _record_or_mark(buf: _Buffer, pos: int, limit: int, seed: int, marks: bool) -> bool:
    """Whether a record that checks out, or (``marks``) this life's end mark, is at ``pos``."""
    return _checks_out(buf, pos, limit, seed) or (marks and mark_at(buf, pos, limit, seed) > 0)


def header_damaged(buf: _Buffer, head: bytes) -> bool:
    """Whether a segment whose file header ``head`` is not a version-1 header is
    one of ours in version 1 with a damaged header: its first record checks out
    (structure and CRC), and the header is not that of another version (b"WSEG"
    and another number), which this check must leave alone, unless one flipped
    bit made it so."""
    if len(head) >= FILE_HEADER_SIZE and head[:4] == FILE_MAGIC:
        version = _U32.unpack_from(head, 4)[0]
        if (version ^ FORMAT_VERSION).bit_count() > 1 or version == V2:
            return False
    return _checks_out(buf, FILE_HEADER_SIZE, len(buf))


def next_record(buf: _Buffer, start: int, limit: int, seed: int = 0, marks: bool = False) -> int:
    """The first offset from ``start`` on where a whole record checks out (CRC
    seeded with ``seed``) or, with ``marks``, this life's end mark lies; -1 when
    there is none.

    Every byte is a candidate (in C when built: warren._fastpath.find_record).
    Here, a candidate's length field must fit in the bytes left, so when they
    are few its leading bytes are zeros, and find() jumps to the next place that
    has them (most of a damaged record's body is skipped at C speed); a run of
    eight zero bytes or more, which holds neither a record nor an end mark, is
    skipped to its end."""
    if _find_record is not None:
        return _find_record(buf, start, limit, seed, marks)
    return next_record_python(buf, start, limit, seed, marks)


def next_record_python(
    buf: _Buffer, start: int, limit: int, seed: int = 0, marks: bool = False
) -> int:
    """next_record without the C extension (and the C version's reference)."""
    last = limit - (MARK_SIZE if marks else MIN_RECORD_SIZE)
    if start > last:
        return -1
    span = limit - start
    zeros = 4 - (span.bit_length() + 7) // 8  # an end mark starts with four
    prefix = b"\x00" * zeros
    q = start
    while q <= last:
        if zeros:
            q = buf.find(prefix, q, last + zeros)
            if q < 0:
                return -1
        if _record_or_mark(buf, q, limit, seed, marks):
            return q
        if marks and not any(buf[q : q + MARK_SIZE]):
            found = _NONZERO.search(buf, q, limit)
            if found is None:
                return -1
            q = max(q + 1, found.start() - (MARK_SIZE - 1))
            continue
        q += 1
    return -1


def resume_after(buf: _Buffer, pos: int, limit: int, seed: int = 0, marks: bool = False) -> int:
    """Where intact records resume after the damaged record at ``pos``: right
    after it when its structure holds (only its CRC failed) and a record checks
    out there (or, with ``marks``, the data ends there at this life's end
    mark), otherwise the next offset where one does; -1 when none does."""
    start = pos + 1
    try:
        length = inspect_record(buf, pos, limit, False)[0]
    except CorruptRecord:
        pass
    else:
        if _record_or_mark(buf, pos + length, limit, seed, marks):
            return pos + length
        start = pos + length  # the structure delimits it: what follows is damaged too
    return next_record(buf, start, limit, seed, marks)


def damage_reason(buf: _Buffer, pos: int, limit: int, seed: int = 0) -> str:
    """Why the record at ``pos`` does not check out (for the log)."""
    try:
        inspect_record(buf, pos, limit, True, seed)
    except CorruptRecord as exc:
        return exc.reason
    return "unreadable"


def torn_tail(buf: _Buffer, pos: int, limit: int) -> bool:
    """Whether the bytes from ``pos`` to ``limit`` (no intact record after them)
    are what a crash leaves of the last write: fewer than a length field, only
    zeros, or the start of a record whose length, and inner lengths as far as
    they are there, say it goes on past the end."""
    avail = limit - pos
    if avail < 4:
        return True
    if not buf[pos:limit].strip(b"\x00"):
        return True
    length = _U32.unpack_from(buf, pos)[0]
    if length < MIN_RECORD_SIZE or length <= avail:
        return False  # the record is all there, and damaged (or it is not a record)
    o = pos + 13  # exchange length byte read; then the routing key length byte
    if o > limit:
        return True
    o += buf[o - 1] + 1
    if o > limit:
        return True
    o += buf[o - 1] + 4
    if o > limit:
        return True
    o += _U32.unpack_from(buf, o - 4)[0] + 8
    if o > limit:
        return True
    b_len = _U64.unpack_from(buf, o - 8)[0]
    flag = b_len & (NATIVE_FLAG | CHUNK_FLAG)
    if not flag:
        return o - pos + b_len + 4 == length
    o += (b_len ^ flag) + 4  # the body, then a native (or chunk trailer) section's length
    if o > limit:
        return o - pos + 4 <= length
    return o - pos + _U32.unpack_from(buf, o - 4)[0] + 4 == length


def walk(
    buf: _Buffer, start: int, limit: int, seed: int = 0, marks: bool = False
) -> Iterator[tuple[int, int, int, int, int]]:
    """``(offset, length, properties offset, properties length, body length)`` of
    each record from ``start`` to ``limit``, checked (structure and CRC seeded
    with ``seed``). Damaged bytes come as one item ``(offset, length, GAP, 0,
    0)`` when intact records follow (iteration goes on with them), ``(offset,
    length, TAIL, 0, 0)`` when none does (the last item).

    With ``marks`` (version 2), this life's end mark ends the data: ``(offset,
    0, END, 0, 0)`` is the last item (CLOSED for its close mark), and damaged
    bytes before one are a GAP.
    Where nothing checks out any more (no record of this life, no end mark), a
    TAIL item ends it, at ``limit`` too if the bytes simply run out."""
    pos = start
    while pos < limit:
        # Nothing is yielded inside the except clause: a generator suspended in
        # one keeps that exception as the one being handled (compiled, it is
        # then chained to every later exception).
        try:
            length, p_off, p_len, b_len = inspect_record(buf, pos, limit, True, seed)
        except CorruptRecord:
            length = -1
        if length >= 0:
            yield pos, length, p_off, p_len, b_len
            pos += length
            continue
        found = mark_at(buf, pos, limit, seed) if marks else 0
        if found:
            yield pos, 0, CLOSED if found == CLOSE_MARK else END, 0, 0
            return
        nxt = resume_after(buf, pos, limit, seed, marks)
        if nxt < 0:
            yield pos, limit - pos, TAIL, 0, 0
            return
        yield pos, nxt - pos, GAP, 0, 0
        pos = nxt
    if marks:
        yield pos, 0, TAIL, 0, 0


def structure_length(buf: _Buffer, pos: int, limit: int) -> int:
    """The length of the record at ``pos`` when its structure holds (CRC not
    checked: for stepping over a record known dead), else 0."""
    try:
        return inspect_record(buf, pos, limit, False)[0]
    except CorruptRecord:
        return 0


class Survey:
    """A segment from a damaged record on, as survey() found it: the damaged
    ranges (start, end, intact records before it), the dead offsets to step
    over (damaged starts included), and the intact records still to read."""

    __slots__ = ("gaps", "skip", "records", "unread", "unread_bytes", "transient", "transient_bytes")

    def __init__(self) -> None:
        self.gaps: list[tuple[int, int, int]] = []
        self.skip: array[int] = array("I")
        self.records = 0
        self.unread = 0
        self.unread_bytes = 0
        # The transient records among the unread ones, and their body bytes.
        self.transient = 0
        self.transient_bytes = 0


def survey(
    buf: _Buffer,
    start: int,
    limit: int,
    dead: array[int] | None,
    removed: set[int] | None,
    seed: int = 0,
) -> Survey:
    """Walk a segment from ``start`` (where a record failed its check on the read
    path) to ``limit`` (its end of data), with ``dead`` (sorted) and ``removed``
    the offsets the reader steps over: what is left to read once the damage is
    stepped over."""
    found = Survey()
    d = bisect.bisect_left(dead, start) if dead is not None else 0
    nd = len(dead) if dead is not None else 0
    for pos, length, p_off, p_len, b_len in walk(buf, start, limit, seed):
        if p_off < 0:
            found.gaps.append((pos, pos + length, found.records))
            found.skip.append(pos)
            continue
        found.records += 1
        if dead is not None:
            while d < nd and dead[d] < pos:
                d += 1
            if d < nd and dead[d] == pos:
                found.skip.append(pos)
                continue
        if removed is not None and pos in removed:
            continue
        found.unread += 1
        found.unread_bytes += b_len
        if not is_persistent(buf[p_off : p_off + p_len]):
            found.transient += 1
            found.transient_bytes += b_len
    return found


def aside_path(path: Path, start: int) -> Path:
    """Where the damaged bytes of ``path`` from ``start`` are kept."""
    return path.with_name(f"{path.name}.damaged-{start:010d}")


def keep_aside(path: Path, start: int, data: bytes) -> tuple[Path, bool]:
    """Copy damaged bytes of ``path`` (from offset ``start``) next to it, durably:
    the copy is fsynced, renamed into place and the directory fsynced before
    this returns, so the caller may then cut or delete the original. Returns the
    copy and whether it was there already (the same bytes, kept at an earlier
    start: not new damage). Raises OSError when the copy cannot be made."""
    target = aside_path(path, start)
    n = 1
    while True:
        try:
            if target.stat().st_size == len(data) and target.read_bytes() == data:
                return target, True
        except FileNotFoundError:
            break
        n += 1  # other bytes were kept from this offset before: keep both
        target = target.with_name(f"{aside_path(path, start).name}.{n}")
    tmp = target.with_name(target.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, target)
    fsync_directory(target.parent)
    return target, False


def report(
    directory: Path,
    name: str,
    start: int,
    end: int,
    reason: str,
    kept: Path,
    known: bool,
    after: int,
) -> None:
    """The log line for damaged bytes set aside: ERROR when new, WARNING when the
    same bytes were kept aside at an earlier start. ``after``: the intact
    records found after them, -1 for a tail that was cut off."""
    if after < 0:
        (log.warning if known else log.error)(
            "%s: %s: bytes %d-%d (record at offset %d) are damaged (%s) and no intact "
            "record follows: %s as %s, never delivered, and cut off the file",
            directory,
            name,
            start,
            end,
            start,
            reason,
            "kept aside at an earlier start" if known else "kept aside",
            kept.name,
        )
        return
    if known:
        log.warning(
            "%s: %s: bytes %d-%d are damaged (%s), kept aside as %s at an earlier "
            "start; skipped again, %d intact records after them",
            directory,
            name,
            start,
            end,
            reason,
            kept.name,
            after,
        )
        return
    log.error(
        "%s: %s: bytes %d-%d (record at offset %d) are damaged (%s): kept aside as %s, "
        "never delivered; %d intact records after them recovered",
        directory,
        name,
        start,
        end,
        start,
        reason,
        kept.name,
        after,
    )
