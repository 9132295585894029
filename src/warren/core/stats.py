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
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

__all__ = [
    "COUNTERS",
    "MessageStats",
    "OctetStats",
    "RateSampler",
    "count_delivery",
    "count_get",
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


class MessageStats:
    """Cumulative message counters of one object, and their last sampled rates."""

    __slots__ = (*COUNTERS, "_last", "_rates")

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
        self._rates: tuple[float, ...] = (0.0,) * len(COUNTERS)

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
        """An exchange took a message and routed it to ``routed`` queues (one call:
        the caller, VHost.publish, is interpreted; this is compiled)."""
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

    def sample(self, interval_s: float) -> None:
        """Rates since the previous sample, ``interval_s`` seconds ago."""
        now = self.values()
        last = self._last
        if last is not None and interval_s > 0:
            self._rates = tuple((n - p) / interval_s for n, p in zip(now, last, strict=True))
        self._last = now

    def rate(self, name: str) -> float:
        return self._rates[COUNTERS.index(name)]

    def as_dict(self, names: Iterable[str] = COUNTERS) -> dict[str, object]:
        """RabbitMQ's ``message_stats``: each counter that ever moved, with its
        ``_details.rate``; ``deliver_get`` sums deliveries and gets."""
        out: dict[str, object] = {}
        values = dict(zip(COUNTERS, self.values(), strict=True))
        rates = dict(zip(COUNTERS, self._rates, strict=True))
        for name in names:
            if values[name] or rates[name]:
                out[name] = values[name]
                out[f"{name}_details"] = {"rate": round(rates[name], 1)}
        parts = ("deliver", "deliver_no_ack", "get", "get_no_ack")
        total = sum(values[p] for p in parts)
        if total or any(rates[p] for p in parts):
            out["deliver_get"] = total
            out["deliver_get_details"] = {"rate": round(sum(rates[p] for p in parts), 1)}
        return out


class OctetStats:
    """A connection's bytes and socket reads/writes, and their last sampled rates."""

    __slots__ = ("recv_oct", "recv_cnt", "send_oct", "send_cnt", "_last", "_rates")

    def __init__(self) -> None:
        self.recv_oct = 0
        self.recv_cnt = 0
        self.send_oct = 0
        self.send_cnt = 0
        self._last: tuple[int, int] | None = None
        self._rates = (0.0, 0.0)

    def sample(self, interval_s: float) -> None:
        now = (self.recv_oct, self.send_oct)
        last = self._last
        if last is not None and interval_s > 0:
            self._rates = ((now[0] - last[0]) / interval_s, (now[1] - last[1]) / interval_s)
        self._last = now

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
    """

    def __init__(self) -> None:
        self._last_s: float | None = None

    def sample(self, stats: Iterable[MessageStats | OctetStats], now_s: float) -> int:
        """Sample each, over the time since the previous call; returns how many."""
        elapsed = 0.0 if self._last_s is None else now_s - self._last_s
        self._last_s = now_s
        n = 0
        for s in stats:
            s.sample(elapsed)
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
