"""Retained messages: the last retained PUBLISH of each topic, per vhost, kept on disk.

Held in memory (topic -> message, and a tree of topic levels that a SUBSCRIBE's
filter walks: its cost is what it matches, not how many messages are retained)
and in a compacted append-only log (the definitions log's format,
store/definitions.py) so they survive restarts and kill -9; a line that does
not read back as a retained message is damage (store/damage.py), never
skipped. Writes are flushed to the OS at once and fsynced with the publish's
acknowledgement: the log is a ``Syncable`` the group commit (store/sync.py)
includes before a PUBACK is sent.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warren.core.routing import topic_matches
from warren.mqtt.topics import is_valid_topic_name
from warren.store import damage
from warren.store.definitions import DefinitionsLog
from warren.store.disk_budget import UNMETERED, DiskBudget
from warren.store.mirror import FileMirror

__all__ = ["RetainedMessage", "RetainedStore", "filter_matches"]


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


class _Level:
    """One level of the topic tree: the levels below it, and the message retained
    on the topic that ends here (``order``: when the topic got its first one)."""

    __slots__ = ("children", "message", "order")

    def __init__(self) -> None:
        self.children: dict[str, _Level] = {}
        self.message: RetainedMessage | None = None
        self.order = 0


class TopicTree:
    """Retained messages by topic level, for matching filters without a scan."""

    def __init__(self) -> None:
        self._root = _Level()
        self._next = 0

    def put(self, msg: RetainedMessage) -> None:
        node = self._root
        for level in msg.topic.split("/"):
            child = node.children.get(level)
            if child is None:
                child = node.children[level] = _Level()
            node = child
        if node.message is None:
            self._next += 1
            node.order = self._next
        node.message = msg

    def remove(self, topic: str) -> None:
        path = [self._root]
        levels = topic.split("/")
        for level in levels:
            child = path[-1].children.get(level)
            if child is None:
                return
            path.append(child)
        path[-1].message = None
        # Prune the levels left empty, deepest first.
        for depth in range(len(levels), 0, -1):
            node = path[depth]
            if node.message is not None or node.children:
                break
            del path[depth - 1].children[levels[depth - 1]]

    def matching(self, topic_filter: str) -> list[RetainedMessage]:
        """The messages whose topic ``topic_filter`` matches (MQTT-4.7.2-1: a
        wildcard first level skips topics starting with ``$``), oldest topic first."""
        levels = topic_filter.split("/")
        out: list[_Level] = []
        stack = [(self._root, 0)]
        while stack:
            node, i = stack.pop()
            if i == len(levels):
                if node.message is not None:
                    out.append(node)
                continue
            level = levels[i]
            if level == "#":
                # "a/#" matches "a" too, and everything under it.
                if node.message is not None and i > 0:
                    out.append(node)
                self._subtree(node, out, skip_dollar=i == 0)
            elif level == "+":
                for name, child in node.children.items():
                    if not (i == 0 and name.startswith("$")):
                        stack.append((child, i + 1))
            else:
                exact = node.children.get(level)
                if exact is not None:
                    stack.append((exact, i + 1))
        out.sort(key=_order)
        return [node.message for node in out if node.message is not None]

    @staticmethod
    def _subtree(node: _Level, out: list[_Level], skip_dollar: bool) -> None:
        stack = [
            child
            for name, child in node.children.items()
            if not (skip_dollar and name.startswith("$"))
        ]
        while stack:
            node = stack.pop()
            if node.message is not None:
                out.append(node)
            stack.extend(node.children.values())


def _order(node: _Level) -> int:
    return node.order


def _from_record(topic: str, value: Any) -> RetainedMessage:
    """A retained.log record; ValueError (its line is a damaged one) for anything
    put() does not write."""
    try:
        qos, timestamp, expires_at = value["qos"], value["timestamp"], value.get("expires_at")
        if (
            not is_valid_topic_name(topic)
            or qos not in (0, 1, 2)
            or not isinstance(timestamp, int)
            or not (expires_at is None or isinstance(expires_at, int))
        ):
            raise ValueError(f"not a retained message: {topic!r}")
        return RetainedMessage(
            topic,
            base64.b64decode(value["payload"], validate=True),
            qos,
            base64.b64decode(value["properties"], validate=True),
            timestamp,
            expires_at,
        )
    except (KeyError, TypeError, AttributeError, binascii.Error) as exc:
        raise ValueError(f"not a retained message ({exc!r})") from None


class RetainedStore:
    """One vhost's retained messages. ``path`` None: in memory only."""

    def __init__(
        self,
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
        self.messages: dict[str, RetainedMessage] = {}
        self._tree = TopicTree()
        self._log: DefinitionsLog | None = None
        if path is not None:
            self._log = DefinitionsLog(
                path,
                sync=False,
                on_damage=on_damage,
                check=_from_record,
                budget=budget,
                mirror=mirror,
            )
            for key, value in self._log.live.items():
                msg = _from_record(key, value)
                self.messages[key] = msg
                self._tree.put(msg)

    def __len__(self) -> int:
        return len(self.messages)

    def put(self, msg: RetainedMessage) -> None:
        """Retain ``msg`` for its topic (an empty payload clears the topic instead)."""
        if not msg.payload:
            self.clear(msg.topic)
            return
        self.messages[msg.topic] = msg
        self._tree.put(msg)
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
        if self.messages.pop(topic, None) is not None:
            self._tree.remove(topic)
            if self._log is not None:
                self._log.delete(topic)

    def matching(self, topic_filter: str, now_ms: int) -> list[RetainedMessage]:
        """The live retained messages whose topic the filter matches (expired ones are
        dropped on the way)."""
        if "+" not in topic_filter and "#" not in topic_filter:
            candidates = [m] if (m := self.messages.get(topic_filter)) is not None else []
        else:
            candidates = self._tree.matching(topic_filter)
        live = []
        for msg in candidates:
            if msg.expires_at is not None and msg.expires_at <= now_ms:
                self.clear(msg.topic)
            else:
                live.append(msg)
        return live

    @property
    def log(self) -> DefinitionsLog | None:
        """What a publish acknowledgement waits on (group sync); None in memory."""
        return self._log

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
