"""Users, password hashes, per-vhost permissions, topic permissions and user limits,
checked as RabbitMQ does.

Password hashes use RabbitMQ's default scheme (salted SHA-256, base64 of
salt + digest), so definitions exported from RabbitMQ import unchanged.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from warren.core.errors import AccessRefused, NotAllowed

CONFIGURE, WRITE, READ = "configure", "write", "read"

#: RabbitMQ's user limits (``rabbitmqctl set_user_limits``).
MAX_CONNECTIONS, MAX_CHANNELS = "max-connections", "max-channels"
USER_LIMIT_KEYS = (MAX_CONNECTIONS, MAX_CHANNELS)
#: A token user's topic permissions kept per vhost (User.topic_permission).
MAX_RESOLVED_TOPICS = 1024


#: RabbitMQ's names of its password hashing algorithms (rabbit_password_hashing_*),
#: each base64(4-byte salt + digest(salt + UTF-8 password)); SHA-256 is the default.
SHA256 = "rabbit_password_hashing_sha256"
SHA512 = "rabbit_password_hashing_sha512"
MD5 = "rabbit_password_hashing_md5"
#: bcrypt (``$2a$``/``$2b$``/``$2y$`` hashes), as LavinMQ's definitions carry them.
BCRYPT = "bcrypt"
_DIGESTS = {SHA256: hashlib.sha256, SHA512: hashlib.sha512, MD5: hashlib.md5}
#: Spellings accepted on import (RabbitMQ's module names, LavinMQ's short ones).
_ALIASES = {
    SHA256: SHA256,
    SHA512: SHA512,
    MD5: MD5,
    "sha256": SHA256,
    "sha512": SHA512,
    "md5": MD5,
    "bcrypt": BCRYPT,
}
HASHING_ALGORITHMS = frozenset(_DIGESTS) | {BCRYPT}


def hashing_algorithm(name: str) -> str | None:
    """The canonical name of a hashing algorithm (None: not supported)."""
    return _ALIASES.get(name) or _ALIASES.get(name.lower())


def hash_password(password: str, salt: bytes | None = None, algorithm: str = SHA256) -> str:
    if algorithm == BCRYPT:
        import bcrypt

        return bcrypt.hashpw(password.encode(), bcrypt.gensalt()).decode()
    salt = os.urandom(4) if salt is None else salt
    digest = _DIGESTS[algorithm](salt + password.encode()).digest()
    return base64.b64encode(salt + digest).decode()


def valid_hash(password_hash: str, algorithm: str) -> bool:
    """Whether ``password_hash`` is well-formed for ``algorithm`` (empty: no password)."""
    if not password_hash:
        return True
    if algorithm == BCRYPT:
        return password_hash.startswith(("$2a$", "$2b$", "$2y$")) and len(password_hash) == 60
    try:
        raw = base64.b64decode(password_hash, validate=True)
    except ValueError:
        return False
    return len(raw) == 4 + _DIGESTS[algorithm]().digest_size


def check_password(password: str, password_hash: str, algorithm: str = SHA256) -> bool:
    if not password_hash:
        return False  # a user without a password cannot log in with one
    if algorithm == BCRYPT:
        import bcrypt

        try:
            return bcrypt.checkpw(password.encode(), password_hash.encode())
        except ValueError:
            return False
    try:
        raw = base64.b64decode(password_hash, validate=True)
    except ValueError:
        return False
    salt, digest = raw[:4], raw[4:]
    return hmac.compare_digest(_DIGESTS[algorithm](salt + password.encode()).digest(), digest)


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
class TopicPermission:
    """Regexes a routing key (write: publish) or binding key (read: bind) must match
    on one topic exchange (``rabbitmqctl set_topic_permissions``)."""

    write: str = ".*"
    read: str = ".*"
    #: kind -> the compiled pattern, for patterns without placeholders.
    _compiled: dict[str, re.Pattern[str]] = field(default_factory=dict, repr=False, compare=False)
    #: (kind, variables) -> the expanded pattern compiled (None: not a valid regex).
    _expanded: dict[tuple[str, tuple[tuple[str, str], ...]], re.Pattern[str] | None] = field(
        default_factory=dict, repr=False, compare=False
    )

    def allows(self, kind: str, key: str, variables: Mapping[str, str] | None = None) -> bool:
        """rabbit_auth_backend_internal:check_topic_access/4: an empty pattern is
        ``^$``; ``{name}`` is replaced by ``variables[name]`` (plain text, not
        escaped); the match is unanchored (``re:run``), unlike resource permissions."""
        compiled = self._compiled.get(kind)
        if compiled is None:
            compiled = self._pattern(kind, variables)
            if compiled is None:  # not a valid regex (once expanded): nothing matches
                return False
        return compiled.search(key) is not None

    def _pattern(self, kind: str, variables: Mapping[str, str] | None) -> re.Pattern[str] | None:
        """The pattern compiled, cached: this runs for every message published."""
        pattern = getattr(self, kind) or "^$"
        if "{" not in pattern:
            try:
                compiled = self._compiled[kind] = re.compile(pattern)
            except re.error:  # set without validation (the API and imports validate)
                return None
            return compiled
        cache_key = (kind, tuple(variables.items()) if variables else ())
        if cache_key in self._expanded:
            return self._expanded[cache_key]
        for name, value in (variables or {}).items():
            pattern = pattern.replace("{" + name + "}", value)
        try:
            expanded: re.Pattern[str] | None = re.compile(pattern)
        except re.error:  # a variable's value broke the regex
            expanded = None
        if len(self._expanded) >= 256:  # one entry per user and client id: bounded
            self._expanded.clear()
        self._expanded[cache_key] = expanded
        return expanded


@dataclass
class User:
    name: str
    password_hash: str
    tags: list[str] = field(default_factory=list)
    permissions: dict[str, Permission] = field(default_factory=dict)
    #: vhost -> exchange -> TopicPermission; empty for most users, which is what
    #: lets a publish skip the check at the cost of one truth test.
    topic_permissions: dict[str, dict[str, TopicPermission]] = field(default_factory=dict)
    #: How ``password_hash`` was made (SHA256, SHA512, MD5 or BCRYPT).
    hashing_algorithm: str = SHA256
    #: RabbitMQ's user limits: ``max-connections`` and ``max-channels``; 0 allows
    #: none, a negative value or no entry means no limit.
    limits: dict[str, int] = field(default_factory=dict)
    #: An OAuth 2 token's user (core/oauth2.py): when the token expires, in ms on
    #: the broker's clock; None for the user store's users, which never expire
    #: (and for a token without ``exp``, with ``require_exp = false``).
    expires_ms: int | None = None
    #: Logged in with an OAuth 2 token: a secret update must bring another.
    from_token: bool = False
    #: A token's user: the topic permission of an exchange not in
    #: ``topic_permissions`` yet, from the token's scopes and the exchange's name
    #: (as RabbitMQ, whenever the exchange was declared); None for the user
    #: store's users, whose exchanges without an entry allow every key.
    topic_resolver: Callable[[str, str], TopicPermission] | None = None

    def topic_permission(self, vhost: str, exchange: str) -> TopicPermission | None:
        """The topic permission on ``exchange`` (None: every key allowed); a token
        user's is worked out at its first check and kept (per connection)."""
        table = self.topic_permissions.get(vhost)
        perm = None if table is None else table.get(exchange)
        if perm is None and self.topic_resolver is not None:
            if table is None:
                table = self.topic_permissions[vhost] = {}
            elif len(table) >= MAX_RESOLVED_TOPICS:  # exchanges come and go: bounded
                table.clear()
            perm = table[exchange] = self.topic_resolver(vhost, exchange)
        return perm

    def limit(self, key: str) -> int | None:
        """The limit in force for ``key``; None when there is none."""
        value = self.limits.get(key)
        return None if value is None or value < 0 else value


class UserStore:
    def __init__(self) -> None:
        self.users: dict[str, User] = {}
        #: Read from a users file (even one with no users left): the default user
        #: is seeded only into a new broker, as RabbitMQ does, never again after
        #: the last user was deleted.
        self.from_file = False
        #: user name -> open client connections (every protocol) and open AMQP
        #: channels: counted as they open and close, so a limit check is a lookup.
        self.connection_counts: dict[str, int] = {}
        self.channel_counts: dict[str, int] = {}

    def add_user(self, name: str, password: str, tags: list[str] | None = None) -> User:
        user = User(name, hash_password(password), tags or [])
        self.users[name] = user
        return user

    def set_permissions(
        self, user: str, vhost: str, configure: str = ".*", write: str = ".*", read: str = ".*"
    ) -> None:
        self.users[user].permissions[vhost] = Permission(configure, write, read)

    def set_topic_permission(
        self, user: str, vhost: str, exchange: str, write: str = ".*", read: str = ".*"
    ) -> bool:
        """Set (replace) ``user``'s topic permission on ``exchange``; True if one existed."""
        table = self.users[user].topic_permissions.setdefault(vhost, {})
        existed = exchange in table
        table[exchange] = TopicPermission(write, read)
        return existed

    def clear_topic_permissions(self, user: str, vhost: str, exchange: str | None = None) -> bool:
        """Drop ``user``'s topic permissions in ``vhost`` (all, or only ``exchange``'s,
        as ``rabbitmqctl clear_topic_permissions``); False when there was none."""
        perms = self.users[user].topic_permissions
        table = perms.get(vhost)
        if table is None or (exchange is not None and exchange not in table):
            return False
        if exchange is not None:
            del table[exchange]
        if exchange is None or not table:
            # No empty tables left behind: an empty dict keeps publishes check-free.
            del perms[vhost]
        return True

    def set_limit(self, user: str, key: str, value: int) -> None:
        """Set one of ``user``'s limits; existing connections and channels stay."""
        self.users[user].limits[key] = value

    def clear_limit(self, user: str, key: str) -> bool:
        """Drop one of ``user``'s limits; False when it had none."""
        return self.users[user].limits.pop(key, None) is not None

    def check_connection_limit(self, user: User) -> None:
        """Refuse one more connection beyond the user's max-connections (530,
        RabbitMQ 3.10's text)."""
        cap = user.limit(MAX_CONNECTIONS)
        if cap is not None and self.connection_counts.get(user.name, 0) >= cap:
            raise NotAllowed(
                f"connection refused for user '{user.name}': "
                f"user connection limit ({cap}) is reached"
            )

    def check_channel_limit(self, user: User) -> None:
        """Refuse one more channel beyond the user's max-channels, over all of its
        connections (530, RabbitMQ 3.10's text)."""
        cap = user.limit(MAX_CHANNELS)
        if cap is not None and self.channel_counts.get(user.name, 0) >= cap:
            raise NotAllowed(
                f"number of channels opened for user '{user.name}' has reached "
                f"the maximum allowed user limit of ({cap})"
            )

    def count_connection(self, name: str, delta: int) -> None:
        """A connection of user ``name`` opened (+1) or closed (-1)."""
        _count(self.connection_counts, name, delta)

    def count_channel(self, name: str, delta: int) -> None:
        """A channel of user ``name`` opened (+1) or closed (-1)."""
        _count(self.channel_counts, name, delta)

    def delete_user(self, name: str) -> bool:
        """Remove the user, with its permissions and topic permissions."""
        return self.users.pop(name, None) is not None

    def forget_vhost(self, vhost: str) -> None:
        """Drop every permission and topic permission on a deleted vhost, so a vhost
        created again under that name starts with none (as in RabbitMQ)."""
        for user in self.users.values():
            user.permissions.pop(vhost, None)
            user.topic_permissions.pop(vhost, None)

    def authenticate(self, name: str, password: str) -> User | None:
        user = self.users.get(name)
        if user is None or not check_password(password, user.password_hash, user.hashing_algorithm):
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

    @staticmethod
    def check_topic(
        user: User,
        vhost: str,
        exchange: str,
        routing_key: str,
        kind: str,
        variables: Mapping[str, str] | None = None,
    ) -> None:
        """Raise 403 unless ``user`` may ``kind`` (write: publish with, read: bind with)
        ``routing_key`` on the topic exchange ``exchange``; no topic permission for the
        exchange allows everything. ``variables`` fills RabbitMQ's ``{username}``,
        ``{vhost}`` and ``{client_id}`` (MQTT) placeholders. The caller makes sure the
        exchange is a topic exchange: RabbitMQ checks no other type. A token's user
        is checked on every exchange (User.topic_resolver)."""
        perm = user.topic_permission(vhost, exchange)
        if perm is not None and not perm.allows(kind, routing_key, variables):
            raise topic_refused(user, vhost, exchange, routing_key)


def _count(counts: dict[str, int], name: str, delta: int) -> None:
    n = counts.get(name, 0) + delta
    if n > 0:
        counts[name] = n
    else:  # no entries left for users without connections
        counts.pop(name, None)


def topic_refused(user: User, vhost: str, exchange: str, routing_key: str) -> AccessRefused:
    """RabbitMQ's refusal of a routing or binding key by a topic permission."""
    return AccessRefused(
        f"access to topic '{routing_key}' in exchange '{exchange}' in vhost '{vhost}' "
        f"refused for user '{user.name}'"
    )


#: The argument of a new queue or exchange that names an exchange messages
#: will be published to: a queue's dead-letter exchange, an exchange's alternate.
ROUTING_ARGUMENTS = {"queue": "x-dead-letter-exchange", "exchange": "alternate-exchange"}


def check_routing_argument(
    check: Callable[[str, str, str], None],
    resource_type: str,
    name: str,
    arguments: dict[str, Any] | None,
) -> None:
    """RabbitMQ's rule for a queue or exchange being created whose arguments name
    an exchange (ROUTING_ARGUMENTS): the user must be allowed to read the new
    resource and to write to that exchange, or a user could route messages into
    an exchange he may not write to by naming it. ``check(kind, resource_type,
    name)`` raises AccessRefused (each protocol's own check, with its cache). A
    server-named queue (``name`` empty: named later) is checked for the write
    alone. An argument that is not a string is left to the declaration's
    validation."""
    target = (arguments or {}).get(ROUTING_ARGUMENTS[resource_type])
    if isinstance(target, str):
        if name:
            check(READ, resource_type, name)
        check(WRITE, "exchange", target)
