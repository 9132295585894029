"""Resource alarms: free disk and memory, raised and cleared as RabbitMQ's are.

While any alarm is raised, publishing connections are blocked
(connection.blocked; MQTT stops reading). The broker measures both once a
second; the free-disk alarm is also measured as soon as the data directory's
writers have used up the budget it gave them (store/disk_budget.py: the check
before writing), and raised at once when a write fails (docs/storage.md,
"Free-disk alarm"). Knows nothing of connections or stores: the broker passes
in what blocks its publishers and what writes out its buffers.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Callable
from pathlib import Path

from warren.config import Config
from warren.core.events import Events
from warren.memory import resident_bytes, total_bytes
from warren.store.disk_budget import UNLIMITED, DiskBudget

__all__ = ["ALARM_RESOURCES", "ResourceAlarms"]

log = logging.getLogger("warren")

#: Resource alarms in the order RabbitMQ names them in connection.blocked's reason.
ALARM_RESOURCES = ("memory", "disk")


class ResourceAlarms:
    """The free-disk and memory alarms of one broker, and its writers' disk budget.

    ``set_blocked(blocked)`` blocks or unblocks every publisher (when the first
    alarm is raised, the last cleared); ``flush_written()`` writes out what the
    loop turn buffered, so that the file system counts it.
    """

    def __init__(
        self,
        config: Config,
        data_dir: Path,
        set_blocked: Callable[[bool], None],
        flush_written: Callable[[], None],
    ) -> None:
        self.config = config
        self.data_dir = data_dir
        self._set_blocked = set_blocked
        self._flush_written = flush_written
        #: The broker's loop (set by its start): a write failing on another
        #: thread raises the alarm there.
        self.loop: asyncio.AbstractEventLoop | None = None
        #: Raised alarms ("memory", "disk"); changed in place, never replaced.
        self.raised: set[str] = set()
        self.disk = False
        self.memory = False
        #: Told of each alarm raised and cleared (alarm.set, alarm.cleared).
        self.events = Events()
        #: What the writers may still append before the disk is measured again
        #: (store/disk_budget.py): the free-disk alarm's check before writing.
        self.budget = DiskBudget(self._budget_spent, self._write_failed)
        # A write failed (a full disk): the alarm holds until there is room again.
        self._failed_write = False
        #: The broker's memory use (bytes) as last sampled; tests inject the reader.
        self.memory_reader: Callable[[], int] = resident_bytes
        self.total_memory = total_bytes()
        self.mem_used = 0
        self.mem_limit = self.memory_limit()

    # -- free disk --------------------------------------------------------------------------
    def check_disk(self) -> bool:
        """Measure the free disk, raise or clear the free-disk alarm and give the
        writers their budget: the bytes left above free_disk_min (docs/storage.md,
        "Free-disk alarm"). True while the alarm is raised."""
        limit = self.config.free_disk_min
        budget = self.budget
        try:
            free = shutil.disk_usage(self.data_dir).free
        except OSError:
            log.exception("cannot read free disk space of %s", self.data_dir)
            budget.left = UNLIMITED  # measured again at the next check
            return self.disk
        # After a failed write the alarm holds until a write can succeed again.
        alarm = free < limit or (self._failed_write and free < max(limit, 1))
        if alarm != self.disk:
            if alarm:
                log.warning(
                    "free disk %d bytes is below free_disk_min %d: blocking publishers",
                    free,
                    limit,
                )
            else:
                log.info("free disk %d bytes is back above free_disk_min", free)
                self._failed_write = False
            self.set_alarm("disk", alarm)
        # While the alarm is raised no publisher is read: no need to count.
        budget.left = free - limit if limit and not alarm else UNLIMITED
        return alarm

    def _budget_spent(self) -> None:
        """A writer used up the budget (store/disk_budget.py): write out what this
        loop turn buffered, so that the file system counts it, and measure again,
        now; below free_disk_min the alarm blocks every publisher in this turn."""
        self.budget.left = UNLIMITED  # no second call while this one runs
        self._flush_written()
        self.check_disk()

    def _write_failed(self, exc: BaseException) -> None:
        """A write failed and was undone (store/disk_budget.py): raise the disk
        alarm at once (from another thread: on the loop, as soon as it can)."""
        loop = self.loop
        if loop is None:
            return
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if not on_loop:
            loop.call_soon_threadsafe(self._write_failed, exc)
            return
        self._failed_write = True
        self.budget.left = UNLIMITED
        if "disk" not in self.raised:
            log.warning("a write to the data directory failed (%s): blocking publishers", exc)
            self.set_alarm("disk", True)

    # -- memory -----------------------------------------------------------------------------
    def memory_limit(self) -> int:
        """Bytes of memory the broker may use before the memory alarm is raised:
        ``memory_high_watermark_absolute``, else that fraction of the RAM."""
        absolute = self.config.memory_high_watermark_absolute
        if absolute:
            return absolute
        return int(self.total_memory * self.config.memory_high_watermark)

    def check_memory(self) -> bool:
        """Sample the broker's memory use; raise the memory alarm above the limit and
        clear it at or below (RabbitMQ's vm_memory_monitor: no hysteresis). A limit of
        0 blocks every publisher, as a watermark of 0 does in RabbitMQ."""
        try:
            used = self.memory_reader()
        except OSError:
            log.exception("cannot read the broker's memory use")
            return self.memory
        limit = self.memory_limit()
        self.mem_used = used
        self.mem_limit = limit
        known = bool(self.total_memory or self.config.memory_high_watermark_absolute)
        alarm = known and used > limit
        if alarm != self.memory:
            if alarm:
                log.warning(
                    "memory use %d bytes is above the memory high watermark %d: "
                    "blocking publishers",
                    used,
                    limit,
                )
            else:
                log.info("memory use %d bytes is back below the memory high watermark", used)
            self.set_alarm("memory", alarm)
        return alarm

    # -- both -------------------------------------------------------------------------------
    def set_alarm(self, resource_name: str, raised: bool) -> None:
        """Raise or clear one resource alarm; publishers are blocked when the first
        is raised and unblocked when the last clears."""
        alarms = self.raised
        was_blocking = bool(alarms)
        changed = raised != (resource_name in alarms)
        if raised:
            alarms.add(resource_name)
        else:
            alarms.discard(resource_name)
        if changed and self.events:
            name = "alarm.set" if raised else "alarm.cleared"
            self.events.emit(name, {"source": resource_name})
        self.disk = "disk" in alarms
        self.memory = "memory" in alarms
        blocking = bool(alarms)
        if blocking != was_blocking:
            if not blocking:
                log.info("every resource alarm cleared: unblocking publishers")
            self._set_blocked(blocking)

    def blocked_reason(self) -> str:
        """connection.blocked's reason, as RabbitMQ words it: "low on memory",
        "low on disk", "low on memory & disk"."""
        raised = [r for r in ALARM_RESOURCES if r in self.raised]
        return "low on " + " & ".join(raised)
