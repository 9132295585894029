"""A client's session with the core: the rules every protocol shares, once.

Every protocol adapter (AMQP 0-9-1, MQTT, and the protocols to come) holds one
:class:`ClientSession` per connection and answers its client through it where
an answer promises durability:

- **A publish is settled** (a confirm, a PUBACK, a disposition) only once what
  it stored is on disk (the group commit, store/sync.py) and, in a cluster,
  held by the in-sync followers; with ``sync = false`` once the stores were
  written out at the end of the loop turn. A store that dropped a message of
  the answer's write generation (a full disk, store/disk_budget.py) turns it
  into a refusal. :class:`Settlements` keeps what waits, in batches: one
  group-commit callback per batch of a write generation and a store set.
- **A definitions change's reply** (a declare, bind, delete; a subscription)
  waits until the change is on disk and held by the followers:
  :meth:`ClientSession.change_mark` before the change,
  :meth:`ClientSession.when_changes_durable` after it.

- **A login** is checked the same way whatever the mechanism: failed logins
  slow down and floods are refused unchecked (core/auth_guard.py), attempts
  are counted per protocol, loopback-only users stay local, and opening a
  vhost checks its and the user's connection limits, then the user's access,
  in RabbitMQ's order (:meth:`ClientSession.login`, :meth:`ClientSession.open`;
  a :class:`LoginRefused` says why, for the protocol to word).
- **Permissions** are checked through the session, which caches a
  connection's answers as RabbitMQ's channels do (:meth:`ClientSession.check`).
- **Consuming and settling** go through the session's delivery streams
  (:meth:`ClientSession.deliveries`; an AMQP channel, an MQTT connection's
  outgoing half): consumers attached and cancelled, deliveries numbered and
  kept until the client settles them by tag, up to a tag or by a range (ack,
  requeue, drop and dead-letter), prefetch credit, and on close the
  unsettled put back in queue order, the counters kept
  (core/deliveries.py). :meth:`ClientSession.closed` closes the streams still
  open, then deletes the connection's exclusive queues.

What each protocol keeps is its encoding: how an answer looks on its wire, and
how it holds its output meanwhile. The core imports no storage package: the
group commit is reached through :class:`SessionSyncer`, which
store/sync.py's GroupSync is.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Final, Generic, Protocol, TypeVar

from warren.core.commit import Commit
from warren.core.deliveries import Deliveries
from warren.core.errors import AccessRefused, BrokerError, NotAllowed
from warren.core.oauth2 import TokenRefused, looks_like_jwt, token_user
from warren.core.users import User, UserStore

if TYPE_CHECKING:
    from warren.core.channel_counts import ChannelCounts
    from warren.core.stats import MessageStats
    from warren.core.vhost import VHost

__all__ = [
    "ChangeMark",
    "ClientSession",
    "LoginRefused",
    "SessionHost",
    "SessionSyncer",
    "Settlements",
    "is_loopback",
]

log = logging.getLogger("warren.session")

T = TypeVar("T")

#: (replication position, definitions writes): where the changes stood.
ChangeMark = tuple[int, int]

#: The mark of a session without a group commit (nothing to wait for).
_NO_MARK: ChangeMark = (0, 0)


class Replicated(Protocol):
    """Clustering's side (cluster/leader.py's Replicator), as a session needs it."""

    @property
    def position(self) -> int: ...

    def when_replicated(self, position: int, callback: Callable[[], None]) -> None: ...


class SessionSyncer(Protocol):
    """store/sync.py's GroupSync, as far as a session needs it."""

    @property
    def enabled(self) -> bool: ...

    @property
    def gen(self) -> int: ...

    @property
    def replication(self) -> Replicated | None: ...

    def after_sync(
        self, stores: Iterable[Any], callback: Callable[[bool], None], since: int | None = None
    ) -> None: ...

    def change_mark(self) -> ChangeMark: ...

    def after_changes(self, mark: ChangeMark, callback: Callable[[], None]) -> bool: ...


class Named(Protocol):
    """The connection a session belongs to, named for the log."""

    @property
    def name(self) -> str: ...


class SessionHost(Protocol):
    """What a session uses of the broker (warren/node.py's Node is one)."""

    @property
    def syncer(self) -> Any: ...


class LoginHost(SessionHost, Protocol):
    """What a client session uses of the broker (warren/node.py's Node is one)."""

    config: Any
    users: UserStore
    vhosts: dict[str, VHost]
    auth_guard: Any
    auth_attempts: Any
    #: warren/oauth2_backend.py's OAuth2Backend, None when [oauth2] is not set.
    oauth2: Any
    clock: Any

    def connection_opened(self, conn: Any) -> None: ...

    def connection_closed(self, conn: Any) -> None: ...


class LoginRefused(Exception):
    """Why a login or a vhost's opening was refused: ``reason`` is one of the
    constants below, ``text`` what RabbitMQ would say (530 texts for the
    vhost's checks), ``delay_ms`` how long to hold the refusal on the broker's
    clock (repeated guesses slow down; 0: at once)."""

    # Final: compiled (setup.py), a class's plain assignments are instance
    # attributes, which mypyc refuses to read through the class.
    #: Too many failed logins from the address: refused unchecked.
    BLOCKED: Final = "blocked"
    #: No such user, a wrong password, or a certificate naming no user.
    CREDENTIALS: Final = "credentials"
    #: A loopback_users user from another host.
    LOOPBACK: Final = "loopback"
    NO_VHOST: Final = "no vhost"
    #: The vhost's or the user's max-connections.
    LIMIT: Final = "limit"
    NO_ACCESS: Final = "no access"

    def __init__(self, reason: str, text: str, delay_ms: float = 0.0) -> None:
        super().__init__(text)
        self.reason = reason
        self.text = text
        self.delay_ms = delay_ms


def _stores_key(stores: Sequence[object]) -> object:
    """What tells store sets apart, cheaply for the usual one store."""
    return id(stores[0]) if len(stores) == 1 else tuple(id(s) for s in stores)


def _lost(store: object, first: int, last: int) -> bool:
    """Whether ``store`` dropped appends of those write generations."""
    lost_between = getattr(store, "lost_between", None)
    return lost_between is not None and bool(lost_between(first, last))


class Settlements(Generic[T]):
    """Answers (``T``: a publish number, an encoded ack) that wait until the
    messages behind them are settled, in batches of a write generation and a
    store set. ``settled(tokens, ok)`` gets each batch once, ``ok`` False when
    its stores lost some of it.

    ``ordered``: answers must reach the client in the order they were added
    (MQTT's acks): a batch is only extended while it is the newest one, and
    :meth:`after_waiting` puts an answer that needs no sync behind those that
    wait. Unordered (AMQP's confirms, whose multiple acks cover the order),
    every batch of the write generation takes more.

    With ``sync = false`` the answers wait for the end of the loop turn, when
    the protocol has the stores written out and calls :meth:`written`;
    ``wake`` asks it to (once per turn).
    """

    __slots__ = ("_flush", "_gen", "_newest", "_ordered", "_sync", "host", "settled", "wake")

    def __init__(
        self,
        host: SessionHost,
        settled: Callable[[list[T], bool], None],
        wake: Callable[[], None],
        *,
        ordered: bool = False,
    ) -> None:
        self.host = host
        self.settled = settled
        self.wake = wake
        self._ordered = ordered
        # Batches waiting for a sync, of the write generation _gen, by store set.
        self._sync: dict[object, list[T]] = {}
        self._gen = 0
        # sync = false: batches waiting for the turn's write-out, as
        # (stores, write generation, answers).
        self._flush: list[tuple[Sequence[object], int, list[T]]] = []
        # The batch added to last while it waits (None: nothing waits).
        self._newest: list[T] | None = None

    def add(self, token: T, stores: Sequence[object] | None) -> bool:
        """Settle ``token`` once ``stores`` are durable. False when there is
        nothing to wait for (no durable store, or no group commit): the caller
        answers at once."""
        batch = self._batch_for(stores)
        if batch is None:
            return False
        batch.append(token)
        return True

    def add_many(self, tokens: Iterable[T], stores: Sequence[object] | None) -> bool:
        """add() for several answers at once (a run's): one batch entry."""
        batch = self._batch_for(stores)
        if batch is None:
            return False
        batch.extend(tokens)
        return True

    def after_waiting(self, token: T) -> bool:
        """Put an answer that needs no sync behind those still waiting (ordered
        answers); False when none waits: the caller answers at once."""
        newest = self._newest
        if newest is None:
            return False
        newest.append(token)
        return True

    @property
    def waiting(self) -> bool:
        return self._newest is not None

    def _batch_for(self, stores: Sequence[object] | None) -> list[T] | None:
        """The batch answers to ``stores`` wait in; None when nothing waits."""
        if not stores:
            return None
        syncer = self.host.syncer
        if syncer is None:
            return None
        return self._batch(stores, syncer)

    def _batch(self, stores: Sequence[object], syncer: SessionSyncer) -> list[T]:
        gen = syncer.gen
        if not syncer.enabled:
            return self._flush_batch(stores, gen)
        if gen != self._gen:
            self._sync = {}
            self._gen = gen
        key = _stores_key(stores)
        batch = self._sync.get(key)
        if batch is None or (self._ordered and batch is not self._newest):
            new: list[T] = []
            batch = self._sync[key] = new
            syncer.after_sync(stores, lambda ok: self._synced(new, ok))
        self._newest = batch
        return batch

    def _flush_batch(self, stores: Sequence[object], gen: int) -> list[T]:
        batches = self._flush
        if batches:
            last_stores, last_gen, tokens = batches[-1]
            if last_gen == gen and _stores_key(last_stores) == _stores_key(stores):
                self._newest = tokens
                return tokens
        else:
            self.wake()
        new: list[T] = []
        batches.append((list(stores), gen, new))
        self._newest = new
        return new

    def _synced(self, batch: list[T], ok: bool) -> None:
        if self._newest is batch:
            self._newest = None
        self.settled(batch, ok)

    def written(self) -> None:
        """The stores were written out (``sync = false``, the end of the turn):
        settle the batches waiting for it, refusing those whose messages a
        failed write-out dropped; in a cluster, once the followers hold them."""
        batches, self._flush = self._flush, []
        if not batches:
            return
        if self._newest is not None and any(b[2] is self._newest for b in batches):
            self._newest = None
        syncer = self.host.syncer
        replication = syncer.replication if syncer is not None else None
        for stores, gen, tokens in batches:
            ok = not any(_lost(s, gen, gen) for s in stores)
            if ok and replication is not None:
                replication.when_replicated(
                    replication.position, lambda tokens=tokens: self.settled(tokens, True)
                )
            else:
                self.settled(tokens, ok)


class _Waits:
    """What a reply waits for: ``callback(ok)`` once ``count`` is back to 0."""

    __slots__ = ("callback", "count", "ok", "started")

    def __init__(self, callback: Callable[[bool], None]) -> None:
        self.callback = callback
        self.count = 1  # the asker's own, dropped once it has asked for the rest
        self.ok = True
        self.started = False

    def done(self) -> None:
        self.count -= 1
        if self.count == 0 and self.started:
            self.callback(self.ok)

    def synced(self, ok: bool) -> None:
        if not ok:
            self.ok = False
        self.done()


class ClientSession:
    """One client connection's session with the core (see the module docstring)."""

    __slots__ = (
        "_expiry",
        "_permissions",
        "_retire",
        "_streams",
        "host",
        "owner",
        "user",
        "vhost_name",
    )

    def __init__(self, host: LoginHost, owner: Named) -> None:
        """``host``: the broker (warren/node.py's Node); ``owner``: the protocol's
        connection (its name is in log lines)."""
        self.host = host
        self.owner = owner
        #: Who logged in (login()), and the vhost it opened (open()).
        self.user: User | None = None
        self.vhost_name = ""
        # (kind, resource type, name) -> the refusal, or None: allowed.
        self._permissions: dict[tuple[str, str, str], BrokerError | None] = {}
        # The delivery streams not closed yet, by id.
        self._streams: dict[int, Deliveries] = {}
        # Where a stream without a retire target of its own gives its counters
        # (the vhost's session_stats, once the connection is open in it).
        self._retire: MessageStats | None = None
        # An access token's expiry timer (core/oauth2.py), while the connection is open.
        self._expiry: Any = None

    # -- login --------------------------------------------------------------------------
    def login(
        self, attempt: str, username: str, password: str | None, peer_host: str | None
    ) -> User:
        """Check a login: ``password`` None when a verified client certificate
        vouches for ``username`` (EXTERNAL, MQTT's certificate login).
        ``attempt`` is the protocol's label in the auth attempt counters
        (amqp091, mqtt50, ...). Raises LoginRefused."""
        host = self.host
        guard = host.auth_guard
        if guard.blocked(peer_host):
            host.auth_attempts.record(attempt, False)
            raise LoginRefused(
                LoginRefused.BLOCKED,
                f"too many failed logins from {peer_host}",
                guard.failed(peer_host),
            )
        if password is None:
            user = host.users.users.get(username) if username else None
        else:
            user = self._authenticate(username, password)
        host.auth_attempts.record(attempt, user is not None)
        if user is None:
            why = "no such user (client certificate)" if password is None else "invalid credentials"
            raise LoginRefused(LoginRefused.CREDENTIALS, why, guard.failed(peer_host))
        if user.name in host.config.loopback_users and not is_loopback(peer_host):
            raise LoginRefused(
                LoginRefused.LOOPBACK, f"User '{user.name}' can only connect via localhost"
            )
        self.user = user
        return user

    def _authenticate(self, username: str, password: str) -> User | None:
        """The auth_backends chain: the first backend that accepts wins."""
        host = self.host
        for backend in host.config.auth_backends:
            if backend == "internal":
                user = host.users.authenticate(username, password)
            elif host.oauth2 is not None and looks_like_jwt(password):
                user = self._token_user(password)
            else:
                continue
            if user is not None:
                return user
        return None

    def _token_user(self, token: str) -> User | None:
        try:
            verified = self.host.oauth2.verifier.verify(token)
        except TokenRefused as exc:
            log.warning(
                "%s: Authentication using an OAuth 2/JWT token failed: %s", self.owner.name, exc
            )
            return None
        return token_user(verified, self.host.vhosts)

    def update_secret(self, token: str) -> str | None:
        """Replace the logged-in token user's token (AMQP's connection.update-secret):
        None when done (new scopes, new expiry), else why not. The user name
        must stay the same, as RabbitMQ requires. A user of the user store keeps
        its login: accepted, as RabbitMQ's internal backend. (A token's user may
        have no expiry either: ``require_exp = false``.)"""
        user = self.user
        if user is None or not user.from_token:
            return None
        if self.host.oauth2 is None:
            return "OAuth 2 is not configured"
        if not looks_like_jwt(token):
            return "the new secret is not an access token"
        try:
            verified = self.host.oauth2.verifier.verify(token)
        except TokenRefused as exc:
            return f"Authentication using an OAuth 2/JWT token failed: {exc}"
        if verified.username != user.name:
            return "Not allowed to change username on refreshed token"
        new = token_user(verified, self.host.vhosts)
        if self.vhost_name and self.vhost_name not in new.permissions:
            return f"access to vhost '{self.vhost_name}' refused for user '{new.name}'"
        # In place: the token user is this connection's own, and its channels hold it.
        user.permissions, user.tags, user.expires_ms = new.permissions, new.tags, new.expires_ms
        user.topic_permissions.clear()  # the same dict: a publisher may hold it
        user.topic_permissions.update(new.topic_permissions)
        user.topic_resolver = new.topic_resolver
        self._permissions.clear()
        if self._expiry is not None:
            timer, target = self._expiry
            if timer is not None:
                timer.cancel()
            self._expire_at(target)
        return None

    def _expire_at(self, conn: Any) -> None:
        """Close ``conn`` when the user's token expires, as RabbitMQ 3.10+ does
        (AMQP: 320 CONNECTION_FORCED - credential expired)."""
        user = self.user
        if user is None or not user.from_token:
            return
        if user.expires_ms is None:  # no exp: a refresh may bring one
            self._expiry = (None, conn)
            return
        owner = self.owner

        def expired() -> None:
            self._expiry = None
            log.warning(
                "closing connection %s of user '%s': credential has expired",
                owner.name,
                user.name,
            )
            # The protocol's own close for it where it has one (MQTT, AMQP 1.0),
            # else the operator's close (AMQP: 320 CONNECTION_FORCED).
            close = getattr(conn, "credential_expired", None)
            if close is not None:
                close()
            else:
                conn.force_close("credential expired")

        self._expiry = (self.host.clock.call_at(user.expires_ms, expired), conn)

    def open(self, vhost_name: str, counted: bool = False) -> VHost:
        """Open ``vhost_name`` for the logged-in user: it exists, its and the user's
        connection limits allow one more, and the user has access, checked in
        RabbitMQ's order. Raises LoginRefused. ``counted``: the client is one of
        the connections the limits count already (a CoAP client's next
        request), so they are not checked again."""
        host, user = self.host, self.user
        assert user is not None
        vhost = host.vhosts.get(vhost_name)
        if vhost is None:
            raise LoginRefused(LoginRefused.NO_VHOST, f"vhost {vhost_name} not found")
        try:  # the vhost's max-connections, then the user's, as RabbitMQ 3.13
            if not counted:
                vhost.limiter.check_connection_limit(user.name)
                if user.limits:
                    host.users.check_connection_limit(user)
        except NotAllowed as exc:
            raise LoginRefused(LoginRefused.LIMIT, exc.text) from None
        if vhost_name not in user.permissions:
            raise LoginRefused(
                LoginRefused.NO_ACCESS,
                f"access to vhost '{vhost_name}' refused for user '{user.name}'",
            )
        self.vhost_name = vhost_name
        return vhost

    def opened(self, conn: Any, vhost: VHost) -> None:
        """The connection ``conn`` (a ClientConnection) is open in ``vhost``:
        counted against the vhost's and the user's connection limits, listed,
        blocked at once while a resource alarm is raised."""
        vhost.limiter.connection_opened(conn)
        self.host.connection_opened(conn)
        self._expire_at(conn)
        # A stream that is not a channel of its own (MQTT's outgoing half, whose
        # counters are its connection's) gives them to the vhost as it closes, as
        # an AMQP channel gives its own to base_stats.
        self._retire = vhost.session_stats
        for stream in self._streams.values():
            stream.retire_into(vhost.session_stats)

    def closed(self, conn: Any, vhost: VHost) -> None:
        """The connection is gone: its delivery streams still open close (their
        consumers cancelled, what they delivered and was not settled back in
        its queues), its exclusive queues go (their messages too), it leaves
        the counts and the listing, and what it counted is kept for the
        broker's totals."""
        if self._expiry is not None:
            if self._expiry[0] is not None:
                self._expiry[0].cancel()
            self._expiry = None
        for stream in list(self._streams.values()):
            stream.close()
        vhost.delete_exclusive_queues(conn)
        vhost.limiter.connection_closed(conn)
        self.host.connection_closed(conn)

    # -- permissions --------------------------------------------------------------------
    def check(self, kind: str, resource_type: str, name: str) -> None:
        """Raise AccessRefused (403) unless the user may ``kind`` (configure,
        write, read) the resource in its vhost. Answers are cached for the
        session's life, as RabbitMQ's channels cache theirs."""
        key = (kind, resource_type, name)
        cache = self._permissions
        if key not in cache:
            user = self.user
            assert user is not None
            try:
                UserStore.check(user, self.vhost_name, kind, resource_type, name)
                cache[key] = None
            except AccessRefused as exc:
                cache[key] = exc
        refused = cache[key]
        if refused is not None:
            raise AccessRefused(refused.text)

    def allowed(self, kind: str, resource_type: str, name: str) -> bool:
        """check() as a yes or no."""
        try:
            self.check(kind, resource_type, name)
        except AccessRefused:
            return False
        return True

    # -- consuming ----------------------------------------------------------------------
    def deliveries(
        self,
        stats: MessageStats,
        counts: ChannelCounts | None = None,
        retire: MessageStats | None = None,
    ) -> Deliveries:
        """A new delivery stream (core/deliveries.py): an AMQP channel, an MQTT
        connection's outgoing half. ``stats`` counts its acks, ``counts`` its
        acks by queue (None: not kept), ``retire`` gets its counters when it
        closes (None: the vhost's session_stats, once the connection is open
        in it: ``opened``)."""
        if retire is None:
            retire = self._retire
        stream = Deliveries(stats, counts, retire, self._stream_closed)
        self._streams[id(stream)] = stream
        return stream

    def _stream_closed(self, stream: Deliveries) -> None:
        self._streams.pop(id(stream), None)

    # -- publishing ---------------------------------------------------------------------
    def settlements(
        self, settled: Callable[[list[T], bool], None], wake: Callable[[], None], ordered: bool
    ) -> Settlements[T]:
        """A stream of answers that wait for their messages to be settled (a
        channel's confirms, a connection's acks)."""
        return Settlements(self.host, settled, wake, ordered=ordered)

    def when_synced(self, stores: Sequence[object], callback: Callable[[bool], None]) -> bool:
        """When the group commit syncs (``sync = true``): call ``callback(ok)``
        once what was appended to ``stores`` is on disk (and held by the
        followers) and return True. Otherwise False, and it is never called:
        the caller goes on at once (what is written out at the end of the
        turn survives a killed broker)."""
        syncer = self.host.syncer
        if syncer is None or not syncer.enabled or not stores:
            return False
        syncer.after_sync(stores, callback)
        return True

    def commit(self, vhost: VHost, what: str) -> Commit:
        """A unit of publishes stored all-or-nothing (tx.commit, the HTTP API's
        publish), answered once durable (core/commit.py); ``what`` names it."""
        return Commit(vhost, self.host.syncer, what)

    # -- definitions changes ------------------------------------------------------------
    def change_mark(self) -> ChangeMark:
        """Where the changes stand now: take it before a change, and pass it to
        when_changes_durable() after it."""
        syncer = self.host.syncer
        return syncer.change_mark() if syncer is not None else _NO_MARK

    def when_changes_durable(
        self,
        mark: ChangeMark,
        callback: Callable[[bool], None],
        stores: Sequence[object] = (),
    ) -> bool:
        """When the changes made since ``mark`` (and what was appended to
        ``stores``, e.g. a session's records) are not yet on disk or, in a
        cluster, not yet held by the followers: call ``callback(ok)`` once they
        are and return True (the protocol holds its reply meanwhile). Otherwise
        return False and never call it. ``ok`` is False when a store's sync
        failed."""
        syncer = self.host.syncer
        if syncer is None:
            for store in stores:
                sync = getattr(store, "sync", None)
                if sync is not None:
                    sync()  # no group commit (a broker not started): at once
            return False
        waits = _Waits(callback)
        if stores:
            waits.count += 1
            syncer.after_sync(stores, waits.synced)
        waits.count += 1
        if not syncer.after_changes(mark, waits.done):
            waits.count -= 1  # nothing to wait for
        waits.count -= 1  # the asker's own
        if waits.count == 0:
            if not waits.ok:
                log.error("%s: a change could not be synced to disk", self.owner.name)
            return False
        waits.started = True
        return True

    async def changes_durable(self, mark: ChangeMark) -> None:
        """Return once the changes made since ``mark`` are durable (for callers
        that await: the HTTP API's answers)."""
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

        def release(ok: bool) -> None:
            if not done.done():
                done.set_result(ok)

        if self.when_changes_durable(mark, release):
            await done


def is_loopback(host: str | None) -> bool:
    """Whether a peer address is this machine's (no address: a unix socket or an
    in-process transport). Users in ``loopback_users`` may only log in from here,
    whatever the protocol."""
    if not host:
        return True
    return host.startswith("127.") or host in ("::1", "localhost") or host.startswith("::ffff:127.")
