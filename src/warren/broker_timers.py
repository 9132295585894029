"""The broker's periodic work: resource alarms, consumer timeouts, rate sampling.

:class:`BrokerTimers` is a part the broker (broker.py) holds; it sees the
broker through :class:`TimersHost`. Started once the data directory is read,
stopped first at the stop. The free disk and memory are polled on a loop timer
(what they measure moves outside the broker); consumer timeouts and rates go by
the broker's clock, so a test's ManualClock drives them.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Protocol

from warren import sampling

if TYPE_CHECKING:
    from warren.alarms import ResourceAlarms
    from warren.core.clock import TimerHandle

__all__ = ["CONSUMER_TIMEOUT_CHECK_MS", "DISK_CHECK_INTERVAL", "BrokerTimers", "TimersHost"]

log = logging.getLogger("warren")

#: How often (s of the loop's time) the free disk and the memory use are measured.
DISK_CHECK_INTERVAL = 1.0
#: How often (ms of the clock) unacknowledged deliveries are checked for their age.
CONSUMER_TIMEOUT_CHECK_MS = 1000


class TimersHost(sampling.Broker, Protocol):
    """What the timers need of the broker: a Node with its rate sampler and alarms."""

    resource_alarms: ResourceAlarms


class BrokerTimers:
    """The broker's timers: each runs its work, then arms itself again."""

    def __init__(self, host: TimersHost) -> None:
        self.host = host
        self._loop: asyncio.AbstractEventLoop | None = None
        self._disk_timer: asyncio.TimerHandle | None = None
        self._consumer_timer: TimerHandle | None = None
        self._sample_timer: TimerHandle | None = None
        #: The round of rate sampling under way (warren/sampling.py).
        self._sampling: asyncio.Task[int] | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Run each once now (the rates: when collect_statistics_interval asks
        for them), then on its timer."""
        self._loop = loop
        self._check_disk()
        self._check_consumer_timeouts()
        if self.host.config.collect_statistics_interval:
            self._sample()  # the first round at once, then every interval

    def stop(self) -> None:
        for timer in (self._disk_timer, self._consumer_timer, self._sample_timer):
            if timer is not None:
                timer.cancel()
        self._disk_timer = self._consumer_timer = self._sample_timer = None
        if self._sampling is not None:
            self._sampling.cancel()

    def _check_disk(self) -> None:
        """Free disk and memory, polled from the OS once a second: a loop timer,
        not the broker's clock, since what it watches moves outside the broker."""
        assert self._loop is not None
        alarms = self.host.resource_alarms
        alarms.check_disk()
        alarms.check_memory()
        self._disk_timer = self._loop.call_later(DISK_CHECK_INTERVAL, self._check_disk)

    def _check_consumer_timeouts(self) -> None:
        """Close channels holding a delivery unacknowledged for longer than the
        consumer timeout (checked once a second of the clock)."""
        host = self.host
        self._consumer_timer = host.clock.call_later(
            CONSUMER_TIMEOUT_CHECK_MS, self._check_consumer_timeouts
        )
        now = host.clock.now_ms()
        default = host.config.consumer_timeout
        for conn in list(host.connections):
            conn.check_consumer_timeouts(now, default)

    def _schedule_sample(self) -> None:
        """The next round of rate sampling, every collect_statistics_interval ms of
        the clock (0: only when a test calls Broker.sample_stats)."""
        interval = self.host.config.collect_statistics_interval
        if interval:
            self._sample_timer = self.host.clock.call_later(interval, self._sample)

    def _sample(self) -> None:
        assert self._loop is not None
        self._sample_timer = None
        if self._sampling is None:
            now_s = self.host.clock.now_ms() / 1000
            task = self._loop.create_task(sampling.sample_in_slices(self.host, now_s))
            self._sampling = task
            task.add_done_callback(self._sampled)
        self._schedule_sample()

    def _sampled(self, task: asyncio.Task[int]) -> None:
        self._sampling = None
        if not task.cancelled() and task.exception() is not None:
            log.error("sampling the rates failed", exc_info=task.exception())
