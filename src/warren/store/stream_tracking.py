"""A stream's tracked consumer offsets: the file ``offsets`` next to its segments.

A consumer that has Warren keep its position (docs/streams.md, "Server-side
offset tracking") resumes from the offset stored under its name. The offsets
are few and small, so the file is rewritten whole (a temporary file, then a
rename) when they changed: TRACKING_WRITE_MS after the first change at the
latest (a timer on the broker's clock, store/stream_store.py), so at most
that often however many acks move them, at once when a consumer goes, and
when the stream closes; the
stream's next sync fdatasyncs it (docs/storage.md). A kill -9 loses at most
the positions of the last TRACKING_WRITE_MS: those messages are delivered
again, never skipped. A full disk keeps them for the next write.
Each entry: a name length byte, the name (UTF-8), the offset as a big-endian
i64; a torn entry ends the file.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
from pathlib import Path
from typing import Final

from warren.store.segment_log import SegmentLog

__all__ = ["TRACKING_FILE", "TRACKING_WRITE_MS", "TrackedOffsets"]

log = logging.getLogger("warren.store")

TRACKING_FILE: Final = "offsets"
#: How long changed offsets may wait to be written, so how often at most they are.
TRACKING_WRITE_MS: Final = 1000
_I64: Final = struct.Struct(">q")


class TrackedOffsets:
    """The stored offsets of a stream's named consumers, and their file in the
    stream's directory (written through the log's disk budget and mirror)."""

    def __init__(self, seglog: SegmentLog) -> None:
        self._log = seglog
        self._dir = seglog.directory
        self.path = self._dir / TRACKING_FILE
        self._offsets: dict[str, int] = {}
        self._dirty = False
        self._failed = False  # the last write failed (logged once)
        self._unsynced = False  # the file written since the last sync

    def get(self, name: str) -> int | None:
        """The stored offset of the consumer ``name``: the next one it should read."""
        return self._offsets.get(name)

    def set(self, name: str, next_offset: int) -> bool:
        """Remember where consumer ``name`` resumes (written by the next write());
        whether that changed anything."""
        if self._offsets.get(name) == next_offset:
            return False
        self._offsets[name] = next_offset
        self._dirty = True
        return True

    def write(self) -> bool:
        """Rewrite the file when the offsets changed; whether it was. A full disk
        keeps them for the next call (logged once). Caller holds the log's lock."""
        if not self._dirty:
            return False
        self._dirty = False
        parts = []
        for name, offset in sorted(self._offsets.items()):
            raw = name.encode("utf-8", "surrogateescape")
            parts.append(bytes((len(raw),)) + raw + _I64.pack(offset))
        path = self.path
        tmp = path.with_name(TRACKING_FILE + ".tmp")
        content = b"".join(parts)
        self._log.budget.left -= len(content)
        try:
            with open(tmp, "wb") as f:
                f.write(content)
            os.replace(tmp, path)
        except OSError as exc:
            self._dirty = True
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            if not self._failed:
                self._failed = True
                log.error("%s: cannot write tracked offsets (%s): kept for later", self._dir, exc)
            return False
        self._failed = False
        self._log.dir_dirty = True
        self._unsynced = True
        if self._log.mirror is not None:
            self._log.mirror.replaced(path, content)
        return True

    def collect_sync(self, paths: list[Path]) -> None:
        """Add the file to a sync's fdatasyncs when it was written since the last
        one: also when a flush wrote it, as the directory's fsync in the same sync
        makes the rename durable and must not find the new file's data missing."""
        if self._unsynced:
            self._unsynced = False
            paths.append(self.path)

    def read(self) -> None:
        """Take in the offsets the file holds (a missing file holds none)."""
        path = self.path
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return
        pos = 0
        while pos < len(data):
            n = data[pos]
            if pos + 1 + n + 8 > len(data):
                log.warning("%s: torn entry in %s; ignoring the rest", self._dir, path.name)
                break
            name = data[pos + 1 : pos + 1 + n].decode("utf-8", "surrogateescape")
            self._offsets[name] = _I64.unpack_from(data, pos + 1 + n)[0]
            pos += 1 + n + 8
