"""Queue and exchange directories that no definition claims.

A durable queue's messages live in ``vhosts/<vhost>/queues/<sha1(name)>/``; its
definition lives in the vhost's ``definitions.log``. When a queue is deleted,
the log says so (a ``del`` line) before its directory is removed, so a crash in
between leaves a directory whose key the log shows as deleted: a leftover,
removed at the next start. A directory that the log neither claims nor shows
as deleted means the log lost lines (damage, truncation, a restored backup of
the wrong age): its messages are an orphan's, and are never deleted for it.
The broker refuses to start over orphans holding data, unless
``damaged_metadata = set-aside``, where it leaves them in place (a queue
redeclared with the same name takes its directory back) and says so.
``warren orphans`` lists them, restores their definitions from the
``definition.json`` each directory keeps (store/definitions.py), or deletes them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warren.store import damage
from warren.store.definitions import DEFINITION_FILE, decode_line
from warren.store.layout import hashed, vhost_name
from warren.store.mirror import FileMirror
from warren.store.segment_spares import SPARE_NAME

log = logging.getLogger("warren.store")

#: The kinds of directories a vhost's definitions claim, and their key prefixes.
KINDS = (("queues", "q:"), ("exchanges", "e:"))


@dataclass
class Orphan:
    """A directory holding a queue's or exchange's data that no definition claims."""

    vhost: str
    kind: str  # "queue" or "exchange"
    path: Path
    #: The definition its definition.json keeps ({"key": ..., "value": ...}), if any.
    record: dict[str, Any] | None
    data_bytes: int

    @property
    def name(self) -> str | None:
        return None if self.record is None else self.record["key"][2:]

    def describe(self) -> str:
        who = f"{self.kind} '{self.name}'" if self.name is not None else f"an unnamed {self.kind}"
        return f"{who} in vhost '{self.vhost}' ({self.data_bytes} bytes, {self.path})"


def read_definition_file(directory: Path) -> dict[str, Any] | None:
    """The definition a directory keeps; None when it has none or it is unreadable."""
    try:
        record = json.loads((directory / DEFINITION_FILE).read_bytes())
    except (OSError, ValueError):
        return None
    if (
        not isinstance(record, dict)
        or not isinstance(record.get("key"), str)
        or record["key"][:2] not in ("q:", "e:")
        or not isinstance(record.get("value"), dict)
        or hashed(record["key"][2:]) != directory.name
    ):
        return None
    return record


def data_bytes(directory: Path) -> int:
    """Bytes of every file under ``directory`` but its definition.json and spare
    segment files (store/segment_spares.py: they hold no data)."""
    total = 0
    for dirpath, _dirs, files in os.walk(directory):
        for name in files:
            if name == DEFINITION_FILE and dirpath == str(directory):
                continue
            if SPARE_NAME.fullmatch(name):
                continue
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(dirpath, name)).st_size
    return total


def classify(
    vhost: str, vhost_dir: Path, live: set[str] | dict[str, Any], deleted: set[str]
) -> tuple[list[Path], list[Orphan]]:
    """Sort a vhost's unclaimed queue and exchange directories, given the keys its
    definitions hold (``live``) and show as deleted: the leftovers that may go
    (of deletes, or empty and nameless), and the orphans that must stay."""
    leftovers: list[Path] = []
    orphans: list[Orphan] = []
    for kind, prefix in KINDS:
        parent = vhost_dir / kind
        if not parent.is_dir():
            continue
        claimed = {hashed(key[2:]) for key in live if key.startswith(prefix)}
        gone = {hashed(key[2:]) for key in deleted if key.startswith(prefix)}
        for entry in sorted(parent.iterdir()):
            if entry.name in claimed:
                continue
            if entry.name.startswith(".deleted-") or entry.name in gone:
                leftovers.append(entry)
                continue
            record = read_definition_file(entry) if entry.is_dir() else None
            size = data_bytes(entry) if entry.is_dir() else 0
            if record is None and size == 0:
                leftovers.append(entry)
            else:
                orphans.append(Orphan(vhost, kind[:-1], entry, record, size))
    return leftovers, orphans


def sweep(
    vhost: str,
    vhost_dir: Path,
    live: set[str] | dict[str, Any],
    deleted: set[str],
    mirror: FileMirror | None = None,
) -> list[Orphan]:
    """classify(), then remove the leftovers (``mirror``, the data directory's, is
    told); the orphans are left in place."""
    leftovers, orphans = classify(vhost, vhost_dir, live, deleted)
    for path in leftovers:
        log.info("vhost '%s': removing %s, which a delete left or nothing claims", vhost, path)
        shutil.rmtree(path, ignore_errors=True)
        if mirror is not None:
            mirror.deleted(path)
    return orphans


def read_log_keys(path: Path) -> tuple[dict[str, Any], set[str]]:
    """The live keys and the deleted keys of a definitions log, read without
    changing it; unreadable lines are passed over (for listing only)."""
    live: dict[str, Any] = {}
    deleted: set[str] = set()
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return live, deleted
    for raw in data.split(b"\n")[:-1]:
        try:
            entry = decode_line(raw)
        except ValueError:
            continue
        if entry["op"] == "add":
            live[entry["key"]] = entry["value"]
            deleted.discard(entry["key"])
        else:
            live.pop(entry["key"], None)
            deleted.add(entry["key"])
    return live, deleted


def find(root: Path) -> list[Orphan]:
    """Every orphan under a data directory, found without changing anything (the
    broker must not be running: ``warren orphans`` holds the directory's lock)."""
    orphans: list[Orphan] = []
    vhosts = root / "vhosts"
    if not vhosts.is_dir():
        return orphans
    for vhost_dir in sorted(vhosts.iterdir()):
        if vhost_dir.name.startswith(".deleted-") or not vhost_dir.is_dir():
            continue
        vhost = vhost_name(vhost_dir) or f"<unnamed {vhost_dir.name}>"
        live, deleted = read_log_keys(vhost_dir / "definitions.log")
        orphans.extend(classify(vhost, vhost_dir, live, deleted)[1])
    return orphans


def report(definitions: Path, orphans: list[Orphan], policy: str) -> None:
    """Refuse the start over ``orphans`` (DamagedFile), or, with ``set-aside``,
    leave them in place and say so loudly."""
    listed = "; ".join(o.describe() for o in orphans[:5])
    if len(orphans) > 5:
        listed += f"; and {len(orphans) - 5} more"
    problem = (
        f"{len(orphans)} queue or exchange directories hold data that no definition "
        f"claims (lines of the log were lost?): {listed}"
    )
    if policy != damage.SET_ASIDE:
        raise damage.DamagedFile(
            definitions,
            problem,
            "Nothing was deleted. `warren orphans list` shows them, `warren orphans "
            "restore` brings their definitions back (from the definition.json each "
            "keeps); or start with [main] damaged_metadata = set-aside to leave them "
            "where they are (a queue declared again with its name takes its "
            "messages back)",
        )
    for orphan in orphans:
        log.error(
            "orphaned %s left in place, not served: no definition claims it "
            "(`warren orphans` lists and restores them)",
            orphan.describe(),
        )
