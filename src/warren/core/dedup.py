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
A transient exchange's or queue's cache lives in memory only: a restart
forgets it (LavinMQ forgets every exchange's). A durable queue's, stream's or
exchange's cache is durable (docs/storage.md, "Deduplication keys"): it is
rebuilt at start from the keys of the records that survived (a queue's) plus a
journal of keys whose messages were durable (:class:`KeyLog`), so it needs a
clock that survives a restart: milliseconds since the epoch, as records carry
(the broker's ``clock.now_ms``; an in-memory cache takes ``clock.monotonic_ms``,
core/clock.py).

Usage (an exchange or a queue holds one, built when it is declared)::

    dedup = Deduplicator.from_arguments(arguments, what="queue 'q' in vhost '/'")
    if dedup is not None and dedup.seen(msg):
        ...  # a duplicate: drop it
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from warren.core.clock import LoopClock
from warren.core.codec_errors import DecodeError
from warren.core.erlang_format import field_type
from warren.core.errors import PreconditionFailed
from warren.core.properties import headers_offset, peek_headers
from warren.core.table import FIXED_SIZES, decode_field_value

if TYPE_CHECKING:
    from warren.core.message import Message

__all__ = [
    "DEFAULT_CACHE_SIZE",
    "DEFAULT_HEADER",
    "DEDUP_ARGUMENTS",
    "Deduplicator",
    "KeyEntry",
    "KeyLog",
    "forget_dropped",
    "key_of",
]

DEFAULT_CACHE_SIZE = 128
DEFAULT_HEADER = "x-deduplication-header"
#: The per-message header that overrides the cache TTL for that message's key.
TTL_HEADER = "x-cache-ttl"
_TTL_NAME = TTL_HEADER.encode()
_U32 = struct.Struct(">I")
_LONGSTR, _BYTES = ord("S"), ord("x")
#: Every argument the deduplicator reads, e.g. for equivalence checks.
DEDUP_ARGUMENTS = (
    "x-message-deduplication",
    "x-cache-size",
    "x-cache-ttl",
    "x-deduplication-header",
)

Clock = Callable[[], float]
#: A remembered key: (key, first seen in ms, expiry in ms or None: never).
KeyEntry = tuple[Hashable, float, float | None]


class KeyLog(Protocol):
    """Where a durable cache keeps the keys whose messages are durable
    (store/dedup_journal.py); the queue tells it each new key of a stored
    persistent message, and it writes the key once that message is durable."""

    def load(self) -> list[KeyEntry]:
        """The keys written before this start, oldest first."""
        ...

    def recorded(self, entry: KeyEntry, stores: Sequence[Any]) -> None:
        """A new key whose message was just appended to ``stores``."""
        ...

    def withdraw(self, key: Hashable) -> None:
        """A recorded key whose message was taken back out before it was durable
        (a transaction that could not be stored): never write it."""
        ...

    def close(self) -> None: ...

    def delete(self) -> None:
        """Its exchange or queue is deleted: remove what it wrote."""
        ...


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


def key_of(value: Any) -> Hashable:
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
    the message header holding the key, ``clock`` returns the time in ms (the
    broker clock's monotonic_ms, or its now_ms for a durable cache; without one,
    a LoopClock's, for a cache outside a broker).
    Expired keys are dropped lazily, when met again or evicted.
    """

    __slots__ = ("size", "ttl", "header", "_clock", "_entries", "last_new")

    def __init__(
        self,
        size: int = DEFAULT_CACHE_SIZE,
        ttl: int | None = None,
        header: str = DEFAULT_HEADER,
        clock: Clock | None = None,
    ) -> None:
        if size < 1:
            raise ValueError("size must be at least 1")
        self.size = size
        self.ttl = ttl
        self.header = header
        self._clock: Clock = clock if clock is not None else LoopClock().monotonic_ms
        # key -> (first seen, expiry time in ms or None: never, durable), least
        # recently seen first. ``durable``: written to a KeyLog (or rebuilt from one).
        self._entries: OrderedDict[Hashable, tuple[float, float | None, bool]] = OrderedDict()
        #: The entry the last check() recorded, None if it found a duplicate.
        self.last_new: KeyEntry | None = None

    def __repr__(self) -> str:
        return (
            f"<Deduplicator header={self.header!r} size={self.size} ttl={self.ttl} "
            f"keys={len(self._entries)}>"
        )

    def __len__(self) -> int:
        return len(self._entries)

    @classmethod
    def from_arguments(
        cls, arguments: dict[str, Any] | None, what: str = "", clock: Clock | None = None
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

    def _key_and_ttl(self, headers: dict[str, Any] | None) -> tuple[Any, int | None] | None:
        """The key header's value and the message's own TTL (None: the default);
        None without a key."""
        if not headers:
            return None
        value = headers.get(self.header)
        if value is None:
            return None
        ttl = headers.get(TTL_HEADER)
        if not isinstance(ttl, int) or isinstance(ttl, bool) or ttl < 0:
            ttl = None
        return value, ttl

    def seen(self, msg: Message) -> bool:
        """Whether the message is a duplicate; if it is not, its key is recorded."""
        found = self._key_and_ttl(msg.headers)
        return False if found is None else self.check(*found)

    def seen_properties(self, props: bytes) -> bool:
        """seen() for a message with this property list, without a Message or
        the headers as a dict: only the key's and the TTL's entries are
        decoded (a publish run's messages, StreamQueue.publish_run)."""
        try:
            found = self._raw_key_and_ttl(props)
        except (DecodeError, IndexError, struct.error):
            found = self._key_and_ttl(peek_headers(props))  # says what is wrong
        return False if found is None else self.check(*found)

    def _raw_key_and_ttl(self, props: bytes) -> tuple[Any, int | None] | None:
        """_key_and_ttl of the headers in ``props``, read where they lie: each
        top-level entry's key compared as bytes, values skipped by their size
        (the last entry of a name counts, as in the decoded dict)."""
        at = headers_offset(props)
        if at is None:
            return None
        end = at + 4 + _U32.unpack_from(props, at)[0]
        at += 4
        name = self.header.encode("utf-8", "surrogateescape")
        value: Any = None
        ttl: Any = None
        while at < end:
            key_end = at + 1 + props[at]
            key = props[at + 1 : key_end]
            tag = props[key_end]
            if key in (name, _TTL_NAME):
                found, at = decode_field_value(props, key_end)
                if key == name:
                    value = found
                else:
                    ttl = found
                continue
            size = FIXED_SIZES.get(tag)
            if size is not None:
                at = key_end + 1 + size
            elif tag in (_LONGSTR, _BYTES):
                at = key_end + 5 + _U32.unpack_from(props, key_end + 1)[0]
            else:
                at = decode_field_value(props, key_end)[1]
        if at != end:
            raise DecodeError("the headers table does not end where it says")
        if value is None:
            return None
        if not isinstance(ttl, int) or isinstance(ttl, bool) or ttl < 0:
            ttl = None
        return value, ttl

    def entry_of(self, headers: dict[str, Any] | None, seen: float) -> KeyEntry | None:
        """The entry a message with these headers, first seen at ``seen`` (its
        record's timestamp), leaves in the cache; None without a key."""
        found = self._key_and_ttl(headers)
        if found is None:
            return None
        value, ttl = found
        if ttl is None:
            ttl = self.ttl
        return (key_of(value), seen, None if ttl is None else seen + ttl)

    def check(self, value: Any, ttl: int | None = None) -> bool:
        """Whether ``value`` is a key seen within its lifetime; if not, record it for
        ``ttl`` ms (None: the default TTL). The building block of :meth:`seen`."""
        if ttl is None:
            ttl = self.ttl
        key = key_of(value)
        entries = self._entries
        now = self._clock()
        if key in entries:
            expires = entries[key][1]
            if expires is None or expires > now:
                entries.move_to_end(key)
                self.last_new = None
                return True
            del entries[key]
        while len(entries) >= self.size:
            entries.popitem(last=False)
        expiry = None if ttl is None else now + ttl
        entries[key] = (now, expiry, False)
        self.last_new = (key, now, expiry)
        return False

    def use_clock(self, clock: Clock) -> None:
        """Read time from ``clock`` from now on (the vhost's, once the cache's
        exchange belongs to one)."""
        self._clock = clock

    def forget_key(self, key: Hashable) -> None:
        """Drop a key as check() recorded it (its message was refused after all)."""
        self._entries.pop(key, None)

    def forget_message(self, msg: Message) -> Hashable | None:
        """Drop the key of a message check() let in that was not kept after all
        (taken back out of its queues); returns the key, None without one."""
        entry = self.entry_of(msg.headers, 0)
        if entry is None:
            return None
        self._entries.pop(entry[0], None)
        return entry[0]

    def mark_durable(self, key: Hashable, seen: float) -> None:
        """The key recorded at ``seen`` is now in the KeyLog."""
        entry = self._entries.get(key)
        if entry is not None and entry[0] == seen:
            self._entries[key] = (seen, entry[1], True)

    def restore(self, entries: Iterable[KeyEntry]) -> None:
        """Take back durable keys at start: those not expired by now, the most
        recently first seen ones when there are more than ``size``."""
        now = self._clock()
        best: dict[Hashable, KeyEntry] = {}
        for entry in entries:
            expires = entry[2]
            if expires is not None and expires <= now:
                continue
            old = best.get(entry[0])
            if old is None or old[1] <= entry[1]:
                best[entry[0]] = entry
        ordered = sorted(best.values(), key=lambda e: e[1])[-self.size :]
        table = self._entries
        for key, seen, expires in ordered:
            table.pop(key, None)
            table[key] = (seen, expires, True)
        while len(table) > self.size:
            table.popitem(last=False)

    def durable_entries(self) -> list[KeyEntry]:
        """The remembered durable keys, not expired, least recently seen first."""
        now = self._clock()
        return [
            (key, seen, expires)
            for key, (seen, expires, durable) in self._entries.items()
            if durable and (expires is None or expires > now)
        ]

    def forget(self, value: Any) -> None:
        """Drop a key (e.g. a queue removing a message it dropped after all)."""
        self._entries.pop(key_of(value), None)

    def clear(self) -> None:
        self._entries.clear()


def forget_dropped(
    msgs: Iterable[Message],
    dedup: Deduplicator | None,
    key_log: KeyLog | None,
    exchanges: Mapping[str, Any],
) -> None:
    """Messages a queue took and then lost (a failed write-out dropped their
    records: their publishers get nacks) forget the keys they added, the
    queue's (``dedup``, and ``key_log`` never writes them) and their
    deduplicating exchange's: a retry must be stored, not dropped as a
    duplicate. A copy another queue of the exchange did store may come twice
    then: better stored twice than lost."""
    for msg in msgs:
        if dedup is not None:
            key = dedup.forget_message(msg)
            if key is not None and key_log is not None:
                key_log.withdraw(key)
        exchange = exchanges.get(msg.exchange)
        ex_dedup = getattr(exchange, "deduplicator", None)
        if ex_dedup is not None:
            key = ex_dedup.forget_message(msg)
            ex_log = getattr(exchange, "key_log", None)
            if key is not None and ex_log is not None:
                ex_log.withdraw(key)
