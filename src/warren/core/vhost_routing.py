"""A vhost's routing: from an exchange to the queues a message goes to, and into them.

:class:`Router` is the part of :class:`~warren.core.vhost.VHost` that every
publish goes through (``vhost.router``). It reads the vhost's tables
(exchanges, queues, direct reply-to consumers), which the vhost changes. It
follows exchange-to-exchange bindings and alternate exchanges with an
explicit stack, serves direct reply-to (``amq.rabbitmq.reply-to``) and
sender-selected distribution (CC/BCC), and routes runs of alike publishes
(``route_run``, ``publish_run_to``). Compiled with the hot modules
(setup.py): nothing here recurses. Dead-lettering, which does (a queue's
dead-lettered copy can overflow the next queue, whose copy overflows the
next...), is vhost_dead_letters.py's, never compiled.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

from warren.core import dead_letter as dl
from warren.core.destination import QUEUE
from warren.core.exchange import (
    DefaultExchange,
    DirectExchange,
    Exchange,
    FanoutExchange,
    HeadersExchange,
    TopicExchange,
)
from warren.core.message import Message, MessageRun
from warren.core.properties import edit_properties
from warren.core.queue import REJECTED, STORED, Queue

if TYPE_CHECKING:
    from warren.core.queue import Held
    from warren.core.store import MessageStore
    from warren.store.disk_budget import DiskBudget

__all__ = ["REJECTED_BY_QUEUE", "REPLY_TO", "REPLY_TO_PREFIX", "ReplyTarget", "Router"]

log = logging.getLogger("warren.vhost")

REPLY_TO = "amq.rabbitmq.reply-to"

#: Router.publish's answer when a queue refused the message (reject-publish).
REJECTED_BY_QUEUE = -1

REPLY_TO_PREFIX = REPLY_TO + "."

#: Exchange types whose route depends on the routing key alone (the headers
#: exchange's: for a message without headers) (Router.route_run): exact types,
#: so no plugin subclass.
_ROUTE_ONCE = frozenset(
    (DefaultExchange, DirectExchange, FanoutExchange, TopicExchange, HeadersExchange)
)


class ReplyTarget(Protocol):
    """A direct reply-to consumer: replies go straight to it, bypassing queues."""

    def deliver_reply(self, msg: Message) -> bool: ...


class Router:
    """Where a vhost's messages go: route, publish, enqueue, runs of publishes."""

    def __init__(
        self,
        vhost_name: str,
        exchanges: dict[str, Exchange],
        queues: dict[str, Queue],
        reply_targets: dict[str, ReplyTarget],
        default_exchange: DefaultExchange,
    ) -> None:
        # The vhost's own tables, changed by it as things are declared and deleted.
        self.vhost_name = vhost_name
        self.exchanges = exchanges
        self.queues = queues
        self.reply_targets = reply_targets
        self.default_exchange = default_exchange
        #: The data directory's disk budget, whose write generation tells whether a
        #: store lost what it took (enqueue, publish_run_to): set by the broker;
        #: None (no data directory) checks nothing.
        self.write_budget: DiskBudget | None = None

    def route(self, exchange: Exchange, msg: Message) -> list[Queue]:
        """Queues the message goes to, through exchange-to-exchange bindings and
        alternate exchanges, each queue once."""
        if exchange is self.default_exchange:
            q = self.queues.get(msg.routing_key)
            return [q] if q is not None else []
        dests = exchange.match(msg)
        if dests:
            if len(dests) == 1:
                for only in dests:
                    if only.destination_kind == QUEUE:
                        return [only]  # type: ignore[list-item]
            elif all(d.destination_kind == QUEUE for d in dests):
                # Common case, no exchange-to-exchange hop: keep order, drop duplicates.
                return list(dict.fromkeys(dests))  # type: ignore[arg-type]
        elif exchange.alternate_exchange is None:
            return []
        return self._route_through(exchange, msg)

    def _route_through(self, exchange: Exchange, msg: Message) -> list[Queue]:
        """Follow exchange-to-exchange bindings and alternate exchanges, depth first,
        each exchange once; an explicit stack, however long a chain a client built."""
        queues: dict[int, Queue] = {}
        visited: set[int] = set()
        stack: list[Exchange] = [exchange]
        while stack:
            ex = stack.pop()
            if id(ex) in visited:
                continue
            visited.add(id(ex))
            found = False
            onward: list[Exchange] = []
            for dest in ex.match(msg):
                found = True
                if dest.destination_kind == QUEUE:
                    queues[id(dest)] = dest  # type: ignore[assignment]
                elif id(dest) not in visited:
                    onward.append(dest)  # type: ignore[arg-type]
            if not found and ex.alternate_exchange is not None:
                ae = self.exchanges.get(ex.alternate_exchange)
                if ae is None:
                    log.warning(
                        "alternate exchange '%s' of exchange '%s' in vhost '%s' does not exist",
                        ex.alternate_exchange,
                        ex.name,
                        self.vhost_name,
                    )
                elif id(ae) not in visited:
                    onward.append(ae)
            stack.extend(reversed(onward))
        return list(queues.values())

    def publish(
        self,
        exchange: Exchange,
        msg: Message,
        durable_out: list[MessageStore] | None = None,
        held: list[Held] | None = None,
        routed_to: list[Queue] | None = None,
    ) -> int:
        """Route and enqueue; returns how many queues (or reply consumers) took it,
        or REJECTED_BY_QUEUE when a queue refused it (x-overflow reject-publish):
        routed, but the publisher is owed a nack. ``routed_to`` gets the queues
        it was routed to (a channel's counts by queue, core/channel_counts.py).

        Stores that took a persistent message into a durable queue are appended to
        ``durable_out``: a publisher confirm for the message must wait for them.
        With ``held`` the queues only append it, to be taken back if its unit
        cannot be stored (Queue.publish_held, core/commit.py).
        """
        if exchange is self.default_exchange and msg.routing_key.startswith(REPLY_TO_PREFIX):
            target = self.reply_targets.get(msg.routing_key[len(REPLY_TO_PREFIX) :])
            n = 1 if target is not None and target.deliver_reply(msg) else 0
            exchange.stats.count_publish(n)
            return n
        dedup = exchange.deduplicator
        new = None
        if dedup is not None:
            if dedup.seen(msg):
                exchange.stats.count_publish(0)
                return 0  # a duplicate is dropped, as if unroutable (LavinMQ, the plugin)
            new = dedup.last_new
        props = msg.properties
        if props and props[0] & 0x20 and b"CC" in props:  # 0x20: headers present
            queues, msg = self._route_cc(exchange, msg)
        else:
            queues = self.route(exchange, msg)
        if routed_to is not None:
            routed_to += queues
        if new is None:
            return self.enqueue(exchange, queues, msg, durable_out, held)
        assert dedup is not None
        key_log = exchange.key_log
        # A durable cache: the key is written once the stores the message went to
        # are synced; a message no durable store kept leaves its key in memory.
        mine: list[MessageStore] | None = durable_out if key_log is None else []
        taken = self.enqueue(exchange, queues, msg, mine, held)
        if taken == REJECTED_BY_QUEUE:
            dedup.forget_key(new[0])  # nacked: the retry must get in
        if key_log is not None and mine:
            if durable_out is not None:
                durable_out.extend(mine)
            if taken != REJECTED_BY_QUEUE:
                key_log.recorded(new, mine)
        return taken

    def enqueue(
        self,
        exchange: Exchange,
        queues: list[Queue],
        msg: Message,
        durable_out: list[MessageStore] | None = None,
        held: list[Held] | None = None,
    ) -> int:
        """Hand a routed message to its queues; what `publish` returns (also
        REJECTED_BY_QUEUE when a store lost it meanwhile: its confirm is a nack,
        _enqueue_watched)."""
        if durable_out is not None and len(queues) > 1 and self.write_budget is not None:
            return self._enqueue_watched(exchange, queues, msg, durable_out, held)
        n = 0
        rejected = False
        persistent: bool | None = None
        for q in queues:
            taken = q.publish(msg) if held is None else q.publish_held(msg, held)
            if taken:
                n += 1
                if taken == STORED:
                    if durable_out is not None and q.persistent:
                        if q.keeps_every_message:
                            durable_out.append(q.store)  # a stream: whatever delivery-mode says
                        else:
                            if persistent is None:
                                persistent = msg.persistent
                            if persistent:
                                durable_out.append(q.store)
                elif taken == REJECTED:
                    rejected = True
        exchange.stats.count_publish(n)
        return REJECTED_BY_QUEUE if rejected else n

    def _enqueue_watched(
        self,
        exchange: Exchange,
        queues: list[Queue],
        msg: Message,
        durable_out: list[MessageStore],
        held: list[Held] | None,
    ) -> int:
        """enqueue() to several queues whose durable stores a confirm waits for.

        A store's record may be dropped after the store returned: a later
        queue's store that spends the free-disk budget has every store
        written in this turn written out (store/disk_budget.py), and a failed
        write-out drops what they buffered; the confirm, registered at the
        write generation after the last queue, would not see it. So each
        durable store that took the message is asked, at the end, whether it
        lost records since the write generation at which it returned (only
        when the generation moved), as a publish run's are
        (publish_run_to): if one did, REJECTED_BY_QUEUE (a nack).
        Apart from that, and the generation read after each durable store,
        the same loop as enqueue's (kept apart: the one-queue path pays
        nothing)."""
        budget = self.write_budget
        assert budget is not None
        n = 0
        rejected = False
        persistent: bool | None = None
        gen = budget.gen
        mark = len(durable_out)
        # durable_out index -> write generation at its store's return, for the
        # stores that returned after the generation moved (rare: a write-out).
        moved: dict[int, int] | None = None
        for q in queues:
            taken = q.publish(msg) if held is None else q.publish_held(msg, held)
            if taken:
                n += 1
                if taken == STORED:
                    if q.persistent:
                        if q.keeps_every_message:
                            durable_out.append(q.store)
                        else:
                            if persistent is None:
                                persistent = msg.persistent
                            if not persistent:
                                continue
                            durable_out.append(q.store)
                        if budget.gen != gen:
                            if moved is None:
                                moved = {}
                            moved[len(durable_out) - 1] = budget.gen
                elif taken == REJECTED:
                    rejected = True
        exchange.stats.count_publish(n)
        if budget.gen != gen and _lost_since(durable_out, mark, gen, moved, budget.gen):
            rejected = True
        return REJECTED_BY_QUEUE if rejected else n

    def route_run(self, exchange: Exchange, msg: Message) -> list[Queue] | None:
        """The queues of every message in a run of publishes with this message's
        exchange and routing key and simple properties (see
        amqp/publish_run.py), when they depend on nothing else: the built-in
        exchange types straight to queues (not the headers exchange when the
        run's messages carry headers), no deduplication, no direct reply-to.
        None: each message must go through `publish` on its own."""
        kind = type(exchange)
        if exchange.deduplicator is not None or kind not in _ROUTE_ONCE:
            return None
        if kind is HeadersExchange and msg.properties[0] & 0x20:  # 0x20: headers present
            return None
        if exchange is self.default_exchange:
            if msg.routing_key.startswith(REPLY_TO_PREFIX):
                return None
            q = self.queues.get(msg.routing_key)
            return [q] if q is not None else []
        dests = exchange.match(msg)
        if not dests:
            return [] if exchange.alternate_exchange is None else None
        if all(d.destination_kind == QUEUE for d in dests):
            return list(dict.fromkeys(dests))  # type: ignore[arg-type]
        return None

    def route_keys(self, exchange: Exchange, msg: Message, keys: list[str]) -> list[Queue]:
        """Queues for a message routed once per key (CC/BCC, dead-lettering), each once."""
        queues: dict[int, Queue] = {}
        for key in dict.fromkeys(keys):
            probe = (
                msg
                if key == msg.routing_key
                else Message(msg.exchange, key, msg.properties, msg.body, msg.timestamp, msg.native)
            )
            for q in self.route(exchange, probe):
                queues[id(q)] = q
        return list(queues.values())

    def _route_cc(self, exchange: Exchange, msg: Message) -> tuple[list[Queue], Message]:
        """Sender-selected distribution: the CC and BCC headers name more routing keys;
        BCC is removed from what the queues get, as RabbitMQ does."""
        headers = msg.headers
        if not headers or ("CC" not in headers and "BCC" not in headers):
            return self.route(exchange, msg), msg
        keys = [msg.routing_key, *dl.header_keys(headers.get("CC"))]
        if "BCC" in headers:
            keys.extend(dl.header_keys(headers["BCC"]))
            stripped = Message(
                msg.exchange,
                msg.routing_key,
                edit_properties(msg.properties, remove_headers=("BCC",)),
                msg.body,
                msg.timestamp,
                msg.native,
            )
            stripped._ex_rk = msg._ex_rk
            msg = stripped
        return self.route_keys(exchange, msg, keys), msg

    def publish_run_to(
        self, queues: list[Queue], mrun: MessageRun, durable: list[MessageStore], lost: list[int]
    ) -> list[int]:
        """Each queue's publish_run of ``mrun`` (a protocol's run of messages
        alike but for their bodies): how many of its first messages it took;
        ``lost`` gets the indexes of those a store lost meanwhile.

        A store reports what a failed write-out dropped while it stored the
        run; with several queues its part may also be dropped after it
        returned: a later queue's store that spends the free-disk budget has
        every store written in this turn written out (store/disk_budget.py).
        So each store that took part is asked, at the end, whether it lost
        records since the write generation at which it returned (everything
        it took counts as lost then: a full disk met within one run)."""
        if len(queues) == 1:
            return [queues[0].publish_run(mrun, durable, lost)]
        budget = self.write_budget
        taken: list[int] = []
        parts: list[tuple[int, int, int, int]] = []  # durable[lo:hi], at gen, took
        for q in queues:
            lo = len(durable)
            took = q.publish_run(mrun, durable, lost)
            taken.append(took)
            if budget is not None and len(durable) > lo:
                parts.append((lo, len(durable), budget.gen, took))
        if budget is not None:
            now = budget.gen
            for lo, hi, gen, took in parts:
                if gen != now and _lost_since(durable, lo, gen, None, now, hi):
                    lost.extend(range(took))
        return taken


def _lost_since(
    stores: list[MessageStore],
    mark: int,
    gen: int,
    moved: dict[int, int] | None,
    now: int,
    end: int | None = None,
) -> bool:
    """Whether a store of ``stores[mark:end]`` dropped records between the write
    generation at which it took its messages (``moved``'s, else ``gen``) and
    ``now`` (enqueue, publish_run_to)."""
    for i in range(mark, len(stores) if end is None else end):
        since = moved.get(i, gen) if moved is not None else gen
        lost_between = getattr(stores[i], "lost_between", None)
        if since != now and lost_between is not None and lost_between(since, now):
            return True
    return False
