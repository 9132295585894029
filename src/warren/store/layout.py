"""Where things live in the data directory.

    <data_dir>/
      .lock                   held (flock) while a broker uses the directory
      users.json              users, password hashes, permissions
      vhosts.json             the vhost names
      cluster_id.json         the cluster's permanent id (store/cluster_id.py)
      mgmt.json               what the HTTP management API keeps that the core does not
                              (vhost descriptions, user limits, topic permissions ...)
      webhooks.json           the webhook targets made through the API (webhooks/saved.py)
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

DataDir is the one object for a data directory: its paths, its lock, and what
every writer in it is given rather than looks up: the disk budget
(store/disk_budget.py) and clustering's mirror (store/mirror.py). The
StoreFactory (warren/store_factory.py) is made from it and hands both to each
store it makes; the small files written here report to the mirror passed in.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import zlib
from collections.abc import Collection
from pathlib import Path
from typing import IO, Any

from warren.store import damage
from warren.store.damage import set_aside
from warren.store.disk_budget import UNMETERED, DiskBudget
from warren.store.mirror import FileMirror
from warren.store.sync_files import fsync_directory

log = logging.getLogger("warren.store")


def hashed(name: str) -> str:
    """The directory name of a vhost, queue or exchange named ``name``."""
    return hashlib.sha1(name.encode("utf-8", "surrogateescape")).hexdigest()



def vhost_name(vhost_dir: Path) -> str | None:
    """The name a vhost directory keeps in its ``name`` file; None when it has none
    or the name does not hash to the directory."""
    try:
        name = (vhost_dir / "name").read_bytes().decode("utf-8", "surrogateescape")
    except OSError:
        return None
    return name if hashed(name) == vhost_dir.name else None


#: The key of a JSON file's own CRC-32 (write_json_atomically, read_json_checked).
CHECKSUM_KEY = "checksum"


def _checksum(data: dict[str, Any]) -> str:
    text = json.dumps(data, indent=2, sort_keys=True).encode("utf-8")
    return f"crc32:{zlib.crc32(text):08x}"


def write_json_atomically(
    path: Path, data: dict[str, Any], mirror: FileMirror | None = None
) -> None:
    """Write to a temporary file, fsync, rename: readers see the old or the new file.
    The file carries the CRC-32 of the rest of its content, so a flipped byte
    that still parses is caught by read_json_checked. ``mirror``: the data
    directory's (DataDir.mirror), told the new content."""
    tmp = path.with_name(path.name + ".tmp")
    data = {key: value for key, value in data.items() if key != CHECKSUM_KEY}
    stamped = {**data, CHECKSUM_KEY: _checksum(data)}
    content = (json.dumps(stamped, indent=2, sort_keys=True) + "\n").encode("utf-8")
    try:
        with tmp.open("wb") as f:
            f.write(content)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # a full disk: the old file stays as it was, no temporary one
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_directory(path.parent)
    if mirror is not None:
        mirror.replaced(path, content)


def read_json_checked(path: Path, keys: Collection[str]) -> dict[str, Any]:
    """A file write_json_atomically wrote, its checksum checked (a file an older
    Warren wrote has none, and is read as it is). Raises FileNotFoundError, or
    ValueError when it is damaged: not JSON, not an object, a key that is not
    one of ``keys``, or a checksum that does not match."""
    data = json.loads(path.read_bytes())
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    stamp = data.pop(CHECKSUM_KEY, None)
    unknown = set(data) - set(keys)
    if unknown:
        raise ValueError(f"unexpected key(s) {', '.join(sorted(unknown))}")
    if stamp is not None and stamp != _checksum(data):
        raise ValueError("checksum mismatch")
    return data


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


def write_file(
    path: Path, data: bytes, durable: bool = False, mirror: FileMirror | None = None
) -> None:
    """Write a small file whole (a temporary file renamed over it: a reader never
    sees half of it) and report it to ``mirror``, the data directory's. ``durable``:
    fsync it and its directory first (a vhost's name, which a start cannot do without)."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as f:
        f.write(data)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if durable:
        fsync_directory(path.parent)
    if mirror is not None:
        mirror.replaced(path, data)


class DataDir:
    """A data directory: where everything lives, and what its writers are given."""

    def __init__(
        self, root: Path, budget: DiskBudget = UNMETERED, mirror: FileMirror | None = None
    ) -> None:
        self.root = root
        #: What the writers may still append before the free disk is measured
        #: again (store/disk_budget.py): the broker's resource alarms own it.
        self.budget = budget
        #: Clustering's replication (store/mirror.py), told of every change; set by
        #: the broker before it starts, None without clustering. Stores take it
        #: when they are made: one made before it was set is not covered.
        self.mirror = mirror
        self._vhost_dirs: dict[str, Path] = {}  # vhost_dir's, made and not deleted since
        self._lock: IO[bytes] | None = None

    @property
    def users_file(self) -> Path:
        return self.root / "users.json"

    @property
    def vhosts_file(self) -> Path:
        return self.root / "vhosts.json"

    @property
    def cluster_id_file(self) -> Path:
        return self.root / "cluster_id.json"

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
        leftovers = [*(self.root / "vhosts").glob(".deleted-*")]
        leftovers += (self.root / "mqtt").glob(".deleted-*")
        for leftover in leftovers:
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
        path = self.root / "vhosts" / hashed(vhost)
        if not path.exists():
            # Durable at once, before anything in it: a vhost is made rarely, its
            # definitions log and queue directories are only as durable as its own
            # entry, and a start identifies the vhost by its name file.
            make_dirs_durably(path)
            name = vhost.encode("utf-8", "surrogateescape")
            write_file(path / "name", name, durable=True, mirror=self.mirror)
        self._vhost_dirs[vhost] = path
        return path

    def has_vhost_dir(self, vhost: str) -> bool:
        return vhost in self._vhost_dirs or (self.root / "vhosts" / hashed(vhost)).exists()

    def detach_vhost_dirs(self, vhost: str) -> list[Path]:
        """Rename a deleted vhost's directories out of the way (a new vhost of the
        same name starts empty), durably: a power cut must not bring the directory
        back under its name for the next vhost of that name to find. The caller
        removes the returned paths later."""
        moved = []
        self._vhost_dirs.pop(vhost, None)
        durable = (self.root / "vhosts" / hashed(vhost), self.root / "mqtt" / hashed(vhost))
        for path in (*durable, self.transient_root / hashed(vhost)):
            if path.exists():
                target = path.with_name(f".deleted-{path.name}-{os.urandom(4).hex()}")
                path.rename(target)
                moved.append(target)
                if path in durable:
                    fsync_directory(path.parent)
                if self.mirror is not None:
                    self.mirror.deleted(path)
        return moved

    def definitions_file(self, vhost: str) -> Path:
        return self.vhost_dir(vhost) / "definitions.log"

    def queue_dir(self, vhost: str, queue: str) -> Path:
        return self.vhost_dir(vhost) / "queues" / hashed(queue)

    def transient_queue_dir(self, vhost: str, queue: str) -> Path:
        return self.transient_root / hashed(vhost) / hashed(queue)

    def exchange_dir(self, vhost: str, exchange: str) -> Path:
        return self.vhost_dir(vhost) / "exchanges" / hashed(exchange)

    def transient_exchange_dir(self, vhost: str, exchange: str) -> Path:
        return self.transient_root / hashed(vhost) / "exchanges" / hashed(exchange)

    @property
    def delivered_file(self) -> Path:
        return self.root / "delivered.json"

    def save_delivered_marks(self, marks: dict[Path, int]) -> None:
        """Record a clean shutdown's delivered marks (store directory -> seq)."""
        root = os.path.abspath(self.root)
        relative = {os.path.relpath(os.path.abspath(d), root): m for d, m in marks.items()}
        write_json_atomically(
            self.delivered_file, {"version": 1, "marks": relative}, self.mirror
        )

    def take_delivered_marks(self) -> dict[Path, int] | None:
        """The marks the last clean shutdown recorded, the file removed (a crash
        from here on must not find them); None when there are none (the last
        stop was not clean) or they cannot be read."""
        path = self.delivered_file
        try:
            data = read_json_checked(path, ("version", "marks"))
            marks = {self.root / rel: int(seq) for rel, seq in data["marks"].items()}
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            # Safe to go on: without marks every recovered message is redelivered.
            set_aside(path, f"unreadable ({exc}): every recovered message counts as delivered")
            return None
        path.unlink(missing_ok=True)
        fsync_directory(self.root)
        if self.mirror is not None:
            self.mirror.deleted(path)
        return marks

    def load_vhosts(self, on_damage: str = damage.REFUSE) -> list[str]:
        """The vhosts: one per vhost directory, named by its ``name`` file, in the
        order vhosts.json lists them. A vhost's directory is made before
        vhosts.json lists it and detached before vhosts.json forgets it, so the
        directories are the record and vhosts.json only orders them: a damaged
        one is set aside, and a name it lists without a directory is a delete cut
        short. A directory without a readable name is damage (store/damage.py)."""
        listed: list[str] = []
        try:
            data = read_json_checked(self.vhosts_file, ("vhosts",))
            if not isinstance(data.get("vhosts"), list):
                raise ValueError("not a vhosts file")
            listed = [v for v in data["vhosts"] if isinstance(v, str)]
            if len(listed) != len(data["vhosts"]):
                raise ValueError("a vhost name is not a string")
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as exc:
            listed = []
            set_aside(self.vhosts_file, f"unreadable ({exc}); rebuilt from the vhost directories")
        found: list[str] = []
        vhosts = self.root / "vhosts"
        for vhost_dir in sorted(vhosts.iterdir()) if vhosts.is_dir() else ():
            if vhost_dir.name.startswith(".") or not vhost_dir.is_dir():
                continue
            name = vhost_name(vhost_dir)
            if name is None:
                problem = "missing or unreadable: the vhost this directory holds is unknown"
                if on_damage != damage.SET_ASIDE:
                    raise damage.refusal(vhost_dir / "name", problem)
                log.error("%s is %s; the directory is left as it is", vhost_dir / "name", problem)
                continue
            found.append(name)
        names = [name for name in listed if name in found]
        for name in listed:
            if name not in found:
                log.warning("vhost '%s' has no directory: its delete was cut short", name)
        for name in found:
            if name not in names:
                log.warning("vhost '%s' has a directory but was not in %s", name, self.vhosts_file)
                names.append(name)
        return names

    @property
    def is_new(self) -> bool:
        """Whether the directory holds no broker's data yet (no users file, no vhost):
        only then is the default user made."""
        vhosts = self.root / "vhosts"
        return not (
            self.users_file.exists()
            or self.vhosts_file.exists()
            or (vhosts.is_dir() and any(vhosts.iterdir()))
        )

    def save_vhosts(self, names: list[str]) -> None:
        write_json_atomically(self.vhosts_file, {"vhosts": names}, self.mirror)
