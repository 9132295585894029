"""users.json: users, password hashes, permissions and topic permissions, in
RabbitMQ's terms."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from warren.core.users import (
    SHA256,
    Permission,
    TopicPermission,
    User,
    UserStore,
    hashing_algorithm,
)
from warren.store.layout import write_json_atomically

log = logging.getLogger("warren.store")

#: The management API's file next to users.json; it kept topic permissions before
#: the core did (see _migrate_topic_permissions).
MGMT_FILE = "mgmt.json"


def load_users(path: Path) -> UserStore:
    store = UserStore()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        data = {}
    except (OSError, ValueError) as exc:
        log.error("%s is unreadable (%s); starting with no users but the default", path, exc)
        return store
    store.from_file = bool(data)
    for rec in data.get("users", []):
        try:
            user = User(rec["name"], rec["password_hash"], list(rec.get("tags", [])))
            user.hashing_algorithm = hashing_algorithm(rec.get("hashing_algorithm", SHA256)) or SHA256
            for vhost, perm in rec.get("permissions", {}).items():
                user.permissions[vhost] = Permission(perm["configure"], perm["write"], perm["read"])
            for vhost, table in rec.get("topic_permissions", {}).items():
                user.topic_permissions[vhost] = {
                    exchange: TopicPermission(perm["write"], perm["read"])
                    for exchange, perm in table.items()
                }
            store.users[user.name] = user
        except (KeyError, TypeError, AttributeError) as exc:
            log.error("%s: skipping malformed user record (%s)", path, exc)
    _migrate_topic_permissions(store, path)
    return store


def _migrate_topic_permissions(store: UserStore, path: Path) -> None:
    """Move the topic permissions an older Warren kept in mgmt.json (stored, never
    enforced) into users.json, once: users.json is written first, so a crash in
    between only repeats the (idempotent) move at the next start."""
    mgmt = path.parent / MGMT_FILE
    try:
        data: Any = json.loads(mgmt.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # none, or unreadable: the management API reports that itself
    if not isinstance(data, dict) or "topic_permissions" not in data:
        return
    records = data.pop("topic_permissions")
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
    try:
        save_users(store, path)
        write_json_atomically(mgmt, data)
    except OSError as exc:
        log.error("cannot move topic permissions from %s to %s: %s", mgmt, path, exc)
        return
    log.info("moved %d topic permission(s) from %s to %s", moved, mgmt, path)


def save_users(store: UserStore, path: Path) -> None:
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
        }
        for u in store.users.values()
    ]
    write_json_atomically(path, {"users": users})
