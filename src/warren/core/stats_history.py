"""The history of one sampled object's values, kept as RabbitMQ keeps it.

RabbitMQ's management plugin keeps each object's samples under a retention
policy (``management.sample_retention_policies``): a list of (max age,
interval) pairs, e.g. a queue's ``basic`` policy keeps 605 s of samples every
5 s and an hour of samples every 60 s, and a vhost's ``global`` one goes on to
8 hours every 10 minutes and a day every 30 minutes. :class:`History` keeps the
same: its *tiers*, finest first; a sample enters the first tier and, once
older than that tier's max age, moves to the next, where one sample per
interval is kept (the last of each); past the last tier's max age it is gone
(its values are what the history answers for any earlier time, as RabbitMQ
repeats its oldest sample).

A sample is kept only when a value changed, so an idle object costs one
record. Records are the *differences* from the previous record, zigzag
varints behind a bit mask of the values that moved, with the milliseconds
since the previous record: a busy queue's record is about ten bytes, so an
hour of a queue's 5 s and 60 s samples is under 2 KiB, not the 25 KiB of
tuples (docs/benchmarks.md, bench/stats_history.py). The newest record of
each tier stays unencoded while later samples of its interval may replace it.
Decoding happens only when a request asks for a range (``msg_rates_age`` ...):
:func:`series` walks the records once per object and request.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from warren.sample_retention import DEFAULT_POLICIES, Retention

__all__ = [
    "BASIC",
    "DEFAULT_POLICIES",
    "GLOBAL",
    "History",
    "Deltas",
    "Retention",
    "series",
]

#: Queues, exchanges, channels and connections.
BASIC: Final = DEFAULT_POLICIES["basic"]
#: Vhosts, the overview and the node.
GLOBAL: Final = DEFAULT_POLICIES["global"]


def _put(buf: bytearray, n: int) -> None:
    """An unsigned varint (7 bits a byte, low bits first)."""
    while n >= 0x80:
        buf.append((n & 0x7F) | 0x80)
        n >>= 7
    buf.append(n)


def _get(buf: bytearray, pos: int) -> tuple[int, int]:
    """The varint at ``pos``: (value, the position after it)."""
    n = 0
    shift = 0
    while True:
        b = buf[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if b < 0x80:
            return n, pos
        shift += 7


#: Differences of one record from the previous one, value by value.
Deltas = tuple[int, ...]
#: A tier holds no record (its front is later than any time).
_EMPTY = 1 << 62


def _encode(buf: bytearray, dt_ms: int, deltas: Deltas) -> None:
    """A record: milliseconds since the previous one, the mask of the values that
    moved, and their zigzag-encoded differences."""
    mask = 0
    bit = 1
    for d in deltas:
        if d:
            mask |= bit
        bit <<= 1
    _put(buf, dt_ms)
    _put(buf, mask)
    for d in deltas:
        if d:
            _put(buf, d << 1 if d >= 0 else ((-d) << 1) - 1)


def _decode(buf: bytearray, pos: int, width: int) -> tuple[int, Deltas, int]:
    """The record at ``pos``: (milliseconds since the previous one, differences,
    the position after it)."""
    dt, pos = _get(buf, pos)
    mask, pos = _get(buf, pos)
    deltas = [0] * width
    i = 0
    while mask:
        if mask & 1:
            z, pos = _get(buf, pos)
            deltas[i] = z >> 1 if not z & 1 else -((z + 1) >> 1)
        mask >>= 1
        i += 1
    return dt, tuple(deltas), pos


def _decode_into(buf: bytearray, pos: int, acc: list[int]) -> tuple[int, int]:
    """Add the differences of the record at ``pos`` to ``acc``: (its milliseconds since
    the previous one, the position after it)."""
    dt, pos = _get(buf, pos)
    mask, pos = _get(buf, pos)
    i = 0
    while mask:
        if mask & 1:
            z, pos = _get(buf, pos)
            acc[i] += z >> 1 if not z & 1 else -((z + 1) >> 1)
        mask >>= 1
        i += 1
    return dt, pos


class _Tier:
    """One interval's records, oldest first: encoded ones, then the open one (the
    newest, to which later records of the same interval are added)."""

    __slots__ = (
        "max_age_ms",
        "interval_ms",
        "data",
        "head_ms",
        "tail_ms",
        "front_ms",
        "open_ms",
        "open",
    )

    def __init__(self, max_age_s: int, interval_s: int) -> None:
        self.max_age_ms = max_age_s * 1000
        self.interval_ms = max(1, interval_s * 1000)
        #: Encoded records (None until the first).
        self.data: bytearray | None = None
        #: The time the first encoded record's milliseconds count from.
        self.head_ms = 0
        #: The time of the last encoded record.
        self.tail_ms = 0
        #: The time of the oldest record (_EMPTY: none).
        self.front_ms = _EMPTY
        self.open_ms = 0
        #: The open record's differences (added to in place).
        self.open: list[int] | None = None

    def _same_interval(self, t_ms: int) -> bool:
        """Whether ``t_ms`` falls in the open record's interval. Intervals end on
        their multiples ((t - i, t]): a range's timestamps, at multiples of its
        increment, get the values sampled then."""
        i = self.interval_ms
        return -(-t_ms // i) == -(-self.open_ms // i)

    def _open_new(self, t_ms: int) -> list[int]:
        """Encode the open record (if any) and open an empty one at ``t_ms``."""
        held = self.open
        data = self.data
        if held is not None:
            if not data:
                data = self.data = bytearray()
                self.head_ms = self.tail_ms = self.open_ms
            _encode(data, self.open_ms - self.tail_ms, tuple(held))
            self.tail_ms = self.open_ms
        elif not data:
            self.front_ms = t_ms
        acc: list[int] = []
        self.open = acc
        self.open_ms = t_ms
        return acc

    def _moved_to(self, t_ms: int) -> None:
        """The open record now counts as taken at ``t_ms`` (a later one joined it)."""
        self.open_ms = t_ms
        if not self.data:
            self.front_ms = t_ms

    def push(self, t_ms: int, deltas: Deltas) -> None:
        """A newer record: added to the open one when in the same interval, else the
        open one is encoded and it takes its place."""
        held = self.open
        if held is not None and self._same_interval(t_ms):
            for i, d in enumerate(deltas):
                if d:
                    held[i] += d
        else:
            self._open_new(t_ms).extend(deltas)
        self._moved_to(t_ms)

    def move_front(self, into: _Tier, width: int) -> None:
        """Move the oldest record into ``into`` (a coarser tier, whose records are all
        older): added to its open record when in the same interval."""
        data = self.data
        if data:
            t = self.front_ms
            held = into.open
            if held is not None and into._same_interval(t):
                _dt, end = _decode_into(data, 0, held)
            else:
                acc = into._open_new(t)
                acc.extend([0] * width)
                _dt, end = _decode_into(data, 0, acc)
            into._moved_to(t)
            del data[:end]
            self.head_ms = t
            if data:
                dt, _ = _get(data, 0)
                self.front_ms = t + dt
            else:
                self.front_ms = self.open_ms if self.open is not None else _EMPTY
            return
        moved = self.open
        assert moved is not None
        t = self.open_ms
        self.open = None
        self.front_ms = _EMPTY
        held = into.open
        if held is not None and into._same_interval(t):
            for i, d in enumerate(moved):
                if d:
                    held[i] += d
        else:
            into._open_new(t).extend(moved)
        into._moved_to(t)

    def drain(self, until_ms: int, acc: list[int]) -> int:
        """Take out every record up to ``until_ms``, their differences added to ``acc``;
        the time of the last one taken (-1: none)."""
        last = -1
        data = self.data
        if data:
            pos = 0
            n = len(data)
            t = self.head_ms
            while pos < n:
                dt, _ = _get(data, pos)
                if t + dt > until_ms:
                    break
                dt, pos = _decode_into(data, pos, acc)
                t += dt
                last = t
            if pos:
                del data[:pos]
                self.head_ms = t
            if data:
                dt, _ = _get(data, 0)
                self.front_ms = t + dt
                return last
        held = self.open
        if held is not None and self.open_ms <= until_ms:
            for i, d in enumerate(held):
                if d:
                    acc[i] += d
            last = self.open_ms
            self.open = None
        self.front_ms = self.open_ms if self.open is not None else _EMPTY
        return last

    def records(self, width: int, out: list[tuple[int, Deltas]]) -> None:
        """Append every record, oldest first, as (time, differences)."""
        data = self.data
        if data:
            pos = 0
            t = self.head_ms
            n = len(data)
            while pos < n:
                dt, deltas, pos = _decode(data, pos, width)
                t += dt
                out.append((t, deltas))
        if self.open is not None:
            out.append((self.open_ms, tuple(self.open)))


class History:
    """One object's values over time, under a retention policy (module docstring).

    The newest record stays in the history itself (``pending``) until a newer one
    comes: an object that never changes again costs no tier at all."""

    __slots__ = ("policy", "tiers", "base", "newest", "pending", "newest_ms", "last_s", "version")

    def __init__(self) -> None:
        self.policy: Retention = BASIC
        #: Finest first; made as records reach them (None: no record before the newest).
        self.tiers: list[_Tier] | None = None
        #: The values before the oldest record: None (zeros, the object was new)
        #: until records are dropped past the last tier.
        self.base: Deltas | None = None
        #: The newest record's values, its differences from the one before, its time.
        self.newest: Deltas | None = None
        self.pending: Deltas | None = None
        self.newest_ms = 0
        #: When the object was last sampled (the end of every history answer).
        self.last_s = 0.0
        #: Changes with every record (series' cache).
        self.version = 0

    @property
    def trimmed(self) -> bool:
        """Whether records were dropped (before the oldest: its values, not 0)."""
        return self.base is not None

    def add(self, now_s: float, values: Deltas, policy: Retention = BASIC) -> None:
        """A sample: kept when a value changed since the last one kept."""
        self.last_s = now_s
        newest = self.newest
        if newest is not None and (newest is values or newest == values):
            return
        self.version += 1
        t_ms = int(now_s * 1000)
        self.newest = values
        if newest is None:  # the first: its differences from zero are its values
            self.pending = values
            self.newest_ms = t_ms
            self.policy = policy
            return
        pending = self.pending
        assert pending is not None
        t_ms = max(t_ms, self.newest_ms)  # a clock set back: with the newest
        self.pending = tuple([a - b for a, b in zip(values, newest, strict=True)])
        tiers = self.tiers
        if tiers is None or policy is not self.policy:
            self.policy = policy
            if tiers is None:
                max_age, interval = policy[0]
                tiers = self.tiers = [_Tier(max_age, interval)]
        tiers[0].push(self.newest_ms, pending)
        self.newest_ms = t_ms
        self._age(tiers, t_ms, len(values))

    def _age(self, tiers: list[_Tier], now_ms: int, width: int) -> None:
        """Move what grew older than each tier's max age to the next tier, record by
        record (so objects sampled together do not all move a whole interval in
        the same round), or drop it past the last one (into ``base``)."""
        policy = self.policy
        k = 0
        while k < len(tiers):
            tier = tiers[k]
            limit = now_ms - tier.max_age_ms
            if tier.front_ms < limit:
                if k + 1 < len(policy):
                    if k + 1 == len(tiers):
                        max_age, interval = policy[k + 1]
                        tiers.append(_Tier(max_age, interval))
                    coarser = tiers[k + 1]
                    while tier.front_ms < limit:
                        tier.move_front(coarser, width)
                else:
                    acc = list(self.base) if self.base is not None else [0] * width
                    if tier.drain(limit - 1, acc) >= 0:
                        self.base = tuple(acc)
            k += 1

    def changed_s(self) -> float:
        """When the values last changed (the newest record's sample; 0: none yet)."""
        return self.newest_ms / 1000 if self.newest is not None else 0.0

    def records(self) -> list[tuple[int, Deltas]]:
        """Every record kept, oldest first: (time in ms, differences)."""
        newest = self.newest
        out: list[tuple[int, Deltas]] = []
        if newest is None:
            return out
        width = len(newest)
        if self.tiers is not None:
            for tier in reversed(self.tiers):
                tier.records(width, out)
        assert self.pending is not None
        out.append((self.newest_ms, self.pending))
        return out

    def values_at(self, times_ms: Sequence[int]) -> list[Deltas]:
        """The values at each of ``times_ms`` (ascending): those of the last record
        taken then or before; before the oldest, ``base`` (zeros when nothing was
        dropped: the object was new then)."""
        newest = self.newest
        if newest is None:
            return [()] * len(times_ms)
        width = len(newest)
        current = list(self.base) if self.base is not None else [0] * width
        out: list[Deltas] = []
        n = len(times_ms)
        i = 0
        for t, deltas in self.records():
            while i < n and times_ms[i] < t:
                out.append(tuple(current))
                i += 1
            if i == n:
                return out
            for j, d in enumerate(deltas):
                if d:
                    current[j] += d
        last = tuple(current)
        while i < n:
            out.append(last)
            i += 1
        return out

    def size(self) -> int:
        """Bytes of encoded records (the benchmark's figure)."""
        tiers = self.tiers or []
        return sum(len(tier.data) if tier.data is not None else 0 for tier in tiers)


class _SeriesCache:
    """The last series computed: the fields of a request's objects ask for it index
    by index (messages, messages_ready, ...), so one walk serves them all."""

    __slots__ = ("history", "key", "times", "rows")

    def __init__(self) -> None:
        self.history: History | None = None
        self.key: tuple[int, float, int, int, float] = (0, 0.0, 0, 0, 0.0)
        self.times: list[int] = []
        self.rows: list[tuple[int, ...]] = []


_cache = _SeriesCache()


def series(
    history: History, age: int, incr: int, end_s: float
) -> tuple[list[int], list[tuple[int, ...]]]:
    """The sample timestamps of a range (ms, newest first, ``age / incr + 1`` of them
    at multiples of ``incr`` ending at the object's last sample, or at ``end_s``
    for one never sampled) and the values at each."""
    key = (history.version, history.last_s, age, incr, end_s)
    cache = _cache
    if cache.history is history and cache.key == key:
        return cache.times, cache.rows
    step_ms = incr * 1000
    newest = int((history.last_s or end_s) * 1000) // step_ms * step_ms
    times = [newest - i * step_ms for i in range(age // incr + 1)]
    rows = history.values_at(times[::-1])[::-1]
    cache.history, cache.key, cache.times, cache.rows = history, key, times, rows
    return times, rows
