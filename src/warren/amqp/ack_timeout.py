"""The consumer (delivery acknowledgement) timeout, without a clock read per delivery.

Once a second the broker's check records a mark: (highest delivery tag so far,
time). A delivery with tag T happened no later than the first mark whose tag is
at least T, so ``now - that mark's time`` is a lower bound of its age: a channel
is closed only for deliveries certainly older than the timeout, at most one
check late. Delivery tags grow with time, so ages only fall in tag
order and the scan stops at the first delivery young enough.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from warren.core.queue import Queue


class AckDeadlines:
    __slots__ = ("_marks",)

    def __init__(self) -> None:
        self._marks: deque[tuple[int, int]] = deque()

    def overdue(
        self,
        unacked: Iterable[tuple[int, Queue | None]],
        last_tag: int,
        now: int,
        default: int,
        floor: int,
    ) -> int | None:
        """The timeout (ms) some unacked delivery has exceeded, or None.

        ``default`` applies to deliveries from queues without x-consumer-timeout
        (0: no timeout); ``floor`` is the smallest timeout that could apply, so the
        scan can stop early.
        """
        marks = self._marks
        first = True
        i = n = 0
        for tag, queue in unacked:
            if first:
                first = False
                if not marks or marks[-1][0] < last_tag:
                    marks.append((last_tag, now))
                while marks and marks[0][0] < tag:  # tag: the oldest delivery's
                    marks.popleft()
                n = len(marks)
            while i < n and marks[i][0] < tag:
                i += 1
            if i == n:
                return None
            age = now - marks[i][1]
            if age < floor:
                return None
            timeout = default
            if queue is not None and queue.consumer_timeout is not None:
                timeout = queue.consumer_timeout
            if timeout and age >= timeout:
                return timeout
        if first:  # nothing unacked
            marks.clear()
        return None
