"""An MQTT session's state that outlives its network connection, and where it is kept.

A session is the client id's subscriptions (each a binding of the session's
queue, with the options the binding cannot hold), the QoS 2 packet ids in
flight both ways, and which queued messages were in flight under which packet
id (so a reconnect re-sends them with their original id and DUP set). Its
messages are in an ordinary core queue, ``mqtt-subscription-<client id>qos1``
as RabbitMQ names it: durable for a persistent session, exclusive to the
connection for a clean one. Persistent sessions are recorded in the vhost's
``sessions.log`` (store/definitions.py's compacted log), flushed on every
change and fsynced before the acknowledgement that depends on it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from warren.store.definitions import DefinitionsLog

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
        return cls(
            int(rec[0]),
            bool(rec[1]),
            bool(rec[2]),
            int(rec[3]),
            int(rec[4]),
            str(rec[5]),
            rec[6] if isinstance(rec[6], str) else None,
        )


@dataclass
class Session:
    client_id: str
    vhost: str
    #: Seconds the session outlives its connection (NEVER_EXPIRES; 0: a clean session).
    expiry: int = 0
    subscriptions: dict[str, SubscriptionOptions] = field(default_factory=dict)
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
        return {
            "client_id": self.client_id,
            "expiry": self.expiry,
            "subscriptions": {f: o.record() for f, o in self.subscriptions.items()},
            "awaiting_release": sorted(self.awaiting_release),
            "released": sorted(self.released),
            "redeliver": [[seq, pid] for seq, pid in self.redeliver.items()],
            "disconnected_at": self.disconnected_at,
            "pending_will": self.pending_will,
        }

    @classmethod
    def from_record(cls, vhost: str, rec: dict[str, Any]) -> Session:
        return cls(
            client_id=str(rec["client_id"]),
            vhost=vhost,
            expiry=int(rec["expiry"]),
            subscriptions={
                str(f): SubscriptionOptions.from_record(o)
                for f, o in rec.get("subscriptions", {}).items()
            },
            awaiting_release={int(p) for p in rec.get("awaiting_release", ())},
            released={int(p) for p in rec.get("released", ())},
            redeliver={int(s): int(p) for s, p in rec.get("redeliver", ())},
            disconnected_at=rec.get("disconnected_at"),
            pending_will=rec.get("pending_will"),
        )


class SessionStore:
    """One vhost's persistent sessions (``path`` None: kept in memory only)."""

    def __init__(self, vhost: str, path: Path | None) -> None:
        self.vhost = vhost
        self.sessions: dict[str, Session] = {}
        self._log: DefinitionsLog | None = None
        if path is not None:
            self._log = DefinitionsLog(path, sync=False)
            for key, value in list(self._log.live.items()):
                try:
                    self.sessions[key] = Session.from_record(vhost, value)
                except (KeyError, ValueError, TypeError) as exc:
                    log.warning("%s: unreadable session %r skipped: %s", path, key, exc)

    def save(self, session: Session) -> None:
        """Record a persistent session's current state (flushed to the OS now)."""
        self.sessions[session.client_id] = session
        if self._log is not None:
            self._log.put(session.client_id, session.record())

    def forget(self, client_id: str) -> None:
        if self.sessions.pop(client_id, None) is not None and self._log is not None:
            self._log.delete(client_id)

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
