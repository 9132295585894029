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
- two message priorities, served two high for one normal (store/priority_store.py's
  QuorumPriorityStore);
- ``x-overflow: reject-publish-dlx`` is not supported: RabbitMQ logs a warning
  and falls back to ``drop-head``, and so does Warren;
- ``x-dead-letter-strategy: at-least-once`` (with ``reject-publish`` and a
  dead-letter exchange; otherwise it falls back to at-most-once, with a
  warning): a message whose dead-letter copy no queue took, or some target
  refused, is kept in the queue rather than dropped;
- consuming with a global prefetch (basic.qos global=true) is refused (540), as
  RabbitMQ refuses it; the declaration rules are core/queue_arguments.py's.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, ClassVar

from warren.core.codec_errors import DecodeError
from warren.core.message import Message
from warren.core.properties import edit_properties
from warren.core.queue import Queue
from warren.core.queue_settings import DROP_HEAD, REJECT_PUBLISH, REJECT_PUBLISH_DLX
from warren.core.store import MessageStore

if TYPE_CHECKING:
    from warren.core.vhost import VHost

__all__ = ["AT_LEAST_ONCE", "AT_MOST_ONCE", "DEFAULT_DELIVERY_LIMIT", "QuorumQueue"]

log = logging.getLogger("warren.queue")

#: RabbitMQ 4.0's delivery limit for a quorum queue that sets none.
DEFAULT_DELIVERY_LIMIT = 20
AT_MOST_ONCE, AT_LEAST_ONCE = "at-most-once", "at-least-once"


class QuorumQueue(Queue):
    """A durable, non-exclusive queue with RabbitMQ 4.x's quorum queue behaviour."""

    keeps_every_message: ClassVar[bool] = True
    queue_type: ClassVar[str] = "quorum"
    queue_module: ClassVar[str] = "rabbit_quorum_queue"
    count_explicit_returns: ClassVar[bool] = True

    def __init__(
        self, vhost: VHost, name: str, store: MessageStore, arguments: dict[str, Any]
    ) -> None:
        #: The dead-letter strategy in force (at-least-once only with reject-publish
        #: and a dead-letter exchange).
        self.dead_letter_strategy = AT_MOST_ONCE
        self._warned: set[str] = set()
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

    def _configure(self, settings: dict[str, Any]) -> None:
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
        super()._configure(settings)

    def persistent_counts(self) -> tuple[int, int] | None:
        """Every message of a quorum queue is kept whatever its delivery-mode,
        and RabbitMQ counts every one as persistent."""
        return (
            max(0, self.store.ready_count + self.unacked),
            max(0, self.store.ready_bytes + self.unacked_bytes),
        )

    def _warn_once(self, key: str, text: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning("queue '%s' in vhost '%s': %s", self.name, self.vhost.name, text)

    def _over_limit(self, extra: int) -> bool:
        """reject-publish as rabbit_fifo applies it: only once the queue is over its
        limit, so a full queue takes one message more than a classic queue would."""
        store = self.store
        max_length = self._max_length
        if max_length is not None and store.ready_count > max_length:
            return True
        max_bytes = self._max_bytes
        return max_bytes is not None and store.ready_bytes > max_bytes

    def _dead_letter(self, seq: int, msg: Message, reason: str, now: int) -> bool:
        """The copy leaves without the x-delivery-count its deliveries carried (as
        RabbitMQ's); at-least-once: the original stays unless every queue the
        copy was routed to (at least one) took it."""
        if self.dead_letter_exchange is not None and self._delivery_counts.get(seq):
            msg = _without_delivery_count(msg)
        if self.dead_letter_strategy != AT_LEAST_ONCE:
            return super()._dead_letter(seq, msg, reason, now)
        try:
            if self.vhost.dead_letter(self, msg, reason, now):
                return True
            problem = "no queue took its copy"
        except Exception as exc:
            problem = f"its copy could not be made ({exc})"
        if seq < 0 or seq not in self._stuck:
            log.warning(
                "queue '%s' in vhost '%s': a message dead-lettered (%s) at least once to "
                "exchange '%s' stays in the queue: %s",
                self.name,
                self.vhost.name,
                reason,
                self.dead_letter_exchange,
                problem,
            )
        return False


def _without_delivery_count(msg: Message) -> Message:
    try:
        raw = edit_properties(msg.properties, remove_headers=("x-delivery-count",))
    except DecodeError:
        return msg
    copy = Message(msg.exchange, msg.routing_key, raw, msg.body, msg.timestamp)
    copy._ex_rk = msg._ex_rk
    return copy
