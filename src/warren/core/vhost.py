"""A virtual host: its exchanges, queues and the bindings between them.

All declaration, binding and routing rules that RabbitMQ applies per vhost live
here and in the parts VHost holds, so every protocol adapter gets the same
answers and the same errors: routing and publishing in vhost_routing.py
(``vhost.router``), dead-lettering in vhost_dead_letters.py
(``vhost.dead_letters``), policies and limits in vhost_parameters.py and
restoring at start and closing at stop in vhost_lifecycle.py; the durable
objects' records in vhost_records.py.
"""

from __future__ import annotations

import base64
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from warren.core.clock import Clock, LoopClock
from warren.core.consumer import Consumer
from warren.core.equivalence import check_exchange_equivalent, check_queue_equivalent
from warren.core.errors import (
    AccessRefused,
    BrokerError,
    NotFound,
    NotImplemented_,
    PreconditionFailed,
    ResourceError,
    ResourceLocked,
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
from warren.core.store import MemoryStore, MessageStore
from warren.core.stream import StreamLog
from warren.core.stream_queue import StreamQueue
from warren.core.table_tags import wire_type
from warren.core.vhost_dead_letters import DeadLetters
from warren.core.vhost_lifecycle import VHostLifecycle
from warren.core.vhost_parameters import (
    ComponentParameters,
    DefinitionsWriter,
    Limits,
    Policies,
    VHostMetadata,
)
from warren.core.vhost_records import (
    binding_event,
    binding_is_durable,
    binding_record,
    exchange_event,
    exchange_record,
    queue_record,
)
from warren.core.vhost_routing import ReplyTarget, Router
from warren.store.definitions import exchange_key, queue_key
from warren.store.priority_store import PriorityStore
from warren.store.quorum_store import QuorumPriorityStore

if TYPE_CHECKING:
    from warren.store.definitions import DefinitionsLog

__all__ = [
    "PREDECLARED",
    "ExchangeStoreFactory",
    "StoreFactory",
    "StreamStoreFactory",
    "VHost",
    "server_named",
]

log = logging.getLogger("warren.vhost")

_T = TypeVar("_T")
_R = TypeVar("_R")

PREDECLARED = (
    ("amq.direct", "direct", False),
    ("amq.fanout", "fanout", False),
    ("amq.topic", "topic", False),
    ("amq.headers", "headers", False),
    ("amq.match", "headers", False),
    ("amq.rabbitmq.trace", "topic", True),
)


# (vhost, queue name, persistent, x-max-priority or 0, or QUORUM): persistent stores
# survive a restart; a max priority above 0 asks for a priority store, QUORUM for a
# quorum queue's (two fair priority levels, every message kept whatever its
# delivery-mode).
QUORUM = -1
StoreFactory = Callable[["VHost", str, bool, int], MessageStore]
# (vhost, exchange name, persistent): for exchanges that hold messages (x-delayed-message).
ExchangeStoreFactory = Callable[["VHost", str, bool], MessageStore]
# (vhost, queue name, arguments): a stream queue's storage.
StreamStoreFactory = Callable[["VHost", str, dict[str, Any]], StreamLog]


def _memory_exchange_store(vhost: VHost, name: str, persistent: bool) -> MessageStore:
    return MemoryStore()


def _memory_store(vhost: VHost, name: str, persistent: bool, priorities: int) -> MessageStore:
    if priorities == QUORUM:
        return QuorumPriorityStore(lambda level: MemoryStore())
    if priorities:
        return PriorityStore(priorities, lambda level: MemoryStore())
    return MemoryStore()


def server_named(prefix: str = "amq.gen-") -> str:
    return prefix + base64.urlsafe_b64encode(os.urandom(16)).rstrip(b"=").decode()


class VHost:
    """A vhost's exchanges, queues and bindings, with RabbitMQ's rules for declaring,
    deleting and binding them. Its routing (vhost_routing.py), dead-lettering
    (vhost_dead_letters.py), policies, limits, other components' parameters and
    metadata (vhost_parameters.py) and its restore and close (vhost_lifecycle.py)
    are parts it holds."""

    def __init__(
        self,
        name: str,
        call_soon: Callable[[Callable[[], None]], Any],
        store_factory: StoreFactory = _memory_store,
        definitions: DefinitionsLog | None = None,
        clock: Clock | None = None,
        exchange_store_factory: ExchangeStoreFactory = _memory_exchange_store,
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
        self._store_factory = store_factory
        self._exchange_store_factory = exchange_store_factory
        self._stream_store_factory = stream_store_factory
        # Durable exchanges, queues and bindings are recorded here as they change.
        self.definitions = definitions
        #: Makes a durable deduplicating queue's key journal (KeyLog), given the queue
        #: and its cache: set by the broker; None keeps every cache in memory.
        self.key_logs: Callable[[Any, Any], Any] | None = None
        #: The same for a durable deduplicating exchange, given the exchange.
        self.exchange_key_logs: Callable[[Any, Any], Any] | None = None
        self._written: dict[int, MessageStore] = {}
        self.exchanges: dict[str, Exchange] = {}
        self.queues: dict[str, Queue] = {}
        # The names of the exclusive queues each connection declared (some may
        # be gone): a connection's close finds them without a scan of them all.
        self._exclusive: dict[object, list[str]] = {}
        # Bindings by destination object, so deleting a queue finds its bindings fast.
        self._inbound: dict[int, dict[tuple[Any, ...], Binding]] = {}
        #: Direct reply-to consumers by token (amq.rabbitmq.reply-to.<token>).
        self.reply_targets: dict[str, ReplyTarget] = {}
        # Its runtime parameters (vhost_parameters.py), each recording its changes
        # in the definitions log.
        self._writer = DefinitionsWriter(name, definitions)
        #: Which policy applies to which queue and exchange.
        self.policy_rules = Policies(
            name, self._writer, self.queues, self.exchanges, self.exchange_changed
        )
        #: max-connections, max-queues and the open connections.
        self.limiter = Limits(name, self._writer, self.queues)
        #: Other components' parameters (federation upstreams, ...).
        self.parameters = ComponentParameters(self._writer)
        #: The default queue type.
        self.metadata = VHostMetadata(name, self._writer)
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
        #: Called with (vhost, exchange name) when an exchange appears, goes, gets or
        #: loses a binding or another policy: federation follows them.
        self.exchange_watchers: list[Callable[[VHost, str], None]] = []
        #: The broker's event observers (core/events.py; the broker gives its own).
        self.events = Events()
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
        self.event("policy.set", name=name, pattern=pattern, definition=definition)
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
        self.event("operator.policy.set", name=name, pattern=pattern, definition=definition)
        return policy

    def clear_policy(self, name: str) -> None:
        self.policy_rules.clear_policy(name)
        self.event("policy.cleared", name=name)

    def clear_operator_policy(self, name: str) -> None:
        self.policy_rules.clear_operator_policy(name)
        self.event("operator.policy.cleared", name=name)

    def event(self, event: str, /, **props: Any) -> None:
        """Emit a broker event about this vhost's objects (core/events.py)."""
        if self.events:
            self.events.emit(event, {**props, "vhost": self.name})

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

    def _store(self, what: str, key: str, record: dict[str, Any] | None) -> None:
        """Write a change to the definitions log (DefinitionsWriter.write)."""
        self._writer.write(what, key, record)

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
        if durable and self.definitions is not None:
            # Stored before it exists: a definition that cannot be stored must not.
            try:
                record = self._encoded(ex, exchange_record)
                self._store(f"exchange '{name}'", exchange_key(name), record)
            except BrokerError:
                ex.close()
                raise
        self.exchanges[name] = ex
        self.policy_rules.attach_exchange(ex)
        log.debug("exchange declared vhost=%s name=%s type=%s", self.name, name, type_)
        if self.events:
            self.event("exchange.created", **exchange_event(ex))
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
        if ex.durable and self.definitions is not None:
            self._store(f"the deletion of exchange '{ex.name}'", exchange_key(ex.name), None)
        ex.deleted = True
        ex.discard()
        self.exchanges.pop(ex.name, None)
        for binding in list(ex.bindings.values()):
            self._drop_binding(binding, cascade=False)
        for binding in list(self._inbound.get(id(ex), {}).values()):
            self._drop_binding(binding)
        self._inbound.pop(id(ex), None)
        log.debug("exchange deleted vhost=%s name=%s", self.name, ex.name)
        self.event("exchange.deleted", name=ex.name)
        if self.exchange_watchers:
            self.exchange_changed(ex.name)

    # -- queues -----------------------------------------------------------------------
    def get_queue(self, name: str, owner: object | None = None) -> Queue:
        q = self.queues.get(name)
        if q is None:
            raise NotFound(f"no queue '{name}' in vhost '{self.name}'")
        if q.exclusive_owner is not None and q.exclusive_owner is not owner:
            raise self._locked(name)
        return q

    def _locked(self, name: str) -> ResourceLocked:
        return ResourceLocked(
            f"cannot obtain exclusive access to locked queue '{name}' in vhost '{self.name}'. "
            "It could be originally declared on another connection or the exclusive property "
            "value does not match that of the original declaration."
        )

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
                raise self._locked(name)
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
        if persistent and self.definitions is not None:
            # Stored before the queue exists: a definition that cannot be stored
            # must not exist (its directory stays for the next start to judge).
            try:
                self._store(f"queue '{name}'", queue_key(name), self._encoded(q, queue_record))
            except BrokerError:
                q.store.close()
                raise
        self.queues[name] = q
        self.queues_created += 1
        if q.exclusive_owner is not None:
            self._exclusive.setdefault(q.exclusive_owner, []).append(name)
        self.policy_rules.attach_queue(q)
        log.debug("queue declared vhost=%s name=%s durable=%s", self.name, name, durable)
        self.event(
            "queue.created",
            name=name,
            durable=durable,
            auto_delete=auto_delete,
            exclusive=exclusive,
            type=q.queue_type,
        )
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
            if self._stream_store_factory is None:
                raise PreconditionFailed(
                    f"invalid arg 'x-queue-type' for queue '{name}' in vhost '{self.name}': "
                    "streams need a data directory (this vhost has none)"
                )
            log_ = self._stream_store_factory(self, name, arguments)
            return StreamQueue(self, name, log_, arguments)
        if is_quorum(arguments):
            return QuorumQueue(self, name, self._store_factory(self, name, True, QUORUM), arguments)
        store = self._store_factory(self, name, persistent, max_priority(arguments))
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
        if q.exclusive_owner is not None and owner is not None and q.exclusive_owner is not owner:
            raise self._locked(name)
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
        if q.persistent and self.definitions is not None:
            self._store(f"the deletion of queue '{name}'", queue_key(name), None)
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
        self.event("queue.deleted", name=name)
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
        if self.definitions is not None and binding_is_durable(binding):
            key, record = self._encoded(binding, binding_record)
            self._store(f"a binding of exchange '{source.name}'", key, record)
        source.bind(binding)
        self._inbound.setdefault(id(destination), {})[(id(source), binding.key)] = binding
        if self.exchange_watchers:
            self.exchange_changed(source.name)
        if self.events:
            self.event("binding.created", **binding_event(binding))
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
        if self.definitions is not None and binding_is_durable(binding):
            key = binding_record(binding)[0]
            self._store(f"the deletion of a binding of exchange '{source.name}'", key, None)
        source.unbind(binding.key)
        inbound = self._inbound.get(id(binding.destination))
        if inbound is not None:
            inbound.pop((id(source), binding.key), None)
        if self.events:
            self.event("binding.deleted", **binding_event(binding))
        if self.exchange_watchers and not source.deleted:
            self.exchange_changed(source.name)
        if cascade and source.auto_delete and not source.bindings and not source.deleted:
            self._remove_exchange(source)

    # -- the definitions log ----------------------------------------------------------------
    def _encoded(self, obj: _T, record: Callable[[_T], _R]) -> _R:
        """``record(obj)``: its definitions-log record; arguments that cannot be
        encoded (nested too deep for a field table) refuse the declaration."""
        try:
            return record(obj)
        except (ValueError, TypeError) as exc:
            raise PreconditionFailed(f"cannot store the arguments: {exc}") from None

    def exchange_changed(self, name: str) -> None:
        """Tell the exchange watchers that exchange ``name`` changed."""
        for watcher in list(self.exchange_watchers):
            watcher(self, name)

    # -- services for exchanges that hold messages ---------------------------------------
    def exchange_store(self, exchange: str, persistent: bool) -> MessageStore:
        """A store of the exchange's own (x-delayed-message keeps its held messages there)."""
        return self._exchange_store_factory(self, exchange, persistent)

    # -- store flushing -----------------------------------------------------------------
    def store_written(self, store: MessageStore) -> None:
        """Note a store with buffered writes; all are flushed once at the end of this
        loop turn, so whatever the broker has processed survives a killed process
        without a write syscall per message."""
        if not self._written:
            self.call_soon(self.flush_written)
        self._written[id(store)] = store

    def flush_written(self) -> None:
        stores, self._written = self._written, {}
        for store in stores.values():
            try:
                store.flush()
            except OSError:
                log.exception("vhost '%s': flushing a queue store failed", self.name)

    # -- connection cleanup -----------------------------------------------------------
    def delete_exclusive_queues(self, owner: object) -> None:
        for name in self._exclusive.pop(owner, ()):
            q = self.queues.get(name)
            if q is not None and q.exclusive_owner is owner:
                self.delete_queue(name)


def _notify_cancelled(consumers: list[Consumer]) -> None:
    for consumer in consumers:
        consumer.cancelled()
