"""What a queue does beyond the plain path: length limits, message TTL,
dead-lettering and x-expires (Queue builds on it).

A message leaving the queue by expiry, a drop-head overflow or a rejection is
dead-lettered (DeadLetters.publish); when no copy can be made it is put back at
the tail and kept (``_stuck``): it no longer expires or gets dropped, and the
messages behind it are not held up. Deadlines come from the queue's TTL (in
queue order: the head is checked) and a message's own expiration (a heap of
(deadline, seq), expired wherever it sits), with one timer for the earliest.
Timers that fail try again a second later (docs/architecture.md, "Queue
features").
"""

from __future__ import annotations

import heapq
import logging
from typing import TYPE_CHECKING, Any, ClassVar

from mypy_extensions import mypyc_attr

from warren.core import dead_letter as dl
from warren.core.clock import Clock
from warren.core.consumer import Consumer
from warren.core.message import Message
from warren.core.queue_settings import DROP_HEAD, message_ttl, properties_ttl
from warren.core.stats import MessageStats
from warren.core.store import MessageStore

if TYPE_CHECKING:
    from warren.core.vhost import VHost

log = logging.getLogger("warren.queue")

# After an expiry run failed unexpectedly, the next try (ms).
RETRY_MS = 1000


# Queue's base; Queue is subclassed by core/exchange_delayed.py, not compiled.
@mypyc_attr(allow_interpreted_subclasses=True)
class QueueFeatures:
    """The limits, TTL, dead-lettering and x-expires state and work of a Queue."""

    #: The management API's type, and RabbitMQ's module of that type (in its texts,
    #: and the queue_type label of its metrics).
    queue_type: ClassVar[str] = "classic"
    queue_module: ClassVar[str] = "rabbit_classic_queue"
    #: Whether queue.declare of the queue, passive or not, counts as use for
    #: x-expires: a classic queue's does, a quorum queue's not (RabbitMQ 3.10's
    #: answers, tests/data/rabbitmq_expires_renewal.json; basic.get does for both).
    declare_renews: ClassVar[bool] = True
    vhost: VHost
    clock: Clock
    name: str
    store: MessageStore
    stats: MessageStats
    consumers: list[Consumer]
    deleted: bool

    def __init__(self) -> None:
        # Whether none of the features applies: Queue's fast paths (see _configure).
        self._plain = True
        self._ttl: int | None = None
        self._max_length: int | None = None
        self._max_bytes: int | None = None
        self._overflow = DROP_HEAD
        self.dead_letter_exchange: str | None = None
        self.dead_letter_routing_key: str | None = None
        # Returns per message (seq), for the delivery limit.
        self._delivery_counts: dict[int, int] = {}
        self._expires: int | None = None
        self._expires_timer: Any = None
        self._last_used = 0  # set by Queue, from its vhost's clock
        # Messages kept after their dead-letter copy could not be made (_let_go):
        # they no longer expire or get dropped.
        self._stuck: set[int] = set()
        # Messages carrying their own expiration, as (deadline, seq): found and
        # expired wherever they sit, not only at the head.
        self._expiring: list[tuple[int, int]] = []
        self._has_expiring = False
        self._timer: Any = None
        self._timer_at = 0

    def schedule_delivery(self) -> None:  # Queue's
        raise NotImplementedError

    # -- limits -------------------------------------------------------------------------
    def _over_limit(self, extra: int) -> bool:
        """Whether the queue is full for reject-publish (RabbitMQ: at the limit)."""
        store = self.store
        max_length = self._max_length
        if max_length is not None and store.ready_count >= max_length:
            return True
        max_bytes = self._max_bytes
        return max_bytes is not None and store.ready_bytes + extra > max_bytes

    def _drop_over_limit(self) -> None:
        """drop-head: drop (and dead-letter) from the head until within the limits."""
        if self._overflow != DROP_HEAD:
            return
        store = self.store
        max_length = self._max_length
        max_bytes = self._max_bytes
        now = 0
        passes = len(self._stuck)
        while store.ready_count and (
            (max_length is not None and store.ready_count > max_length)
            or (max_bytes is not None and store.ready_bytes > max_bytes)
        ):
            item = store.peek()
            if item is None:
                break
            seq, msg, _ = item
            now = now or self.clock.now_ms()
            if seq in self._stuck:
                if not passes:
                    break  # every message over the limit is one that cannot go
                passes -= 1
                self._move_to_tail(seq)
                continue
            store.remove_ready(seq)
            self._delivery_counts.pop(seq, None)
            self._let_go(seq, msg, dl.MAXLEN, now)
        if now:
            self.vhost.store_written(store)

    # -- expiry -------------------------------------------------------------------------
    def _deadline(self, msg: Message, own_ttl: int | None = -1) -> int | None:
        """When the message expires in this queue (ms since the epoch), or None."""
        ttl = self._ttl
        if own_ttl == -1:
            own_ttl = message_ttl(msg) if self._has_expiring else None
        if own_ttl is not None and (ttl is None or own_ttl < ttl):
            ttl = own_ttl
        return None if ttl is None else msg.timestamp + ttl

    def _expire(self, now: int) -> None:
        """Dead-letter every ready message whose time has come: those at the head
        (queue TTL keeps deadlines in order), and per-message ones anywhere."""
        store = self.store
        stuck = self._stuck
        passes = len(stuck)
        expired = False
        while store.ready_count:
            item = store.peek()
            if item is None:
                break
            seq, msg, _ = item
            deadline = self._deadline(msg)
            if deadline is None or deadline > now:
                break
            if seq in stuck:
                # Kept after a dead-letter copy failed: it no longer expires, and it
                # must not hold up the messages behind it.
                if not passes:
                    break
                passes -= 1
                self._move_to_tail(seq)
                expired = True
                continue
            store.remove_ready(seq)
            self._delivery_counts.pop(seq, None)
            self._let_go(seq, msg, dl.EXPIRED, now)
            expired = True
        heap = self._expiring
        while heap and heap[0][0] <= now:
            _, seq = heapq.heappop(heap)
            if seq in stuck:
                continue
            removed = store.remove_ready(seq)
            if removed is not None:
                self._delivery_counts.pop(seq, None)
                self._let_go(seq, removed, dl.EXPIRED, now)
                expired = True
        if expired:
            self.vhost.store_written(store)
        self._timer_at = 0
        self._arm_next()

    def _arm_next(self) -> None:
        """Set the timer for the earliest deadline: the head's or a per-message one."""
        at = self._expiring[0][0] if self._expiring else 0
        if self._ttl is not None and self.store.ready_count:
            item = self.store.peek()
            if item is not None and item[0] not in self._stuck:
                head = self._deadline(item[1])
                if head is not None and (not at or head < at):
                    at = head
        if at:
            self._arm_timer(at)

    def _arm_timer(self, at: int) -> None:
        if self._timer_at and self._timer_at <= at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        self._timer = self.clock.call_at(at, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = 0
        if self.deleted:
            return
        try:
            self._expire(self.clock.now_ms())
        except Exception:
            log.exception(
                "queue '%s' in vhost '%s': expiring messages failed", self.name, self.vhost.name
            )
            self._retry_timer()

    def _retry_timer(self) -> None:
        """After a failed expiry run: try again in a second rather than never (or at
        once, for ever)."""
        if self._timer is None and not self.deleted:
            clock = self.clock
            self._timer_at = clock.now_ms() + RETRY_MS
            self._timer = clock.call_later(RETRY_MS, self._on_timer)

    def rebuild_expiry_index(self) -> None:
        """After a restart: find the ready messages that carry their own expiration
        (the records hold publish time and properties), so they expire on time."""
        for seq, timestamp, props in self.store.scan_ready():
            ttl = properties_ttl(props)
            if ttl is not None:
                self._expiring.append((timestamp + ttl, seq))
        if self._expiring:
            heapq.heapify(self._expiring)
            self._has_expiring = True
            self._plain = False
        if self._ttl is not None or self._expiring:
            self._expire(self.clock.now_ms())

    # -- dead-lettering -----------------------------------------------------------------
    def _dead_letter(self, seq: int, msg: Message, reason: str, now: int) -> bool:
        """Publish the dead-letter copy of a message leaving the queue. False when no
        copy could be made; the failure is logged (once per message, ``seq``, when
        it is stored) and the caller keeps the original."""
        if self.dead_letter_exchange is None:
            return True
        try:
            self.vhost.dead_letters.publish(self, msg, reason, now)
        except Exception:
            if seq < 0 or seq not in self._stuck:
                log.exception(
                    "queue '%s' in vhost '%s': cannot dead-letter a message (%s) to "
                    "exchange '%s'; the message stays in the queue",
                    self.name,
                    self.vhost.name,
                    reason,
                    self.dead_letter_exchange,
                )
            return False
        return True

    def _let_go(self, seq: int, msg: Message, reason: str, now: int) -> None:
        """A message just taken out of the queue (expired, over the limit, rejected):
        dead-letter it, or, when no copy can be made, put it back at the tail,
        where it stays (no longer expiring or dropped) until consumed."""
        if self._dead_letter(seq, msg, reason, now):
            return
        self._stuck.discard(seq)
        self._stuck.add(self.store.append(msg))
        self.vhost.store_written(self.store)
        self.schedule_delivery()

    def _move_to_tail(self, seq: int) -> None:
        """Move a kept message (see _let_go) from the head to the tail."""
        msg = self.store.remove_ready(seq)
        self._stuck.discard(seq)
        if msg is not None:
            self._stuck.add(self.store.append(msg))

    # -- queue expiry (x-expires) -------------------------------------------------------
    @property
    def last_used_ms(self) -> int:
        """When the queue was last used (ms since the epoch): its ``idle_since``."""
        return self._last_used

    def touch(self) -> None:
        """The queue was used (declared, consumed from, read): x-expires starts over."""
        self._last_used = self.clock.now_ms()
        if self._expires is not None and self._expires_timer is None and not self.consumers:
            self._arm_expires()

    def _arm_expires(self) -> None:
        if self._expires_timer is not None:
            self._expires_timer.cancel()
            self._expires_timer = None
        if self._expires is None or self.deleted or self.consumers:
            return
        self._expires_timer = self.clock.call_at(
            self._last_used + self._expires, self.check_expires
        )

    def check_expires(self) -> None:
        """The x-expires timer: delete the queue if unused for its time by the
        vhost's clock, else wait again."""
        if self._expires_timer is not None:  # called early: the check is now
            self._expires_timer.cancel()
        self._expires_timer = None
        if self.deleted or self.consumers or self._expires is None:
            return
        try:
            self._expire_queue()
        except Exception:
            log.exception(
                "queue '%s' in vhost '%s': x-expires check failed", self.name, self.vhost.name
            )

    def _expire_queue(self) -> None:
        assert self._expires is not None
        if self.clock.now_ms() < self._last_used + self._expires:
            self._arm_expires()
            return
        log.info("queue '%s' in vhost '%s' expired (unused)", self.name, self.vhost.name)
        self.vhost.delete_queue(self.name)
