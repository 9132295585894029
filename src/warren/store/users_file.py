"""users.json: users, password hashes, permissions, topic permissions and user
limits, in RabbitMQ's terms."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from warren.core.users import (
    SHA256,
    USER_LIMIT_KEYS,
    Permission,
    TopicPermission,
    User,
    UserStore,
    hashing_algorithm,
)
from warren.store import damage
from warren.store.layout import read_json_checked, write_json_atomically
from warren.store.mirror import FileMirror

log = logging.getLogger("warren.store")

#: The management API's file next to users.json; it kept topic permissions and user
#: limits before the core did (see _migrate_topic_permissions, _migrate_user_limits).
MGMT_FILE = "mgmt.json"
_MGMT_KEYS = ("vhost_metadata", "global_parameters")


def load_users(
    path: Path,
    on_damage: str = damage.REFUSE,
    mirror: FileMirror | None = None,
    migrate: bool = True,
) -> UserStore:
    """The users ``path`` holds (an empty store, ``from_file`` False, when there is
    no such file). A file that cannot be read whole refuses the start, or is set
    aside and the store starts empty with ``from_file`` True, so that no
    default user is made in its place (store/damage.py). ``migrate``: move an
    older mgmt.json's entries in now (a start does it with migrate_from_mgmt
    once it is accepted, so a refused start writes nothing)."""
    store = UserStore()
    try:
        data = read_json_checked(path, ("users",))
        if not isinstance(data.get("users", []), list):
            raise ValueError("not a users file")
        for rec in data.get("users", []):
            user = _user(rec)
            store.users[user.name] = user
    except FileNotFoundError:
        return store
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        damage.handle(path, f"unreadable ({exc})", on_damage)
        store = UserStore()
        store.from_file = True
        log.error("starting with no users: add one with `warren users add`")
        return store
    store.from_file = bool(data)
    if migrate:
        migrate_from_mgmt(store, path, mirror)
    return store


def _user(rec: Any) -> User:
    """A user from its record; KeyError, TypeError or ValueError when malformed."""
    if not isinstance(rec, dict) or not isinstance(rec.get("name"), str):
        raise ValueError(f"malformed user record {rec!r:.80}")
    user = User(rec["name"], rec["password_hash"], list(rec.get("tags", [])))
    user.hashing_algorithm = hashing_algorithm(rec.get("hashing_algorithm", SHA256)) or SHA256
    for vhost, perm in rec.get("permissions", {}).items():
        user.permissions[vhost] = Permission(perm["configure"], perm["write"], perm["read"])
    for vhost, table in rec.get("topic_permissions", {}).items():
        user.topic_permissions[vhost] = {
            exchange: TopicPermission(perm["write"], perm["read"])
            for exchange, perm in table.items()
        }
    user.limits = _limits(rec.get("limits", {}))
    return user


def _limits(raw: Any) -> dict[str, int]:
    """The user limits of a record: known keys with integer values only."""
    if not isinstance(raw, dict):
        raise TypeError(f"limits must be an object, not {raw!r}")
    return {
        k: v
        for k, v in raw.items()
        if k in USER_LIMIT_KEYS and isinstance(v, int) and not isinstance(v, bool)
    }


def migrate_from_mgmt(store: UserStore, path: Path, mirror: FileMirror | None) -> None:
    """Move what an older Warren kept in mgmt.json (stored, never enforced) into
    users.json, once: users.json is written first, so a crash in between only
    repeats the (idempotent) move at the next start."""
    mgmt = path.parent / MGMT_FILE
    try:
        data: Any = read_json_checked(mgmt, ("topic_permissions", "user_limits", *_MGMT_KEYS))
    except (OSError, ValueError):
        return  # none, or unreadable: the management API reports that itself
    if not isinstance(data, dict) or not ("topic_permissions" in data or "user_limits" in data):
        return
    moved = _migrate_topic_permissions(store, data, mgmt)
    moved_limits = _migrate_user_limits(store, data, mgmt)
    try:
        save_users(store, path, mirror)
        write_json_atomically(mgmt, data, mirror)
    except OSError as exc:
        log.error("cannot move topic permissions and limits from %s to %s: %s", mgmt, path, exc)
        return
    log.info(
        "moved %d topic permission(s) and the limits of %d user(s) from %s to %s",
        moved,
        moved_limits,
        mgmt,
        path,
    )


def _migrate_topic_permissions(store: UserStore, data: dict[str, Any], mgmt: Path) -> int:
    """Take mgmt.json's topic permissions into ``store``; how many were moved."""
    records = data.pop("topic_permissions", [])
    moved = 0
    for rec in records if isinstance(records, list) else []:
        keys = ("user", "vhost", "exchange", "write", "read")
        if not isinstance(rec, dict) or not all(isinstance(rec.get(k), str) for k in keys):
            log.error("%s: skipping malformed topic permission %r", mgmt, rec)
            continue
        if rec["user"] not in store.users:
            log.warning("%s: topic permission of missing user '%s' dropped", mgmt, rec["user"])
            continue
        store.set_topic_permission(*(rec[k] for k in keys))
        moved += 1
    return moved


def _migrate_user_limits(store: UserStore, data: dict[str, Any], mgmt: Path) -> int:
    """Take mgmt.json's user limits ({user: {key: n}}) into ``store``; how many
    users' limits were moved."""
    table = data.pop("user_limits", {})
    moved = 0
    for name, limits in table.items() if isinstance(table, dict) else ():
        user = store.users.get(name)
        if user is None:
            log.warning("%s: limits of missing user '%s' dropped", mgmt, name)
            continue
        try:
            user.limits.update(_limits(limits))
        except TypeError:
            log.error("%s: skipping malformed limits of user '%s': %r", mgmt, name, limits)
            continue
        moved += 1
    return moved


def save_users(store: UserStore, path: Path, mirror: FileMirror | None = None) -> None:
    """Write the users to ``path`` (``mirror``: the data directory's, told)."""
    users = [
        {
            "name": u.name,
            "password_hash": u.password_hash,
            "hashing_algorithm": u.hashing_algorithm,
            "tags": u.tags,
            "permissions": {
                vhost: {"configure": p.configure, "write": p.write, "read": p.read}
                for vhost, p in u.permissions.items()
            },
            "topic_permissions": {
                vhost: {x: {"write": p.write, "read": p.read} for x, p in table.items()}
                for vhost, table in u.topic_permissions.items()
            },
            "limits": dict(u.limits),
        }
        for u in store.users.values()
    ]
    write_json_atomically(path, {"users": users}, mirror)
