"""A delivery stream's unsettled deliveries (an AMQP channel's, an MQTT
connection's), by delivery tag.

A delivery made alone is one entry (queue, seq, message, consumer, body size).
The deliveries of a run (Queue.publish_run stored them in one write and the
consumer wrote them in one go, or a backlog span) stay one `UnsettledRun`:
consecutive tags, their sequence numbers as an array of offsets into one
segment, no Message. An ack with multiple=true then settles a whole run, or
its front, with one slice and one store call instead of a dict entry and a
Message per message; a nack or reject hands the queue the run whole
(QueueSettlement.reject_run). The rarer paths (a transaction, a closing
channel, singles and runs mixed) see every delivery as an entry; a run's
entries carry no message (None), which the queue reads back from its store
when it needs one. core/deliveries.py settles them.
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Iterator
from typing import TYPE_CHECKING

from warren.core.errors import PreconditionFailed

if TYPE_CHECKING:
    from warren.core.consumer import Consumer
    from warren.core.message import Message
    from warren.core.queue import Queue

# An unacked delivery: the queue it came from, the queue's sequence number, the
# message (None: a run's, still in the store), the consumer that took it (None
# for basic.get) and its body size (what prefetch-size counts).
Unsettled = tuple["Queue", int, "Message | None", "Consumer | None", int]


class UnsettledRun:
    """Deliveries with tags ``first .. first + len(offsets) - 1`` from one queue to
    one consumer: sequence numbers ``(segment << 32) | offsets[i]``, body sizes
    ``sizes[i]`` (core/store.py's StoredRun, as delivered)."""

    __slots__ = ("first", "queue", "consumer", "segment", "offsets", "sizes")

    def __init__(
        self,
        first: int,
        queue: Queue,
        consumer: Consumer | None,
        segment: int,
        offsets: array[int],
        sizes: array[int],
    ) -> None:
        self.first = first
        self.queue = queue
        self.consumer = consumer
        self.segment = segment
        self.offsets = offsets
        self.sizes = sizes

    def __len__(self) -> int:
        return len(self.offsets)

    @property
    def last(self) -> int:
        return self.first + len(self.offsets) - 1

    def split(self, k: int) -> UnsettledRun:
        """Cut off and return the first ``k`` deliveries; this keeps the rest."""
        head = UnsettledRun(
            self.first, self.queue, self.consumer, self.segment, self.offsets[:k], self.sizes[:k]
        )
        self.first += k
        self.offsets = self.offsets[k:]
        self.sizes = self.sizes[k:]
        return head

    def entries(self) -> Iterator[tuple[int, Unsettled]]:
        """Each delivery as a (tag, Unsettled) of its own, without its message."""
        base = self.segment << 32
        queue, consumer, sizes = self.queue, self.consumer, self.sizes
        for i, offset in enumerate(self.offsets):
            yield self.first + i, (queue, base | offset, None, consumer, sizes[i])


class UnsettledDeliveries:
    """Tag-ordered unacked deliveries: single ones in a dict, runs in a list."""

    __slots__ = ("singles", "runs")

    def __init__(self) -> None:
        self.singles: dict[int, Unsettled] = {}  # ascending tags (insertion order)
        self.runs: list[UnsettledRun] = []  # ascending tags, disjoint

    def __len__(self) -> int:
        return len(self.singles) + sum(len(r) for r in self.runs)

    def __bool__(self) -> bool:
        return bool(self.singles) or bool(self.runs)

    def add(self, tag: int, entry: Unsettled) -> None:
        self.singles[tag] = entry

    def add_run(self, run: UnsettledRun) -> None:
        self.runs.append(run)  # tags only grow: it goes last

    def clear(self) -> None:
        self.singles.clear()
        self.runs.clear()

    def take(self, tag: int, multiple: bool) -> tuple[list[tuple[int, Unsettled]], list[UnsettledRun]]:
        """Remove what an ack (or nack) of ``tag`` settles: that delivery, or with
        ``multiple`` every delivery up to it (all of them for tag 0). A tag
        that settles nothing is a channel error (406), as in RabbitMQ."""
        singles = self.singles
        runs = self.runs
        if multiple:
            if tag == 0:
                taken = list(singles.items())
                taken_runs = runs[:]
                self.clear()
                return taken, taken_runs
            taken = []
            for t in singles:
                if t > tag:
                    break
                taken.append((t, singles[t]))
            for t, _ in taken:
                del singles[t]
            taken_runs = []
            while runs and runs[0].first <= tag:
                run = runs[0]
                if run.last <= tag:
                    taken_runs.append(runs.pop(0))
                else:
                    taken_runs.append(run.split(tag - run.first + 1))
                    break
            if not taken and not taken_runs:
                raise PreconditionFailed(f"unknown delivery tag {tag}")
            return taken, taken_runs
        entry = singles.pop(tag, None)
        if entry is not None:
            return [(tag, entry)], []
        for i, run in enumerate(runs):
            if run.first > tag:
                break
            if tag <= run.last:
                k = tag - run.first
                if k:
                    runs.insert(i, run.split(k))  # the part before stays unacked
                one = run.split(1)
                if not run.offsets:
                    runs.remove(run)
                return [], [one]
        raise PreconditionFailed(f"unknown delivery tag {tag}")

    def take_range(
        self, first: int, last: int
    ) -> tuple[list[tuple[int, Unsettled]], list[UnsettledRun]] | None:
        """Remove tags ``first .. last`` as take() would one by one, when runs
        side by side hold all of them (cut out of the first and the last) or
        single deliveries do; None, and nothing removed, otherwise (a tag
        missing, or singles and runs mixed)."""
        runs = self.runs
        n = len(runs)
        i = 0
        while i < n and runs[i].last < first:
            i += 1
        if i < n and runs[i].first <= first:
            j = i
            while runs[j].last < last:
                if j + 1 == n or runs[j + 1].first != runs[j].last + 1:
                    return None
                j += 1
            k = first - runs[i].first
            if k:
                runs.insert(i, runs[i].split(k))  # the part before stays unacked
                i += 1
                j += 1
            end = runs[j]
            taken = runs[i:j]
            taken.append(end.split(last - end.first + 1))
            del runs[i:j]
            if not end.offsets:
                del runs[i]
            return [], taken
        singles = self.singles
        tags = range(first, last + 1)
        for tag in tags:
            if tag not in singles:
                return None
        return [(tag, singles.pop(tag)) for tag in tags], []

    def __contains__(self, tag: object) -> bool:
        if tag in self.singles:
            return True
        return isinstance(tag, int) and any(r.first <= tag <= r.last for r in self.runs)

    def entries(self) -> list[tuple[int, Unsettled]]:
        """Every delivery as (tag, Unsettled), in tag order (runs' without messages)."""
        if not self.runs:
            return list(self.singles.items())
        return list(
            heapq.merge(
                self.singles.items(),
                *(r.entries() for r in self.runs),
                key=lambda item: item[0],
            )
        )

    def restore(self, entries: list[tuple[int, Unsettled]]) -> None:
        """Put settled deliveries back (a rolled-back transaction's), in tag order."""
        merged = dict(self.singles)
        for tag, entry in entries:
            merged[tag] = entry
        self.singles = dict(sorted(merged.items()))

    def by_age(self) -> Iterator[tuple[int, Queue | None]]:
        """(tag, queue), oldest delivery first; a run counts once, by its oldest."""
        if not self.runs:
            for tag, entry in self.singles.items():
                yield tag, entry[0]
            return
        singles = ((tag, entry[0]) for tag, entry in self.singles.items())
        runs = ((r.first, r.queue) for r in self.runs)
        yield from heapq.merge(singles, runs, key=lambda item: item[0])
