"""A channel's message counters by exchange and by queue.

RabbitMQ's Prometheus plugin shows a channel's publishes per exchange
(``channel_exchange_metrics``: published, confirmed, returned, dropped), its
deliveries per queue (``channel_queue_metrics``: gets, deliveries, redeliveries,
acks, empty gets) and its publishes per queue and exchange
(``channel_queue_exchange_metrics``). A channel keeps them here, beside its own
totals (core/stats.py's MessageStats), counted where the channel already
handles a run or a batch, never as an event per message:

- publishes: a run (amqp/publishing.py) is counted once for its exchange and
  queues; a message published alone goes into a tally of the last exchange
  and queue list, folded into the counts when the route changes (a
  publisher mostly sends to one place), and before the counts are read;
- confirms: a channel in confirm mode marks where its publishes change
  exchange (:class:`ConfirmMarks`); a confirm is charged to the exchange its
  publish number falls in, in one step while every unsettled publish went to
  the same exchange;
- deliveries and gets: each consumer holds its channel's :class:`QueueCounts`
  for its queue and adds a run's deliveries at once; acks are counted per
  queue as the channel settles them (one call per queue and ack).
"""

from __future__ import annotations

from bisect import bisect_right
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from warren.core.exchange import Exchange
    from warren.core.queue import Queue

__all__ = ["ChannelCounts", "ConfirmMarks", "ExchangeCounts", "QueueCounts"]


class ExchangeCounts:
    """What a channel published into one exchange (by name, as RabbitMQ keys it)."""

    __slots__ = ("name", "publish", "confirm", "return_unroutable", "drop_unroutable")

    def __init__(self, name: str) -> None:
        self.name = name
        self.publish = 0
        self.confirm = 0
        self.return_unroutable = 0
        self.drop_unroutable = 0

    def values(self) -> tuple[int, int, int, int]:
        return (self.publish, self.confirm, self.return_unroutable, self.drop_unroutable)


class QueueCounts:
    """What a channel took from one queue."""

    __slots__ = (
        "queue",
        "get",
        "get_no_ack",
        "deliver",
        "deliver_no_ack",
        "redeliver",
        "ack",
        "get_empty",
    )

    def __init__(self, queue: Queue) -> None:
        self.queue = queue
        self.get = 0
        self.get_no_ack = 0
        self.deliver = 0
        self.deliver_no_ack = 0
        self.redeliver = 0
        self.ack = 0
        self.get_empty = 0

    def values(self) -> tuple[int, int, int, int, int, int, int]:
        """In RabbitMQ's order: get (manual ack), get_no_ack, deliver (manual
        ack), deliver_no_ack, redeliver, ack, get_empty."""
        return (
            self.get,
            self.get_no_ack,
            self.deliver,
            self.deliver_no_ack,
            self.redeliver,
            self.ack,
            self.get_empty,
        )


#: Queues (or queue and exchange pairs) a channel counts before deleted queues
#: are dropped from its counts (RPC replies go to ever new queues).
_PRUNE_AT = 32


class ChannelCounts:
    """One channel's counts by exchange, by queue and by queue and exchange."""

    __slots__ = (
        "exchanges",
        "queues",
        "routed",
        "_last_ex",
        "_last_counts",
        "_tally_counts",
        "_tally_queues",
        "_tally_n",
        "_prune_at",
    )

    def __init__(self) -> None:
        self.exchanges: dict[str, ExchangeCounts] = {}
        #: id(queue) -> its counts (which hold the queue, so the id stays its own).
        self.queues: dict[int, QueueCounts] = {}
        #: (id(queue), exchange name) -> (queue, publishes routed to it from there).
        self.routed: dict[tuple[int, str], tuple[Queue, int]] = {}
        self._last_ex: Exchange | None = None
        self._last_counts: ExchangeCounts | None = None
        # Publishes not yet folded in: n messages, each to these queues.
        self._tally_counts: ExchangeCounts | None = None
        self._tally_queues: list[Queue] = []
        self._tally_n = 0
        self._prune_at = _PRUNE_AT

    def exchange(self, ex: Exchange) -> ExchangeCounts:
        """The counts of an exchange (the last one asked for, without a lookup)."""
        if ex is self._last_ex:
            counts = self._last_counts
            assert counts is not None
            return counts
        counts = self.exchanges.get(ex.name)
        if counts is None:
            counts = self.exchanges[ex.name] = ExchangeCounts(ex.name)
        self._last_ex = ex
        self._last_counts = counts
        return counts

    def queue(self, queue: Queue) -> QueueCounts:
        counts = self.queues.get(id(queue))
        if counts is None:
            if len(self.queues) >= self._prune_at:
                self._prune()
            counts = self.queues[id(queue)] = QueueCounts(queue)
        return counts

    def published(self, counts: ExchangeCounts, queues: list[Queue], n: int) -> None:
        """``n`` messages published into ``counts``' exchange, each routed to
        ``queues`` (none: unroutable)."""
        if counts is self._tally_counts and queues == self._tally_queues:
            self._tally_n += n
            return
        self.fold()
        self._tally_counts = counts
        self._tally_queues = queues
        self._tally_n = n

    def fold(self) -> None:
        """Fold the tally into the counts (before they are read)."""
        counts = self._tally_counts
        n = self._tally_n
        if counts is None or not n:
            return
        counts.publish += n
        routed = self.routed
        name = counts.name
        for q in self._tally_queues:
            key = (id(q), name)
            prior = routed.get(key)
            if prior is None:
                if len(routed) >= self._prune_at:
                    self._prune()
                    routed = self.routed
                routed[key] = (q, n)
            else:
                routed[key] = (q, prior[1] + n)
        self._tally_n = 0

    def _prune(self) -> None:
        """Drop deleted queues' counts (RabbitMQ drops their series too)."""
        self.queues = {k: c for k, c in self.queues.items() if not c.queue.deleted}
        self.routed = {k: v for k, v in self.routed.items() if not v[0].deleted}
        self._prune_at = max(_PRUNE_AT, 2 * len(self.queues), 2 * len(self.routed))

    def rows(
        self,
    ) -> tuple[
        list[tuple[str, tuple[int, int, int, int]]],
        list[tuple[str, tuple[int, ...]]],
        list[tuple[str, str, int]],
    ]:
        """Everything counted, for the metrics: (exchange, its 4 counts), (queue,
        its 7 counts), (queue, exchange, publishes); deleted queues left out."""
        self.fold()
        self._prune()
        return (
            [(c.name, c.values()) for c in self.exchanges.values()],
            [(c.queue.name, c.values()) for c in self.queues.values()],
            [(q.name, ex_name, n) for (_, ex_name), (q, n) in self.routed.items()],
        )


class ConfirmMarks:
    """Where a confirm-mode channel's publishes changed exchange: publish numbers
    from ``firsts[i]`` on went to ``counts[i]`` (until the next mark)."""

    __slots__ = ("firsts", "counts")

    def __init__(self) -> None:
        self.firsts: list[int] = []
        self.counts: list[ExchangeCounts] = []

    def mark(self, seq: int, counts: ExchangeCounts) -> None:
        """Publish ``seq`` (and the next ones) went to ``counts``' exchange."""
        if not self.counts or self.counts[-1] is not counts:
            self.firsts.append(seq)
            self.counts.append(counts)

    def confirmed(self, seqs: list[int] | range) -> None:
        """Charge confirms to the exchanges their publishes went to."""
        counts = self.counts
        if len(counts) == 1:
            counts[0].confirm += len(seqs)
            return
        firsts = self.firsts
        for seq in seqs:
            i = bisect_right(firsts, seq) - 1
            if i >= 0:
                counts[i].confirm += 1

    def confirmed_one(self, seq: int) -> None:
        counts = self.counts
        if len(counts) == 1:
            counts[0].confirm += 1
        elif counts:
            i = bisect_right(self.firsts, seq) - 1
            if i >= 0:
                counts[i].confirm += 1

    def settled_below(self, floor: int | None) -> None:
        """Every publish before ``floor`` (None: every publish) is settled: the
        marks before the one ``floor`` falls in are no longer needed."""
        if len(self.counts) < 2:
            return
        firsts = self.firsts
        keep = len(firsts) - 1 if floor is None else max(0, bisect_right(firsts, floor) - 1)
        if keep:
            del firsts[:keep]
            del self.counts[:keep]
