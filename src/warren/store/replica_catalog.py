"""What a follower's copy of the data directory holds, read without a broker.

A cluster follower runs no broker, but its directory is the leader's, file for
file: users.json, vhosts.json, each vhost's definitions.log and every stream's
segments. The follower's read-only stream service (amqp/replica.py) asks this
catalog who may log in, which vhosts and stream queues exist, and for the
streams' files (store/stream_replica.py). Each file is read again only when
its size or mtime changed, so a replica follows the leader's declares, deletes
and user changes as they are replicated.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from warren.core.users import UserStore
from warren.store.definitions import decode_arguments, decode_line, queue_key
from warren.store.layout import hashed
from warren.store.stream_replica import ReplicaStreamStore
from warren.store.users_file import load_users

__all__ = ["ReplicaCatalog"]

log = logging.getLogger("warren.store")


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


class ReplicaCatalog:
    """Users, vhosts, stream queues and their stores in a replicated directory."""

    def __init__(self, root: Path, default_user: str = "guest", default_password: str = "guest"):
        self.root = Path(root)
        self._default = (default_user, default_password)
        self._users: tuple[tuple[int, int] | None, UserStore] | None = None
        self._vhosts: tuple[tuple[int, int] | None, list[str]] | None = None
        # vhost -> (stamp of definitions.log, live queue records by name)
        self._queues: dict[str, tuple[tuple[int, int] | None, dict[str, dict[str, Any]]]] = {}
        #: Open stream stores by (vhost, queue): those a consumer reads.
        self.streams: dict[tuple[str, str], ReplicaStreamStore] = {}

    # -- users and vhosts -----------------------------------------------------------------
    def users(self) -> UserStore:
        path = self.root / "users.json"
        stamp = _stamp(path)
        if self._users is None or self._users[0] != stamp:
            store = load_users(path)
            if not store.users and not store.from_file:
                # A leader that never wrote users.json has its default user only.
                name, password = self._default
                store.add_user(name, password, ["administrator"])
                store.set_permissions(name, "/")
            self._users = (stamp, store)
        return self._users[1]

    def vhosts(self) -> list[str]:
        path = self.root / "vhosts.json"
        stamp = _stamp(path)
        if self._vhosts is None or self._vhosts[0] != stamp:
            names = ["/"]
            try:
                names = [str(v) for v in json.loads(path.read_text("utf-8")).get("vhosts", [])]
            except FileNotFoundError:
                pass
            except (OSError, ValueError) as exc:
                log.warning("%s is unreadable (%s)", path, exc)
            self._vhosts = (stamp, names)
        return self._vhosts[1]

    # -- queues ---------------------------------------------------------------------------
    def _vhost_dir(self, vhost: str) -> Path:
        return self.root / "vhosts" / hashed(vhost)

    def queue(self, vhost: str, name: str) -> dict[str, Any] | None:
        """The durable queue's record (arguments decoded), None when there is none."""
        path = self._vhost_dir(vhost) / "definitions.log"
        stamp = _stamp(path)
        cached = self._queues.get(vhost)
        if cached is None or cached[0] != stamp:
            cached = (stamp, self._read_queues(path))
            self._queues[vhost] = cached
        return cached[1].get(name)

    @staticmethod
    def _read_queues(path: Path) -> dict[str, dict[str, Any]]:
        live: dict[str, dict[str, Any]] = {}
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return live
        for line in raw.split(b"\n"):
            if not line:
                continue
            try:
                entry = decode_line(line)
                key = entry["key"]
                if not key.startswith("q:"):
                    continue
                if entry["op"] == "add":
                    live[key] = entry["value"]
                else:
                    live.pop(key, None)
            except (ValueError, KeyError, TypeError, AttributeError):
                continue  # a line being written: the next read has it whole
        queues: dict[str, dict[str, Any]] = {}
        for key, value in live.items():
            try:
                record = dict(value)
                record["arguments"] = decode_arguments(value.get("arguments", ""))
                queues[key[len(queue_key("")) :]] = record
            except Exception:
                log.warning("%s: unreadable queue record %s", path, key)
        return queues

    def stream(self, vhost: str, name: str) -> ReplicaStreamStore | None:
        """The stream's store (opened on first use), None when its directory does
        not exist yet (a stream nothing was published to)."""
        key = (vhost, name)
        store = self.streams.get(key)
        if store is not None:
            return store
        directory = self._vhost_dir(vhost) / "queues" / hashed(name)
        if not directory.is_dir():
            return None
        store = self.streams[key] = ReplicaStreamStore(directory)
        return store

    def forget(self, vhost: str, name: str) -> None:
        store = self.streams.pop((vhost, name), None)
        if store is not None:
            store.close()

    def refresh(self) -> list[tuple[str, str]]:
        """Refresh every open stream; the keys of those whose bounds changed."""
        changed = []
        for key, store in list(self.streams.items()):
            if store.refresh():
                changed.append(key)
        return changed
