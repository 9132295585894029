"""The x-delayed-message exchange, as the rabbitmq-delayed-message-exchange plugin.

Declared with type ``x-delayed-message`` and the required argument
``x-delayed-type``, the type whose routing it uses (direct, fanout, topic,
headers, x-consistent-hash). A message with a positive integer ``x-delay``
header (milliseconds; the plugin also takes a numeric string or a float, and
at most 2^32-1) is held and routed when due; any other message is routed at
once. Its deadline is the publish time plus the delay, so messages leave in
deadline order, not publish order. When a held message is routed its
``x-delay`` header becomes the negated delay (a signed 32-bit int), as the
plugin does, so it is never delayed twice on its way through other exchanges.

Held messages live in the exchange's own store (VHost.exchange_store: for the
broker a SegmentStore under ``exchanges/`` in the vhost's directory, or under
``transient/`` for a non-durable exchange). Memory holds one small heap entry
per message (deadline, order, sequence number); the message is read back from
its segment when due. A persistent message held by a durable exchange is on
disk before its publisher confirm, like one in a durable queue, and after a
restart every held message is scheduled again by its original deadline (one
that passed while the broker was down is routed right after start). Deleting
the exchange drops what it holds.

To the rest of the broker the held messages are an internal queue (LavinMQ
calls its ``amq.delayed-<exchange>``): while a message is delayed, match()
returns that queue, so Router.publish stores it, counts it as routed (no
basic.return for a mandatory message, no alternate exchange) and collects its
store for the publisher confirm, through exchange-to-exchange bindings too.
The plugin itself returns a delayed mandatory message as unroutable; see the
README's compatibility notes.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

from warren.core.errors import PreconditionFailed
from warren.core.exchange import Binding, Exchange, exchange_class
from warren.core.message import Message
from warren.core.properties import set_header
from warren.core.queue import STORED, Queue

if TYPE_CHECKING:
    from warren.core.clock import TimerHandle
    from warren.core.queue import Held
    from warren.core.store import MessageStore
    from warren.core.vhost import VHost

__all__ = ["MAX_DELAY", "DelayedMessageExchange", "delay_of"]

log = logging.getLogger("warren.delayed")

#: The longest delay the plugin honours (an Erlang timer's limit); longer ones route at once.
MAX_DELAY = 4_294_967_295
#: Held messages routed per timer callback: a burst of due messages shares the loop.
_RELEASE_BATCH = 512


def delay_of(msg: Message) -> int | None:
    """The message's delay in ms if it is to be held, as the plugin reads ``x-delay``:
    an integer, a numeric string or a float (truncated), in 1 .. 2^32-1."""
    headers = msg.headers
    if not headers:
        return None
    value = headers.get("x-delay")
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        delay = value
    elif isinstance(value, float):
        delay = int(value)
    elif isinstance(value, str | bytes):
        try:
            delay = int(value)
        except ValueError:
            return None
    else:
        return None
    return delay if 0 < delay <= MAX_DELAY else None


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return value if isinstance(value, str) else None


class _HeldMessages(Queue):
    """The exchange's internal queue of held messages; only Router.publish sees it."""

    def __init__(self, exchange: DelayedMessageExchange, vhost: VHost, store: MessageStore):
        super().__init__(vhost, f"amq.delayed-{exchange.name}", store, durable=exchange.durable)
        self.exchange = exchange

    def publish(self, msg: Message) -> int:
        self.exchange.hold(msg)
        return STORED

    def publish_held(self, msg: Message, held: list[Held]) -> int:
        return self.publish(msg)  # not taken back: it is released on its own schedule


class DelayedMessageExchange(Exchange):
    type = "x-delayed-message"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        delayed_type = _text(self.arguments.get("x-delayed-type"))
        # The plugin's checks and texts; an unknown type is RabbitMQ's own 503.
        if delayed_type is None:
            raise PreconditionFailed(
                "Invalid argument, 'x-delayed-type' must be an existing exchange type"
            )
        if delayed_type == self.type:
            raise PreconditionFailed(
                "Invalid argument, 'x-delayed-message' can't be used for 'x-delayed-type'"
            )
        cls = exchange_class(delayed_type)
        if cls is None:  # rabbit_exchange:check_type's error, 406 since RabbitMQ 3.12.x
            raise PreconditionFailed(f"unknown exchange type '{delayed_type}'")
        inner_args = {k: v for k, v in self.arguments.items() if k != "x-message-deduplication"}
        #: Routes for this exchange: bindings are indexed by it, its match() is ours.
        self.inner = cls(
            self.vhost_name, self.name, self.durable, self.auto_delete, self.internal, inner_args
        )
        if self.deduplicator is None:  # x-delayed-type x-message-deduplication
            self.deduplicator = self.inner.deduplicator
        self._vhost: VHost | None = None
        self._held: _HeldMessages | None = None
        # The store's read(seq), when it has one: then the heap keeps no message.
        self._read: Callable[[int], Message] | None = None
        # (deadline ms, order, store seq, message or None when the store reads it back)
        self._heap: list[tuple[int, int, int, Message | None]] = []
        self._order = 0
        self._timer: TimerHandle | None = None
        self._timer_at = 0

    @property
    def delayed_type(self) -> str:
        return self.inner.type

    @property
    def held_count(self) -> int:
        """Messages waiting for their deadline."""
        return len(self._heap)

    # -- bindings: the delayed type's --------------------------------------------------
    def validate_binding(self, routing_key: str, arguments: dict[str, Any] | None) -> None:
        self.inner.validate_binding(routing_key, arguments)

    def _index_add(self, binding: Binding) -> None:
        self.inner._index_add(binding)

    def _index_remove(self, binding: Binding) -> None:
        self.inner._index_remove(binding)

    def match(self, msg: Message) -> Collection[Queue | Exchange]:
        if self._held is not None and delay_of(msg) is not None:
            return (self._held,)
        return self.inner.match(msg)

    # -- lifecycle ----------------------------------------------------------------------
    def attach(self, vhost: VHost) -> None:
        super().attach(vhost)
        store = vhost.exchange_store(self.name, self.durable)
        self._vhost = vhost
        self._held = _HeldMessages(self, vhost, store)
        self._read = getattr(store, "read", None)
        # Messages held before a restart: the store hands each back once, in publish
        # order; they stay unacked in it until routed.
        while (item := store.shift()) is not None:
            seq, msg, _ = item
            delay = delay_of(msg) or 0
            self._push(msg.timestamp + delay, seq, None if self._read else msg)
        if self._heap:
            log.info(
                "exchange '%s' in vhost '%s': %d delayed messages recovered",
                self.name,
                vhost.name,
                len(self._heap),
            )
        self._schedule()

    def discard(self) -> None:
        self._cancel_timer()
        self._heap.clear()
        if self._held is not None:
            self._held.store.delete()
            self._held = None
        super().discard()

    def stores(self) -> list[MessageStore]:
        return [] if self._held is None else [self._held.store]

    def close(self) -> None:
        super().close()
        self._cancel_timer()
        if self._held is not None:
            self._held.store.close()

    # -- holding and releasing ----------------------------------------------------------
    def hold(self, msg: Message) -> None:
        """Keep ``msg`` until its deadline (publish time + x-delay)."""
        held, vhost = self._held, self._vhost
        assert held is not None and vhost is not None, "hold() before attach()"
        store = held.store
        seq = store.append_shifted(msg)
        vhost.store_written(store)
        deadline = msg.timestamp + (delay_of(msg) or 0)
        self._push(deadline, seq, None if self._read else msg)
        self._schedule()

    def _push(self, deadline: int, seq: int, msg: Message | None) -> None:
        self._order += 1
        heapq.heappush(self._heap, (deadline, self._order, seq, msg))

    def _schedule(self) -> None:
        """Have the timer fire at the earliest deadline."""
        if not self._heap or self._vhost is None:
            self._cancel_timer()
            return
        first = self._heap[0][0]
        if self._timer is not None:
            if self._timer_at <= first:
                return
            self._timer.cancel()
        self._timer_at = first
        self._timer = self._vhost.clock.call_at(first, self._release)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _release(self) -> None:
        self._timer = None
        heap = self._heap
        if self._vhost is None:
            return
        now = self._vhost.clock.now_ms()
        for _ in range(_RELEASE_BATCH):
            if not heap or heap[0][0] > now or self._held is None:
                break
            _, _, seq, msg = heapq.heappop(heap)
            try:
                self._route(seq, msg, now)
            except Exception:
                log.exception(
                    "exchange '%s' in vhost '%s': routing a delayed message failed",
                    self.name,
                    self.vhost_name,
                )
        self._schedule()

    def _route(self, seq: int, msg: Message | None, now: int) -> None:
        held, vhost = self._held, self._vhost
        assert held is not None and vhost is not None
        store = held.store
        if msg is None:
            assert self._read is not None
            try:
                msg = self._read(seq)
            except Exception:
                store.ack(seq)  # an unreadable record can never be routed
                vhost.store_written(store)
                raise
        delay = delay_of(msg)
        props = msg.properties if delay is None else set_header(msg.properties, "x-delay", -delay)
        # Routed as published now: queue TTLs count from here, as in RabbitMQ.
        out = Message(msg.exchange, msg.routing_key, props, msg.body, now, msg.native)
        # Until routed the message stays held: a failure here (only a record held
        # before properties were validated at publish can cause one) keeps it for
        # the next start, logged by _release.
        queues = vhost.router.route(self, out)
        store.ack(seq)
        vhost.store_written(store)
        for q in queues:
            try:
                q.publish(out)
            except Exception:
                log.exception(
                    "exchange '%s' in vhost '%s': queue '%s' failed to take a delayed message",
                    self.name,
                    self.vhost_name,
                    q.name,
                )
