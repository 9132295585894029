"""The durable definitions of one vhost: exchanges, queues, bindings, policies, limits.

Every change is appended to ``definitions.log`` as one line, so a declare that a
client saw confirmed survives kill -9 and a power cut: the reply waits until
the line is fdatasynced, by the group commit (store/sync.py) when the broker
runs one, else here as the line is written. Replaying the log in order
rebuilds the state; when deletes have made most lines dead, the log is
rewritten (to a temporary file, fsynced, renamed over the old one) so it does
not grow without bound under declare/delete churn.

A line is ``<crc32 of the JSON, 8 hex digits> <JSON>``: a flipped byte that still
parses as JSON is caught. Lines an older Warren wrote (bare JSON) are read as
they are. A torn last line (a crash mid-write) is cut off, and its bytes kept
beside the log; any other line that cannot be read is damage, which refuses
the start or is set aside (store/damage.py): never silently dropped.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from warren.core.codec_errors import DecodeError
from warren.core.table_tags import decode_arguments as decode_tagged
from warren.core.table_tags import encode_arguments as encode_tagged
from warren.store import damage
from warren.store.disk_budget import UNMETERED, DiskBudget
from warren.store.layout import fsync_directory, hashed, make_dirs, write_file
from warren.store.mirror import FileMirror

log = logging.getLogger("warren.store")

_COMPACT_MIN_LINES = 1000

#: The file in a durable queue's or exchange's directory that repeats its
#: definition, so a directory the log no longer claims can be restored
#: (``warren orphans``).
DEFINITION_FILE = "definition.json"


def encode_arguments(arguments: dict[str, Any] | None) -> str:
    """Arguments as base64 of their AMQP table encoding: lossless for every field
    type, and a declare's arguments keep the wire types they came with (table_tags)."""
    return base64.b64encode(encode_tagged(arguments or {})).decode()


def decode_arguments(text: str) -> dict[str, Any]:
    table, _ = decode_tagged(base64.b64decode(text), 0)
    return table


def exchange_key(name: str) -> str:
    return "e:" + name


def queue_key(name: str) -> str:
    return "q:" + name


def binding_key(source: str, kind: str, destination: str, routing_key: str, args: str) -> str:
    return json.dumps(["b", source, kind, destination, routing_key, args])


def encode_line(entry: dict[str, Any]) -> bytes:
    """One log line: the entry's JSON behind its CRC-32."""
    text = json.dumps(entry, separators=(",", ":")).encode()
    return b"%08x " % zlib.crc32(text) + text + b"\n"


def decode_line(raw: bytes) -> dict[str, Any]:
    """A line's entry (without its newline); ValueError says why it cannot be read."""
    if raw.startswith(b"{"):  # written before lines had a checksum
        text = raw
    else:
        if len(raw) < 10 or raw[8:9] != b" ":
            raise ValueError("not a log line")
        try:
            crc = int(raw[:8], 16)
        except ValueError:
            raise ValueError("not a log line") from None
        text = raw[9:]
        if zlib.crc32(text) != crc:
            raise ValueError("checksum mismatch")
    entry = json.loads(text)
    if (
        not isinstance(entry, dict)
        or entry.get("op") not in ("add", "del")
        or not isinstance(entry.get("key"), str)
        or (entry["op"] == "add" and "value" not in entry)
    ):
        raise ValueError("not a definition change")
    return entry


class DefinitionsLog:
    """Append-only log of definition changes with the live state kept alongside."""

    def __init__(
        self,
        path: Path,
        sync: bool = True,
        *,
        on_damage: str = damage.REFUSE,
        object_dirs: bool = False,
        check: Callable[[str, Any], object] | None = None,
        budget: DiskBudget = UNMETERED,
        mirror: FileMirror | None = None,
    ) -> None:
        """``sync``: fdatasync each line as it is written, unless ``on_write`` is set
        (the broker's group commit then syncs it before any reply depends on it).
        ``on_damage``: what an unreadable line does (store/damage.py).
        ``object_dirs``: this is a vhost's log; a durable queue's or exchange's
        definition is also written to ``definition.json`` in its directory.
        ``check``: called with each added key and value as the log is read; what
        it raises (ValueError, KeyError, TypeError) makes that line unreadable.
        ``budget`` and ``mirror``: the data directory's (store/layout.py's DataDir);
        a log opened on its own (offline tools) has neither."""
        self.path = path
        self.sync_each_write = sync
        self.on_damage = on_damage
        self.object_dirs = object_dirs
        self._check = check
        self.live: dict[str, dict[str, Any]] = {}
        #: Keys deleted (and not added again) since the log was last compacted: a
        #: queue directory whose key is here is a delete's leftover, not an orphan.
        self.deleted: set[str] = set()
        #: Called after each line is handed to the OS, instead of syncing it here.
        self.on_write: Callable[[DefinitionsLog], None] | None = None
        self._lines = 0
        self._fd = -1
        self._size = 0
        #: Clustering's replication (store/mirror.py), told of every write.
        self.mirror = mirror
        #: The data directory's free-disk budget (store/disk_budget.py).
        self.budget = budget
        self._load()

    # -- loading --------------------------------------------------------------------------
    def _load(self) -> None:
        new_dirs = make_dirs(self.path.parent)
        created = False
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            data = b""
            created = True
        lines = data.split(b"\n")[:-1]  # the part after the last newline is torn
        # After a power cut some file systems show a file's unsynced tail as NUL
        # bytes: as torn as a last line without its newline.
        while lines and lines[-1] and not lines[-1].strip(b"\0"):
            lines.pop()
        end = sum(len(line) + 1 for line in lines)
        problems: list[str] = []
        for number, raw in enumerate(lines, 1):
            try:
                entry = decode_line(raw)
                if self._check is not None and entry["op"] == "add":
                    self._check(entry["key"], entry["value"])
                self._apply(entry)
            except (ValueError, KeyError, TypeError, DecodeError) as exc:
                problems.append(f"line {number}: {exc}")
            self._lines += 1
        if problems:
            what = f"{len(problems)} unreadable line(s) ({'; '.join(problems[:3])})"
            damage.handle(self.path, what, self.on_damage)
            # Set aside: the readable lines are the log from here on.
            self._rewrite(self._live_content())
            data = b""
            end = 0
        if end < len(data):
            self._keep_torn_tail(data[end:])
            with self.path.open("r+b") as f:
                f.truncate(end)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._size = os.fstat(self._fd).st_size
        if created:
            # The file's entry (and any directory made for it) is durable before the
            # first fdatasynced line counts as stored: a power cut keeps an entry only
            # once its directory was fsynced, however synced the file's data was.
            for directory in [*new_dirs, self.path.parent]:
                fsync_directory(directory)

    def _keep_torn_tail(self, tail: bytes) -> None:
        """A last line without its newline: a change cut short by a crash (its reply
        was never sent). Cut off, its bytes kept beside the log."""
        aside = self.path.with_name(self.path.name + ".torn")
        try:
            with aside.open("ab") as f:
                f.write(tail + b"\n")
        except OSError as exc:
            log.error("%s: cannot keep the torn last line aside: %s", self.path, exc)
        log.warning(
            "%s: torn last line (%d bytes, a write cut short) cut off; kept in %s",
            self.path,
            len(tail),
            aside,
        )

    def _apply(self, entry: dict[str, Any]) -> None:
        key = entry["key"]
        if entry["op"] == "add":
            self.live[key] = entry["value"]
            self.deleted.discard(key)
        else:
            self.live.pop(key, None)
            self.deleted.add(key)

    # -- writing --------------------------------------------------------------------------
    def _append(self, line: bytes) -> None:
        """Hand ``line`` to the OS whole, or not at all: a failed write (a full
        disk) is cut back off, so the log never holds half a line."""
        offset = self._size
        budget = self.budget  # the free-disk alarm's (store/disk_budget.py)
        budget.left -= len(line)
        if budget.left < 0:
            budget.spent()
        try:
            view = memoryview(line)
            while view:
                view = view[os.write(self._fd, view) :]
        except OSError as failed:
            try:
                os.ftruncate(self._fd, offset)
            except OSError as exc:
                log.error("%s: cannot cut a failed write back off: %s", self.path, exc)
            budget.write_failed(failed)
            raise
        self._size = offset + len(line)
        if self.mirror is not None:
            self.mirror.appended(self.path, offset, line)

    def _write(self, entry: dict[str, Any]) -> None:
        """Write the change, then apply it: a change that cannot be written
        raises (OSError) and changes nothing."""
        self._append(encode_line(entry))
        self._apply(entry)
        self._lines += 1
        if self.on_write is not None:
            self.on_write(self)
        elif self.sync_each_write:
            os.fdatasync(self._fd)
        if self._lines > _COMPACT_MIN_LINES and self._lines > 2 * len(self.live):
            self.compact()

    def put(self, key: str, value: dict[str, Any]) -> None:
        if self.live.get(key) == value:
            return
        self._write({"op": "add", "key": key, "value": value})
        if self.object_dirs and key[:2] in ("q:", "e:"):
            self._write_definition_file(key, value)

    def delete(self, key: str) -> None:
        if key in self.live:
            self._write({"op": "del", "key": key})

    def _write_definition_file(self, key: str, value: dict[str, Any]) -> None:
        """The definition again, in the object's directory when it has one: a
        redundant copy (not synced: the log is what a reply waits for) from which
        ``warren orphans restore`` can bring back a directory the log lost."""
        directory = self._object_dir(key)
        if not directory.is_dir():
            return
        record = {"key": key, "value": value}
        try:
            data = json.dumps(record).encode() + b"\n"
            write_file(directory / DEFINITION_FILE, data, mirror=self.mirror)
        except OSError as exc:
            log.warning("%s: cannot write %s: %s", directory, DEFINITION_FILE, exc)

    def _object_dir(self, key: str) -> Path:
        """The directory of the queue (``q:`` key) or exchange (``e:``) of a key."""
        kind = "queues" if key.startswith("q:") else "exchanges"
        return self.path.parent / kind / hashed(key[2:])

    def _live_content(self) -> bytes:
        return b"".join(
            encode_line({"op": "add", "key": key, "value": value})
            for key, value in self.live.items()
        )

    def _rewrite(self, content: bytes) -> None:
        """Replace the log with ``content``: temporary file, fsync, rename, fsync of
        the directory."""
        tmp = self.path.with_suffix(".tmp")
        with tmp.open("wb") as f:
            f.write(content)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        fsync_directory(self.path.parent)
        if self.mirror is not None:
            self.mirror.replaced(self.path, content)

    def compact(self) -> None:
        # A deleted queue's or exchange's directory still there (its removal comes
        # just after the delete's line) keeps its tombstone, so the next start
        # knows it for a delete's leftover rather than an orphan.
        self.deleted = {
            key
            for key in self.deleted
            if self.object_dirs and key[:2] in ("q:", "e:") and self._object_dir(key).exists()
        }
        content = self._live_content() + b"".join(
            encode_line({"op": "del", "key": key}) for key in sorted(self.deleted)
        )
        self._rewrite(content)
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        self._size = len(content)
        self._lines = len(self.live) + len(self.deleted)

    # -- Syncable (store/sync.py): the group commit syncs what on_write reported -----------
    def flush(self) -> None:
        """Nothing buffered: every line is handed to the OS as it is written."""

    def sync(self) -> None:
        if self._fd >= 0:
            os.fdatasync(self._fd)

    def collect_sync(self, fds: list[int], paths: list[Path], dirs: list[Path]) -> None:
        """sync()'s first half: nothing to write out, the descriptor to fdatasync."""
        if self._fd >= 0:
            fds.append(os.dup(self._fd))

    def entries(self, prefix: str) -> Iterator[dict[str, Any]]:
        for key, value in self.live.items():
            if key.startswith(prefix):
                yield value

    def close(self) -> None:
        if self._fd >= 0:
            try:
                if self.sync_each_write or self.on_write is not None:
                    os.fdatasync(self._fd)
            finally:
                os.close(self._fd)
                self._fd = -1
