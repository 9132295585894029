"""x-expires: a queue unused for its time is deleted; a part every Queue holds
(``queue.expires``).

Use is a declaration (a classic queue's: ``declare_renews``), a consumer
leaving the last, a basic.get; while a consumer is attached the queue never
expires. The timer is armed for last use + x-expires by the vhost's clock,
and when it fires early (the queue was used meanwhile) it waits again.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from warren.core.queue import Queue

__all__ = ["QueueExpires"]

log = logging.getLogger("warren.queue")


class QueueExpires:
    """When a queue was last used, and its x-expires timer."""

    def __init__(self, queue: Queue) -> None:
        self.queue = queue
        #: The x-expires setting (ms), or None.
        self.expires: int | None = None
        #: When the queue was last used (ms since the epoch).
        self.last_used = queue.clock.now_ms()
        self._timer: Any = None

    def configure(self, expires: int | None) -> None:
        """Adopt the x-expires setting (arguments or policy): armed at once."""
        if expires != self.expires:
            self.expires = expires
            self._arm()

    def touch(self) -> None:
        """The queue was used: x-expires starts over."""
        self.last_used = self.queue.clock.now_ms()
        if self.expires is not None and self._timer is None and not self.queue.consumers:
            self._arm()

    def stop(self) -> None:
        """A consumer came, or the queue is deleted: no timer until used again."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self) -> None:
        self.stop()
        q = self.queue
        if self.expires is None or q.deleted or q.consumers:
            return
        self._timer = q.clock.call_at(self.last_used + self.expires, self.check)

    def check(self) -> None:
        """The x-expires timer: delete the queue if unused for its time by the
        vhost's clock, else wait again."""
        self.stop()  # called early: the check is now
        q = self.queue
        if q.deleted or q.consumers or self.expires is None:
            return
        try:
            if q.clock.now_ms() < self.last_used + self.expires:
                self._arm()
                return
            log.info("queue '%s' in vhost '%s' expired (unused)", q.name, q.vhost.name)
            q.vhost.delete_queue(q.name)
        except Exception:
            log.exception("queue '%s' in vhost '%s': x-expires check failed", q.name, q.vhost.name)
