"""Where things live in the data directory.

    <data_dir>/
      .lock                   held (flock) while a broker uses the directory
      users.json              users, password hashes, permissions
      vhosts.json             the vhost names
      mgmt.json               what the HTTP management API keeps that the core does not
                              (vhost descriptions, user limits, topic permissions ...)
      delivered.json          written by a clean shutdown, read and removed at the next
                              start: how far each durable queue's messages had been
                              delivered (without it, after a crash, every recovered
                              message counts as delivered)
      vhosts/<sha1(vhost)>/
        name                  the vhost's name, for people reading the tree
        definitions.log       durable exchanges, queues, bindings, policies, limits
        queues/<sha1(queue)>/ one durable queue's segment and ack files
        exchanges/<sha1(exchange)>/
                              a durable exchange's own store: the messages a
                              x-delayed-message exchange holds
      transient/              stores of non-durable queues (<sha1(vhost)>/<sha1(queue)>)
                              and exchanges (<sha1(vhost)>/exchanges/<sha1(exchange)>);
                              wiped at every start

Names are hashed because vhost and queue names may hold any character.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
from pathlib import Path
from typing import IO, Any

from warren.store.mirror import mirror_for

log = logging.getLogger("warren.store")


def _hashed(name: str) -> str:
    return hashlib.sha1(name.encode("utf-8", "surrogateescape")).hexdigest()


def write_json_atomically(path: Path, data: Any) -> None:
    """Write to a temporary file, fsync, rename: readers see the old or the new file."""
    tmp = path.with_name(path.name + ".tmp")
    content = (json.dumps(data, indent=2, sort_keys=True) + "\n").encode("utf-8")
    with tmp.open("wb") as f:
        f.write(content)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_directory(path.parent)
    mirror = mirror_for(path)
    if mirror is not None:
        mirror.replaced(path, content)


def fsync_directory(directory: Path) -> None:
    """Make a rename or removal in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dirs(directory: Path) -> list[Path]:
    """``mkdir -p directory``; returns the directories that got a new entry (the parent
    of each directory made), which must be fsynced before anything inside counts as
    durable: a power cut keeps an entry only once its directory was fsynced, even
    if the file it names was."""
    made: list[Path] = []
    path = directory
    while not path.is_dir():
        made.append(path)
        if path.parent == path:
            break
        path = path.parent
    directory.mkdir(parents=True, exist_ok=True)
    return [d.parent for d in made]


def make_dirs_durably(directory: Path) -> None:
    """``mkdir -p directory`` and fsync what the new entries went into, now."""
    for parent in make_dirs(directory):
        fsync_directory(parent)


def write_file(path: Path, data: bytes) -> None:
    """Write a small file outright (a name kept for people reading the tree) and
    report it to the directory's mirror."""
    path.write_bytes(data)
    mirror = mirror_for(path)
    if mirror is not None:
        mirror.replaced(path, data)


class DataDir:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._vhost_dirs: dict[str, Path] = {}  # vhost_dir's, made and not deleted since
        self._lock: IO[bytes] | None = None

    @property
    def users_file(self) -> Path:
        return self.root / "users.json"

    @property
    def vhosts_file(self) -> Path:
        return self.root / "vhosts.json"

    @property
    def transient_root(self) -> Path:
        return self.root / "transient"

    def prepare(self) -> None:
        """Create the tree, take the lock, and wipe the transient area."""
        self.root.mkdir(parents=True, exist_ok=True)
        lock = (self.root / ".lock").open("ab")
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.close()
            raise OSError(f"data dir {self.root} is in use by another Warren process") from None
        self._lock = lock
        shutil.rmtree(self.transient_root, ignore_errors=True)
        self.transient_root.mkdir()
        for leftover in (self.root / "vhosts").glob(".deleted-*"):
            # A deleted vhost's files whose removal a stop or crash cut short.
            shutil.rmtree(leftover, ignore_errors=True)

    def release(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def vhost_dir(self, vhost: str) -> Path:
        # Known to exist: every durable queue's and exchange's directory asks
        # (100,000 stat calls at the start of a broker with 100,000 queues).
        path = self._vhost_dirs.get(vhost)
        if path is not None:
            return path
        path = self.root / "vhosts" / _hashed(vhost)
        if not path.exists():
            # Durable at once: a vhost is made rarely, and its definitions log and
            # queue directories are only as durable as its own entry.
            make_dirs_durably(path)
            write_file(path / "name", vhost.encode("utf-8", "surrogateescape"))
        self._vhost_dirs[vhost] = path
        return path

    def detach_vhost_dirs(self, vhost: str) -> list[Path]:
        """Rename a deleted vhost's directories out of the way (a new vhost of the
        same name starts empty), durably: a power cut must not bring the directory
        back under its name for the next vhost of that name to find. The caller
        removes the returned paths later."""
        moved = []
        self._vhost_dirs.pop(vhost, None)
        durable = self.root / "vhosts" / _hashed(vhost)
        for path in (durable, self.transient_root / _hashed(vhost)):
            if path.exists():
                target = path.with_name(f".deleted-{path.name}-{os.urandom(4).hex()}")
                path.rename(target)
                moved.append(target)
                if path == durable:
                    fsync_directory(path.parent)
                mirror = mirror_for(path)
                if mirror is not None:
                    mirror.deleted(path)
        return moved

    def definitions_file(self, vhost: str) -> Path:
        return self.vhost_dir(vhost) / "definitions.log"

    def queue_dir(self, vhost: str, queue: str) -> Path:
        return self.vhost_dir(vhost) / "queues" / _hashed(queue)

    def transient_queue_dir(self, vhost: str, queue: str) -> Path:
        return self.transient_root / _hashed(vhost) / _hashed(queue)

    def exchange_dir(self, vhost: str, exchange: str) -> Path:
        return self.vhost_dir(vhost) / "exchanges" / _hashed(exchange)

    def transient_exchange_dir(self, vhost: str, exchange: str) -> Path:
        return self.transient_root / _hashed(vhost) / "exchanges" / _hashed(exchange)

    def remove_orphan_queue_dirs(self, vhost: str, queues: list[str]) -> None:
        """Queue directories with no durable queue behind them (a crash between the
        delete of the definition and of the files) are removed."""
        self._remove_orphans(vhost, "queues", queues)

    def remove_orphan_exchange_dirs(self, vhost: str, exchanges: list[str]) -> None:
        """Exchange directories with no durable exchange behind them are removed."""
        self._remove_orphans(vhost, "exchanges", exchanges)

    def _remove_orphans(self, vhost: str, kind: str, owners: list[str]) -> None:
        parent = self.vhost_dir(vhost) / kind
        if not parent.is_dir():
            return
        keep = {_hashed(name) for name in owners}
        for entry in parent.iterdir():
            if entry.name not in keep:
                log.warning(
                    "vhost '%s': removing orphaned %s directory %s", vhost, kind[:-1], entry
                )
                shutil.rmtree(entry, ignore_errors=True)
                mirror = mirror_for(entry)
                if mirror is not None:
                    mirror.deleted(entry)

    @property
    def delivered_file(self) -> Path:
        return self.root / "delivered.json"

    def save_delivered_marks(self, marks: dict[Path, int]) -> None:
        """Record a clean shutdown's delivered marks (store directory -> seq)."""
        root = os.path.abspath(self.root)
        relative = {os.path.relpath(os.path.abspath(d), root): m for d, m in marks.items()}
        write_json_atomically(self.delivered_file, {"version": 1, "marks": relative})

    def take_delivered_marks(self) -> dict[Path, int] | None:
        """The marks the last clean shutdown recorded, the file removed (a crash
        from here on must not find them); None when there are none (the last
        stop was not clean) or they cannot be read."""
        path = self.delivered_file
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            marks = {self.root / rel: int(seq) for rel, seq in data["marks"].items()}
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.error(
                "%s is unreadable (%s): every recovered message counts as delivered", path, exc
            )
            marks = None
        path.unlink(missing_ok=True)
        fsync_directory(self.root)
        mirror = mirror_for(path)
        if mirror is not None:
            mirror.deleted(path)
        return marks

    def load_vhosts(self) -> list[str]:
        try:
            data = json.loads(self.vhosts_file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as exc:
            log.error(
                "%s is unreadable (%s); starting with the default vhost", self.vhosts_file, exc
            )
            return []
        return [str(v) for v in data.get("vhosts", [])]

    def save_vhosts(self, names: list[str]) -> None:
        write_json_atomically(self.vhosts_file, {"vhosts": names})
