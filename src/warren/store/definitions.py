"""The durable definitions of one vhost: exchanges, queues, bindings, policies, limits.

Every change is appended to ``definitions.log`` as one JSON line and fsynced, so
a declare that a client saw confirmed survives kill -9. Replaying the log in
order rebuilds the state; when deletes have made most lines dead, the log is
rewritten (to a temporary file, fsynced, renamed over the old one) so it does
not grow without bound under declare/delete churn.
"""

from __future__ import annotations

import base64
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from warren.core.codec_errors import DecodeError
from warren.core.table import decode_table
from warren.core.table_encode import encode_table
from warren.store.layout import fsync_directory, make_dirs
from warren.store.mirror import mirror_for

log = logging.getLogger("warren.store")

_COMPACT_MIN_LINES = 1000


def encode_arguments(arguments: dict[str, Any] | None) -> str:
    """Arguments as base64 of their AMQP table encoding: lossless for every field type."""
    return base64.b64encode(encode_table(arguments or {})).decode()


def decode_arguments(text: str) -> dict[str, Any]:
    table, _ = decode_table(base64.b64decode(text), 0)
    return table


def exchange_key(name: str) -> str:
    return "e:" + name


def queue_key(name: str) -> str:
    return "q:" + name


def binding_key(source: str, kind: str, destination: str, routing_key: str, args: str) -> str:
    return json.dumps(["b", source, kind, destination, routing_key, args])


class DefinitionsLog:
    """Append-only log of definition changes with the live state kept alongside."""

    def __init__(self, path: Path, sync: bool = True) -> None:
        self.path = path
        self.sync_each_write = sync
        self.live: dict[str, dict[str, Any]] = {}
        self._lines = 0
        self._file: Any = None
        #: Clustering's replication (store/mirror.py), told of every write.
        self.mirror = mirror_for(path)
        self._load()

    def _load(self) -> None:
        new_dirs = make_dirs(self.path.parent)
        created = not self.path.exists()
        if not created:
            good_bytes = 0
            with self.path.open("rb") as f:
                for raw in f:
                    if not raw.endswith(b"\n"):
                        log.warning("%s: torn last line cut off", self.path)
                        break
                    try:
                        entry = json.loads(raw)
                        self._apply(entry)
                    except (ValueError, KeyError, TypeError, DecodeError) as exc:
                        log.warning("%s: unreadable line skipped: %s", self.path, exc)
                    good_bytes += len(raw)
                    self._lines += 1
            if good_bytes != self.path.stat().st_size:
                with self.path.open("r+b") as f:
                    f.truncate(good_bytes)
        self._file = self.path.open("ab")
        if created:
            # The file's entry (and any directory made for it) is durable before the
            # first fdatasynced line counts as stored: a power cut keeps an entry only
            # once its directory was fsynced, however synced the file's data was.
            for directory in [*new_dirs, self.path.parent]:
                fsync_directory(directory)

    def _apply(self, entry: dict[str, Any]) -> None:
        op = entry["op"]
        key = entry["key"]
        if op == "add":
            self.live[key] = entry["value"]
        elif op == "del":
            self.live.pop(key, None)
        else:
            raise ValueError(f"unknown op {op!r}")

    def _write(self, entry: dict[str, Any]) -> None:
        self._apply(entry)
        line = json.dumps(entry, separators=(",", ":")).encode() + b"\n"
        if self.mirror is not None:
            self.mirror.appended(self.path, self._file.tell(), line)
        self._file.write(line)
        self._file.flush()
        if self.sync_each_write:
            os.fdatasync(self._file.fileno())
        self._lines += 1
        if self._lines > _COMPACT_MIN_LINES and self._lines > 2 * len(self.live):
            self.compact()

    def put(self, key: str, value: dict[str, Any]) -> None:
        if self.live.get(key) == value:
            return
        self._write({"op": "add", "key": key, "value": value})

    def delete(self, key: str) -> None:
        if key in self.live:
            self._write({"op": "del", "key": key})

    def compact(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        content = b"".join(
            json.dumps({"op": "add", "key": key, "value": value}, separators=(",", ":")).encode()
            + b"\n"
            for key, value in self.live.items()
        )
        with tmp.open("wb") as f:
            f.write(content)
            f.flush()
            os.fsync(f.fileno())
        self._file.close()
        os.replace(tmp, self.path)
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        self._lines = len(self.live)
        self._file = self.path.open("ab")
        if self.mirror is not None:
            self.mirror.replaced(self.path, content)

    # -- Syncable (store/sync.py), for logs written with sync=False ---------------------
    def flush(self) -> None:
        """Nothing buffered: every write is flushed to the OS as it is made."""

    def sync(self) -> None:
        if self._file is not None:
            os.fdatasync(self._file.fileno())

    def collect_sync(self, fds: list[int], paths: list[Path], dirs: list[Path]) -> None:
        """sync()'s first half: nothing to write out, the descriptor to fdatasync."""
        if self._file is not None:
            fds.append(os.dup(self._file.fileno()))

    def entries(self, prefix: str) -> Iterator[dict[str, Any]]:
        for key, value in self.live.items():
            if key.startswith(prefix):
                yield value

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
