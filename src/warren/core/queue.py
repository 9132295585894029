"""A queue: ordered messages behind a store, and the consumers it delivers to.

A queue with none of the optional behaviours (TTL, length limits, single
active consumer, deduplication; a delivery limit once a message has come back)
takes the plain path: publish appends or hands the message to a free
consumer, nothing else. The features live in the ``_featured`` methods, so that the common case
pays one flag test (``plain``) for them. The rest is parts the queue holds,
each of one idea: ``features`` (limits, message TTL, dead-lettering:
core/queue_features.py), ``expires`` (x-expires: core/queue_expires.py),
``delivery`` (the consumers' order and the delivery passes:
core/queue_delivery.py) and ``settler`` (how delivered messages come back:
acks, requeues, drops: core/queue_settle.py). A kind of queue differs by the
parts it makes (the ``_features``, ``_delivery``, ``_settlement`` hooks) and by
the few methods it overrides (core/quorum_queue.py, core/stream_queue.py).
"""

from __future__ import annotations

from collections.abc import Hashable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from mypy_extensions import mypyc_attr

from warren.core import dead_letter as dl
from warren.core.consumer import Consumer
from warren.core.destination import QUEUE
from warren.core.errors import AccessRefused, PreconditionFailed
from warren.core.message import Message, MessageRun
from warren.core.queue_delivery import QueueDelivery
from warren.core.queue_expires import QueueExpires
from warren.core.queue_features import QueueFeatures
from warren.core.queue_settings import (
    DROP_HEAD,
    REJECT_PUBLISH_DLX,
    argument_settings,
    message_ttl,
)
from warren.core.queue_settle import QueueSettlement
from warren.core.stats import GaugeStats, MessageStats
from warren.core.store import MessageStore

if TYPE_CHECKING:
    from warren.core.dedup import Deduplicator, KeyEntry, KeyLog
    from warren.core.policies import Policy
    from warren.core.vhost import VHost
    #: A message of a unit stored all-or-nothing (core/commit.py): its queue,
    #: sequence number and the deduplication key it added (None: none).
    Held = tuple["Queue", int, Hashable | None]

# What Queue.publish did with a message. REJECTED: refused by x-overflow
# reject-publish(-dlx); it counts as routed, but the publisher gets a nack.
NOT_TAKEN, STORED, DELIVERED, REJECTED = 0, 1, 2, 3


# Subclassed by core/exchange_delayed.py, which is not compiled (setup.py).
@mypyc_attr(allow_interpreted_subclasses=True)
class Queue:
    """Ordered messages behind a store, the consumers they go to, and its parts."""

    destination_kind: ClassVar[str] = QUEUE
    #: Whether every message is stored durably, whatever its delivery-mode (streams):
    #: a publisher confirm then always waits for the sync.
    keeps_every_message: ClassVar[bool] = False
    #: The management API's type, and RabbitMQ's module of that type (in its texts,
    #: and the queue_type label of its metrics).
    queue_type: ClassVar[str] = "classic"
    queue_module: ClassVar[str] = "rabbit_classic_queue"
    #: Whether queue.declare of the queue, passive or not, counts as use for
    #: x-expires: a classic queue's does, a quorum queue's not (RabbitMQ 3.10's
    #: answers, tests/data/rabbitmq_expires_renewal.json; basic.get does for both).
    declare_renews: ClassVar[bool] = True

    def __init__(
        self,
        vhost: VHost,
        name: str,
        store: MessageStore,
        durable: bool = True,
        exclusive_owner: object | None = None,
        auto_delete: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> None:
        self.vhost = vhost
        #: The broker's clock (the vhost's), held here for the publish path.
        self.clock = vhost.clock
        self.name = name
        self.store = store
        #: Message counters (publish, deliver, get, ack, ...) for management and metrics.
        self.stats = MessageStats()
        #: Its lengths (messages, ready, unacknowledged) at the last samples.
        self.lengths = GaugeStats(3)
        self.durable = durable
        self.exclusive_owner = exclusive_owner
        self.auto_delete = auto_delete
        self.arguments: dict[str, Any] = arguments or {}
        self.consumers: list[Consumer] = []
        #: The returns of messages that came back so far, by seq (every return in
        #: the low bits, queue_delivery.py's RETURNS; a quorum queue's survive a
        #: restart: its store keeps them).
        self.delivery_counts = self._recovered_counts()
        self.unacked = 0
        #: The body bytes of the unacked messages (basic.get's too).
        self.unacked_bytes = 0
        self.deleted = False
        #: Whether none of the features applies: the fast paths (see _configure).
        self.plain = True
        self._had_consumer = False
        #: Limits, message TTL, dead-lettering (queue_features.py).
        self.features = self._features()
        #: x-expires: when it was last used, its timer (queue_expires.py).
        self.expires = QueueExpires(self)
        #: The consumers' order and the delivery passes (queue_delivery.py).
        self.delivery = self._delivery()
        #: How delivered messages come back: acks, requeues, drops (queue_settle.py).
        self.settler = self._settlement()
        self.policy: Policy | None = None
        self.operator_policy: Policy | None = None
        self.settings: dict[str, Any] = {}
        timeout = self.arguments.get("x-consumer-timeout")
        self.consumer_timeout: int | None = (
            timeout if isinstance(timeout, int) and not isinstance(timeout, bool) else None
        )
        self._dedup: Deduplicator | None = None
        self._key_log: KeyLog | None = None
        if self.arguments.get("x-message-deduplication") is True:
            self._start_dedup()
        self._configure(argument_settings(self.arguments))
        if hasattr(store, "on_dropped"):  # a store on disk: a full disk can drop records
            store.on_dropped = self._dropped

    def _start_dedup(self) -> None:
        """Build the deduplication cache; a durable queue's (a stream's) is durable:
        rebuilt from its surviving records and its key journal (docs/storage.md)."""
        from warren.core.dedup import Deduplicator

        vhost = self.vhost
        what = f"queue '{self.name}' in vhost '{vhost.name}'"
        durable = self.persistent and vhost.key_logs is not None
        if not durable:
            self._dedup = Deduplicator.from_arguments(
                self.arguments, what, vhost.clock.monotonic_ms
            )
            return
        dedup = Deduplicator.from_arguments(self.arguments, what, vhost.clock.now_ms)
        if dedup is None:
            return
        self._dedup = dedup
        entries = self._recovered_keys(dedup)
        if not self.keeps_every_message:
            make = vhost.key_logs
            assert make is not None
            log_ = make(self, dedup)
            self._key_log = log_
            entries = log_.load() + entries
        dedup.restore(entries)

    def _dropped(self, msgs: list[Message]) -> None:
        """The store's on_dropped: a failed write-out dropped these messages
        (their publishers get nacks), so the deduplication keys they added go
        (core/dedup.py's forget_dropped): a retry is stored, not taken for a
        duplicate."""
        from warren.core.dedup import forget_dropped

        forget_dropped(msgs, self._dedup, self._key_log, self.vhost.exchanges)

    def _recovered_keys(self, dedup: Deduplicator) -> list[KeyEntry]:
        """The keys of the messages the store recovered (all durable)."""
        return self.routed_keys(None, dedup)

    def routed_keys(self, exchange: str | None, dedup: Deduplicator) -> list[KeyEntry]:
        """``dedup``'s keys of the ready messages published to ``exchange`` (None:
        all): what a deduplicating queue or exchange rebuilds its cache from."""
        from warren.core.properties import peek_headers

        out: list[KeyEntry] = []
        for _seq, timestamp, raw in self.store.scan_ready(exchange):
            entry = dedup.entry_of(peek_headers(raw), float(timestamp))
            if entry is not None:
                out.append(entry)
        return out

    def __repr__(self) -> str:
        return f"<Queue {self.name!r} in {self.vhost.name!r}>"

    # -- the parts (a kind of queue makes its own) ---------------------------------------
    def _features(self) -> QueueFeatures:
        """The part with this queue's limits, TTL and dead-lettering."""
        return QueueFeatures(self)

    def _delivery(self) -> QueueDelivery:
        """The part that delivers this queue's messages to its consumers."""
        return QueueDelivery(self, self.arguments.get("x-single-active-consumer") is True)

    def _settlement(self) -> QueueSettlement:
        """The part that settles this queue's deliveries."""
        return QueueSettlement(self)

    def _recovered_counts(self) -> dict[int, int]:
        """The delivery counts (seq -> returns) the store kept from before: none."""
        return {}

    @property
    def persistent(self) -> bool:
        """Durable and not exclusive: its store and definition survive a restart."""
        return self.durable and self.exclusive_owner is None

    @property
    def exclusive(self) -> bool:
        return self.exclusive_owner is not None

    @property
    def message_count(self) -> int:
        return self.store.ready_count

    @property
    def consumer_count(self) -> int:
        return len(self.consumers)

    @property
    def active_consumer(self) -> Consumer | None:
        """The consumer that gets the messages under single active consumer."""
        return self.delivery.active_consumer

    @property
    def dead_letter_exchange(self) -> str | None:
        """The dead-letter exchange in force (arguments or policy), or None."""
        return self.features.dead_letter_exchange

    @property
    def dead_letter_routing_key(self) -> str | None:
        return self.features.dead_letter_routing_key

    @property
    def last_used_ms(self) -> int:
        """When the queue was last used (ms since the epoch): its ``idle_since``."""
        return self.expires.last_used

    def touch(self) -> None:
        """The queue was used (declared, consumed from, read): x-expires starts over."""
        self.expires.touch()

    def schedule_delivery(self) -> None:
        """Ask for a delivery pass soon; cheap to call repeatedly (once per loop turn)."""
        self.delivery.schedule()

    def rebuild_expiry_index(self) -> None:
        """After a restart: messages with their own expiration expire on time."""
        self.features.rebuild_expiry_index()

    # -- settings ---------------------------------------------------------------------
    def apply_policies(self, policy: Policy | None, operator_policy: Policy | None) -> None:
        """Take a (new) matching policy and operator policy; applies at once."""
        from warren.core.policies import effective_queue_settings

        self.policy = policy
        self.operator_policy = operator_policy
        self._configure(effective_queue_settings(self.arguments, policy, operator_policy))

    def _configure(self, settings: dict[str, Any]) -> None:
        """Adopt effective settings (policy keys): from arguments alone, or merged
        with the queue's policies."""
        features = self.features
        self.settings = settings = features.configure(settings)
        self.expires.configure(settings.get("expires"))
        self.plain = not (
            features.expiring
            or features.limited
            or bool(self.delivery_counts)  # a delivery limit alone: until a return
            or self.delivery.single_active
            or self._dedup is not None
        )
        if self.deleted:
            return
        features.apply()
        self.delivery.schedule()

    # -- publishing -------------------------------------------------------------------
    def publish(self, msg: Message) -> int:
        """Take a routed message: NOT_TAKEN, STORED, DELIVERED (handed straight to
        a no-ack consumer or dropped by a feature: nothing to sync) or REJECTED.
        With an empty backlog and a consumer that can take it, delivery happens
        right here. Counted in ``stats.publish`` whatever becomes of it."""
        self.stats.publish += 1
        props = msg.properties
        if not self.plain or (props and props[0] & 1):  # 1: the expiration flag
            return self._publish_featured(msg)
        if self.consumers and not self.store.ready_count:
            consumer = self.delivery.next_consumer()
            if consumer is not None:
                if consumer.no_ack:
                    consumer.deliver(0, msg, False)
                    return DELIVERED
                return self._deliver_stored(consumer, msg)
        self.store.append(msg)
        self.vhost.store_written(self.store)
        self.delivery.stored()
        return STORED

    def publish_held(self, msg: Message, held: list[Held]) -> int:
        """publish() for a unit stored all-or-nothing (core/commit.py): never handed
        straight to a consumer, only appended, so that it can be taken back
        (``held`` gets this queue, the message's sequence number and, in a
        deduplicating queue, the key the message added) until its
        store has written it; a delivery pass in a later loop turn delivers it.
        A queue whose messages cannot be taken back (a stream, a delayed
        exchange's) takes it with publish() and adds nothing to ``held``."""
        self.stats.publish += 1
        props = msg.properties
        if not self.plain or (props and props[0] & 1):
            return self._publish_featured(msg, held)
        store = self.store
        held.append((self, store.append(msg), None))
        self.vhost.store_written(store)
        self.delivery.stored()
        return STORED

    def take_back(self, seq: int, key: Hashable | None = None) -> bool:
        """Take a held message (publish_held) out again while it is still ready:
        its unit could not be stored. False when it is not ready any more (a
        store that could not write it dropped it itself). ``key``: the
        deduplication key it added, forgotten either way, so that a retry of
        it gets in."""
        if key is not None and self._dedup is not None:
            self._dedup.forget_key(key)
            if self._key_log is not None:
                self._key_log.withdraw(key)
        if self.store.remove_ready(seq) is None:
            return False
        self.vhost.store_written(self.store)
        return True

    def publish_run(
        self,
        run: MessageRun,
        durable_out: list[MessageStore] | None = None,
        lost_out: list[int] | None = None,
    ) -> int:
        """How many of a run's first messages this queue takes at once: a plain
        queue with nothing waiting, whose consumer (the only one, the active
        one) takes them, hands them over where `publish` would hand each
        straight to one: all of them when it is no-ack, as many as its prefetch
        allows otherwise (stored in one write, then delivered), or a
        round-robin of all among the highest priority's no-ack consumers; one
        with a backlog, or whose consumer cannot take any, stores them all in
        one write, ready, as `publish` would one by one. 0: publish them one
        by one. ``durable_out`` gets the store when what it
        took must be synced before a confirm (as Router.enqueue's); ``lost_out``
        the indexes of messages it took that a failed write-out dropped before
        it returned (a stream's run, stored in pieces; a queue's run is one
        piece, written after the room for it was made: never)."""
        if not self.plain:
            return 0
        if self.store.ready_count or not self.consumers:
            return self._store_run(run, durable_out)
        delivery = self.delivery
        consumer = delivery.run_consumer()
        if consumer is None:
            if delivery.single_active:  # no active one
                return self._store_run(run, durable_out)
            return delivery.round_robin_run(run)
        if not consumer.can_take():
            return self._store_run(run, durable_out)
        if consumer.no_ack:
            n = consumer.no_ack_credit(len(run))
            if n < 1:
                return self._store_run(run, durable_out)
            self.stats.publish += n
            consumer.deliver_run(run, 0, n)
            return n
        return self._deliver_stored_run(consumer, run, durable_out)

    def _store_run(self, run: MessageRun, durable_out: list[MessageStore] | None) -> int:
        """The whole run appended, ready (the delivery pass takes it from there)."""
        store = self.store
        stored = store.append_ready_run(run, 0, len(run))
        if stored is None:
            return 0
        n = len(stored)
        self.vhost.store_written(store)
        self.stats.publish += n
        if durable_out is not None and self.persistent and stored.persistent:
            durable_out.append(store)
        self.delivery.stored()
        return n

    def _deliver_stored_run(
        self, consumer: Consumer, run: MessageRun, durable_out: list[MessageStore] | None
    ) -> int:
        """_deliver_stored for as many of a run's first messages as the consumer
        has credit for: one store write, one delivery write."""
        m = consumer.run_credit(len(run))
        if m < 1:
            return 0
        store = self.store
        stored = store.append_run(run, 0, m)
        if stored is None:
            return 0
        self.vhost.store_written(store)
        self.unacked += m
        self.unacked_bytes += sum(stored.sizes)
        self.stats.publish += m
        if durable_out is not None and self.persistent and stored.persistent:
            durable_out.append(store)
        consumer.deliver_stored_run(run, 0, m, stored)
        return m

    def _deliver_stored(self, consumer: Consumer, msg: Message) -> int:
        """Hand a message to an ack-mode consumer while nothing else is ready.

        Stored (for requeue, and for a restart until acked) but delivered now,
        without a delivery pass reading it back from the segment."""
        store = self.store
        seq = store.append_shifted(msg)
        self.vhost.store_written(store)
        self.unacked += 1
        self.unacked_bytes += len(msg.body)
        consumer.deliver(seq, msg, False)
        return STORED

    def _publish_featured(self, msg: Message, held: list[Held] | None = None) -> int:
        dedup = self._dedup
        if dedup is not None:
            if dedup.seen(msg):
                return DELIVERED  # a duplicate: accepted and dropped, as the plugin does
            new = dedup.last_new
            if new is not None:
                taken = self._publish_unique(msg, held)
                if taken == REJECTED:
                    dedup.forget_key(new[0])  # nacked: the retry must get in
                elif taken == STORED:
                    if held:
                        q, seq, _none = held[-1]
                        if q is self:  # to forget should the unit be taken back
                            held[-1] = (self, seq, new[0])
                    if self._key_log is not None and msg.persistent:
                        self._key_log.recorded(new, (self.store,))
                return taken
        return self._publish_unique(msg, held)

    def _publish_unique(self, msg: Message, held: list[Held] | None = None) -> int:
        store = self.store
        features = self.features
        now = self.clock.now_ms()
        overflow = features.overflow
        if overflow != DROP_HEAD and features.over_limit(len(msg.body)):
            if overflow == REJECT_PUBLISH_DLX:
                features.dead_letter(-1, msg, dl.MAXLEN, now)
            return REJECTED
        own_ttl = message_ttl(msg)
        if own_ttl is not None:
            features.saw_own_expiry()
        if held is None and self.consumers and not store.ready_count:
            consumer = self.delivery.next_consumer()
            if consumer is not None:
                if consumer.no_ack:
                    consumer.deliver(0, msg, False)
                    return DELIVERED
                return self._deliver_stored(consumer, msg)
        deadline = features.deadline(msg, own_ttl)
        if deadline is not None and deadline <= now:
            # TTL 0 (or a message already past its time): only a consumer waiting
            # right now could have had it. Without a dead-letter copy the
            # publisher keeps it: a nack, not a confirm.
            return DELIVERED if features.dead_letter(-1, msg, dl.EXPIRED, now) else REJECTED
        seq = store.append(msg)
        if held is not None:
            held.append((self, seq, None))
        self.vhost.store_written(store)
        if deadline is not None:
            features.stored(seq, deadline, own_ttl)
        if features.limited:
            features.drop_over_limit()
        self.delivery.schedule()
        return STORED

    # -- consumers --------------------------------------------------------------------
    def add_consumer(self, consumer: Consumer) -> None:
        if "x-stream-offset" in consumer.arguments:
            raise PreconditionFailed(
                f"invalid arg 'x-stream-offset' for queue '{self.name}' in vhost "
                f"'{self.vhost.name}' of queue type {self.queue_module}"
            )
        if self.consumers and (consumer.exclusive or any(c.exclusive for c in self.consumers)):
            raise AccessRefused(
                f"queue '{self.name}' in vhost '{self.vhost.name}' in exclusive use"
            )
        self.consumers.append(consumer)
        self._had_consumer = True
        self.delivery.added(consumer)
        self.expires.stop()
        self.delivery.schedule()

    def remove_consumer(self, consumer: Consumer) -> None:
        """Detach a consumer; an auto-delete queue goes with its last consumer."""
        try:
            self.consumers.remove(consumer)
        except ValueError:
            return
        self.delivery.removed(consumer)
        if not self.consumers:
            self.expires.touch()
        if self.auto_delete and self._had_consumer and not self.consumers and not self.deleted:
            self.vhost.delete_queue(self.name)

    # -- pull ---------------------------------------------------------------------------
    def pull_next(self, no_ack: bool) -> tuple[int, Message, bool] | None:
        """The next message (basic.get): (seq, message, redelivered), unacked
        unless ``no_ack``; None when none is ready. Reached through a client
        session's delivery stream (Deliveries.pull)."""
        self.expires.touch()
        item = self.store.shift() if self.plain else self.delivery.take(self.clock.now_ms())
        if item is None:
            return None
        if no_ack:
            self.store.ack(item[0])
            self.delivery_counts.pop(item[0], None)
            self.vhost.store_written(self.store)
        else:
            self.unacked += 1
            self.unacked_bytes += len(item[1].body)
        return item

    def persistent_counts(self) -> tuple[int, int] | None:
        """messages_persistent and message_bytes_persistent as RabbitMQ counts
        them: the persistent (delivery-mode 2) messages ready and unacked, and
        their body bytes, in a durable queue; none in a transient or exclusive
        one. None where there are no such figures (a stream)."""
        if not self.persistent:
            return 0, 0
        transient, transient_bytes = self.store.transient()
        return (
            max(0, self.store.ready_count + self.unacked - transient),
            max(0, self.store.ready_bytes + self.unacked_bytes - transient_bytes),
        )

    def purge(self) -> int:
        count = self.store.purge()
        self.features.purged()
        self.vhost.store_written(self.store)
        return count

    # -- policies ---------------------------------------------------------------------
    # -- lifecycle --------------------------------------------------------------------
    def delivered_marks(self) -> dict[Path, int]:
        """The store's marks of what was delivered (DiskStore.delivered_marks: not
        the queue's interface, a store in RAM has none), for a clean shutdown to
        record; none for a queue that does not survive one."""
        marks = getattr(self.store, "delivered_marks", None) if self.persistent else None
        return marks() if marks is not None else {}

    def mark_deleted(self) -> list[Consumer]:
        """Called by the vhost: stop delivering and hand back consumers to notify."""
        self.deleted = True
        consumers, self.consumers = self.consumers, []
        self.delivery.stop()
        self.features.stop()
        self.expires.stop()
        if self._key_log is not None:
            self._key_log.close()
        self.store.delete()
        return consumers

