"""The deduplication keys of a durable queue or exchange, on disk (docs/storage.md,
"Deduplication keys").

A durable deduplicating queue rebuilds its cache at start from two sources:
the keys in the records that survived (those messages are durable by
definition), and this journal, ``dedup.keys`` in the queue's directory, of keys
whose messages were durable when the key was written, so that a key outlives
its message once the message is consumed, for as long as the cache's TTL and
size allow. A durable deduplicating exchange keeps only the journal, in the
exchange's directory: the keys of messages it routed into durable queues.

A key is written only after the group commit round that made its message
durable in every store it went to has completed (``GroupSync.after_sync``),
so a key is never durable while its message is not; it is handed to the OS in
the same loop turn as the confirm, before any later ack can be, and
fdatasynced by the next round.

One entry per key, integers big-endian::

    u32  entry length     this field through the CRC
    u64  first seen       ms since the epoch
    u64  expiry + 1       ms since the epoch; 0: never
    u8   key kind         s str, b bytes, i int, f float, B bool, r repr
    ...  key              UTF-8 / raw bytes / decimal text
    u32  CRC32            of every byte before it

Reading stops at the first entry that does not check out (a torn tail after a
crash); the file is then rewritten with the entries before it. The file is
rewritten with only the keys the cache still holds (temporary file, fsync,
rename, fsync of the directory) once it holds more than twice as many entries
as the cache plus 1,024.
"""

from __future__ import annotations

import logging
import os
import shutil
import struct
import zlib
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import Any

from warren.core.dedup import Deduplicator, KeyEntry
from warren.store.mirror import FileMirror

__all__ = [
    "FILE_NAME",
    "DedupJournal",
    "decode_entries",
    "encode_entry",
]

log = logging.getLogger("warren.store")

FILE_NAME = "dedup.keys"
_HEAD = struct.Struct(">IQQ")
_U32 = struct.Struct(">I")
_MIN = _HEAD.size + 1 + _U32.size
_COMPACT_SLACK = 1024


def _encode_key(key: Hashable) -> bytes:
    if isinstance(key, str):
        return b"s" + key.encode("utf-8", "surrogatepass")
    if isinstance(key, bytes):
        return b"b" + key
    if isinstance(key, bool):  # not produced by key_of, which tags booleans
        return b"B" + (b"1" if key else b"0")
    if isinstance(key, int):
        return b"i" + str(key).encode()
    if isinstance(key, float):
        return b"f" + repr(key).encode()
    if isinstance(key, tuple) and len(key) == 2 and key[0] == "bool":
        return b"B" + (b"1" if key[1] else b"0")
    if isinstance(key, tuple) and len(key) == 2 and key[0] == "repr":
        return b"r" + str(key[1]).encode("utf-8", "surrogatepass")
    return b"r" + repr(key).encode("utf-8", "surrogatepass")


def _decode_key(raw: bytes) -> Hashable:
    kind, data = raw[:1], raw[1:]
    if kind == b"s":
        return data.decode("utf-8", "surrogatepass")
    if kind == b"b":
        return data
    if kind == b"i":
        return int(data)
    if kind == b"f":
        return float(data)
    if kind == b"B":
        return ("bool", data == b"1")
    if kind == b"r":
        return ("repr", data.decode("utf-8", "surrogatepass"))
    raise ValueError(f"unknown key kind {kind!r}")


def encode_entry(entry: KeyEntry) -> bytes:
    key, seen, expires = entry
    raw = _encode_key(key)
    head = _HEAD.pack(
        _HEAD.size + len(raw) + _U32.size,
        max(0, int(seen)),
        0 if expires is None else max(0, int(expires)) + 1,
    )
    body = head + raw
    return body + _U32.pack(zlib.crc32(body))


def decode_entries(data: bytes) -> tuple[list[KeyEntry], int]:
    """The intact entries at the start of ``data`` and where they end."""
    out: list[KeyEntry] = []
    pos = 0
    n = len(data)
    while n - pos >= _MIN:
        length, seen, expiry = _HEAD.unpack_from(data, pos)
        end = pos + length
        if length < _MIN or end > n:
            break
        (crc,) = _U32.unpack_from(data, end - 4)
        if zlib.crc32(data[pos : end - 4]) != crc:
            break
        try:
            key = _decode_key(data[pos + _HEAD.size : end - 4])
        except (ValueError, UnicodeDecodeError):
            break
        out.append((key, float(seen), None if expiry == 0 else float(expiry - 1)))
        pos = end
    return out, pos


class DedupJournal:
    """One queue's or exchange's key journal (a KeyLog); also a Syncable, so that a
    group commit round fdatasyncs what it wrote. ``syncer`` returns the broker's
    GroupSync, looked up at each use (None: keys are written at once).
    ``mirror``: the data directory's (store/layout.py's DataDir)."""

    def __init__(
        self,
        path: Path,
        dedup: Deduplicator,
        syncer: Callable[[], Any | None],
        mirror: FileMirror | None = None,
    ) -> None:
        self.path = path
        self.dedup = dedup
        self._syncer = syncer
        self._mirror = mirror
        # Keys whose messages were appended but whose round has not completed:
        # (serial number, entry); the round under way covers serials up to
        # ``_covered``, and ``_waiting`` holds the stores of the keys after it.
        self._pending: list[tuple[int, KeyEntry]] = []
        self._serial = 0
        self._covered = 0
        self._waiting: dict[int, Any] = {}
        self._armed = False
        self._entries_on_disk = 0
        self._size = 0
        self._unsynced = False
        self._new_file = False
        self.closed = False

    # -- KeyLog ---------------------------------------------------------------------------
    def load(self) -> list[KeyEntry]:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        entries, end = decode_entries(data)
        self._entries_on_disk = len(entries)
        self._size = end
        if end != len(data):
            log.warning(
                "%s: %d bytes after %d intact entries do not check out (a torn "
                "write); they are cut off",
                self.path,
                len(data) - end,
                len(entries),
            )
            self._rewrite(entries)
        return entries

    @property
    def syncer(self) -> Any | None:
        return self._syncer()

    def recorded(self, entry: KeyEntry, stores: Sequence[Any]) -> None:
        syncer = self.syncer
        if syncer is None:
            self._write([entry])
            return
        self._serial += 1
        self._pending.append((self._serial, entry))
        for store in stores:
            self._waiting[id(store)] = store
        if not self._armed:
            self._arm()

    def withdraw(self, key: Hashable) -> None:
        self._pending = [(n, e) for n, e in self._pending if e[0] != key]

    def close(self) -> None:
        self.closed = True
        self._pending = []

    def delete(self) -> None:
        """Its exchange is deleted (after the definitions log said so): remove the
        exchange's directory, the journal and the definition.json with it."""
        self.close()
        directory = self.path.parent
        shutil.rmtree(directory, ignore_errors=True)
        if self._mirror is not None:
            self._mirror.deleted(directory)

    # -- rounds ---------------------------------------------------------------------------
    def _arm(self) -> None:
        """Wait for the round that makes every store of the keys recorded so far durable."""
        syncer = self.syncer
        if syncer is None:
            return
        self._armed = True
        covered = self._covered = self._serial
        stores, self._waiting = list(self._waiting.values()), {}
        syncer.after_sync(stores, lambda ok: self._round_done(ok, covered))

    def _round_done(self, ok: bool, covered: int) -> None:
        """The round covering every key recorded up to serial ``covered`` is over."""
        self._armed = False
        if self.closed:
            return
        pending = self._pending
        done = [e for n, e in pending if n <= covered]
        self._pending = [(n, e) for n, e in pending if n > covered]
        if done:
            if ok:
                self._write(done)
            else:
                # Their publishes were nacked: a retry must not be dropped.
                for key, _seen, _exp in done:
                    self.dedup.forget_key(key)
        if self._pending:
            self._arm()

    def _write(self, entries: list[KeyEntry]) -> None:
        data = b"".join(encode_entry(e) for e in entries)
        try:
            new = self._size == 0 and not self.path.exists()
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
        except OSError as exc:
            log.error("%s: keys could not be written, kept in memory only: %s", self.path, exc)
            for key, _seen, _exp in entries:
                self.dedup.forget_key(key)  # not durable: better stored twice than lost
            return
        if self._mirror is not None:
            self._mirror.appended(self.path, self._size, data)
        self._size += len(data)
        self._entries_on_disk += len(entries)
        self._new_file = self._new_file or new
        for key, seen, _exp in entries:
            self.dedup.mark_durable(key, seen)
        syncer = self.syncer
        if syncer is not None and syncer.enabled:
            self._unsynced = True
            syncer.after_sync([self], _ignore)
        if self._entries_on_disk > 2 * len(self.dedup) + _COMPACT_SLACK:
            self._rewrite(self.dedup.durable_entries())

    def _rewrite(self, entries: list[KeyEntry]) -> None:
        """Replace the file with ``entries`` (temporary file, fsync, rename, fsync dir)."""
        data = b"".join(encode_entry(e) for e in entries)
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
            dfd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError as exc:
            log.error("%s: could not be rewritten (left as it was): %s", self.path, exc)
            return
        if self._mirror is not None:
            self._mirror.replaced(self.path, data)
        self._size = len(data)
        self._entries_on_disk = len(entries)

    # -- Syncable -------------------------------------------------------------------------
    def flush(self) -> None:
        """Entries are handed to the OS as they are written."""

    def sync(self) -> None:
        fds: list[int] = []
        paths: list[Path] = []
        dirs: list[Path] = []
        self.collect_sync(fds, paths, dirs)
        for path in paths:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fdatasync(fd)
            finally:
                os.close(fd)
        for d in dirs:
            fd = os.open(d, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def collect_sync(self, fds: list[int], paths: list[Path], dirs: list[Path]) -> None:
        if self._unsynced:
            self._unsynced = False
            paths.append(self.path)
        if self._new_file:
            self._new_file = False
            dirs.append(self.path.parent)


def _ignore(ok: bool) -> None:
    """A round that fdatasyncs the journal: nobody waits for it."""
