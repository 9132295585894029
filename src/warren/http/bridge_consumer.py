"""The HTTP bridge's consumers: a queue consumed over long-polls or Server-Sent Events.

A bridge consumer is a client session of its own (core/session.py) with one
delivery stream and one core `Consumer` on its queue, so prefetch, requeue,
dead-lettering and the delivery limit are the core's, as for an AMQP channel.
What HTTP adds is when the queue may deliver: only while a request waits
(``demand``), so a consumer nobody polls holds no messages; each message
handed out has an id (its delivery tag) that an ack or nack names, and goes
back to the queue if it is not settled within the visibility timeout. A
consumer no request has used for its idle timeout, or whose SSE connection
dropped, is closed: whatever it holds goes back. Every timer is the node
clock's. This module is compiled (setup.py): `BridgeConsumer` subclasses the
compiled Consumer.
"""

from __future__ import annotations

import asyncio
import functools
import secrets
from collections import deque
from typing import TYPE_CHECKING

from warren.core.consumer import Consumer
from warren.core.session import ClientSession
from warren.core.stats import MessageStats, count_delivery

if TYPE_CHECKING:
    from warren.core.clock import Clock, TimerHandle
    from warren.core.message import Message
    from warren.core.queue import Queue
    from warren.core.session import LoginHost
    from warren.core.vhost import VHost

__all__ = ["BridgeConsumer", "BridgeSubscription", "Delivered"]

#: Requests (long-polls, SSE streams) a consumer may start per second, and at once.
REQUESTS_PER_SECOND = 10

#: A message handed to the bridge: (id, message, redelivered).
Delivered = tuple[int, "Message", bool]


class BridgeConsumer(Consumer):
    """The core's view of a bridge subscription: takes messages only while a request waits."""

    __slots__ = ("subscription",)

    def __init__(self, subscription: BridgeSubscription, queue: Queue, prefetch: int) -> None:
        super().__init__(
            subscription.deliveries,
            subscription.id,
            queue,
            no_ack=False,
            prefetch_count=prefetch,
        )
        self.subscription = subscription

    def can_take(self) -> bool:
        sub = self.subscription
        return not sub.closed and sub.demand > 0 and self.has_credit()

    def deliver(self, seq: int, msg: Message, redelivered: bool) -> None:
        self.subscription.delivered(self, seq, msg, redelivered)

    def cancelled(self) -> None:
        """The queue was deleted: the subscription ends."""
        self.subscription.deliveries.cancelled(self.tag, self)
        self.subscription.close()


class _Owner:
    """Who the client session is, for the log and the connection listings."""

    def __init__(self, name: str) -> None:
        self.name = name


class BridgeSubscription:
    """One bridge consumer: its session, its delivery stream, what waits for a request."""

    def __init__(
        self,
        host: LoginHost,
        clock: Clock,
        vhost: VHost,
        queue: Queue,
        user: str,
        prefetch: int,
        visibility_ms: int,
        idle_ms: int,
    ) -> None:
        self.id = secrets.token_urlsafe(16)
        self.user = user
        self.vhost = vhost
        self.queue = queue
        self.clock = clock
        self.visibility_ms = visibility_ms
        self.idle_ms = idle_ms
        self.stats = MessageStats()
        session = ClientSession(host, _Owner(f"HTTP bridge consumer of user '{user}'"))
        self.deliveries = session.deliveries(self.stats, retire=vhost.base_stats)
        #: How many more messages the waiting request takes (0: none waits).
        self.demand = 0
        #: Delivered and not yet handed out (at most the demand).
        self.ready: deque[Delivered] = deque()
        #: Handed out and unsettled: their visibility timers, by id.
        self.out: dict[int, TimerHandle] = {}
        #: A request (a long-poll, an SSE stream) is under way.
        self.busy = False
        self.closed = False
        self._wake: asyncio.Future[None] | None = None
        self._idle: TimerHandle | None = None
        # A token bucket of requests (admit), on the node clock.
        self._tokens = float(REQUESTS_PER_SECOND)
        self._tokens_at = clock.monotonic_ms()
        self.consumer = BridgeConsumer(self, queue, prefetch)
        try:  # the queue may refuse it (an exclusive consumer of its own): a BrokerError
            self.deliveries.consume(self.id, self.consumer)
        except BaseException:
            self.closed = True
            self.deliveries.close()
            raise
        self.touch()

    # -- the queue's side -----------------------------------------------------------------
    def delivered(
        self, consumer: BridgeConsumer, seq: int, msg: Message, redelivered: bool
    ) -> None:
        tag = self.deliveries.next_tag()
        self.deliveries.track(tag, consumer.queue, seq, msg, consumer)
        count_delivery(self.stats, consumer.queue.stats, False, redelivered)
        self.ready.append((tag, msg, redelivered))
        self.demand -= 1
        self.wake()

    # -- the requests' side ---------------------------------------------------------------
    def want(self, n: int) -> None:
        """A request takes up to ``n`` messages: the queue may deliver."""
        self.demand = max(0, n - len(self.ready))
        if self.demand:
            self.deliveries.resume()

    async def wait(self, timeout_ms: float) -> None:
        """Until a message is ready, the subscription closes, or ``timeout_ms``
        (node clock) passes."""
        if self.ready or self.closed:
            return
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._wake = future
        handle = self.clock.call_later(timeout_ms, self.wake)
        try:
            await future
        finally:
            handle.cancel()
            self._wake = None

    def wake(self) -> None:
        future = self._wake
        if future is not None and not future.done():
            future.set_result(None)

    def take(self, n: int) -> list[Delivered]:
        """Up to ``n`` ready messages, handed out now: their visibility timers start."""
        out: list[Delivered] = []
        while self.ready and len(out) < n:
            item = self.ready.popleft()
            tag = item[0]
            self.out[tag] = self.clock.call_later(
                self.visibility_ms, functools.partial(self._invisible_too_long, tag)
            )
            out.append(item)
        return out

    def settle(self, ids: list[int], requeue: bool | None) -> list[int]:
        """Ack (``requeue`` None) or nack the handed-out messages ``ids``; the ids
        that are not (any more) this subscription's unsettled ones."""
        unknown: list[int] = []
        for tag in ids:
            handle = self.out.pop(tag, None)
            if handle is None:
                unknown.append(tag)
                continue
            handle.cancel()
            if requeue is None:
                self.deliveries.ack(tag, False)
            else:
                self.deliveries.reject(tag, False, requeue=requeue)
        return unknown

    def _invisible_too_long(self, tag: int) -> None:
        if self.out.pop(tag, None) is not None and not self.closed:
            self.deliveries.reject(tag, False, requeue=True, explicit=False)

    def admit(self) -> bool:
        """Whether a request may start now: a client polling in a loop with no
        wait is held to REQUESTS_PER_SECOND, not to what the node can answer."""
        now = self.clock.monotonic_ms()
        rate = REQUESTS_PER_SECOND
        self._tokens = min(float(rate), self._tokens + (now - self._tokens_at) * rate / 1000)
        self._tokens_at = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True

    def touch(self) -> None:
        """A request used the subscription: its idle timeout starts again."""
        if self._idle is not None:
            self._idle.cancel()
        self._idle = None if self.closed else self.clock.call_later(self.idle_ms, self._idled)

    def _idled(self) -> None:
        if self.busy:
            self.touch()
        else:
            self.close()

    def close(self) -> None:
        """The end: the consumer is cancelled, every unsettled message goes back."""
        if self.closed:
            return
        self.closed = True
        self.demand = 0
        for handle in self.out.values():
            handle.cancel()
        self.out.clear()
        self.ready.clear()
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        self.deliveries.close()
        self.wake()
