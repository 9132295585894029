"""Exchanges: one class per type, each with its own routing function.

An exchange keeps its bindings in the shape its routing function wants (a dict
for direct, a set for fanout, patterns with a result cache for topic), so that
routing a message costs a lookup, not a scan, on the common types.

The plugin types RabbitMQ and LavinMQ ship live in their own modules, and
:func:`exchange_class`, the registry of every type, adds them on first use:

    exchange_consistent_hash.py  x-consistent-hash (rabbitmq_consistent_hash_exchange)
    exchange_delayed.py          x-delayed-message (rabbitmq-delayed-message-exchange)
    exchange_deduplication.py    x-message-deduplication (rabbitmq-message-deduplication)

Any exchange may also deduplicate messages, LavinMQ's way: the argument
``x-message-deduplication: true`` gives it a Deduplicator (dedup.py) that
Router.publish consults before routing. A durable exchange's cache is durable
(its ``key_log``, store/dedup_journal.py), unless the plugin type's
``x-cache-persistence`` says ``memory``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection
from typing import TYPE_CHECKING, Any, ClassVar

from warren.core.dedup import Deduplicator, KeyEntry, KeyLog
from warren.core.destination import EXCHANGE
from warren.core.routing import HeadersMatcher, TopicMatcher, validate_x_match
from warren.core.stats import MessageStats

if TYPE_CHECKING:
    from warren.core.message import Message
    from warren.core.policies import Policy
    from warren.core.queue import Queue
    from warren.core.store import MessageStore
    from warren.core.vhost import VHost


def _args_key(arguments: dict[str, Any] | None) -> tuple[tuple[str, str], ...]:
    """A hashable identity for binding arguments (RabbitMQ compares them by value)."""
    if not arguments:
        return ()
    return tuple(sorted((k, repr(v)) for k, v in arguments.items()))


class Binding:
    __slots__ = ("source", "destination", "routing_key", "arguments", "key")

    def __init__(
        self,
        source: Exchange,
        destination: Queue | Exchange,
        routing_key: str,
        arguments: dict[str, Any] | None,
    ) -> None:
        self.source = source
        self.destination = destination
        self.routing_key = routing_key
        self.arguments = arguments or {}
        self.key = (id(destination), routing_key, _args_key(arguments))

    @property
    def destination_kind(self) -> str:
        return self.destination.destination_kind


class Exchange(ABC):
    type: ClassVar[str] = ""
    destination_kind: ClassVar[str] = EXCHANGE

    def __init__(
        self,
        vhost_name: str,
        name: str,
        durable: bool = True,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> None:
        self.vhost_name = vhost_name
        self.name = name
        self.durable = durable
        self.auto_delete = auto_delete
        self.internal = internal
        self.arguments: dict[str, Any] = arguments or {}
        self.bindings: dict[tuple[Any, ...], Binding] = {}
        self.deleted = False
        #: publish_in / publish_out counters for management and metrics.
        self.stats = MessageStats()
        # The policy that applies, kept current by the vhost (vhost_parameters.py).
        self.policy: Policy | None = None
        # Raises PreconditionFailed for bad x-message-deduplication arguments.
        self.deduplicator = Deduplicator.from_arguments(
            self.arguments, f"exchange '{name}' in vhost '{vhost_name}'"
        )
        #: Where a durable cache's keys go (attach() makes it); None: in memory only.
        self.key_log: KeyLog | None = None
        self._journal: list[KeyEntry] = []  # what key_log had at start

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} in {self.vhost_name!r}>"

    @property
    def alternate_exchange(self) -> str | None:
        """The exchange's own argument if it has one, else its policy's
        (rabbit_policy:get_arg/3)."""
        if "alternate-exchange" in self.arguments:
            ae = self.arguments["alternate-exchange"]
        elif self.policy is not None:
            ae = self.policy.definition.get("alternate-exchange")
        else:
            return None
        if isinstance(ae, bytes):
            ae = ae.decode("utf-8", "replace")
        return ae if isinstance(ae, str) and ae else None

    # Lifecycle hooks for what an exchange holds beyond its bindings: a durable
    # deduplication cache's keys here, held messages in x-delayed-message (whose
    # overrides call these).
    def attach(self, vhost: VHost) -> None:
        """Called once the exchange belongs to ``vhost`` (declared, or restored at
        start): a durable deduplicating exchange gets its cache back."""
        dedup = self.deduplicator
        if dedup is None:
            return
        make = vhost.exchange_key_logs
        if not self.durable or make is None or not self.durable_cache():
            dedup.use_clock(vhost.clock.monotonic_ms)  # in memory: the vhost's clock
            return
        # A durable cache's times must survive a restart: the clock's epoch ms.
        dedup = Deduplicator(dedup.size, dedup.ttl, dedup.header, vhost.clock.now_ms)
        key_log = make(self, dedup)
        self._journal = key_log.load()
        dedup.restore(self._journal)
        self.deduplicator, self.key_log = dedup, key_log

    def restore_routed_keys(self, queues: Collection[Queue]) -> None:
        """At start, once the queues are back: the keys of the messages this exchange
        routed into them that are still there join the journal's. They are durable
        (recovered), but their keys may not be in the journal yet: a kill -9
        before their sync round completed leaves the messages (handed to the OS)
        and no journal entry, and their publishers, never confirmed, send them
        again (docs/storage.md, "Deduplication keys")."""
        dedup = self.deduplicator
        if dedup is None:
            return
        entries = list(self._journal)
        self._journal = []
        for q in queues:
            entries.extend(q.routed_keys(self.name, dedup))
        dedup.restore(entries)

    def durable_cache(self) -> bool:
        """Whether a durable exchange's cache is kept on disk (the plugin type's
        ``x-cache-persistence: memory`` says no)."""
        return True

    def discard(self) -> None:
        """Called when the exchange is deleted: drop whatever it holds."""
        if self.key_log is not None:
            self.key_log.delete()
            self.key_log = None

    def stores(self) -> list[MessageStore]:
        """The stores it keeps messages in (a delayed exchange's), to sync at a stop."""
        return []

    def close(self) -> None:
        """Called when the broker stops: write out whatever it holds."""
        if self.key_log is not None:
            self.key_log.close()

    # Binding management; subclasses index bindings for their routing function.
    def validate_binding(self, routing_key: str, arguments: dict[str, Any] | None) -> None:  # noqa: B027
        """Refuse a binding this type cannot route by; most types take any binding."""

    def bind(self, binding: Binding) -> bool:
        if binding.key in self.bindings:
            return False
        self.bindings[binding.key] = binding
        self._index_add(binding)
        return True

    def unbind(self, binding_key: tuple[Any, ...]) -> Binding | None:
        binding = self.bindings.pop(binding_key, None)
        if binding is not None:
            self._index_remove(binding)
        return binding

    def find_binding(
        self, destination: Queue | Exchange, routing_key: str, arguments: dict[str, Any] | None
    ) -> Binding | None:
        return self.bindings.get((id(destination), routing_key, _args_key(arguments)))

    @abstractmethod
    def _index_add(self, binding: Binding) -> None: ...

    @abstractmethod
    def _index_remove(self, binding: Binding) -> None: ...

    @abstractmethod
    def match(self, msg: Message) -> Collection[Queue | Exchange]:
        """Destinations bound to this exchange that the message goes to."""


class DirectExchange(Exchange):
    type = "direct"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._by_key: dict[str, dict[tuple[Any, ...], Queue | Exchange]] = {}

    def _index_add(self, binding: Binding) -> None:
        self._by_key.setdefault(binding.routing_key, {})[binding.key] = binding.destination

    def _index_remove(self, binding: Binding) -> None:
        dests = self._by_key.get(binding.routing_key)
        if dests is not None:
            dests.pop(binding.key, None)
            if not dests:
                del self._by_key[binding.routing_key]

    def match(self, msg: Message) -> Collection[Queue | Exchange]:
        dests = self._by_key.get(msg.routing_key)
        return dests.values() if dests else ()


class FanoutExchange(Exchange):
    type = "fanout"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._dests: dict[tuple[Any, ...], Queue | Exchange] = {}

    def _index_add(self, binding: Binding) -> None:
        self._dests[binding.key] = binding.destination

    def _index_remove(self, binding: Binding) -> None:
        self._dests.pop(binding.key, None)

    def match(self, msg: Message) -> Collection[Queue | Exchange]:
        return self._dests.values()


class TopicExchange(Exchange):
    type = "topic"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._matcher: TopicMatcher[Queue | Exchange] = TopicMatcher()

    def _index_add(self, binding: Binding) -> None:
        self._matcher.add(binding.routing_key, binding.key, binding.destination)

    def _index_remove(self, binding: Binding) -> None:
        self._matcher.remove(binding.routing_key, binding.key)

    def match(self, msg: Message) -> Collection[Queue | Exchange]:
        return self._matcher.match(msg.routing_key)


class HeadersExchange(Exchange):
    type = "headers"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._matchers: dict[tuple[Any, ...], tuple[HeadersMatcher, Queue | Exchange]] = {}

    def validate_binding(self, routing_key: str, arguments: dict[str, Any] | None) -> None:
        validate_x_match(arguments or {})

    def _index_add(self, binding: Binding) -> None:
        self._matchers[binding.key] = (HeadersMatcher(binding.arguments), binding.destination)

    def _index_remove(self, binding: Binding) -> None:
        self._matchers.pop(binding.key, None)

    def match(self, msg: Message) -> Collection[Queue | Exchange]:
        if not self._matchers:
            return ()
        headers = msg.headers or {}
        return [dest for matcher, dest in self._matchers.values() if matcher.matches(headers)]


class DefaultExchange(DirectExchange):
    """The nameless exchange: every queue is implicitly bound by its own name.

    The vhost resolves the queue itself; this class only refuses explicit bindings.
    """

    type = "direct"


EXCHANGE_TYPES: dict[str, type[Exchange]] = {
    cls.type: cls for cls in (DirectExchange, FanoutExchange, TopicExchange, HeadersExchange)
}


def exchange_class(type_name: str) -> type[Exchange] | None:
    """The class implementing an exchange type, or None for an unknown type."""
    if not _plugin_types_registered:
        _register_plugin_types()
    return EXCHANGE_TYPES.get(type_name)


_plugin_types_registered = False


def _register_plugin_types() -> None:
    """Add the plugin types; they subclass Exchange, so they cannot be imported above."""
    global _plugin_types_registered
    from warren.core.exchange_consistent_hash import ConsistentHashExchange
    from warren.core.exchange_deduplication import DeduplicationExchange
    from warren.core.exchange_delayed import DelayedMessageExchange

    for cls in (ConsistentHashExchange, DelayedMessageExchange, DeduplicationExchange):
        EXCHANGE_TYPES[cls.type] = cls
    _plugin_types_registered = True
