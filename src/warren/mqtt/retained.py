"""Retained messages: the last retained PUBLISH of each topic, per vhost, kept on disk.

Held in memory (topic -> message) and in a compacted append-only log (the
definitions log's format, store/definitions.py) so they survive restarts and
kill -9. Writes are flushed to the OS at once and fsynced with the publish's
acknowledgement: the log is a ``Syncable`` the group commit (store/sync.py)
includes before a PUBACK is sent.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from warren.core.routing import topic_matches
from warren.store.definitions import DefinitionsLog

__all__ = ["RetainedMessage", "RetainedStore", "filter_matches"]

log = logging.getLogger("warren.mqtt")


@dataclass(slots=True)
class RetainedMessage:
    topic: str
    payload: bytes
    qos: int
    #: The message's AMQP properties (core/properties.py encoding), as published.
    properties: bytes
    #: Milliseconds since the epoch when it was published.
    timestamp: int
    #: When it expires (MQTT 5 message expiry), or None.
    expires_at: int | None = None

    @classmethod
    def published(
        cls, topic: str, payload: bytes, qos: int, properties: bytes, now: int, expiry: object
    ) -> RetainedMessage:
        """A retained PUBLISH received at ``now`` with its Message Expiry Interval
        (seconds, or None)."""
        expires_at = now + expiry * 1000 if isinstance(expiry, int) else None
        return cls(topic, payload, qos, properties, now, expires_at)


def filter_matches(topic_filter: str, topic: str) -> bool:
    """MQTT filter matching: ``+`` one level, ``#`` the rest; a wildcard at the first
    level does not match a topic starting with ``$`` (MQTT-4.7.2-1)."""
    if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    if "+" not in topic_filter and "#" not in topic_filter:
        return topic_filter == topic
    pattern = ["*" if level == "+" else level for level in topic_filter.split("/")]
    return topic_matches(pattern, topic.split("/"))


class RetainedStore:
    """One vhost's retained messages. ``path`` None: in memory only."""

    def __init__(self, path: Path | None) -> None:
        self.messages: dict[str, RetainedMessage] = {}
        self._log: DefinitionsLog | None = None
        if path is not None:
            self._log = DefinitionsLog(path, sync=False)
            for key, value in list(self._log.live.items()):
                try:
                    self.messages[key] = RetainedMessage(
                        key,
                        base64.b64decode(value["payload"]),
                        int(value["qos"]),
                        base64.b64decode(value["properties"]),
                        int(value["timestamp"]),
                        value.get("expires_at"),
                    )
                except (KeyError, ValueError, TypeError) as exc:
                    log.warning("%s: unreadable retained message %r skipped: %s", path, key, exc)

    def __len__(self) -> int:
        return len(self.messages)

    def put(self, msg: RetainedMessage) -> None:
        """Retain ``msg`` for its topic (an empty payload clears the topic instead)."""
        if not msg.payload:
            self.clear(msg.topic)
            return
        self.messages[msg.topic] = msg
        if self._log is not None:
            self._log.put(
                msg.topic,
                {
                    "payload": base64.b64encode(msg.payload).decode(),
                    "qos": msg.qos,
                    "properties": base64.b64encode(msg.properties).decode(),
                    "timestamp": msg.timestamp,
                    "expires_at": msg.expires_at,
                },
            )

    def clear(self, topic: str) -> None:
        if self.messages.pop(topic, None) is not None and self._log is not None:
            self._log.delete(topic)

    def matching(self, topic_filter: str, now_ms: int) -> Iterator[RetainedMessage]:
        """The live retained messages whose topic the filter matches (expired ones are
        dropped on the way)."""
        if "+" not in topic_filter and "#" not in topic_filter:
            candidates = [m] if (m := self.messages.get(topic_filter)) is not None else []
        else:
            candidates = [m for t, m in self.messages.items() if filter_matches(topic_filter, t)]
        for msg in candidates:
            if msg.expires_at is not None and msg.expires_at <= now_ms:
                self.clear(msg.topic)
                continue
            yield msg

    @property
    def log(self) -> DefinitionsLog | None:
        """What a publish acknowledgement waits on (group sync); None in memory."""
        return self._log

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
