"""Publishes stored all-or-nothing, answered once they are durable.

An AMQP tx.commit and the HTTP API's publish (which RabbitMQ's management
plugin answers with its publish's confirm) promise what a publisher confirm
promises: once answered, the messages are in their queues and, when persistent
and routed to durable queues, on disk. When a store cannot write its part (a
full disk: the write fails and the store drops what it could not write,
store/disk_budget.py), a confirm becomes a nack for exactly the lost messages;
a commit has no nack, so it must fail as a whole, and nothing of it may stay
in any queue.

So a :class:`Commit` routes its messages with deliveries held back (each queue
only appends them, Queue.publish_held: no consumer has one yet), then has
every store it touched write out at once, in the same loop turn. If a store
dropped any of the unit's records, every message of the unit still in a queue
is taken back out (as durable as an ack) and the unit is refused
(:class:`NotStored`); otherwise it waits for the group sync (store/sync.py)
of its durable stores, and only then is it answered. Queues deliver the
messages in a later loop turn, after that write-out.

What cannot be taken back: a stream's or a delayed exchange's part (both only
append), copies dead-lettered by a queue's limits on the way, and a message a
consumer got after the write-out if the fdatasync itself fails afterwards (an
I/O error, not a full disk: the write had succeeded). docs/storage.md
("Confirms, transactions and the disk") says so.

The core only knows the group sync through :class:`Syncer`: it imports no
storage or protocol package.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from warren.core.errors import PreconditionFailed

if TYPE_CHECKING:
    from warren.core.exchange import Exchange
    from warren.core.message import Message
    from warren.core.queue import Held, Queue
    from warren.core.store import MessageStore
    from warren.core.vhost import VHost

__all__ = ["NOT_STORED", "Commit", "NotStored", "Syncer"]

log = logging.getLogger("warren.commit")

#: What a refused unit's error says (a client sees it in the reply text).
NOT_STORED = "the messages could not be stored (the disk is full or failing)"


class Syncer(Protocol):
    """store/sync.py's GroupSync, as far as a commit needs it."""

    @property
    def gen(self) -> int: ...

    def after_sync(
        self, stores: Iterable[Any], callback: Callable[[bool], None], since: int | None = None
    ) -> None: ...


class NotStored(PreconditionFailed):
    """A unit of publishes could not be stored, and nothing of it was kept: a
    channel error (406, the code RabbitMQ gives a failed tx.commit), so the
    connection and its other channels go on."""


def _lost(store: object, first: int, last: int) -> bool:
    lost_between = getattr(store, "lost_between", None)
    return lost_between is not None and bool(lost_between(first, last))


class Commit:
    """One unit of publishes in a vhost: publish() each, then write_out() and
    after_sync() (or stored(), awaited)."""

    def __init__(self, vhost: VHost, syncer: Syncer | None, what: str) -> None:
        """``what`` names the unit in the log (a connection and channel, a user)."""
        self.vhost = vhost
        self.syncer = syncer
        self.what = what
        #: Stores a durable message went to: the answer waits for their sync.
        self.durable: list[MessageStore] = []
        # (queue, sequence number) of every message appended, to take back.
        self._held: list[Held] = []
        self._since = syncer.gen if syncer is not None else 0
        self.count = 0
        # Messages a deduplicating exchange let in: their keys go if taken back.
        self._dedup_seen: list[tuple[Exchange, Message]] = []

    def publish(
        self, exchange: Exchange, msg: Message, routed_to: list[Queue] | None = None
    ) -> int:
        """Router.publish with deliveries held back; returns what it returns."""
        self.count += 1
        routed = self.vhost.router.publish(exchange, msg, self.durable, self._held, routed_to)
        dedup = exchange.deduplicator
        if dedup is not None:
            new, entry = dedup.last_new, dedup.entry_of(msg.headers, 0)
            if new is not None and entry is not None and new[0] == entry[0]:
                self._dedup_seen.append((exchange, msg))  # let in: not a duplicate
        return routed

    def write_out(self) -> bool:
        """Have every store the unit touched write out now. False when one could
        not write all of the unit: every message of it still in a queue has been
        taken back, and the failure logged."""
        stores: dict[int, Any] = {id(s): s for s in self.durable}
        for q, _seq, _key in self._held:
            stores.setdefault(id(q.store), q.store)
        failed = False
        for store in stores.values():
            try:
                store.flush()
            except OSError:
                log.exception("%s: writing out a queue store failed", self.what)
                failed = True
        syncer = self.syncer
        if not failed and syncer is not None:
            first, last = self._since, syncer.gen
            failed = any(_lost(s, first, last) for s in stores.values())
        if failed:
            self._take_back("could not be written")
        return not failed

    def after_sync(self, callback: Callable[[bool], None]) -> None:
        """After a write_out() that succeeded: call ``callback(True)`` once the
        unit is durable (at once when nothing of it needs a sync), or
        ``callback(False)`` when the sync failed and what was still ready was
        taken back."""
        syncer = self.syncer
        if not self.durable or syncer is None:
            callback(True)
            return

        def synced(ok: bool) -> None:
            if not ok:
                self._take_back("could not be synced to disk")
            callback(ok)

        # Written out already: only what the next round's fdatasync does counts.
        syncer.after_sync(self.durable, synced, syncer.gen)

    async def stored(self) -> None:
        """write_out() and after_sync() for a coroutine: returns once the unit is
        durable, raises NotStored when it could not be stored."""
        if not self.write_out():
            raise NotStored(NOT_STORED)
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

        def settle(ok: bool) -> None:
            if not done.done():
                done.set_result(ok)

        self.after_sync(settle)
        if not await done:
            raise NotStored(NOT_STORED)

    def _take_back(self, why: str) -> None:
        held, self._held = self._held, []
        taken = sum(1 for q, seq, key in held if q.take_back(seq, key))
        seen, self._dedup_seen = self._dedup_seen, []
        for exchange, msg in seen:
            dedup = exchange.deduplicator
            if dedup is not None:
                key = dedup.forget_message(msg)
                if key is not None and exchange.key_log is not None:
                    exchange.key_log.withdraw(key)
        log.error(
            "%s: %d published messages %s (disk full?): refused, %d taken back out of "
            "their queues, nothing of them is kept",
            self.what,
            self.count,
            why,
            taken,
        )
