"""The consumer (delivery acknowledgement) timeout, without a clock read per delivery.

Once a second the broker's check records a mark: (highest delivery tag so far,
time). A delivery with tag T happened no later than the first mark whose tag is
at least T, so ``now - that mark's time`` is a lower bound of its age: a channel
is closed only for deliveries certainly older than the timeout, at most one
check late. Delivery tags grow with time, so ages only fall along the unacked
dict's order and the scan stops at the first delivery young enough.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from warren.core.queue import Queue


class AckDeadlines:
    __slots__ = ("_marks",)

    def __init__(self) -> None:
        self._marks: deque[tuple[int, int]] = deque()

    def overdue(
        self,
        unacked: Mapping[int, tuple[Queue | None, Any, Any, Any]],
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
        if not unacked:
            marks.clear()
            return None
        if not marks or marks[-1][0] < last_tag:
            marks.append((last_tag, now))
        oldest = next(iter(unacked))
        while marks and marks[0][0] < oldest:
            marks.popleft()
        i = 0
        n = len(marks)
        for tag, entry in unacked.items():
            while i < n and marks[i][0] < tag:
                i += 1
            if i == n:
                return None
            age = now - marks[i][1]
            if age < floor:
                return None
            queue = entry[0]
            timeout = default
            if queue is not None and queue.consumer_timeout is not None:
                timeout = queue.consumer_timeout
            if timeout and age >= timeout:
                return timeout
        return None
