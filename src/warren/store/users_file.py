"""users.json: users, password hashes and permissions, in RabbitMQ's terms."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from warren.core.users import Permission, User, UserStore
from warren.store.layout import write_json_atomically

log = logging.getLogger("warren.store")

HASHING_ALGORITHM = "rabbit_password_hashing_sha256"


def load_users(path: Path) -> UserStore:
    store = UserStore()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return store
    except (OSError, ValueError) as exc:
        log.error("%s is unreadable (%s); starting with no users but the default", path, exc)
        return store
    for rec in data.get("users", []):
        try:
            user = User(rec["name"], rec["password_hash"], list(rec.get("tags", [])))
            for vhost, perm in rec.get("permissions", {}).items():
                user.permissions[vhost] = Permission(perm["configure"], perm["write"], perm["read"])
            store.users[user.name] = user
        except (KeyError, TypeError) as exc:
            log.error("%s: skipping malformed user record (%s)", path, exc)
    return store


def save_users(store: UserStore, path: Path) -> None:
    users = [
        {
            "name": u.name,
            "password_hash": u.password_hash,
            "hashing_algorithm": HASHING_ALGORITHM,
            "tags": u.tags,
            "permissions": {
                vhost: {"configure": p.configure, "write": p.write, "read": p.read}
                for vhost, p in u.permissions.items()
            },
        }
        for u in store.users.values()
    ]
    write_json_atomically(path, {"users": users})
