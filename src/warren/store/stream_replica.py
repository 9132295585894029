"""A stream's files read from a follower's copy of the data directory.

A cluster follower holds the leader's stream segments byte for byte
(cluster/follower.py writes them as the leader appends). ReplicaStreamStore
reads them as StreamStore does, so StreamCursor serves consumers from it
unchanged, but never writes: no recovery cuts, no appends, no retention (the
leader's retention reaches the follower as deleted files). ``refresh()`` picks
up what the follower applied since the last call: new records at the end of
the last segment, new segments, and segments removed at the front.

A record the follower has only partly written (an append lands in pieces) is
not counted until it is whole: the scan stops at the first record that does
not yet check out and starts there next time. That is also where a
version-2 file's data ends (its end mark, or the zeros allocated ahead),
and
the log is told so: readers map and read only up to there.
"""

from __future__ import annotations

import logging
import mmap
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from warren.core.message import Message, MessageRun
from warren.store.records import CorruptRecord, inspect_record
from warren.store.segment_format import V2_HEADER_SIZE, parse_header
from warren.store.segment_log import MSGS_NAME
from warren.store.stream_records import RECORD_TS, chunk_count, record_offsets
from warren.store.stream_segment import StreamSegment
from warren.store.stream_store import StreamStore

__all__ = ["ReplicaStreamStore"]

log = logging.getLogger("warren.store")


class ReplicaStreamStore(StreamStore):
    """A read-only StreamStore over files another process appends to."""

    def __init__(self, directory: Path) -> None:
        # Where the scan of the last segment stopped: (segment id, file position).
        self._scanned: tuple[int, int] = (0, 0)
        super().__init__(directory)

    def _recover(self) -> None:
        self._tracking.read()
        self.refresh()

    def refresh(self) -> bool:
        """Take in what the files gained or lost since the last call; True when
        the stream's bounds changed."""
        before = (self.first_offset, self._next_offset)
        try:
            ids = sorted(
                int(match.group(1))
                for match in map(MSGS_NAME.fullmatch, os.listdir(self._dir))
                if match is not None
            )
        except FileNotFoundError:
            ids = []
        present = set(ids)
        segs = self._segs
        while segs and segs[0].id not in present:  # retention on the leader
            seg = segs.pop(0)
            self._firsts.pop(0)
            self._bytes -= seg.bytes
            self._log.forget(seg.id)
        last_id, last_pos = self._scanned
        for sid in ids:
            if sid < last_id or (segs and sid < segs[-1].id):
                continue
            start = last_pos if sid == last_id else 0  # 0: from its header on
            try:
                self._scan(sid, start)
            except OSError as exc:
                log.warning("%s: cannot read segment %d yet: %s", self._dir, sid, exc)
                break
            if self._scanned[0] != sid:  # the segment holds no whole record yet
                break
        self._tracking.read()
        return before != (self.first_offset, self._next_offset)

    def _scan(self, sid: int, start: int) -> None:
        """Count the whole records of segment ``sid`` from ``start`` (0: its first)."""
        path = self._log.msgs_path(sid)
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            if size <= start:
                return
            if not start:
                header = parse_header(os.pread(fd, V2_HEADER_SIZE, 0))
                if header.problem or (header.segment_id and header.segment_id != sid):
                    return  # not written yet (or not a segment)
                self._log.adopt(sid, header.seed, header.start, header.start)
                start = header.start
            seed = self._log.file(sid).seed
            m = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        try:
            segs = self._segs
            seg = segs[-1] if segs and segs[-1].id == sid else None
            pos = start
            while pos < size:
                try:
                    length, p_off, p_len, _b_len = inspect_record(m, pos, size, True, seed)
                except CorruptRecord:
                    break  # not whole yet (or the end of the data): the next refresh reads it
                ts = RECORD_TS.unpack_from(m, pos + 4)[0]
                count = chunk_count(m, pos) or 1  # a chunk record holds many offsets
                if seg is None:
                    first = self._next_offset
                    stored = record_offsets(m, p_off, p_len)[0]
                    if stored >= 0:
                        first = stored
                    seg = StreamSegment(sid, first, ts)
                    segs.append(seg)
                    self._firsts.append(first)
                    self._next_offset = first
                seg.count += count
                seg.bytes += length
                self._bytes += length
                if ts > seg.last_ts:
                    seg.last_ts = ts
                self._next_offset += count
                pos += length
            if seg is not None:
                self._scanned = (sid, pos)
                self._log.file(sid).end = pos  # readers read up to here
        finally:
            m.close()

    def _set_aside(self, path: Path, start: int, data: bytes, reason: str, after: int) -> None:
        """A follower's copy is the leader's, file for file: damage met here is
        stepped over and logged, and nothing is written next to it."""
        log.error(
            "%s: %s: bytes %d-%d are damaged (%s): never delivered from this copy",
            self._dir,
            path.name,
            start,
            start + len(data),
            reason,
        )

    # -- writes belong to the leader (a call is a bug: RuntimeError) ----------------------
    def append(self, msg: Message) -> int:
        raise RuntimeError(f"{self._dir}: a replica's stream is read-only")

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
        raise RuntimeError(f"{self._dir}: a replica's stream is read-only")

    def append_run(
        self, run: MessageRun, start: int, stop: int, lost: list[int] | None = None
    ) -> int:
        raise RuntimeError(f"{self._dir}: a replica's stream is read-only")

    def append_stretches(
        self,
        run: MessageRun,
        stretches: Iterable[tuple[int, int]],
        lost: list[int] | None = None,
    ) -> None:
        raise RuntimeError(f"{self._dir}: a replica's stream is read-only")

    def apply_retention(
        self, max_length: int | None, max_bytes: int | None, max_age_ms: int | None, now_ms: int
    ) -> int:
        return 0

    def track(self, name: str, next_offset: int, at_once: bool = False) -> None:
        raise RuntimeError(f"{self._dir}: offsets are tracked on the leader")

    def flush(self) -> None:
        """Nothing is written here."""

    def sync(self) -> None:
        """Nothing is written here."""

    def seal(self) -> None:
        """Nothing is written here."""

    def close(self, sync: bool = True) -> None:
        self._log.closed = True

    def delete(self) -> None:
        raise RuntimeError(f"{self._dir}: a replica's stream is deleted by the leader")
