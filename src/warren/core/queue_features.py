"""What a queue does beyond the plain path: length limits, message TTL and
dead-lettering, a part every Queue holds (``queue.features``).

A message leaving the queue by expiry, a drop-head overflow or a rejection is
dead-lettered (DeadLetters.publish); when no copy can be made it is put back at
the tail and kept (``stuck``): it no longer expires or gets dropped, and the
messages behind it are not held up. Deadlines come from the queue's TTL (in
queue order: the head is checked) and a message's own expiration (a heap of
(deadline, seq), expired wherever it sits), with one timer for the earliest.
Timers that fail try again a second later (docs/architecture.md, "Queue
features"). A quorum queue's part is its own kind (core/quorum_queue.py's
QuorumFeatures: its length limit and at-least-once dead-lettering).
"""

from __future__ import annotations

import heapq
import logging
from typing import TYPE_CHECKING, Any

from warren.core import dead_letter as dl
from warren.core.message import Message
from warren.core.queue_settings import DROP_HEAD, message_ttl, properties_ttl

if TYPE_CHECKING:
    from warren.core.queue import Queue

__all__ = ["RETRY_MS", "QueueFeatures"]

log = logging.getLogger("warren.queue")

# After an expiry run failed unexpectedly, the next try (ms).
RETRY_MS = 1000


class QueueFeatures:
    """A queue's limits, message TTL and dead-lettering: how messages leave it
    other than by delivery."""

    def __init__(self, queue: Queue) -> None:
        self.queue = queue
        self.ttl: int | None = None
        self.max_length: int | None = None
        self.max_bytes: int | None = None
        self.overflow = DROP_HEAD
        self.dead_letter_exchange: str | None = None
        self.dead_letter_routing_key: str | None = None
        #: The delivery limit in force (returns a message may have), or None.
        self.delivery_limit: int | None = None
        #: Messages kept after their dead-letter copy could not be made (let_go):
        #: they no longer expire or get dropped.
        self.stuck: set[int] = set()
        # Messages carrying their own expiration, as (deadline, seq): found and
        # expired wherever they sit, not only at the head.
        self._expiring: list[tuple[int, int]] = []
        #: Whether a message with its own expiration was seen (then every one is
        #: checked for one).
        self.has_expiring = False
        self._timer: Any = None
        self._timer_at = 0

    def configure(self, settings: dict[str, Any]) -> dict[str, Any]:
        """Adopt effective settings (policy keys), and return them as adopted (a
        kind's own defaults filled in); Queue._configure then applies them."""
        self.ttl = settings.get("message-ttl")
        self.max_length = settings.get("max-length")
        self.max_bytes = settings.get("max-length-bytes")
        self.overflow = settings.get("overflow") or DROP_HEAD
        self.dead_letter_exchange = settings.get("dead-letter-exchange")
        self.dead_letter_routing_key = settings.get("dead-letter-routing-key")
        self.delivery_limit = settings.get("delivery-limit")
        return settings

    def apply(self) -> None:
        """Apply the settings now: expire what is due, drop what is over the limits."""
        if self.ttl is not None or self.has_expiring:
            self.expire(self.queue.clock.now_ms())
        if self.max_length is not None or self.max_bytes is not None:
            self.drop_over_limit()

    @property
    def limited(self) -> bool:
        """Whether a length limit applies."""
        return self.max_length is not None or self.max_bytes is not None

    @property
    def expiring(self) -> bool:
        """Whether messages can expire: a queue TTL, or one of their own."""
        return self.ttl is not None or self.has_expiring

    # -- limits -------------------------------------------------------------------------
    def over_limit(self, extra: int) -> bool:
        """Whether the queue is full for reject-publish (RabbitMQ: at the limit)."""
        store = self.queue.store
        max_length = self.max_length
        if max_length is not None and store.ready_count >= max_length:
            return True
        max_bytes = self.max_bytes
        return max_bytes is not None and store.ready_bytes + extra > max_bytes

    def drop_over_limit(self) -> None:
        """drop-head: drop (and dead-letter) from the head until within the limits."""
        if self.overflow != DROP_HEAD:
            return
        q = self.queue
        store = q.store
        max_length = self.max_length
        max_bytes = self.max_bytes
        now = 0
        passes = len(self.stuck)
        while store.ready_count and (
            (max_length is not None and store.ready_count > max_length)
            or (max_bytes is not None and store.ready_bytes > max_bytes)
        ):
            item = store.peek()
            if item is None:
                break
            seq, msg, _ = item
            now = now or q.clock.now_ms()
            if seq in self.stuck:
                if not passes:
                    break  # every message over the limit is one that cannot go
                passes -= 1
                self._move_to_tail(seq)
                continue
            store.remove_ready(seq)
            q.delivery_counts.pop(seq, None)
            self.let_go(seq, msg, dl.MAXLEN, now)
        if now:
            q.vhost.store_written(store)

    # -- expiry -------------------------------------------------------------------------
    def deadline(self, msg: Message, own_ttl: int | None = -1) -> int | None:
        """When the message expires in this queue (ms since the epoch), or None."""
        ttl = self.ttl
        if own_ttl == -1:
            own_ttl = message_ttl(msg) if self.has_expiring else None
        if own_ttl is not None and (ttl is None or own_ttl < ttl):
            ttl = own_ttl
        return None if ttl is None else msg.timestamp + ttl

    def stored(self, seq: int, deadline: int, own_ttl: int | None) -> None:
        """A message stored with a deadline: its timer (and, when it carries its own
        expiration, its place in the heap)."""
        if own_ttl is not None:
            heapq.heappush(self._expiring, (deadline, seq))
        self._arm_timer(deadline)

    def saw_own_expiry(self) -> None:
        """A message with its own expiration came: from now on every one is checked."""
        if not self.has_expiring:
            self.has_expiring = True
            self.queue.plain = False

    def expire(self, now: int) -> None:
        """Dead-letter every ready message whose time has come: those at the head
        (queue TTL keeps deadlines in order), and per-message ones anywhere."""
        q = self.queue
        store = q.store
        stuck = self.stuck
        passes = len(stuck)
        expired = False
        while store.ready_count:
            item = store.peek()
            if item is None:
                break
            seq, msg, _ = item
            deadline = self.deadline(msg)
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
            q.delivery_counts.pop(seq, None)
            self.let_go(seq, msg, dl.EXPIRED, now)
            expired = True
        heap = self._expiring
        while heap and heap[0][0] <= now:
            _, seq = heapq.heappop(heap)
            if seq in stuck:
                continue
            removed = store.remove_ready(seq)
            if removed is not None:
                q.delivery_counts.pop(seq, None)
                self.let_go(seq, removed, dl.EXPIRED, now)
                expired = True
        if expired:
            q.vhost.store_written(store)
        self._timer_at = 0
        self._arm_next()

    def _arm_next(self) -> None:
        """Set the timer for the earliest deadline: the head's or a per-message one."""
        at = self._expiring[0][0] if self._expiring else 0
        store = self.queue.store
        if self.ttl is not None and store.ready_count:
            item = store.peek()
            if item is not None and item[0] not in self.stuck:
                head = self.deadline(item[1])
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
        self._timer = self.queue.clock.call_at(at, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = 0
        q = self.queue
        if q.deleted:
            return
        try:
            self.expire(q.clock.now_ms())
        except Exception:
            log.exception(
                "queue '%s' in vhost '%s': expiring messages failed", q.name, q.vhost.name
            )
            self._retry_timer()

    def _retry_timer(self) -> None:
        """After a failed expiry run: try again in a second rather than never (or at
        once, for ever)."""
        if self._timer is None and not self.queue.deleted:
            clock = self.queue.clock
            self._timer_at = clock.now_ms() + RETRY_MS
            self._timer = clock.call_later(RETRY_MS, self._on_timer)

    def rebuild_expiry_index(self) -> None:
        """After a restart: find the ready messages that carry their own expiration
        (the records hold publish time and properties), so they expire on time."""
        q = self.queue
        for seq, timestamp, props in q.store.scan_ready():
            ttl = properties_ttl(props)
            if ttl is not None:
                self._expiring.append((timestamp + ttl, seq))
        if self._expiring:
            heapq.heapify(self._expiring)
            self.has_expiring = True
            q.plain = False
        if self.ttl is not None or self._expiring:
            self.expire(q.clock.now_ms())

    def purged(self) -> None:
        """The queue was purged: no per-message deadline is left."""
        self._expiring.clear()

    def stop(self) -> None:
        """The queue is deleted: no more expiry runs."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # -- dead-lettering -----------------------------------------------------------------
    def dead_letter(self, seq: int, msg: Message, reason: str, now: int) -> bool:
        """Publish the dead-letter copy of a message leaving the queue. False when no
        copy could be made; the failure is logged (once per message, ``seq``, when
        it is stored) and the caller keeps the original."""
        if self.dead_letter_exchange is None:
            return True
        q = self.queue
        try:
            q.vhost.dead_letters.publish(q, msg, reason, now)
        except Exception:
            if seq < 0 or seq not in self.stuck:
                log.exception(
                    "queue '%s' in vhost '%s': cannot dead-letter a message (%s) to "
                    "exchange '%s'; the message stays in the queue",
                    q.name,
                    q.vhost.name,
                    reason,
                    self.dead_letter_exchange,
                )
            return False
        return True

    def let_go(self, seq: int, msg: Message, reason: str, now: int) -> None:
        """A message just taken out of the queue (expired, over the limit, rejected):
        dead-letter it, or, when no copy can be made, put it back at the tail,
        where it stays (no longer expiring or dropped) until consumed."""
        if self.dead_letter(seq, msg, reason, now):
            return
        q = self.queue
        self.stuck.discard(seq)
        self.stuck.add(q.store.append(msg))
        q.vhost.store_written(q.store)
        q.delivery.schedule()

    def _move_to_tail(self, seq: int) -> None:
        """Move a kept message (see let_go) from the head to the tail."""
        store = self.queue.store
        msg = store.remove_ready(seq)
        self.stuck.discard(seq)
        if msg is not None:
            self.stuck.add(store.append(msg))
