"""A virtual host: its exchanges, queues and the bindings between them.

All declaration, binding and routing rules that RabbitMQ applies per vhost live
here and in the parts VHost holds, so every protocol adapter gets the same
answers and the same errors: routing and publishing in vhost_routing.py
(``vhost.router``), dead-lettering in vhost_dead_letters.py
(``vhost.dead_letters``), policies and limits in vhost_parameters.py,
exclusive queues' owners in vhost_exclusive.py (``vhost.exclusive``), the
stores and their flushing in vhost_stores.py (``vhost.stores``), the events
and exchange watchers told of changes in vhost_events.py (``vhost.notices``),
restoring at start and closing at stop in vhost_lifecycle.py; the durable
objects' records, and their writing (``vhost.records``), in vhost_records.py.
"""

from __future__ import annotations

import base64
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from warren.core.clock import Clock, LoopClock
from warren.core.consumer import Consumer
from warren.core.equivalence import check_exchange_equivalent, check_queue_equivalent
from warren.core.errors import (
    AccessRefused,
    NotFound,
    NotImplemented_,
    PreconditionFailed,
    ResourceError,
)
from warren.core.events import Events
from warren.core.exchange import Binding, DefaultExchange, Exchange, exchange_class
from warren.core.names import check_name
from warren.core.policies import Policy
from warren.core.queue import Queue
from warren.core.queue_arguments import (
    is_quorum,
    is_stream,
    max_priority,
    validate_queue_arguments,
    validate_quorum_declaration,
    validate_stream_declaration,
)
from warren.core.quorum_queue import QuorumQueue
from warren.core.stats import GaugeStats, MessageStats
from warren.core.store import MessageStore
from warren.core.stream_queue import StreamQueue
from warren.core.table_tags import wire_type
from warren.core.vhost_dead_letters import DeadLetters
from warren.core.vhost_events import VHostNotices
from warren.core.vhost_exclusive import ExclusiveQueues
from warren.core.vhost_lifecycle import VHostLifecycle
from warren.core.vhost_parameters import (
    ComponentParameters,
    DefinitionsWriter,
    Limits,
    Policies,
    VHostMetadata,
)
from warren.core.vhost_records import DurableRecords
from warren.core.vhost_routing import ReplyTarget, Router
from warren.core.vhost_stores import (
    QUORUM,
    ExchangeStoreFactory,
    StoreFactory,
    StreamStoreFactory,
    VHostStores,
    memory_exchange_store,
    memory_store,
)

if TYPE_CHECKING:
    from warren.store.definitions import DefinitionsLog

__all__ = [
    "PREDECLARED",
    "QUORUM",
    "ExchangeStoreFactory",
    "StoreFactory",
    "StreamStoreFactory",
    "VHost",
    "server_named",
]

log = logging.getLogger("warren.vhost")

PREDECLARED = (
    ("amq.direct", "direct", False),
    ("amq.fanout", "fanout", False),
    ("amq.topic", "topic", False),
    ("amq.headers", "headers", False),
    ("amq.match", "headers", False),
    ("amq.rabbitmq.trace", "topic", True),
)


def server_named(prefix: str = "amq.gen-") -> str:
    return prefix + base64.urlsafe_b64encode(os.urandom(16)).rstrip(b"=").decode()


class VHost:
    """A vhost's exchanges, queues and bindings, with RabbitMQ's rules for declaring,
    deleting and binding them. Its routing (vhost_routing.py), dead-lettering
    (vhost_dead_letters.py), policies, limits, other components' parameters and
    metadata (vhost_parameters.py), exclusive queues' owners (vhost_exclusive.py),
    stores (vhost_stores.py), events and exchange watchers (vhost_events.py),
    durable records (vhost_records.py) and its restore and close
    (vhost_lifecycle.py) are parts it holds."""

    def __init__(
        self,
        name: str,
        call_soon: Callable[[Callable[[], None]], Any],
        store_factory: StoreFactory = memory_store,
        definitions: DefinitionsLog | None = None,
        clock: Clock | None = None,
        exchange_store_factory: ExchangeStoreFactory = memory_exchange_store,
        stream_store_factory: StreamStoreFactory | None = None,
    ) -> None:
        self.name = name
        #: Set as the vhost is deleted: what its closing connections would still
        #: store (an MQTT session) must not outlive it.
        self.deleted = False
        self.call_soon = call_soon
        #: The broker's clock (core/clock.py): message TTL, x-expires, delayed
        #: messages, retention, deduplication TTLs, retries after a failure.
        self.clock: Clock = clock if clock is not None else LoopClock()
        #: Makes its queues' and exchanges' stores; flushes them once per loop turn.
        self.stores = VHostStores(
            self, call_soon, store_factory, exchange_store_factory, stream_store_factory
        )
        # Bound here, not delegating methods: the per-message path calls them.
        self.store_written = self.stores.written
        self.flush_written = self.stores.flush
        # Durable exchanges, queues and bindings are recorded here as they change.
        self.definitions = definitions
        #: Makes a durable deduplicating queue's key journal (KeyLog), given the queue
        #: and its cache: set by the broker; None keeps every cache in memory.
        self.key_logs: Callable[[Any, Any], Any] | None = None
        #: The same for a durable deduplicating exchange, given the exchange.
        self.exchange_key_logs: Callable[[Any, Any], Any] | None = None
        self.exchanges: dict[str, Exchange] = {}
        self.queues: dict[str, Queue] = {}
        #: Which connection owns which exclusive queue.
        self.exclusive = ExclusiveQueues(name, self.queues)
        # Bindings by destination object, so deleting a queue finds its bindings fast.
        self._inbound: dict[int, dict[tuple[Any, ...], Binding]] = {}
        #: Direct reply-to consumers by token (amq.rabbitmq.reply-to.<token>).
        self.reply_targets: dict[str, ReplyTarget] = {}
        #: The broker's event observers and the exchange watchers, told of changes.
        self.notices = VHostNotices(self)
        # Its runtime parameters (vhost_parameters.py), each recording its changes
        # in the definitions log.
        self._writer = DefinitionsWriter(name, definitions)
        #: Which policy applies to which queue and exchange.
        self.policy_rules = Policies(
            name, self._writer, self.queues, self.exchanges, self.notices.exchange_changed
        )
        #: max-connections, max-queues and the open connections.
        self.limiter = Limits(name, self._writer, self.queues)
        #: Other components' parameters (federation upstreams, ...).
        self.parameters = ComponentParameters(self._writer)
        #: The default queue type.
        self.metadata = VHostMetadata(name, self._writer)
        #: Its durable exchanges, queues and bindings written as they change.
        self.records = DurableRecords(self._writer)
        #: Restoring its definitions at start, its stores and marks at a clean stop.
        self.lifecycle = VHostLifecycle(self)
        #: Counts no live channel holds: closed channels' (folded in at close) and
        #: operations without a channel (the management API's publish and get).
        #: With the live channels' they make the vhost's message_stats, which never
        #: go backwards.
        self.base_stats = MessageStats()
        #: Counts of closed connections whose counters are not a channel's (MQTT:
        #: its connection's stream, folded in by core/session.py as it closes).
        #: Part of message_stats with base_stats; the Prometheus metrics count
        #: them per protocol (metrics/history.py's Retired.sessions) instead.
        self.session_stats = MessageStats()
        #: Churn, as RabbitMQ's metrics count it: declarations (new or not), queues
        #: created and deleted (by any means) since the start.
        self.queues_declared = 0
        self.queues_created = 0
        self.queues_deleted = 0
        #: AMQP channels opened and closed in it (an MQTT connection has none,
        #: as in RabbitMQ 3.13's native MQTT).
        self.channels_opened = 0
        self.channels_closed = 0
        #: For the Prometheus metrics (warren/metrics), counted once per object,
        #: never per publish or delivery: the counters of deleted queues by queue
        #: type (its queue_module, RabbitMQ's label), messages published on
        #: channels in confirm mode (folded in as such a channel closes); the
        #: dead-lettered ones are dead_letters.counts.
        self.deleted_queue_stats: dict[str, MessageStats] = {}
        self.received_confirm = 0
        #: Those plus the live channels', summed when the broker samples rates.
        self.stats = MessageStats()
        #: Its queues' lengths (messages, ready, unacknowledged) and its connections'
        #: bytes (received, sent), set and sampled with the rates.
        self.lengths = GaugeStats(5)
        self.default_exchange = DefaultExchange(name, "", durable=True)
        self.exchanges[""] = self.default_exchange
        for ex_name, ex_type, internal in PREDECLARED:
            cls = exchange_class(ex_type)
            assert cls is not None
            self.exchanges[ex_name] = cls(name, ex_name, durable=True, internal=internal)
        #: Where a published message goes (route, publish, publish runs).
        self.router = Router(
            name, self.exchanges, self.queues, self.reply_targets, self.default_exchange
        )
        #: What its queues let go of, republished to their dead-letter exchanges
        #: (and counted: messages dead-lettered by queue type, strategy, reason).
        self.dead_letters = DeadLetters(name, self.exchanges, self.router)

    def __repr__(self) -> str:
        return f"<VHost {self.name!r}>"

    # -- its parts' most used methods (many callers: HTTP, definitions, tests) ----------
    @property
    def policies(self) -> list[Policy]:
        """The vhost's policies, highest priority first."""
        return self.policy_rules.policies

    @property
    def operator_policies(self) -> list[Policy]:
        return self.policy_rules.operator_policies

    def set_policy(
        self,
        name: str,
        pattern: str,
        definition: dict[str, Any],
        priority: int = 0,
        apply_to: str = "all",
    ) -> Policy:
        """Policies.set_policy."""
        policy = self.policy_rules.set_policy(name, pattern, definition, priority, apply_to)
        self.notices.emit("policy.set", name=name, pattern=pattern, definition=definition)
        return policy

    def set_operator_policy(
        self,
        name: str,
        pattern: str,
        definition: dict[str, Any],
        priority: int = 0,
        apply_to: str = "all",
    ) -> Policy:
        policy = self.policy_rules.set_operator_policy(
            name, pattern, definition, priority, apply_to
        )
        self.notices.emit("operator.policy.set", name=name, pattern=pattern, definition=definition)
        return policy

    def clear_policy(self, name: str) -> None:
        self.policy_rules.clear_policy(name)
        self.notices.emit("policy.cleared", name=name)

    def clear_operator_policy(self, name: str) -> None:
        self.policy_rules.clear_operator_policy(name)
        self.notices.emit("operator.policy.cleared", name=name)

    @property
    def events(self) -> Events:
        """VHostNotices.events: the broker sets its own."""
        return self.notices.events

    @events.setter
    def events(self, events: Events) -> None:
        self.notices.events = events

    @property
    def exchange_watchers(self) -> list[Callable[[VHost, str], None]]:
        """VHostNotices.exchange_watchers (federation adds its own)."""
        return self.notices.exchange_watchers

    def exchange_changed(self, name: str) -> None:
        self.notices.exchange_changed(name)

    @property
    def limits(self) -> dict[str, int]:
        """Limits.limits: as set, empty when none."""
        return self.limiter.limits

    @property
    def has_limits(self) -> bool:
        return self.limiter.has_limits

    def set_limits(self, limits: dict[str, Any]) -> None:
        self.limiter.set_limits(limits)

    def clear_limits(self, name: str | None = None) -> None:
        self.limiter.clear_limits(name)

    @property
    def default_queue_type(self) -> str | None:
        """VHostMetadata.default_queue_type."""
        return self.metadata.default_queue_type

    def close(self) -> int:
        """VHostLifecycle.close: how many of its stores failed to close."""
        return self.lifecycle.close()

    # -- exchanges --------------------------------------------------------------------
    def get_exchange(self, name: str) -> Exchange:
        ex = self.exchanges.get(name)
        if ex is None:
            raise NotFound(f"no exchange '{name}' in vhost '{self.name}'")
        return ex

    def declare_exchange(
        self,
        name: str,
        type_: str,
        durable: bool = True,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: dict[str, Any] | None = None,
        passive: bool = False,
    ) -> Exchange:
        if passive:
            if name == "":  # refused even when passive, as RabbitMQ does
                raise AccessRefused("operation not permitted on the default exchange")
            return self.get_exchange(name)
        check_name("exchange", name)  # other doors than AMQP's (HTTP, definitions, MQTT)
        # RabbitMQ checks the type first, then the name. An unknown type is a
        # channel error (406) as in RabbitMQ 3.12.x/3.13 and later (its PR 11214)
        # and LavinMQ; 3.10 closed the whole connection with 503 COMMAND_INVALID.
        cls = exchange_class(type_)
        if cls is None:
            raise PreconditionFailed(f"unknown exchange type '{type_}'")
        if name == "":
            raise AccessRefused("operation not permitted on the default exchange")
        arguments = arguments or {}
        existing = self.exchanges.get(name)
        if existing is not None:
            # RabbitMQ checks the reserved prefix only when creating: an equivalent
            # redeclaration of amq.direct & co succeeds.
            check_exchange_equivalent(
                self.name, existing, type_, durable, auto_delete, internal, arguments
            )
            return existing
        if name.startswith("amq."):
            raise AccessRefused(f"exchange name '{name}' contains reserved prefix 'amq.*'")
        ae = arguments.get("alternate-exchange")
        if ae is not None and wire_type(arguments, "alternate-exchange") != "longstr":
            raise PreconditionFailed(
                f"invalid type '{wire_type(arguments, 'alternate-exchange')}' "
                "for arg 'alternate-exchange' in "
                f"exchange '{name}' in vhost '{self.name}'"
            )
        try:  # a delayed exchange opens its store (and directory)
            ex = self.new_exchange(cls, name, durable, auto_delete, internal, arguments)
        except OSError as exc:
            log.error("vhost '%s': cannot create exchange '%s': %s", self.name, name, exc)
            raise ResourceError(
                f"cannot create exchange '{name}' in vhost '{self.name}': {exc.strerror or exc}"
            ) from None
        self.records.exchange_declared(ex)  # before it exists (see DurableRecords)
        self.exchanges[name] = ex
        self.policy_rules.attach_exchange(ex)
        log.debug("exchange declared vhost=%s name=%s type=%s", self.name, name, type_)
        self.notices.exchange_created(ex)
        return ex

    def delete_exchange(self, name: str, if_unused: bool = False) -> None:
        if name == "":
            raise AccessRefused("operation not permitted on the default exchange")
        if name.startswith("amq."):
            raise AccessRefused(
                f"deletion of system exchange '{name}' in vhost '{self.name}' not allowed"
            )
        ex = self.exchanges.get(name)
        if ex is None:
            return  # RabbitMQ treats deleting a missing exchange as success
        if if_unused and ex.bindings:
            raise PreconditionFailed(f"exchange '{name}' in vhost '{self.name}' in use")
        self._remove_exchange(ex)

    def _remove_exchange(self, ex: Exchange) -> None:
        self.records.exchange_deleted(ex)
        ex.deleted = True
        ex.discard()
        self.exchanges.pop(ex.name, None)
        for binding in list(ex.bindings.values()):
            self._drop_binding(binding, cascade=False)
        for binding in list(self._inbound.get(id(ex), {}).values()):
            self._drop_binding(binding)
        self._inbound.pop(id(ex), None)
        log.debug("exchange deleted vhost=%s name=%s", self.name, ex.name)
        self.notices.exchange_deleted(ex.name)

    # -- queues -----------------------------------------------------------------------
    def get_queue(self, name: str, owner: object | None = None) -> Queue:
        q = self.queues.get(name)
        if q is None:
            raise NotFound(f"no queue '{name}' in vhost '{self.name}'")
        self.exclusive.check(q, owner)
        return q

    def declare_queue(
        self,
        name: str,
        durable: bool = True,
        exclusive: bool = False,
        auto_delete: bool = False,
        arguments: dict[str, Any] | None = None,
        passive: bool = False,
        owner: object | None = None,
    ) -> Queue:
        if passive:
            found = self.get_queue(name, owner)
            if found.declare_renews:
                found.touch()
            return found
        check_name("queue", name)  # other doors than AMQP's (HTTP, definitions, MQTT)
        self.queues_declared += 1
        if not name:
            for kind, module in ((is_stream, "stream"), (is_quorum, "quorum")):
                if kind(arguments or {}):
                    raise PreconditionFailed(
                        f"Cannot declare a server-named queue for type rabbit_{module}_queue"
                    )
            name = server_named()
        elif name.startswith("amq."):
            raise AccessRefused(f"queue name '{name}' contains reserved prefix 'amq.*'")
        arguments = arguments or {}
        existing = self.queues.get(name)
        if existing is not None:
            # RabbitMQ checks exclusivity strictly, before equivalence: the owner
            # must match, and a mismatched exclusive flag is 405, not 406.
            if existing.exclusive_owner is not (owner if exclusive else None):
                raise self.exclusive.locked(name)
            check_queue_equivalent(self.name, existing, durable, exclusive, auto_delete, arguments)
            if existing.declare_renews:
                existing.touch()
            return existing
        # Only a new queue counts against the limit and has its arguments
        # validated (RabbitMQ's order).
        self.limiter.check_queue_limit(name)
        stream = is_stream(arguments)
        quorum = not stream and is_quorum(arguments)
        if stream:
            validate_stream_declaration(name, self.name, durable, exclusive, auto_delete, arguments)
        elif quorum:
            validate_quorum_declaration(name, self.name, durable, exclusive, auto_delete, arguments)
        else:
            validate_queue_arguments(name, self.name, arguments)
        persistent = stream or (durable and not exclusive)
        try:
            q = self.new_queue(
                name,
                arguments,
                durable=durable,
                auto_delete=auto_delete,
                owner=owner if exclusive else None,
                persistent=persistent,
            )
        except OSError as exc:  # its directory or files could not be made
            log.error("vhost '%s': cannot create queue '%s': %s", self.name, name, exc)
            raise ResourceError(
                f"cannot create queue '{name}' in vhost '{self.name}': {exc.strerror or exc}"
            ) from None
        if persistent:
            self.records.queue_declared(q)  # before it exists (see DurableRecords)
        self.queues[name] = q
        self.queues_created += 1
        self.exclusive.add(q)
        self.policy_rules.attach_queue(q)
        log.debug("queue declared vhost=%s name=%s durable=%s", self.name, name, durable)
        self.notices.queue_created(q, exclusive)
        return q

    def new_queue(
        self,
        name: str,
        arguments: dict[str, Any],
        *,
        durable: bool = True,
        auto_delete: bool = False,
        owner: object | None = None,
        persistent: bool = True,
    ) -> Queue:
        """A queue of the type its arguments ask for, with its store (not yet in the
        vhost: declare_queue and the lifecycle's restore add it)."""
        if is_stream(arguments):
            return StreamQueue(self, name, self.stores.stream_log(name, arguments), arguments)
        if is_quorum(arguments):
            return QuorumQueue(self, name, self.stores.queue_store(name, True, QUORUM), arguments)
        store = self.stores.queue_store(name, persistent, max_priority(arguments))
        return Queue(
            self,
            name,
            store,
            durable=durable,
            exclusive_owner=owner,
            auto_delete=auto_delete,
            arguments=arguments,
        )

    def delete_queue(
        self,
        name: str,
        if_unused: bool = False,
        if_empty: bool = False,
        owner: object | None = None,
    ) -> int:
        q = self.queues.get(name)
        if q is None:
            return 0  # deleting a missing queue succeeds, as in RabbitMQ
        if owner is not None:
            self.exclusive.check(q, owner)
        if (if_unused or if_empty) and q.queue_type == "quorum":
            raise NotImplemented_(
                f"cannot delete queue '{name}' in vhost '{self.name}'. queue.delete operations "
                f"with {'if-unused' if if_unused else 'if-empty'} flag set are not supported "
                "by quorum queues"
            )
        stream = isinstance(q, StreamQueue)
        # RabbitMQ deletes a stream whatever if-unused and if-empty say, and counts
        # none of its messages in delete-ok.
        if if_unused and q.consumers and not stream:
            raise PreconditionFailed(f"queue '{name}' in vhost '{self.name}' in use")
        if if_empty and q.message_count and not stream:
            raise PreconditionFailed(f"queue '{name}' in vhost '{self.name}' not empty")
        count = 0 if stream else q.message_count
        self.records.queue_deleted(q)
        self.queues.pop(name, None)
        self.queues_deleted += 1
        gone = self.deleted_queue_stats.get(q.queue_module)
        if gone is None:
            gone = self.deleted_queue_stats[q.queue_module] = MessageStats()
        gone.add(q.stats)
        for binding in list(self._inbound.get(id(q), {}).values()):
            self._drop_binding(binding)
        self._inbound.pop(id(q), None)
        consumers = q.mark_deleted()
        if consumers:
            # As RabbitMQ: the cancel notifications follow whatever reply the
            # deleting call sends (queue.delete-ok), even on the same channel.
            self.call_soon(lambda: _notify_cancelled(consumers))
        log.debug("queue deleted vhost=%s name=%s", self.name, name)
        self.notices.queue_deleted(name)
        return count

    def new_exchange(
        self,
        cls: type[Exchange],
        name: str,
        durable: bool,
        auto_delete: bool,
        internal: bool,
        arguments: dict[str, Any],
    ) -> Exchange:
        """An exchange attached to this vhost (not yet in it: declare_exchange and the
        lifecycle's restore add it)."""
        ex = cls(self.name, name, durable, auto_delete, internal, arguments)
        ex.attach(self)
        return ex

    # -- bindings ---------------------------------------------------------------------
    def add_restored_binding(self, binding: Binding) -> None:
        """Put back a binding read from the definitions log (VHostLifecycle)."""
        if binding.source.bind(binding):
            self._inbound.setdefault(id(binding.destination), {})[
                (id(binding.source), binding.key)
            ] = binding

    def bind(
        self,
        source: Exchange,
        destination: Queue | Exchange,
        routing_key: str,
        arguments: dict[str, Any] | None = None,
    ) -> Binding:
        if source is self.default_exchange or destination is self.default_exchange:
            raise AccessRefused("operation not permitted on the default exchange")
        source.validate_binding(routing_key, arguments)
        binding = Binding(source, destination, routing_key, arguments)
        existing = source.bindings.get(binding.key)
        if existing is not None:
            return existing
        self.records.binding_added(binding)
        source.bind(binding)
        self._inbound.setdefault(id(destination), {})[(id(source), binding.key)] = binding
        self.notices.binding_created(binding)
        return binding

    def bind_queue(
        self,
        exchange: str,
        queue: str,
        routing_key: str,
        arguments: dict[str, Any] | None,
        owner: object | None,
    ) -> Binding:
        """A queue binding, whoever asks (0-9-1's queue.bind, the HTTP API, AMQP
        1.0's /management; their permission checks come first): RabbitMQ's order,
        the exchange, then the queue must exist, then the binding be valid; only
        then is the queue's exclusivity checked (``owner`` None: the HTTP API's,
        no connection, which binds any queue)."""
        ex = self.get_exchange(exchange)
        q = self.queues.get(queue)
        if q is None:
            raise NotFound(f"no queue '{queue}' in vhost '{self.name}'")
        ex.validate_binding(routing_key, arguments)
        if owner is not None:
            self.get_queue(queue, owner)
        return self.bind(ex, q, routing_key, arguments)

    def unbind(
        self,
        source: Exchange,
        destination: Queue | Exchange,
        routing_key: str,
        arguments: dict[str, Any] | None = None,
    ) -> bool:
        if source is self.default_exchange or destination is self.default_exchange:
            raise AccessRefused("operation not permitted on the default exchange")
        binding = source.find_binding(destination, routing_key, arguments)
        if binding is None:
            return False
        self._drop_binding(binding)
        return True

    def _drop_binding(self, binding: Binding, cascade: bool = True) -> None:
        source = binding.source
        self.records.binding_dropped(binding)
        source.unbind(binding.key)
        inbound = self._inbound.get(id(binding.destination))
        if inbound is not None:
            inbound.pop((id(source), binding.key), None)
        self.notices.binding_deleted(binding)
        if cascade and source.auto_delete and not source.bindings and not source.deleted:
            self._remove_exchange(source)

    # -- services for exchanges that hold messages ---------------------------------------
    def exchange_store(self, exchange: str, persistent: bool) -> MessageStore:
        """VHostStores.exchange_store (x-delayed-message's held messages)."""
        return self.stores.exchange_store(exchange, persistent)

    # -- connection cleanup -----------------------------------------------------------
    def delete_exclusive_queues(self, owner: object) -> None:
        """Delete the exclusive queues of ``owner``, a closing connection."""
        for name in self.exclusive.take(owner):
            self.delete_queue(name)


def _notify_cancelled(consumers: list[Consumer]) -> None:
    for consumer in consumers:
        consumer.cancelled()
