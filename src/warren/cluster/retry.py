"""The cluster code's clock, and how it retries without flooding the log.

A node retries while the leader is dead or etcd is out of reach: quickly at
first, then less often (:class:`Backoff`), logging the change of state once
rather than every attempt. Its timing goes through one :class:`Clock` (the
event loop's by default), so tests drive the retries without waiting.
"""

from __future__ import annotations

import asyncio
from typing import Protocol


class Clock(Protocol):
    """Seconds, monotonic, and a sleep on the same time line."""

    def time(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class LoopClock:
    """The running event loop's clock (what asyncio's timeouts use)."""

    def time(self) -> float:
        return asyncio.get_running_loop().time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class Backoff:
    """Delays between retries: ``first``, doubling up to ``cap``; ``reset`` after
    a success. A dead leader is retried at once and then every ``cap`` seconds,
    not once a second for as long as its etcd lease lasts."""

    def __init__(self, first: float = 0.1, cap: float = 2.0) -> None:
        self.first = first
        self.cap = cap
        #: Failed attempts since the last success (0: not failing; 1: the one to log).
        self.failures = 0

    def next(self) -> float:
        """Count a failure; the delay before the next attempt."""
        self.failures += 1
        return min(self.first * 2 ** min(self.failures - 1, 30), self.cap)

    def reset(self) -> None:
        self.failures = 0
