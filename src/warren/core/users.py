"""Users, password hashes and per-vhost permissions, checked as RabbitMQ does.

Password hashes use RabbitMQ's default scheme (salted SHA-256, base64 of
salt + digest), so definitions exported from RabbitMQ import unchanged.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
from dataclasses import dataclass, field

from warren.core.errors import AccessRefused

CONFIGURE, WRITE, READ = "configure", "write", "read"


def hash_password(password: str, salt: bytes | None = None) -> str:
    salt = os.urandom(4) if salt is None else salt
    digest = hashlib.sha256(salt + password.encode()).digest()
    return base64.b64encode(salt + digest).decode()


def check_password(password: str, password_hash: str) -> bool:
    try:
        raw = base64.b64decode(password_hash, validate=True)
    except ValueError:
        return False
    salt, digest = raw[:4], raw[4:]
    return hmac.compare_digest(hashlib.sha256(salt + password.encode()).digest(), digest)


@dataclass
class Permission:
    configure: str = ".*"
    write: str = ".*"
    read: str = ".*"
    _compiled: dict[str, re.Pattern[str]] = field(default_factory=dict, repr=False)

    def allows(self, kind: str, resource: str) -> bool:
        pattern = self._compiled.get(kind)
        if pattern is None:
            pattern = self._compiled[kind] = re.compile(getattr(self, kind))
        # RabbitMQ's empty pattern grants nothing, and a match must cover the whole name.
        return bool(getattr(self, kind)) and pattern.fullmatch(resource) is not None


@dataclass
class User:
    name: str
    password_hash: str
    tags: list[str] = field(default_factory=list)
    permissions: dict[str, Permission] = field(default_factory=dict)


class UserStore:
    def __init__(self) -> None:
        self.users: dict[str, User] = {}

    def add_user(self, name: str, password: str, tags: list[str] | None = None) -> User:
        user = User(name, hash_password(password), tags or [])
        self.users[name] = user
        return user

    def set_permissions(
        self, user: str, vhost: str, configure: str = ".*", write: str = ".*", read: str = ".*"
    ) -> None:
        self.users[user].permissions[vhost] = Permission(configure, write, read)

    def authenticate(self, name: str, password: str) -> User | None:
        user = self.users.get(name)
        if user is None or not check_password(password, user.password_hash):
            return None
        return user

    @staticmethod
    def check(user: User, vhost: str, kind: str, resource_type: str, name: str) -> None:
        """Raise 403 unless ``user`` may ``kind`` (configure/write/read) the resource."""
        perm = user.permissions.get(vhost)
        if perm is None or not perm.allows(kind, name):
            raise AccessRefused(
                f"access to {resource_type} '{name}' in vhost '{vhost}' "
                f"refused for user '{user.name}'"
            )
