"""A quorum queue (``x-queue-type: quorum``): a durable queue with quorum's rules.

Warren's durable queues are already crash-safe (the segment store) and, in a
cluster, replicated and confirmed only once the in-sync followers have them
(docs/clustering.md), which is what RabbitMQ's Raft-based quorum queues
promise. So a quorum queue is a Queue with RabbitMQ 4.x's quorum semantics on
top, not another storage engine:

- every message is kept on disk whatever its delivery-mode (its store recovers
  transient messages too) and a publisher confirm always waits for the sync;
- a delivery limit always applies: ``x-delivery-limit`` or the
  ``delivery-limit`` policy, 20 when neither sets one (RabbitMQ 4.0+), none
  when it is negative; a message returned more often is dead-lettered with
  reason ``delivery_limit``, or dropped without a dead-letter exchange;
- two message priorities, served two high for one normal (store/quorum_store.py's
  QuorumPriorityStore);
- the delivery counts survive a restart and a failover: the store keeps them
  next to the messages (store/delivery_counts.py), as RabbitMQ's Raft log does;
- ``x-overflow: reject-publish-dlx`` is not supported: RabbitMQ logs a warning
  and falls back to ``drop-head``, and so does Warren;
- ``x-dead-letter-strategy: at-least-once`` (with ``reject-publish`` and a
  dead-letter exchange; otherwise it falls back to at-most-once, with a
  warning): a message leaving the queue (expired, rejected, over the delivery
  limit) whose dead-letter copy no queue took, or some target refused, is held
  apart as RabbitMQ's "discards" (the store's held level): never delivered,
  not ready, counted against the length limits, and tried again until every
  target takes it (retry_dead_letters);
- consuming with a global prefetch (basic.qos global=true) is refused (540), as
  RabbitMQ refuses it; the declaration rules are core/queue_arguments.py's.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, ClassVar, cast

from warren.core import dead_letter as dl
from warren.core.codec_errors import DecodeError
from warren.core.message import Message
from warren.core.properties import edit_properties
from warren.core.queue import Queue
from warren.core.queue_features import QueueFeatures
from warren.core.queue_settings import DROP_HEAD, REJECT_PUBLISH, REJECT_PUBLISH_DLX
from warren.core.queue_settle import QueueSettlement
from warren.core.store import MessageStore
from warren.store.quorum_store import QuorumPriorityStore

if TYPE_CHECKING:
    from warren.core.vhost import VHost

__all__ = [
    "AT_LEAST_ONCE",
    "AT_MOST_ONCE",
    "DEFAULT_DELIVERY_LIMIT",
    "QuorumFeatures",
    "QuorumQueue",
    "QuorumSettlement",
]

log = logging.getLogger("warren.queue")

#: RabbitMQ 4.0's delivery limit for a quorum queue that sets none.
DEFAULT_DELIVERY_LIMIT = 20
AT_MOST_ONCE, AT_LEAST_ONCE = "at-most-once", "at-least-once"
#: ms between tries to hand held dead-letter copies on (RabbitMQ's worker
#: tries every dead_letter_worker_publisher_confirm_timeout, 3 minutes; Warren
#: sooner, and at once when the queue's settings change, as RabbitMQ does).
HELD_RETRY_MS = 5000
#: Held copies tried per pass; a pass stops at the first one still not taken.
HELD_BATCH = 256


class QuorumQueue(Queue):
    """A durable, non-exclusive queue with RabbitMQ 4.x's quorum queue behaviour:
    its features are QuorumFeatures, its settler QuorumSettlement, and its store
    keeps the delivery counts."""

    keeps_every_message: ClassVar[bool] = True
    queue_type: ClassVar[str] = "quorum"
    queue_module: ClassVar[str] = "rabbit_quorum_queue"
    declare_renews: ClassVar[bool] = False

    def __init__(
        self, vhost: VHost, name: str, store: MessageStore, arguments: dict[str, Any]
    ) -> None:
        limit = arguments.get("x-delivery-limit")
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool)):
            # RabbitMQ 3.10 takes it and ignores it; the default limit applies.
            log.warning(
                "queue '%s' in vhost '%s': x-delivery-limit %r is not an integer; ignored",
                name,
                vhost.name,
                limit,
            )
        super().__init__(vhost, name, store, durable=True, arguments=arguments)

    @property
    def dead_letter_strategy(self) -> str:
        """The dead-letter strategy in force (at-least-once only with reject-publish
        and a dead-letter exchange)."""
        return cast("QuorumFeatures", self.features).dead_letter_strategy

    def _features(self) -> QueueFeatures:
        return QuorumFeatures(self)

    def _settlement(self) -> QueueSettlement:
        return QuorumSettlement(self)

    def _recovered_counts(self) -> dict[int, int]:
        """The counts the store kept (its DeliveryCounts'), the queue's own from now on."""
        store = self.store
        if isinstance(store, QuorumPriorityStore) and store.delivery_counts is not None:
            return store.delivery_counts.counts
        return {}

    def persistent_counts(self) -> tuple[int, int] | None:
        """Every message of a quorum queue is kept whatever its delivery-mode,
        and RabbitMQ counts every one as persistent."""
        return (
            max(0, self.store.ready_count + self.unacked),
            max(0, self.store.ready_bytes + self.unacked_bytes),
        )


class QuorumFeatures(QueueFeatures):
    """A quorum queue's limits and dead-lettering: its settings' defaults and
    fallbacks, reject-publish as rabbit_fifo applies it, and at-least-once
    dead-lettering (copies held in the store until taken)."""

    def __init__(self, queue: Queue) -> None:
        super().__init__(queue)
        #: The dead-letter strategy in force (at-least-once only with reject-publish
        #: and a dead-letter exchange).
        self.dead_letter_strategy = AT_MOST_ONCE
        self._warned: set[str] = set()
        # The timer of retry_dead_letters while copies are held.
        self._held_timer: Any = None

    def configure(self, settings: dict[str, Any]) -> dict[str, Any]:
        """The delivery limit's default, the overflow and strategy fallbacks, then
        QueueFeatures'."""
        settings = dict(settings)
        limit = settings.get("delivery-limit")
        if not isinstance(limit, int) or isinstance(limit, bool):
            limit = DEFAULT_DELIVERY_LIMIT
        settings["delivery-limit"] = limit if limit >= 0 else None
        if settings.get("overflow") == REJECT_PUBLISH_DLX:
            self._warn_once(
                "overflow",
                "overflow strategy 'reject-publish-dlx' is not supported by quorum queues; "
                "using 'drop-head'",
            )
            settings["overflow"] = DROP_HEAD
        strategy = AT_MOST_ONCE
        if settings.get("dead-letter-strategy") == AT_LEAST_ONCE:
            if settings.get("overflow") != REJECT_PUBLISH:
                self._warn_once(
                    "strategy",
                    "at-least-once dead-lettering needs overflow 'reject-publish'; "
                    "falling back to at-most-once",
                )
            elif settings.get("dead-letter-exchange") is not None:
                strategy = AT_LEAST_ONCE
        self.dead_letter_strategy = strategy
        return super().configure(settings)

    def apply(self) -> None:
        super().apply()
        self._retry_soon(0)  # held copies: new settings (and a start) try them now

    def _warn_once(self, key: str, text: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            q = self.queue
            log.warning("queue '%s' in vhost '%s': %s", q.name, q.vhost.name, text)

    def over_limit(self, extra: int) -> bool:
        """reject-publish as rabbit_fifo applies it: only once the queue is over its
        limit, so a full queue takes one message more than a classic queue would."""
        store = self.queue.store
        held = held_bytes = 0
        if isinstance(store, QuorumPriorityStore):  # held copies count, as rabbit_fifo's
            held, held_bytes = store.held_count, store.held_bytes
        max_length = self.max_length
        if max_length is not None and store.ready_count + held > max_length:
            return True
        max_bytes = self.max_bytes
        return max_bytes is not None and store.ready_bytes + held_bytes > max_bytes

    def dead_letter(self, seq: int, msg: Message, reason: str, now: int) -> bool:
        """The copy leaves without the x-delivery-count its deliveries carried (as
        RabbitMQ's); at-least-once: a copy not every target (at least one) took
        is held (the original may go), and tried again until it is."""
        q = self.queue
        dlx_name = self.dead_letter_exchange
        if dlx_name is not None and q.delivery_counts.get(seq):
            msg = _without_delivery_count(msg)
        store = q.store
        if self.dead_letter_strategy != AT_LEAST_ONCE or not isinstance(
            store, QuorumPriorityStore
        ):
            return super().dead_letter(seq, msg, reason, now)
        assert dlx_name is not None  # at-least-once needs one (configure)
        try:
            copy, keys = dl.dead_letter(
                msg, q.name, reason, dlx_name, self.dead_letter_routing_key, now
            )
        except Exception:  # a record stored before publish validated its properties
            return super().dead_letter(seq, msg, reason, now)
        vhost = q.vhost
        vhost.dead_letters.count(q, "at_least_once", reason)
        try:
            if self._route(copy, keys, reason):
                vhost.dead_letters.count(q, "at_least_once", "confirmed")
                return True
        except Exception:
            log.exception(
                "queue '%s' in vhost '%s': dead-lettering a message (%s) failed; its copy "
                "is held and tried again",
                q.name,
                vhost.name,
                reason,
            )
        if not store.held_count:
            log.warning(
                "queue '%s' in vhost '%s': a message dead-lettered (%s) at least once "
                "reached no queue of exchange '%s', or not all of them took it: held "
                "until they do (messages_dlx)",
                q.name,
                vhost.name,
                reason,
                dlx_name,
            )
        store.hold(copy)
        vhost.store_written(store)
        self._retry_soon(HELD_RETRY_MS)
        return True

    def _route(self, copy: Message, keys: list[str], reason: str) -> bool:
        """Hand a dead-letter copy to the dead-letter exchange in force: whether
        every queue it reached (at least one) took it."""
        dlx_name = self.dead_letter_exchange
        if dlx_name is None:
            return True  # none any more: nothing to hand it to
        vhost = self.queue.vhost
        dlx = vhost.exchanges.get(dlx_name)
        if dlx is None:
            return False
        if copy.exchange != dlx_name:  # the queue's settings changed since it was held
            copy = Message(
                dlx_name, copy.routing_key, copy.properties, copy.body, copy.timestamp, copy.native
            )
        return vhost.dead_letters.route(self.queue, dlx, copy, keys, reason)

    def _retry_soon(self, delay_ms: int) -> None:
        q = self.queue
        store = q.store
        if q.deleted or not isinstance(store, QuorumPriorityStore) or not store.held_count:
            return
        if self._held_timer is not None:
            if delay_ms:
                return  # one is set already
            self._held_timer.cancel()
        self._held_timer = q.clock.call_later(delay_ms, self.retry_dead_letters)

    def retry_dead_letters(self) -> None:
        """The held copies' timer: hand them to the dead-letter exchange again,
        oldest first, stopping at the first one still not taken. Under
        at-most-once now (a policy changed it), or without a dead-letter exchange,
        each goes once, taken or not."""
        if self._held_timer is not None:
            self._held_timer.cancel()
            self._held_timer = None
        q = self.queue
        store = q.store
        if q.deleted or not isinstance(store, QuorumPriorityStore) or not store.held_count:
            return
        strict = self.dead_letter_strategy == AT_LEAST_ONCE
        vhost = q.vhost
        try:
            for _ in range(HELD_BATCH):
                item = store.next_held()
                if item is None:
                    break
                seq, copy = item
                headers = copy.headers or {}
                reason = str(headers.get("x-last-death-reason", ""))
                keys = [copy.routing_key, *dl.header_keys(headers.get("CC"))]
                try:
                    taken = self._route(copy, keys, reason)
                except Exception:
                    log.exception(
                        "queue '%s' in vhost '%s': a held dead-letter copy could not be "
                        "handed on; tried again later",
                        q.name,
                        vhost.name,
                    )
                    taken = False
                if taken or not strict:
                    store.release_held(seq)
                    if taken and strict:
                        vhost.dead_letters.count(q, "at_least_once", "confirmed")
                else:
                    store.keep_held(seq, copy)
                    break
        finally:
            vhost.store_written(store)
        if store.held_count:
            self._retry_soon(HELD_RETRY_MS)
        else:
            log.info(
                "queue '%s' in vhost '%s': every held dead-letter copy was handed on",
                q.name,
                vhost.name,
            )


def _without_delivery_count(msg: Message) -> Message:
    try:
        raw = edit_properties(msg.properties, remove_headers=("x-delivery-count",))
    except DecodeError:
        return msg
    copy = Message(msg.exchange, msg.routing_key, raw, msg.body, msg.timestamp, msg.native)
    copy._ex_rk = msg._ex_rk
    return copy


class QuorumSettlement(QueueSettlement):
    """A quorum queue's settler: the returns it counts are journalled too."""

    __slots__ = ()

    def requeue_refusal(self, seq: int, msg: Message, now: int, explicit: bool) -> str | None:
        """QueueSettlement's, and a return it counted goes to the store's journal,
        written out at the end of this loop turn."""
        refusal = super().requeue_refusal(seq, msg, now, explicit)
        q = self.queue
        if refusal is None and q.features.delivery_limit is not None:
            store = q.store
            if isinstance(store, QuorumPriorityStore) and store.delivery_counts is not None:
                store.delivery_counts.recorded(seq)
                q.vhost.store_written(store)
        return refusal
