"""What a stream queue needs from its storage, and how consumers say where to start.

The storage (store/stream_store.py, on the segment log) is reached only through
the StreamLog protocol here, so the core stays free of files. Offsets, the
``x-stream-offset`` consumer argument and the filter and tracking arguments are
parsed here, with RabbitMQ's rules and reply texts, for every protocol to use.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from warren.core.erlang_format import field_type, term_p
from warren.core.errors import PreconditionFailed
from warren.core.message import Message, MessageRun

__all__ = [
    "StartSpec",
    "StreamCursorLike",
    "StreamLog",
    "filter_wants",
    "parse_interval",
    "parse_start",
]

#: Headers a stream message carries on delivery (stored with it at publish).
OFFSET_HEADER = "x-stream-offset"
TIMESTAMP_HEADER = "x-stream-timestamp"
#: The header a publisher sets to let filtering consumers skip a message.
FILTER_VALUE_HEADER = "x-stream-filter-value"


def filter_wants(
    filters: frozenset[str], match_unfiltered: bool, headers: dict[str, Any] | None
) -> bool:
    """Whether a consumer filtering on ``filters`` (x-stream-filter) takes a
    message with ``headers``: its filter value is one of them, or it has none
    and the consumer takes those too (x-stream-match-unfiltered). The one rule
    of the leader's readers and of both followers' read services."""
    value = (headers or {}).get(FILTER_VALUE_HEADER)
    if isinstance(value, bytes):
        value = value.decode("utf-8", "surrogateescape")
    if value is None:
        return match_unfiltered
    return isinstance(value, str) and value in filters


class StreamCursorLike(Protocol):
    offset: int

    def next(self) -> tuple[int, Message] | None: ...

    def span(self) -> tuple[Any, int, int, int] | None: ...

    def skip(self, n: int, end: int) -> None: ...

    def chunk(self) -> tuple[int, int, Any, int, int] | None: ...

    def close(self) -> None: ...


class StreamLog(Protocol):
    """A stream's storage: append with an offset, read with independent cursors."""

    @property
    def first_offset(self) -> int: ...

    @property
    def next_offset(self) -> int: ...

    @property
    def ready_count(self) -> int: ...

    @property
    def ready_bytes(self) -> int: ...

    @property
    def first_timestamp(self) -> int | None: ...

    @property
    def last_timestamp(self) -> int | None: ...

    @property
    def dirty(self) -> bool: ...

    @property
    def directory(self) -> Path: ...

    def append(self, msg: Message) -> int: ...

    def append_run(
        self, run: MessageRun, start: int, stop: int, lost: list[int] | None = None
    ) -> int: ...

    def append_stretches(
        self,
        run: MessageRun,
        stretches: Iterable[tuple[int, int]],
        lost: list[int] | None = None,
    ) -> None: ...

    def append_chunk(
        self,
        data: bytes | memoryview,
        num_entries: int,
        ts: int,
        reference: str = "",
        last_id: int = 0,
        data_crc: int = -1,
        num_records: int = -1,
        sequences: Mapping[str, int] | None = None,
    ) -> int: ...

    def publisher_sequence(self, reference: str) -> int: ...

    def last_message_offset(self) -> int: ...

    def offset_at(self, timestamp_ms: int) -> int: ...

    def cursor(self, offset: int) -> StreamCursorLike: ...

    def apply_retention(
        self, max_length: int | None, max_bytes: int | None, max_age_ms: int | None, now_ms: int
    ) -> int: ...

    def tracked(self, name: str) -> int | None: ...

    def track(self, name: str, next_offset: int, at_once: bool = False) -> None: ...

    def flush(self) -> None: ...

    def sync(self) -> None: ...

    def collect_sync(self, fds: list[int], paths: list[Path], dirs: list[Path]) -> None: ...

    def close(self, sync: bool = True) -> None: ...

    def delete(self) -> None: ...


# -- where a consumer starts ----------------------------------------------------------------

_INTERVAL = re.compile(r"(\d+)([YMDhms])")
_UNIT_MS = {
    "Y": 365 * 86_400_000,
    "M": 30 * 86_400_000,
    "D": 86_400_000,
    "h": 3_600_000,
    "m": 60_000,
    "s": 1_000,
}


def parse_interval(text: str) -> int | None:
    """An interval such as ``7D`` or ``30m`` (RabbitMQ's x-max-age and x-stream-offset
    syntax: a positive integer and one of Y M D h m s) in milliseconds, or None."""
    match = _INTERVAL.fullmatch(text)
    if match is None or int(match.group(1)) <= 0:
        return None
    return int(match.group(1)) * _UNIT_MS[match.group(2)]


@dataclass(frozen=True)
class StartSpec:
    """Where a consumer starts: one of ``kind`` first/last/next/offset/timestamp
    (``value``: an offset, or a time in ms since the epoch)."""

    kind: str
    value: int = 0

    def resolve(self, stream: StreamLog, messages: bool = False) -> int:
        """The offset this start means in ``stream`` now; ``messages``: for a
        reader of one message at a time (AMQP), whose "last" is the last
        message it can read (not in a sub-entry batch it skips)."""
        if self.kind == "first":
            return stream.first_offset
        if self.kind == "next":
            return stream.next_offset
        if self.kind == "last":
            # The last message (RabbitMQ: the last chunk of several).
            if messages:
                return stream.last_message_offset()
            return max(stream.first_offset, stream.next_offset - 1)
        if self.kind == "timestamp":
            return stream.offset_at(self.value)
        return self.value


def parse_start(value: Any, now_ms: int, what: str) -> StartSpec:
    """The ``x-stream-offset`` consumer argument; 406 with RabbitMQ's text otherwise
    (where RabbitMQ 3.10 crashes with 541 on a value, Warren answers the same 406)."""
    raw = value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else value
    if isinstance(raw, str):
        if raw in ("first", "last", "next"):
            return StartSpec(raw)
        interval = parse_interval(raw)
        if interval is not None:
            return StartSpec("timestamp", now_ms - interval)
    elif isinstance(raw, datetime.datetime):
        return StartSpec("timestamp", int(raw.timestamp()) * 1000)
    elif isinstance(raw, int) and not isinstance(raw, bool):
        # A negative offset means the start, as RabbitMQ reads it.
        return StartSpec("offset", max(raw, 0))
    raise PreconditionFailed(
        f"invalid arg 'x-stream-offset' for {what}: "
        f"{{invalid_stream_offset_arg,{{{field_type(value)},{term_p(value)}}}}}"
    )
