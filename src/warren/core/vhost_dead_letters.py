"""A vhost's dead-lettering: what a queue lets go of, republished to its
dead-letter exchange.

:class:`DeadLetters` is the part of :class:`~warren.core.vhost.VHost` that
queues hand such a message to (``vhost.dead_letters``): it makes the copy
(core/dead_letter.py), routes it with the vhost's Router and counts it for
the metrics. Never compiled (setup.py): a copy can overflow its target queue,
whose own dead-lettered copy overflows the next, and so on as deep as a
client chained its queues; interpreted, that recursion meets Python's limit
and the RecursionError is contained like any dead-letter failure, where
compiled calls would overflow the C stack.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from warren.core import dead_letter as dl
from warren.core.queue import REJECTED

if TYPE_CHECKING:
    from warren.core.exchange import Exchange
    from warren.core.message import Message
    from warren.core.queue_features import QueueFeatures
    from warren.core.vhost_routing import Router

__all__ = ["DeadLetters"]

log = logging.getLogger("warren.vhost")


class DeadLetters:
    """Republishing to dead-letter exchanges, at most once, and the counts of it."""

    def __init__(self, vhost_name: str, exchanges: dict[str, Exchange], router: Router) -> None:
        self.vhost_name = vhost_name
        self.exchanges = exchanges  # the vhost's, changed by it
        self.router = router
        #: Messages dead-lettered by (queue type, strategy, reason), counted once
        #: per message, for rabbitmq_global_messages_dead_lettered_*_total.
        self.counts: dict[tuple[str, str, str], int] = {}

    def publish(self, queue: QueueFeatures, msg: Message, reason: str, now: int) -> bool:
        """Republish a message a queue let go of to the queue's dead-letter exchange.

        Raises when the copy cannot be made or routed (the queue then keeps the
        original); a target queue's own failure is logged and does not. Returns
        whether the copy reached at least one queue and every queue took it (a
        quorum queue's at-least-once dead-lettering keeps the original otherwise)."""
        dlx_name = queue.dead_letter_exchange
        if dlx_name is None:
            return True
        dlx = self.exchanges.get(dlx_name)
        if dlx is None:
            log.debug(
                "vhost '%s': dead-letter exchange '%s' of queue '%s' does not exist; dropped",
                self.vhost_name,
                dlx_name,
                queue.name,
            )
            return False
        copy, keys = dl.dead_letter(
            msg, queue.name, reason, dlx_name, queue.dead_letter_routing_key, now
        )
        # Counted per dead-lettered message (a copy is made anyway), for
        # rabbitmq_global_messages_dead_lettered_*_total.
        self.count(queue, "at_most_once", reason)
        return self.route(queue, dlx, copy, keys, reason)

    def count(self, queue: QueueFeatures, strategy: str, what: str) -> None:
        """One more for rabbitmq_global_messages_dead_lettered_<what>_total."""
        counted = (queue.queue_module, strategy, what)
        self.counts[counted] = self.counts.get(counted, 0) + 1

    def route(
        self, queue: QueueFeatures, dlx: Exchange, copy: Message, keys: list[str], reason: str
    ) -> bool:
        """Route a dead-letter copy through ``dlx`` with ``keys``: whether it
        reached at least one queue and every queue took it."""
        taken, complete = 0, True
        for target in self.router.route_keys(dlx, copy, keys):
            if dl.is_cycle(target.name, copy.headers):
                log.warning(
                    "vhost '%s': message dead-lettered from queue '%s' (%s) would cycle "
                    "back to queue '%s' with no rejection on the way; dropped",
                    self.vhost_name,
                    queue.name,
                    reason,
                    target.name,
                )
                continue
            # At most once, as RabbitMQ's classic queues: no confirm waits for it.
            # The copy exists now, so the original goes whatever befalls one target.
            try:
                if target.publish(copy) == REJECTED:
                    complete = False
                else:
                    taken += 1
            except Exception:
                log.exception(
                    "vhost '%s': queue '%s' failed to take a message dead-lettered from "
                    "queue '%s' (%s)",
                    self.vhost_name,
                    target.name,
                    queue.name,
                    reason,
                )
                complete = False
        return complete and taken > 0
