"""Failed logins per source address: refusals delayed, floods refused unchecked.

Every protocol (AMQP, MQTT, the management API) reports a failed login here
before it refuses it, and waits the delay `failed` returns: 0 for the first
failure of an address, then ``delay_ms`` doubling with each further failure
in the last minute (at most MAX_DELAY_MS), so guessing passwords gets slow
while a user who mistyped once notices nothing. An address with
``per_minute`` failures in the last minute is `blocked`: its logins are
refused without looking at the credentials until its failures age out. Time
is the broker's clock (core/clock.py, its monotonic ms); the delay is a timer
on it.
"""

from __future__ import annotations

from collections import deque

from warren.core.clock import Clock, LoopClock

__all__ = ["AuthGuard"]

#: The longest a refusal is held (ms): below the AMQP listener's close-ok timeout.
MAX_DELAY_MS = 2000.0
WINDOW_MS = 60_000.0
#: Addresses tracked at most; beyond it the stalest are forgotten first.
MAX_ADDRESSES = 100_000


class AuthGuard:
    def __init__(
        self,
        delay_ms: int = 200,
        per_minute: int = 30,
        clock: Clock | None = None,
    ) -> None:
        self.delay_ms = float(delay_ms)
        self.per_minute = per_minute
        self.clock: Clock = clock if clock is not None else LoopClock()
        self._failures: dict[str, deque[float]] = {}
        self.refused = 0

    def _recent(self, host: str, now: float) -> deque[float] | None:
        times = self._failures.get(host)
        if times is None:
            return None
        while times and times[0] <= now - WINDOW_MS:
            times.popleft()
        if not times:
            del self._failures[host]
            return None
        return times

    def blocked(self, host: str | None) -> bool:
        """Too many failures from ``host`` in the last minute: refuse it unchecked."""
        if not self.per_minute or host is None:
            return False
        times = self._recent(host, self.clock.monotonic_ms())
        return times is not None and len(times) >= self.per_minute

    def failed(self, host: str | None) -> float:
        """Record a failed login; the ms to hold its refusal (a timer on the clock)."""
        self.refused += 1
        if host is None:
            return self.delay_ms
        now = self.clock.monotonic_ms()
        times = self._recent(host, now)
        if times is None:
            if len(self._failures) >= MAX_ADDRESSES:
                del self._failures[next(iter(self._failures))]
            times = self._failures[host] = deque(maxlen=max(self.per_minute, 64))
        times.append(now)
        n = len(times)
        if n <= 1 or not self.delay_ms:
            return 0.0
        return min(self.delay_ms * 2 ** (n - 2), MAX_DELAY_MS)
