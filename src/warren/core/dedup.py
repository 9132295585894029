"""Message deduplication: a bounded cache of the keys of messages already seen.

The arguments are LavinMQ's (which match the rabbitmq-message-deduplication
plugin's names), for an exchange or a queue:

    x-message-deduplication  bool     enables deduplication
    x-cache-size             int > 0  most keys remembered (default 128); the least
                                      recently seen key makes room for a new one
    x-cache-ttl              int > 0  milliseconds a key is remembered (default: for ever)
    x-deduplication-header   str      the message header holding the key
                                      (default ``x-deduplication-header``)

A message's own ``x-cache-ttl`` header (an integer, milliseconds) overrides the
default TTL for its key. A message without the key header is never a duplicate.
The cache lives in memory only: a restart forgets it, as in LavinMQ.

Usage (an exchange or a queue holds one, built when it is declared)::

    dedup = Deduplicator.from_arguments(arguments, what="queue 'q' in vhost '/'")
    if dedup is not None and dedup.seen(msg):
        ...  # a duplicate: drop it
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

from warren.core.erlang_format import field_type
from warren.core.errors import PreconditionFailed

if TYPE_CHECKING:
    from warren.core.message import Message

__all__ = [
    "DEFAULT_CACHE_SIZE",
    "DEFAULT_HEADER",
    "DEDUP_ARGUMENTS",
    "Deduplicator",
    "monotonic_ms",
]

DEFAULT_CACHE_SIZE = 128
DEFAULT_HEADER = "x-deduplication-header"
#: The per-message header that overrides the cache TTL for that message's key.
TTL_HEADER = "x-cache-ttl"
#: Every argument the deduplicator reads, e.g. for equivalence checks.
DEDUP_ARGUMENTS = (
    "x-message-deduplication",
    "x-cache-size",
    "x-cache-ttl",
    "x-deduplication-header",
)

Clock = Callable[[], float]


def monotonic_ms() -> float:
    """The default clock: milliseconds that never go backwards."""
    return time.monotonic() * 1000.0


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _positive_int(value: Any) -> int | None:
    """A positive integer argument; numeric strings count, as the plugin takes them."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str):
        text = value.strip()
        if not text.isdigit():
            return None
        value = int(text)
    if _is_int(value) and value > 0:
        return int(value)
    return None


def _key(value: Any) -> Hashable:
    """A dict key for a header value of any AMQP type (tables and arrays included)."""
    if isinstance(value, bool):
        return ("bool", value)  # True must not equal the integer 1
    if isinstance(value, str | bytes | int | float):
        return value
    return ("repr", repr(value))


class Deduplicator:
    """Remembers message keys; :meth:`seen` tells a duplicate and records a new key.

    ``size`` bounds the number of keys (least recently seen evicted first), ``ttl``
    is the default lifetime of a key in ms (None: until evicted), ``header`` names
    the message header holding the key, ``clock`` returns the time in ms (monotonic).
    Expired keys are dropped lazily, when met again or evicted.
    """

    __slots__ = ("size", "ttl", "header", "_clock", "_entries")

    def __init__(
        self,
        size: int = DEFAULT_CACHE_SIZE,
        ttl: int | None = None,
        header: str = DEFAULT_HEADER,
        clock: Clock = monotonic_ms,
    ) -> None:
        if size < 1:
            raise ValueError("size must be at least 1")
        self.size = size
        self.ttl = ttl
        self.header = header
        self._clock = clock
        # key -> expiry time in ms (None: never), least recently seen first.
        self._entries: OrderedDict[Hashable, float | None] = OrderedDict()

    def __repr__(self) -> str:
        return (
            f"<Deduplicator header={self.header!r} size={self.size} ttl={self.ttl} "
            f"keys={len(self._entries)}>"
        )

    def __len__(self) -> int:
        return len(self._entries)

    @classmethod
    def from_arguments(
        cls, arguments: dict[str, Any] | None, what: str = "", clock: Clock = monotonic_ms
    ) -> Deduplicator | None:
        """The deduplicator the declaration arguments ask for, or None when they do not
        enable it. Raises PreconditionFailed (406) for an argument of the wrong type;
        ``what`` names the object in the error text, e.g. ``exchange 'x' in vhost '/'``."""
        if not arguments:
            return None
        enabled = arguments.get("x-message-deduplication")
        if enabled is None:
            return None
        where = f" for {what}" if what else ""

        def invalid(arg: str, expected: str) -> PreconditionFailed:
            value = arguments[arg]
            return PreconditionFailed(
                f"invalid arg '{arg}'{where}: expected {expected}, "
                f"got {field_type(value)} {value!r}"
            )

        if not isinstance(enabled, bool):
            raise invalid("x-message-deduplication", "a boolean")
        if not enabled:
            return None
        size = DEFAULT_CACHE_SIZE
        if "x-cache-size" in arguments:
            parsed = _positive_int(arguments["x-cache-size"])
            if parsed is None:
                raise invalid("x-cache-size", "an integer greater than 0")
            size = parsed
        ttl: int | None = None
        if "x-cache-ttl" in arguments:
            ttl = _positive_int(arguments["x-cache-ttl"])
            if ttl is None:
                raise invalid("x-cache-ttl", "an integer greater than 0 (milliseconds)")
        header = DEFAULT_HEADER
        if "x-deduplication-header" in arguments:
            name = arguments["x-deduplication-header"]
            if isinstance(name, bytes):
                name = name.decode("utf-8", "surrogateescape")
            if not isinstance(name, str) or not name:
                raise invalid("x-deduplication-header", "a non-empty string")
            header = name
        return cls(size, ttl, header, clock)

    def seen(self, msg: Message) -> bool:
        """Whether the message is a duplicate; if it is not, its key is recorded."""
        headers = msg.headers
        if not headers:
            return False
        value = headers.get(self.header)
        if value is None:
            return False
        ttl = headers.get(TTL_HEADER)
        if not isinstance(ttl, int) or isinstance(ttl, bool) or ttl < 0:
            ttl = None
        return self.check(value, ttl)

    def check(self, value: Any, ttl: int | None = None) -> bool:
        """Whether ``value`` is a key seen within its lifetime; if not, record it for
        ``ttl`` ms (None: the default TTL). The building block of :meth:`seen`."""
        if ttl is None:
            ttl = self.ttl
        key = _key(value)
        entries = self._entries
        now = self._clock()
        if key in entries:
            expires = entries[key]
            if expires is None or expires > now:
                entries.move_to_end(key)
                return True
            del entries[key]
        while len(entries) >= self.size:
            entries.popitem(last=False)
        entries[key] = None if ttl is None else now + ttl
        return False

    def forget(self, value: Any) -> None:
        """Drop a key (e.g. a queue removing a message it dropped after all)."""
        self._entries.pop(_key(value), None)

    def clear(self) -> None:
        self._entries.clear()
