"""Message counters and their rates, as RabbitMQ's management API reports them.

Every queue, exchange and channel carries one :class:`MessageStats`: plain
integer counters that the hot path increments (no events, no timestamps per
message). A :class:`RateSampler`, run every few seconds by the broker, turns
the counters of every live object into rates: ``rate`` is the change since
the previous sample divided by the time between them, RabbitMQ's
``<name>_details.rate``.

The names are RabbitMQ's ``message_stats`` keys. Queues count publish,
deliver, deliver_no_ack, get, get_no_ack, get_empty, ack, redeliver;
exchanges publish_in and publish_out; channels publish, confirm,
return_unroutable, drop_unroutable, deliver, deliver_no_ack, get,
get_no_ack, get_empty, ack, redeliver. ``deliver_get`` is derived.
As RabbitMQ, an object lists a whole group of counters once any of them moved
(:data:`QUEUE_GROUPS`, :data:`CHANNEL_GROUPS`, ...), zeros included.

Gauges (a queue's lengths, the node's memory and descriptors) are
:class:`GaugeStats`: values set by the sampler, with the same rates. Each
sampled object keeps a :class:`~warren.core.stats_history.History` of its
values (kept only when they changed, as long as its retention policy says:
RabbitMQ's ``basic`` for queues, exchanges, channels and connections,
``global`` for vhosts, the overview and the node), from which ``*_details``
gets RabbitMQ's ``samples``, ``avg`` and ``avg_rate`` when a request asks for
an age (``msg_rates_age``, ...).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

from warren.core.stats_history import BASIC, GLOBAL, History, Retention, series

__all__ = [
    "CHANNEL_GROUPS",
    "COUNTERS",
    "EXCHANGE_GROUPS",
    "QUEUE_GROUPS",
    "VHOST_GROUPS",
    "Ages",
    "GaugeStats",
    "History",
    "MessageStats",
    "OctetStats",
    "RateSampler",
    "count_delivery",
    "count_get",
    "details",
]

#: Every counter, in the order message_stats lists them.
COUNTERS: Final = (
    "publish",
    "publish_in",
    "publish_out",
    "confirm",
    "return_unroutable",
    "drop_unroutable",
    "deliver",
    "deliver_no_ack",
    "get",
    "get_no_ack",
    "get_empty",
    "ack",
    "redeliver",
)


_DELIVER_GROUP: Final = (
    "ack",
    "deliver",
    "deliver_no_ack",
    "get",
    "get_empty",
    "get_no_ack",
    "redeliver",
)
#: The counter groups RabbitMQ lists for each kind of object (all of a group, or none).
QUEUE_GROUPS: Final = (("publish",), _DELIVER_GROUP)
EXCHANGE_GROUPS: Final = (("publish_in",), ("publish_out",))
CHANNEL_GROUPS: Final = (
    ("confirm", "drop_unroutable", "publish", "return_unroutable"),
    _DELIVER_GROUP,
)
#: A vhost's and the overview's: every channel counter, always.
VHOST_GROUPS: Final = (CHANNEL_GROUPS[0] + _DELIVER_GROUP,)
_GET_PARTS: Final = ("deliver", "deliver_no_ack", "get", "get_no_ack")
_ZERO_RATES: Final = (0.0,) * len(COUNTERS)
_INDEX: Final = {name: i for i, name in enumerate(COUNTERS)}


class Ages:
    """The history a request asked for, in seconds (0: none): RabbitMQ's
    ``msg_rates_age``/``_incr`` (message_stats, churn), ``lengths_age``/``_incr``
    (queue lengths), ``data_rates_age``/``_incr`` (bytes received and sent) and
    ``node_stats_age``/``_incr`` (the node's figures)."""

    __slots__ = (
        "msg_age",
        "msg_incr",
        "len_age",
        "len_incr",
        "data_age",
        "data_incr",
        "node_age",
        "node_incr",
        "end_s",
    )

    def __init__(
        self,
        msg_age: int = 0,
        msg_incr: int = 0,
        len_age: int = 0,
        len_incr: int = 0,
        data_age: int = 0,
        data_incr: int = 0,
        node_age: int = 0,
        node_incr: int = 0,
        end_s: float = 0.0,
    ) -> None:
        self.msg_age = msg_age
        self.msg_incr = msg_incr
        self.len_age = len_age
        self.len_incr = len_incr
        self.data_age = data_age
        self.data_incr = data_incr
        self.node_age = node_age
        self.node_incr = node_incr
        #: When the broker last sampled: where the history of an object that was
        #: never sampled (new since) ends.
        self.end_s = end_s


NO_AGES: Final = Ages()


def details(
    rate: float,
    history: History | None,
    index: int | Sequence[int],
    age: int,
    incr: int,
    end_s: float = 0.0,
) -> dict[str, object]:
    """RabbitMQ's ``<name>_details``: ``rate``, and for an ``age`` (seconds, with
    samples every ``incr``) ``samples`` newest first at multiples of ``incr``,
    their mean ``avg`` and ``avg_rate``, the change across the age per second.
    ``index``: the value's position in the history, or positions to sum."""
    out: dict[str, object] = {"rate": round(rate, 1)}
    if age <= 0 or incr <= 0 or history is None:
        return out
    times, rows = series(history, age, incr, end_s)
    if isinstance(index, int):
        values = [row[index] if row else 0 for row in rows]
    else:
        values = [sum(row[i] for i in index) if row else 0 for row in rows]
    out["samples"] = [{"sample": v, "timestamp": t} for v, t in zip(values, times, strict=True)]
    out["avg"] = sum(values) / len(values)
    out["avg_rate"] = (values[0] - values[-1]) / age
    return out


class MessageStats:
    """Cumulative message counters of one object, and their last sampled rates."""

    __slots__ = (*COUNTERS, "_last", "_rates", "history")

    def __init__(self) -> None:
        self.publish = 0
        self.publish_in = 0
        self.publish_out = 0
        self.confirm = 0
        self.return_unroutable = 0
        self.drop_unroutable = 0
        self.deliver = 0
        self.deliver_no_ack = 0
        self.get = 0
        self.get_no_ack = 0
        self.get_empty = 0
        self.ack = 0
        self.redeliver = 0
        self._last: tuple[int, ...] | None = None
        self._rates: tuple[float, ...] = _ZERO_RATES
        self.history = History()

    def values(self) -> tuple[int, ...]:
        return (
            self.publish,
            self.publish_in,
            self.publish_out,
            self.confirm,
            self.return_unroutable,
            self.drop_unroutable,
            self.deliver,
            self.deliver_no_ack,
            self.get,
            self.get_no_ack,
            self.get_empty,
            self.ack,
            self.redeliver,
        )

    def count_publish(self, routed: int) -> None:
        """An exchange took a message and routed it to ``routed`` queues (Router.publish)."""
        self.publish_in += 1
        self.publish_out += routed

    def count_publishes(self, messages: int, routed: int) -> None:
        """``messages`` publishes, each routed to ``routed`` queues (a run)."""
        self.publish_in += messages
        self.publish_out += messages * routed

    def set_sum(self, parts: Iterable[MessageStats]) -> None:
        """Make the counters the sum of ``parts`` (a vhost's: its channels')."""
        totals = [0] * len(COUNTERS)
        for part in parts:
            for i, value in enumerate(part.values()):
                totals[i] += value
        for name, total in zip(COUNTERS, totals, strict=True):
            setattr(self, name, total)

    @classmethod
    def combined(cls, parts: Iterable[MessageStats]) -> MessageStats:
        """Counters and rates summed (an overview of several vhosts)."""
        out = cls()
        parts = list(parts)
        out.set_sum(parts)
        rates = [0.0] * len(COUNTERS)
        for part in parts:
            for i, rate in enumerate(part._rates):
                rates[i] += rate
        out._rates = tuple(rates)
        return out

    def add(self, other: MessageStats) -> None:
        """Fold another object's counters in (a closed channel into its vhost's)."""
        for name in COUNTERS:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def sample(self, interval_s: float, now_s: float = 0.0, policy: Retention = BASIC) -> None:
        """Rates since the previous sample, ``interval_s`` seconds ago."""
        now = self.values()
        last = self._last
        if last is not None and interval_s > 0:
            if now == last:  # idle (most objects): no arithmetic, no new record
                self._rates = _ZERO_RATES
                now = last
            else:
                self._rates = tuple((n - p) / interval_s for n, p in zip(now, last, strict=True))
        self._last = now
        self.history.add(now_s, now, policy)

    def rate(self, name: str) -> float:
        return self._rates[COUNTERS.index(name)]

    def as_dict(
        self,
        groups: Sequence[Sequence[str]] = VHOST_GROUPS,
        ages: Ages = NO_AGES,
    ) -> dict[str, object]:
        """RabbitMQ's ``message_stats``: every counter of each group in which one
        ever moved, with its ``_details``; ``deliver_get`` (deliveries and gets)
        with the group that has ``deliver``."""
        values = self.values()
        rates = self._rates
        if not any(values) and not any(rates):  # never moved: most objects
            return {}
        out: dict[str, object] = {}
        history = self.history if ages.msg_age else None
        index = _INDEX.__getitem__
        for group in groups:
            at = [index(name) for name in group]
            if not any(values[i] or rates[i] for i in at):
                continue
            for name, i in zip(group, at, strict=True):
                out[name] = values[i]
                out[f"{name}_details"] = details(
                    rates[i], history, i, ages.msg_age, ages.msg_incr, ages.end_s
                )
            if "deliver" in group:
                out["deliver_get"] = sum(values[index(p)] for p in _GET_PARTS)
                out["deliver_get_details"] = self._deliver_get_details(ages)
        return dict(sorted(out.items()))

    def _deliver_get_details(self, ages: Ages) -> dict[str, object]:
        parts = [COUNTERS.index(p) for p in _GET_PARTS]
        rate = sum(self._rates[i] for i in parts)
        history = self.history if ages.msg_age else None
        return details(rate, history, parts, ages.msg_age, ages.msg_incr, ages.end_s)


class GaugeStats:
    """Values the sampler sets (a queue's lengths, the node's memory), with the
    rate of change since the previous sample and a history, as RabbitMQ's
    ``messages_details``."""

    __slots__ = ("values", "_last", "_rates", "history")

    def __init__(self, size: int) -> None:
        self.values: tuple[int, ...] = (0,) * size
        self._last: tuple[int, ...] | None = None
        self._rates: tuple[float, ...] = (0.0,) * size
        self.history = History()

    def sample(self, interval_s: float, now_s: float = 0.0, policy: Retention = BASIC) -> None:
        now = self.values
        last = self._last
        if last is not None and interval_s > 0:
            if now == last:
                self._rates = (0.0,) * len(now)
            else:
                self._rates = tuple((n - p) / interval_s for n, p in zip(now, last, strict=True))
        self._last = now
        self.history.add(now_s, now, policy)

    def details(
        self, index: int, age: int = 0, incr: int = 0, end_s: float = 0.0
    ) -> dict[str, object]:
        history = self.history if age else None
        return details(self._rates[index], history, index, age, incr, end_s)


class OctetStats:
    """A connection's bytes and socket reads/writes, and their last sampled rates."""

    __slots__ = ("recv_oct", "recv_cnt", "send_oct", "send_cnt", "_last", "_rates", "history")

    def __init__(self) -> None:
        self.recv_oct = 0
        self.recv_cnt = 0
        self.send_oct = 0
        self.send_cnt = 0
        self._last: tuple[int, int] | None = None
        self._rates = (0.0, 0.0)
        self.history = History()

    def sample(self, interval_s: float, now_s: float = 0.0, policy: Retention = BASIC) -> None:
        now = (self.recv_oct, self.send_oct)
        last = self._last
        if last is not None and interval_s > 0:
            self._rates = ((now[0] - last[0]) / interval_s, (now[1] - last[1]) / interval_s)
        self._last = now
        self.history.add(now_s, now, policy)

    def details(
        self, index: int, age: int = 0, incr: int = 0, end_s: float = 0.0
    ) -> dict[str, object]:
        """``recv_oct_details`` (0) or ``send_oct_details`` (1), with history for an age."""
        history = self.history if age else None
        return details(self._rates[index], history, index, age, incr, end_s)

    def as_dict(self) -> dict[str, object]:
        """The fields RabbitMQ's management API gives a connection."""
        return {
            "recv_oct": self.recv_oct,
            "recv_oct_details": {"rate": round(self._rates[0], 1)},
            "recv_cnt": self.recv_cnt,
            "send_oct": self.send_oct,
            "send_oct_details": {"rate": round(self._rates[1], 1)},
            "send_cnt": self.send_cnt,
        }


class RateSampler:
    """Samples every live object's counters (RabbitMQ samples every 5 s).

    The caller passes the time (its clock), so tests need not wait for it.
    ``policies``: the retention of the ``basic`` objects (queues, exchanges,
    channels, connections) and the ``global`` ones (vhosts, the overview, the
    node), RabbitMQ's ``sample_retention_policies``.
    """

    def __init__(self, basic: Retention = BASIC, global_: Retention = GLOBAL) -> None:
        self._last_s: float | None = None
        self.basic = basic
        self.global_ = global_

    def sample(
        self,
        stats: Iterable[MessageStats | OctetStats | GaugeStats],
        now_s: float,
        global_stats: Iterable[MessageStats | OctetStats | GaugeStats] = (),
    ) -> int:
        """Sample each (``global_stats`` under the global policy), over the time
        since the previous call; returns how many. ``now_s`` is the time since the
        epoch (the samples' timestamps)."""
        elapsed = self.start(now_s)
        return self.sample_slice(stats, now_s, elapsed, self.basic) + self.sample_slice(
            global_stats, now_s, elapsed, self.global_
        )

    def start(self, now_s: float) -> float:
        """A round at ``now_s``: the seconds since the previous one (0: the first)."""
        elapsed = 0.0 if self._last_s is None else now_s - self._last_s
        self._last_s = now_s
        return elapsed

    @staticmethod
    def sample_slice(
        stats: Iterable[MessageStats | OctetStats | GaugeStats],
        now_s: float,
        elapsed: float,
        policy: Retention,
    ) -> int:
        """Sample some of a round's objects; how many."""
        n = 0
        for s in stats:
            s.sample(elapsed, now_s, policy)
            n += 1
        return n


def count_delivery(
    channel: MessageStats, queue: MessageStats, no_ack: bool, redelivered: bool
) -> None:
    """A delivery to a consumer, counted for its channel and its queue."""
    if no_ack:
        channel.deliver_no_ack += 1
        queue.deliver_no_ack += 1
    else:
        channel.deliver += 1
        queue.deliver += 1
    if redelivered:
        channel.redeliver += 1
        queue.redeliver += 1


def count_get(channel: MessageStats, queue: MessageStats, no_ack: bool, redelivered: bool) -> None:
    """A message fetched with basic.get (or the HTTP API's get), for channel and queue."""
    if no_ack:
        channel.get_no_ack += 1
        queue.get_no_ack += 1
    else:
        channel.get += 1
        queue.get += 1
    if redelivered:
        channel.redeliver += 1
        queue.redeliver += 1
