"""A vhost's dead-lettering: what a queue lets go of, republished to its
dead-letter exchange.

:class:`DeadLetters` is the part of :class:`~warren.core.vhost.VHost` that
queues hand such a message to (``vhost.dead_letters``): it makes the copy
(core/dead_letter.py), routes it with the vhost's Router, hands it to the
queues and counts it for the metrics.

Handing a copy to a queue can make that queue let go of a message in turn
(the copy overflows it, and its own dead-letter exchange takes the dropped
head), and so on along a chain of queues as long as a client built it. So a
copy made while another is being handed over is routed at once (what fails
there keeps the original in its queue) but handed over after it, by the
outermost call's loop: a chain of any length takes no more stack than one
step. Only a quorum queue's at-least-once hand-over (``route``, whose answer
it waits for) still nests, a level per such queue in the chain; so the module
stays interpreted (setup.py), where Python's recursion limit bounds that.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING

from warren.core import dead_letter as dl
from warren.core.queue import REJECTED

if TYPE_CHECKING:
    from warren.core.exchange import Exchange
    from warren.core.message import Message
    from warren.core.queue import Queue
    from warren.core.vhost_routing import Router

    #: A copy on its way: the queue it left, the copy, the queues it goes to, why.
    Handover = tuple[Queue, Message, list[Queue], str]

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
        # While publish() hands copies over: those made meanwhile, in order.
        self._queued: deque[Handover] | None = None

    def publish(self, queue: Queue, msg: Message, reason: str, now: int) -> None:
        """Republish a message a queue let go of to the queue's dead-letter
        exchange, at most once (as RabbitMQ's classic queues: no confirm waits).

        Raises when the copy cannot be made or routed (the queue then keeps the
        original); a target queue's own failure is logged and does not. Called
        while another copy is handed over, it leaves this one's hand-over to
        that call's loop (see the module's docstring)."""
        dlx_name = queue.dead_letter_exchange
        if dlx_name is None:
            return
        dlx = self.exchanges.get(dlx_name)
        if dlx is None:
            log.debug(
                "vhost '%s': dead-letter exchange '%s' of queue '%s' does not exist; dropped",
                self.vhost_name,
                dlx_name,
                queue.name,
            )
            return
        copy, keys = dl.dead_letter(
            msg, queue.name, reason, dlx_name, queue.dead_letter_routing_key, now
        )
        # Counted per dead-lettered message (a copy is made anyway), for
        # rabbitmq_global_messages_dead_lettered_*_total.
        self.count(queue, "at_most_once", reason)
        targets = self._targets(queue, dlx, copy, keys, reason)
        queued = self._queued
        if queued is not None:
            queued.append((queue, copy, targets, reason))
            return
        self._queued = queued = deque()
        try:
            self._hand_over(queue, copy, targets, reason)
            while queued:
                self._hand_over(*queued.popleft())
        finally:
            self._queued = None

    def count(self, queue: Queue, strategy: str, what: str) -> None:
        """One more for rabbitmq_global_messages_dead_lettered_<what>_total."""
        counted = (queue.queue_module, strategy, what)
        self.counts[counted] = self.counts.get(counted, 0) + 1

    def route(
        self, queue: Queue, dlx: Exchange, copy: Message, keys: list[str], reason: str
    ) -> bool:
        """Route a dead-letter copy through ``dlx`` with ``keys`` and hand it to its
        queues now: whether it reached at least one queue and every queue took
        it (a quorum queue's at-least-once dead-lettering holds it otherwise)."""
        return self._hand_over(queue, copy, self._targets(queue, dlx, copy, keys, reason), reason)

    def _targets(
        self, queue: Queue, dlx: Exchange, copy: Message, keys: list[str], reason: str
    ) -> list[Queue]:
        """The queues ``dlx`` routes the copy to with ``keys``, but for those it
        would reach in an automatic cycle (logged and dropped)."""
        targets = []
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
            targets.append(target)
        return targets

    def _hand_over(
        self, queue: Queue, copy: Message, targets: list[Queue], reason: str
    ) -> bool:
        """Give the copy to each target: whether one at least and every one took it."""
        taken, complete = 0, True
        for target in targets:
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
