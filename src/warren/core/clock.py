"""The broker's one clock: what time it is, and timers.

Every TTL, expiry, delay (x-delayed-message), timeout (consumer, handshake,
login refusals), keep-alive (MQTT), heartbeat (AMQP) and rate (statistics
sampling) reads this clock and arms its timers here, never ``time`` or the
event loop directly (tests/core/test_clock_layering.py checks the source). The
broker holds one (``Broker.clock``) and hands it down: vhosts (``VHost.clock``),
their queues and exchanges, the protocol connections (``Node.clock``).

Units are milliseconds throughout: ``now_ms()`` is wall time in ms since the
epoch, because message timestamps, TTL deadlines, x-expires and delayed
messages are stored and must mean the same after a restart; ``monotonic_ms()``
never goes backwards (in-memory deduplication caches, the login guard);
``call_later(delay_ms, cb)`` and ``call_at(when_ms, cb)`` (a ``now_ms()``
time) return a handle with ``cancel()``.

:class:`LoopClock` is the real one: the system clock and the asyncio loop's
timers. :class:`ManualClock` is the tests': time moves only when the test
calls ``advance(ms)``, which runs the timers that fall due, in order, each
with the clock set to its due time, so no test waits for time to pass.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Callable
from typing import Protocol

from mypy_extensions import mypyc_attr

__all__ = ["Clock", "LoopClock", "ManualClock", "TimerHandle", "sleep", "system_ms"]


def system_ms() -> int:
    """The system's wall clock in ms since the epoch: LoopClock's time, and a
    Message's when it is made outside a broker (tests, tools) with no time given;
    the broker's own paths always pass their clock's."""
    return int(time.time() * 1000)


class TimerHandle(Protocol):
    """What a timer gives back: a way to cancel it (asyncio.TimerHandle is one)."""

    def cancel(self) -> None: ...


# A base class rather than a Protocol: compiled (setup.py), a queue's
# ``self.clock.now_ms()`` is a direct call, as cheap as the module-level
# now_ms() it replaced on the publish path.
@mypyc_attr(allow_interpreted_subclasses=True)
class Clock:
    """What the broker and everything under it know of time."""

    def now_ms(self) -> int:
        """Wall time, ms since the epoch (stored: timestamps, deadlines)."""
        raise NotImplementedError

    def monotonic_ms(self) -> float:
        """ms on a line that never goes backwards (in-memory durations only)."""
        raise NotImplementedError

    def call_later(self, delay_ms: float, callback: Callable[[], None]) -> TimerHandle:
        """Run ``callback`` on the loop ``delay_ms`` from now (at once if <= 0)."""
        raise NotImplementedError

    def call_at(self, when_ms: int, callback: Callable[[], None]) -> TimerHandle:
        """Run ``callback`` on the loop when ``now_ms()`` reaches ``when_ms``."""
        raise NotImplementedError

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop the timers run on (the broker's, given at its start)."""
        raise NotImplementedError


class LoopClock(Clock):
    """The system clock, and the event loop's timers (the running loop's until
    ``attach``). A deadline in wall time becomes a delay when the timer is set,
    so a wall clock set back or forward does not move timers already armed."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.loop = loop

    def now_ms(self) -> int:
        return int(time.time() * 1000)

    def monotonic_ms(self) -> float:
        return time.monotonic() * 1000.0

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def call_later(self, delay_ms: float, callback: Callable[[], None]) -> TimerHandle:
        loop = self.loop
        if loop is None or loop.is_closed():
            loop = asyncio.get_running_loop()
        return loop.call_later(max(delay_ms, 0) / 1000, callback)

    def call_at(self, when_ms: int, callback: Callable[[], None]) -> TimerHandle:
        return self.call_later(when_ms - int(time.time() * 1000), callback)


class _ManualTimer:
    """A ManualClock timer; ordered by due time, then by when it was set."""

    __slots__ = ("when", "order", "callback", "loop", "cancelled")

    def __init__(
        self,
        when: int,
        order: int,
        callback: Callable[[], None],
        loop: asyncio.AbstractEventLoop | None,
    ) -> None:
        self.when = when
        self.order = order
        self.callback = callback
        self.loop = loop
        self.cancelled = False

    def __lt__(self, other: _ManualTimer) -> bool:
        return (self.when, self.order) < (other.when, other.order)

    def cancel(self) -> None:
        self.cancelled = True


class ManualClock(Clock):
    """A clock for tests: it stands still until ``advance(ms)``.

    ``advance`` runs every timer that falls due, earliest first (timers set by
    those callbacks included), with ``now_ms()`` at each timer's due time, and
    leaves the clock at the target. Call it on the loop that owns the broker
    (tests/conftest.py's ``BrokerThread.advance`` does). A timer set for a time
    already reached runs on the next loop turn, as a real loop's would. Timers
    of a loop since closed (a stopped broker's) are dropped, so one clock can
    serve a broker and its restart on the same data directory.
    """

    def __init__(self, start_ms: int | None = None) -> None:
        # Wall time at creation by default: timestamps stay plausible for clients
        # that read them (and x-stream-offset timestamps they send).
        self._now = int(time.time() * 1000) if start_ms is None else start_ms
        self._monotonic = 0.0
        self._timers: list[_ManualTimer] = []
        self._order = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._due_scheduled = False

    def now_ms(self) -> int:
        return self._now

    def monotonic_ms(self) -> float:
        return self._monotonic

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def call_later(self, delay_ms: float, callback: Callable[[], None]) -> TimerHandle:
        return self.call_at(self._now + max(int(delay_ms), 0), callback)

    def call_at(self, when_ms: int, callback: Callable[[], None]) -> TimerHandle:
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:  # set from outside a loop (a test): the attached one's
            loop = self._loop if self._loop is not None and not self._loop.is_closed() else None
        self._order += 1
        timer = _ManualTimer(when_ms, self._order, callback, loop)
        heapq.heappush(self._timers, timer)
        if when_ms <= self._now and loop is not None and not self._due_scheduled:
            self._due_scheduled = True
            loop.call_soon(self._run_due)
        return timer

    def _run_due(self) -> None:
        self._due_scheduled = False
        self._fire_until(self._now)

    def _fire_until(self, target: int) -> int:
        fired = 0
        timers = self._timers
        while timers and timers[0].when <= target:
            timer = heapq.heappop(timers)
            if timer.cancelled or (timer.loop is not None and timer.loop.is_closed()):
                continue
            if timer.when > self._now:
                self._monotonic += timer.when - self._now
                self._now = timer.when
            timer.cancelled = True  # fired: a late cancel() is a no-op
            fired += 1
            timer.callback()
        return fired

    def advance(self, ms: float) -> int:
        """Move time forward by ``ms``, running the timers due on the way; how
        many ran."""
        if ms < 0:
            raise ValueError("a clock does not go back")
        target = self._now + int(ms)
        fired = self._fire_until(target)
        self._monotonic += target - self._now
        self._now = target
        return fired

    def pending(self) -> list[int]:
        """The due times of the timers not yet run nor cancelled (for tests)."""
        return sorted(t.when for t in self._timers if not t.cancelled)


async def sleep(clock: Clock, delay_ms: float) -> None:
    """Wait ``delay_ms`` of ``clock`` (asyncio.sleep on the broker's time line)."""
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def wake() -> None:
        if not future.done():
            future.set_result(None)

    handle = clock.call_later(delay_ms, wake)
    try:
        await future
    finally:
        handle.cancel()
