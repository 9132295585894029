"""An MQTT session's state that outlives its network connection, and where it is kept.

A session is the client id's subscriptions (each a binding of the session's
queue, with the options the binding cannot hold), the QoS 2 packet ids in
flight both ways, and which queued messages were in flight under which packet
id (so a reconnect re-sends them with their original id and DUP set). Its
messages are in an ordinary core queue, ``mqtt-subscription-<client id>qos1``
as RabbitMQ names it: durable for a persistent session, exclusive to the
connection for a clean one. Persistent sessions are recorded in the vhost's
``sessions.log`` (store/definitions.py's compacted log), one record for the
session and one for each subscription, flushed on every change and fsynced
(by the group sync) before the acknowledgement that depends on it. A line that
does not read back as such a record is damage: the start refuses, or with
damaged_metadata = set-aside goes on without it (store/damage.py).
"""

from __future__ import annotations

import logging
from collections.abc import ItemsView, ValuesView
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from warren.mqtt.filters import FilterIndex
from warren.mqtt.topics import is_valid_topic_filter
from warren.store import damage
from warren.store.definitions import DefinitionsLog
from warren.store.disk_budget import UNMETERED, DiskBudget
from warren.store.mirror import FileMirror

__all__ = [
    "MAX_AWAITING_RELEASE",
    "NEVER_EXPIRES",
    "Session",
    "SessionStore",
    "SubscriptionOptions",
    "queue_name",
]

log = logging.getLogger("warren.mqtt")

#: Session Expiry Interval meaning "never" (MQTT 5), and 3.1.1's clean session 0.
NEVER_EXPIRES = 0xFFFFFFFF
#: Incoming QoS 2 messages awaiting PUBREL per session at most (MQTT 5 clients are
#: told so as the server's Receive Maximum): each is in the session's record.
MAX_AWAITING_RELEASE = 1024


def queue_name(client_id: str) -> str:
    """The session queue's name, RabbitMQ's for a QoS 1 subscription queue."""
    return f"mqtt-subscription-{client_id}qos1"


def shared_queue_name(group: str, topic_filter: str) -> str:
    """The queue every member of ``$share/<group>/<filter>`` consumes from."""
    return f"mqtt-shared-{group}-{topic_filter}"


@dataclass(slots=True)
class SubscriptionOptions:
    qos: int
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0
    #: MQTT 5 Subscription Identifier (0: none).
    identifier: int = 0
    #: The AMQP binding key (the filter with ``/`` -> ``.``, ``+`` -> ``*``).
    binding_key: str = ""
    #: For ``$share/<group>/<filter>``: the group (the queue is the group's).
    group: str | None = None

    def record(self) -> list[Any]:
        return [
            self.qos,
            self.no_local,
            self.retain_as_published,
            self.retain_handling,
            self.identifier,
            self.binding_key,
            self.group,
        ]

    @classmethod
    def from_record(cls, rec: list[Any]) -> SubscriptionOptions:
        """The options as record() wrote them; ValueError for anything else."""
        if not isinstance(rec, list) or len(rec) != 7:
            raise ValueError("not a subscription's options")
        qos, no_local, as_published, handling, identifier, key, group = rec
        if (
            qos not in (0, 1, 2)
            or handling not in (0, 1, 2)
            or not isinstance(identifier, int)
            or not 0 <= identifier <= 268_435_455
            or not isinstance(key, str)
            or not (group is None or isinstance(group, str))
        ):
            raise ValueError(f"not a subscription's options: {rec!r}")
        return cls(int(qos), bool(no_local), bool(as_published), int(handling), identifier, key, group)


class SubscriptionTable:
    """A session's subscriptions by topic filter, with what delivery and
    UNSUBSCRIBE ask of them kept up to date as they change: every change and
    every question is O(1), so the 10,000th filter costs what the first did."""

    __slots__ = ("_by_filter", "own", "index", "_own_keys", "_shared", "no_local", "own_qos")

    def __init__(self) -> None:
        self._by_filter: dict[str, SubscriptionOptions] = {}
        #: The subscriptions of the session's own queue (not ``$share``), by filter.
        self.own: dict[str, SubscriptionOptions] = {}
        #: The same by what they match: those a delivered topic matches.
        self.index = FilterIndex()
        # Binding key -> own subscriptions with it ("a/b" and "a.b" share "a.b").
        self._own_keys: dict[str, int] = {}
        # (group, binding key) -> shared subscriptions with it.
        self._shared: dict[tuple[str, str], int] = {}
        #: Subscriptions with No Local set.
        self.no_local = 0
        #: Own subscriptions at QoS 1 or 2 (none: the own queue needs no acks).
        self.own_qos = 0

    def __len__(self) -> int:
        return len(self._by_filter)

    def __contains__(self, topic_filter: object) -> bool:
        return topic_filter in self._by_filter

    def __getitem__(self, topic_filter: str) -> SubscriptionOptions:
        return self._by_filter[topic_filter]

    def get(self, topic_filter: str) -> SubscriptionOptions | None:
        return self._by_filter.get(topic_filter)

    def items(self) -> ItemsView[str, SubscriptionOptions]:
        return self._by_filter.items()

    def values(self) -> ValuesView[SubscriptionOptions]:
        return self._by_filter.values()

    def set(self, topic_filter: str, opts: SubscriptionOptions) -> None:
        """Subscribe (or replace the options of an existing subscription, which
        keeps its place)."""
        old = self._by_filter.get(topic_filter)
        if old is not None:
            self._count(old, -1)
            if old.group is None and opts.group is not None:
                self._drop_own(topic_filter, old)
        self._by_filter[topic_filter] = opts
        self._count(opts, 1)
        if opts.group is None:
            self.own[topic_filter] = opts
            self.index.put(topic_filter, opts)

    def pop(self, topic_filter: str) -> SubscriptionOptions | None:
        opts = self._by_filter.pop(topic_filter, None)
        if opts is not None:
            self._count(opts, -1)
            if opts.group is None:
                self._drop_own(topic_filter, opts)
        return opts

    def _drop_own(self, topic_filter: str, opts: SubscriptionOptions) -> None:
        del self.own[topic_filter]
        self.index.remove(topic_filter, opts)

    def clear(self) -> None:
        for topic_filter in list(self._by_filter):
            self.pop(topic_filter)

    def binds(self, binding_key: str) -> bool:
        """Whether an own subscription still needs the queue's binding with this key."""
        return binding_key in self._own_keys

    def has_shared(self, group: str, binding_key: str) -> bool:
        return (group, binding_key) in self._shared

    def _count(self, opts: SubscriptionOptions, n: int) -> None:
        self.no_local += n if opts.no_local else 0
        if opts.group is None:
            self.own_qos += n if opts.qos else 0
            _add(self._own_keys, opts.binding_key, n)
        else:
            _add(self._shared, (opts.group, opts.binding_key), n)


def _add(counts: dict[Any, int], key: Any, n: int) -> None:
    left = counts.get(key, 0) + n
    if left:
        counts[key] = left
    else:
        del counts[key]


@dataclass
class Session:
    client_id: str
    vhost: str
    #: Seconds the session outlives its connection (NEVER_EXPIRES; 0: a clean session).
    expiry: int = 0
    subscriptions: SubscriptionTable = field(default_factory=SubscriptionTable)
    #: Incoming QoS 2: packet ids PUBREC'd and not yet released (PUBREL).
    awaiting_release: set[int] = field(default_factory=set)
    #: Outgoing QoS 2: packet ids PUBREL'd and not yet completed (PUBCOMP).
    released: set[int] = field(default_factory=set)
    #: Queue sequence -> packet id of deliveries in flight when the connection ended.
    redeliver: dict[int, int] = field(default_factory=dict)
    #: Milliseconds since the epoch of the last disconnect (None while connected).
    disconnected_at: int | None = None
    #: A will waiting out its delay: {"connect": base64 of a CONNECT carrying it,
    #: "user": who published it, "due": when (ms)}; kept so a restart publishes it.
    pending_will: dict[str, Any] | None = None

    @property
    def persistent(self) -> bool:
        return self.expiry > 0

    @property
    def queue(self) -> str:
        return queue_name(self.client_id)

    def record(self) -> dict[str, Any]:
        """The session without its subscriptions (each has a record of its own)."""
        return {
            "client_id": self.client_id,
            "expiry": self.expiry,
            "awaiting_release": sorted(self.awaiting_release),
            "released": sorted(self.released),
            "redeliver": [[seq, pid] for seq, pid in self.redeliver.items()],
            "disconnected_at": self.disconnected_at,
            "pending_will": self.pending_will,
        }

    @classmethod
    def from_record(cls, vhost: str, rec: dict[str, Any]) -> Session:
        """A session from its record; one written before subscriptions had records
        of their own carries them inline."""
        if not isinstance(rec, dict) or not isinstance(rec.get("client_id"), str):
            raise ValueError("not a session's record")
        pending_will = rec.get("pending_will")
        if not (pending_will is None or isinstance(pending_will, dict)):
            raise ValueError("not a session's delayed will")
        session = cls(
            client_id=str(rec["client_id"]),
            vhost=vhost,
            expiry=int(rec["expiry"]),
            awaiting_release={int(p) for p in rec.get("awaiting_release", ())},
            released={int(p) for p in rec.get("released", ())},
            redeliver={int(s): int(p) for s, p in rec.get("redeliver", ())},
            disconnected_at=_int_or_none(rec.get("disconnected_at")),
            pending_will=pending_will,
        )
        for f, o in dict(rec.get("subscriptions", {})).items():
            session.subscriptions.set(str(f), SubscriptionOptions.from_record(o))
        return session


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


# Keys in sessions.log: "<client id>\0" for a session, "<client id>\0<filter>" for
# each of its subscriptions. MQTT strings never hold U+0000, so these never meet
# a key of the older layout (the bare client id, subscriptions inline).
def session_key(client_id: str) -> str:
    return client_id + "\x00"


def subscription_key(client_id: str, topic_filter: str) -> str:
    return client_id + "\x00" + topic_filter


class SessionStore:
    """One vhost's persistent sessions (``path`` None: kept in memory only).

    A subscription is a record of its own, written as it is made or dropped:
    a SUBSCRIBE costs the same with 10 or 10,000 subscriptions in the session,
    and so does every other change to the session's record (QoS 2 ids)."""

    def __init__(
        self,
        vhost: str,
        path: Path | None,
        on_damage: str = damage.REFUSE,
        *,
        budget: DiskBudget = UNMETERED,
        mirror: FileMirror | None = None,
    ) -> None:
        """``on_damage``: what a line that cannot be read does ([main]
        damaged_metadata): refuse (DamagedFile), or set the file aside and go on
        with the lines that read (store/damage.py, via the log). ``budget`` and
        ``mirror``: the data directory's (store/layout.py), for the log."""
        self.vhost = vhost
        self.sessions: dict[str, Session] = {}
        self._log: DefinitionsLog | None = None
        # Client id -> the filters with a record in the log.
        self._recorded: dict[str, set[str]] = {}
        if path is not None:
            self._log = DefinitionsLog(
                path,
                sync=False,
                on_damage=on_damage,
                check=self._check,
                budget=budget,
                mirror=mirror,
            )
            self._load(self._log)

    def _check(self, key: str, value: Any) -> None:
        """A record as _load reads it; ValueError makes its line a damaged one."""
        client_id, _, topic_filter = key.partition("\x00")
        try:
            if topic_filter:
                SubscriptionOptions.from_record(value["options"])
                if not is_valid_topic_filter(topic_filter):
                    raise ValueError(f"invalid topic filter {topic_filter!r}")
            elif Session.from_record(self.vhost, value).client_id != client_id:
                raise ValueError("a session's record under another client id")
        except (KeyError, TypeError, IndexError, AttributeError) as exc:
            raise ValueError(f"not a session record ({exc!r})") from None

    def _load(self, dlog: DefinitionsLog) -> None:
        older: list[str] = []
        subscriptions: list[tuple[str, str, dict[str, Any]]] = []
        for key, value in dlog.live.items():
            client_id, new_layout, topic_filter = key.partition("\x00")
            if topic_filter:
                subscriptions.append((client_id, topic_filter, value))
            elif new_layout:
                self.sessions[client_id] = Session.from_record(self.vhost, value)
            else:
                older.append(key)
        for client_id, topic_filter, value in subscriptions:
            session = self.sessions.get(client_id)
            if session is None:
                # Only left by damage set aside: a session is written before its
                # subscriptions, and forgotten after them.
                log.warning(
                    "%s: subscription %r of no session '%s' dropped",
                    dlog.path,
                    topic_filter,
                    client_id,
                )
                dlog.delete(subscription_key(client_id, topic_filter))
                continue
            session.subscriptions.set(topic_filter, SubscriptionOptions.from_record(value["options"]))
            self._recorded.setdefault(client_id, set()).add(topic_filter)
        for key in older:
            # The older layout: written again in this one (then the old record
            # goes: a crash in between leaves both, and the newer wins).
            session = Session.from_record(self.vhost, dlog.live[key])
            if session.client_id not in self.sessions:
                self.save(session)
            dlog.delete(key)

    def save(self, session: Session) -> None:
        """Record a persistent session's current state (flushed to the OS now); a
        session not stored before (or another object for its client id) with
        all its subscriptions."""
        client_id = session.client_id
        known = self.sessions.get(client_id) is session
        self.sessions[client_id] = session
        dlog = self._log
        if dlog is None:
            return
        dlog.put(session_key(client_id), session.record())
        if not known:
            for topic_filter in list(self._recorded.get(client_id, ())):
                if topic_filter not in session.subscriptions:
                    self.subscription_changed(session, topic_filter)
            for topic_filter, _opts in session.subscriptions.items():
                self.subscription_changed(session, topic_filter)

    def subscription_changed(self, session: Session, topic_filter: str) -> None:
        """Record one subscription of a stored session as it now is (made, changed
        or dropped)."""
        dlog = self._log
        client_id = session.client_id
        if dlog is None or self.sessions.get(client_id) is not session:
            return
        key = subscription_key(client_id, topic_filter)
        recorded = self._recorded.setdefault(client_id, set())
        opts = session.subscriptions.get(topic_filter)
        if opts is None:
            recorded.discard(topic_filter)
            dlog.delete(key)
        else:
            recorded.add(topic_filter)
            dlog.put(key, {"options": opts.record()})

    def forget(self, client_id: str) -> None:
        if self.sessions.pop(client_id, None) is None or self._log is None:
            return
        for topic_filter in self._recorded.pop(client_id, ()):
            self._log.delete(subscription_key(client_id, topic_filter))
        self._log.delete(session_key(client_id))

    @property
    def log(self) -> DefinitionsLog | None:
        """What an acknowledgement depending on the session waits on; None in memory."""
        return self._log

    def sync(self) -> None:
        if self._log is not None:
            self._log.sync()

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
