"""A vhost's runtime parameters: policies, operator policies, limits, metadata.

Each is a part :class:`~warren.core.vhost.VHost` holds, with its own small
interface: :class:`Policies` (which policy applies to which queue and
exchange), :class:`Limits` (the limits and the connection/queue decisions every
protocol front end asks for), :class:`ComponentParameters` (other components'
parameters, e.g. federation upstreams), :class:`VHostMetadata` (the default
queue type). They record their changes through a :class:`DefinitionsWriter`,
the vhost's, which refuses a change it cannot store.

Definitions-log records (beside the exchanges' ``e:``, queues' ``q:`` and the
bindings' JSON-array keys): ``policy:<name>``, ``operator_policy:<name>``
(the policy's JSON fields), ``vhost-limits`` (the limits object),
``vhost-metadata`` (``{"default_queue_type": ...}``, RabbitMQ 3.11+'s vhost
metadata the core acts on) and ``parameter:<component>:<name>`` (a component's
parameter: component, name, value; the components themselves are the
broker's, see runtime_parameters).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sized
from typing import TYPE_CHECKING, Any

from warren.core.errors import (
    NotAllowed,
    NotFound,
    QueueLimitReached,
    ResourceError,
)
from warren.core.policies import Policy, best_match, validate_policy
from warren.core.queue_arguments import with_default_type
from warren.core.runtime_parameters import limit, validate_default_queue_type, validate_limits

if TYPE_CHECKING:
    from warren.core.exchange import Exchange
    from warren.core.queue import Queue
    from warren.store.definitions import DefinitionsLog

__all__ = [
    "LIMITS_KEY",
    "METADATA_KEY",
    "OPERATOR_POLICY_PREFIX",
    "POLICY_PREFIX",
    "ComponentParameters",
    "DefinitionsWriter",
    "Limits",
    "Policies",
    "VHostMetadata",
]

log = logging.getLogger("warren.vhost")

POLICY_PREFIX = "policy:"
PARAMETER_PREFIX = "parameter:"
OPERATOR_POLICY_PREFIX = "operator_policy:"
LIMITS_KEY = "vhost-limits"
METADATA_KEY = "vhost-metadata"

#: Called with (what, the record) for a record that cannot be restored.
Failed = Callable[[str, Any, Exception], None]


def _sorted(policies: dict[str, Policy]) -> list[Policy]:
    return sorted(policies.values(), key=lambda p: (-p.priority, p.name))


class DefinitionsWriter:
    """A vhost's changes to its definitions log (None: a transient vhost, nothing kept)."""

    def __init__(self, vhost: str, definitions: DefinitionsLog | None) -> None:
        self.vhost = vhost
        self.definitions = definitions

    @property
    def enabled(self) -> bool:
        return self.definitions is not None

    def write(self, what: str, key: str, record: dict[str, Any] | None) -> None:
        """Write a change (``record`` None: a deletion) to the definitions log, or
        raise ResourceError having changed nothing (a full or failing disk)."""
        defs = self.definitions
        assert defs is not None
        try:
            if record is None:
                defs.delete(key)
            else:
                defs.put(key, record)
        except OSError as exc:
            log.error("vhost '%s': cannot store %s: %s", self.vhost, what, exc)
            raise ResourceError(
                f"cannot store {what} in vhost '{self.vhost}': {exc.strerror or exc}"
            ) from None


class Policies:
    """A vhost's policies and operator policies, and which applies to which of its
    queues and exchanges (given as the vhost's own, live, tables)."""

    def __init__(
        self,
        vhost: str,
        writer: DefinitionsWriter,
        queues: Mapping[str, Queue],
        exchanges: Mapping[str, Exchange],
        exchange_changed: Callable[[str], None],
    ) -> None:
        self._vhost = vhost
        self._writer = writer
        self._queues = queues
        self._exchanges = exchanges
        self._exchange_changed = exchange_changed
        self._policies: dict[str, Policy] = {}
        self._operator_policies: dict[str, Policy] = {}

    @property
    def policies(self) -> list[Policy]:
        """The vhost's policies, highest priority first."""
        return _sorted(self._policies)

    @property
    def operator_policies(self) -> list[Policy]:
        return _sorted(self._operator_policies)

    def set_policy(
        self,
        name: str,
        pattern: str,
        definition: dict[str, Any],
        priority: int = 0,
        apply_to: str = "all",
    ) -> Policy:
        """Add or replace a policy (ValidationFailed with RabbitMQ's texts if invalid);
        every queue and exchange of the vhost is matched again at once."""
        policy = validate_policy(name, pattern, definition, priority, apply_to)
        self._put(policy)
        return policy

    def set_operator_policy(
        self,
        name: str,
        pattern: str,
        definition: dict[str, Any],
        priority: int = 0,
        apply_to: str = "all",
    ) -> Policy:
        policy = validate_policy(name, pattern, definition, priority, apply_to, operator=True)
        self._put(policy)
        return policy

    def clear_policy(self, name: str) -> None:
        """Remove a policy; NotFound("Parameter does not exist") when there is none."""
        self._drop(self._policies, POLICY_PREFIX, name)

    def clear_operator_policy(self, name: str) -> None:
        self._drop(self._operator_policies, OPERATOR_POLICY_PREFIX, name)

    def _put(self, policy: Policy) -> None:
        table, prefix = (
            (self._operator_policies, OPERATOR_POLICY_PREFIX)
            if policy.operator
            else (self._policies, POLICY_PREFIX)
        )
        if table.get(policy.name) == policy:
            return  # RabbitMQ: setting the same value again changes nothing
        if self._writer.enabled:
            self._writer.write(f"policy '{policy.name}'", prefix + policy.name, policy.as_json())
        table[policy.name] = policy
        log.info(
            "vhost '%s': %s '%s' set: pattern '%s', apply-to %s, priority %s, %s",
            self._vhost,
            "operator policy" if policy.operator else "policy",
            policy.name,
            policy.pattern,
            policy.apply_to,
            policy.priority,
            policy.definition,
        )
        self.reapply()

    def _drop(self, table: dict[str, Policy], prefix: str, name: str) -> None:
        if name not in table:
            raise NotFound("Parameter does not exist")
        if self._writer.enabled:
            self._writer.write(f"the deletion of policy '{name}'", prefix + name, None)
        del table[name]
        label = "operator policy" if prefix == OPERATOR_POLICY_PREFIX else "policy"
        log.info("vhost '%s': %s '%s' cleared", self._vhost, label, name)
        self.reapply()

    def match(
        self, queue_name: str, queue_type: str = "classic"
    ) -> tuple[Policy | None, Policy | None]:
        """The policy and operator policy that apply to the queue named ``queue_name``."""
        return (
            best_match(self._policies.values(), "queue", queue_name, queue_type),
            best_match(self._operator_policies.values(), "queue", queue_name, queue_type),
        )

    def attach_queue(self, q: Queue) -> None:
        """Give a new (declared or restored) queue its policies; always called once."""
        q.apply_policies(*self.match(q.name, q.queue_type))

    def attach_exchange(self, ex: Exchange) -> None:
        policy = best_match(self._policies.values(), "exchange", ex.name)
        if policy != ex.policy:
            ex.policy = policy
            self._exchange_changed(ex.name)

    def reapply(self) -> None:
        """Match every queue and exchange again, as rabbit_policy:update_matched_objects
        does: a queue whose policies changed is told through ``apply_policies``."""
        for q in list(self._queues.values()):
            policy, op = self.match(q.name, q.queue_type)
            if policy != q.policy or op != q.operator_policy:
                q.apply_policies(policy, op)
        for ex in self._exchanges.values():
            self.attach_exchange(ex)

    def restore(self, defs: DefinitionsLog, failed: Failed) -> None:
        """Load the policies from the definitions log (before the objects return)."""
        for prefix, operator in ((POLICY_PREFIX, False), (OPERATOR_POLICY_PREFIX, True)):
            for rec in list(defs.entries(prefix)):
                try:
                    policy = validate_policy(
                        rec["name"],
                        rec["pattern"],
                        rec["definition"],
                        rec["priority"],
                        rec["apply-to"],
                        operator=operator,
                    )
                except (KeyError, TypeError, ValueError) as exc:
                    failed("policy", rec, exc)
                    continue
                table = self._operator_policies if operator else self._policies
                table[policy.name] = policy


class ComponentParameters:
    """Other components' parameters stored in the vhost (federation upstreams, ...),
    validated by their component (Broker.set_parameter)."""

    def __init__(self, writer: DefinitionsWriter) -> None:
        self._writer = writer
        self._params: dict[tuple[str, str], Any] = {}

    def items(self, component: str | None = None) -> list[tuple[str, str, Any]]:
        """(component, name, value) of the stored parameters (of one component)."""
        return [
            (comp, name, value)
            for (comp, name), value in sorted(self._params.items())
            if component is None or comp == component
        ]

    def put(self, component: str, name: str, value: Any) -> None:
        """Store a parameter its component has validated."""
        if self._writer.enabled:
            self._writer.write(
                f"parameter '{name}'",
                f"{PARAMETER_PREFIX}{component}:{name}",
                {"component": component, "name": name, "value": value},
            )
        self._params[(component, name)] = value

    def drop(self, component: str, name: str) -> bool:
        """Forget a parameter; whether there was one."""
        if (component, name) not in self._params:
            return False
        if self._writer.enabled:
            key = f"{PARAMETER_PREFIX}{component}:{name}"
            self._writer.write(f"the deletion of parameter '{name}'", key, None)
        del self._params[(component, name)]
        return True

    def restore(self, defs: DefinitionsLog, failed: Failed) -> None:
        for rec in list(defs.entries(PARAMETER_PREFIX)):
            try:
                self._params[(rec["component"], rec["name"])] = rec["value"]
            except (KeyError, TypeError) as exc:
                failed("parameter", rec, exc)


class Limits:
    """A vhost's limits (max-connections, max-queues) and its open connections: the
    decisions a login and a queue declaration ask for."""

    def __init__(self, vhost: str, writer: DefinitionsWriter, queues: Sized) -> None:
        self._vhost = vhost
        self._writer = writer
        self._queues = queues
        self._limits: dict[str, int] | None = None
        self._open_connections: set[object] = set()

    @property
    def limits(self) -> dict[str, int]:
        """The limits as set (a negative value means no limit); empty when none."""
        return dict(self._limits or {})

    @property
    def has_limits(self) -> bool:
        """Whether a limits parameter is set (possibly empty, as RabbitMQ allows)."""
        return self._limits is not None

    def set_limits(self, limits: dict[str, Any]) -> None:
        """Replace the vhost's limits, as ``rabbitmqctl set_vhost_limits`` does.

        ``max-connections`` and ``max-queues`` are integers; 0 allows none, a
        negative value means no limit. Existing connections and queues stay.
        """
        validated = validate_limits(limits)
        if self._writer.enabled:
            self._writer.write("the vhost's limits", LIMITS_KEY, dict(validated))
        self._limits = validated
        log.info("vhost '%s': limits set to %s", self._vhost, self._limits)

    def clear_limits(self, name: str | None = None) -> None:
        """Remove one limit (``name``) or all of them; NotFound when none are set."""
        if self._limits is None:
            raise NotFound("Parameter does not exist")
        if name is not None:
            self.set_limits({k: v for k, v in self._limits.items() if k != name})
            return
        if self._writer.enabled:
            self._writer.write("the deletion of the vhost's limits", LIMITS_KEY, None)
        self._limits = None
        log.info("vhost '%s': limits cleared", self._vhost)

    def _limit(self, key: str) -> int | None:
        return None if self._limits is None else limit(self._limits, key)

    @property
    def connection_count(self) -> int:
        return len(self._open_connections)

    def check_connection_limit(self, username: str) -> None:
        """Refuse one more connection beyond max-connections (530, RabbitMQ's text)."""
        cap = self._limit("max-connections")
        if cap is not None and len(self._open_connections) >= cap:
            raise NotAllowed(
                f"access to vhost '{self._vhost}' refused for user '{username}': "
                f"connection limit ({cap}) is reached"
            )

    def connection_opened(self, conn: object) -> None:
        self._open_connections.add(conn)

    def connection_closed(self, conn: object) -> None:
        self._open_connections.discard(conn)

    def check_queue_limit(self, queue_name: str) -> None:
        """Refuse a new queue beyond max-queues (406, RabbitMQ's text)."""
        cap = self._limit("max-queues")
        if cap is not None and len(self._queues) + 1 > cap:
            raise QueueLimitReached(
                f"cannot declare queue '{queue_name}': "
                f"queue limit in vhost '{self._vhost}' ({cap}) is reached"
            )

    def restore(self, defs: DefinitionsLog, failed: Failed) -> None:
        for rec in list(defs.entries(LIMITS_KEY)):
            try:
                self._limits = validate_limits(rec)
            except ValueError as exc:
                failed("limits", rec, exc)


class VHostMetadata:
    """The vhost metadata the core acts on (RabbitMQ 3.11+): the default queue type."""

    def __init__(self, vhost: str, writer: DefinitionsWriter) -> None:
        self._vhost = vhost
        self._writer = writer
        self._default_queue_type: str | None = None

    @property
    def default_queue_type(self) -> str | None:
        """The type a queue declared without ``x-queue-type`` gets (None: classic)."""
        return self._default_queue_type

    def set_default_queue_type(self, value: Any) -> None:
        """Set (or, with None or ``undefined``, clear) the default queue type;
        ValueError with RabbitMQ's text for a value it would refuse. Queues that
        exist keep their type."""
        dqt = validate_default_queue_type(value)
        if dqt == self._default_queue_type:
            return
        if self._writer.enabled:
            record = None if dqt is None else {"default_queue_type": dqt}
            self._writer.write("the vhost's default queue type", METADATA_KEY, record)
        self._default_queue_type = dqt
        log.info("vhost '%s': default queue type %s", self._vhost, dqt or "not set (classic)")

    def with_default_type(
        self, durable: bool, exclusive: bool, auto_delete: bool, arguments: dict[str, Any]
    ) -> dict[str, Any]:
        """A queue.declare's arguments with the vhost's default queue type, as RabbitMQ
        3.13 augments them (queue_arguments.with_default_type)."""
        return with_default_type(
            self._default_queue_type, durable, exclusive, auto_delete, arguments
        )

    def restore(self, defs: DefinitionsLog, failed: Failed) -> None:
        for rec in list(defs.entries(METADATA_KEY)):
            try:
                self._default_queue_type = validate_default_queue_type(rec["default_queue_type"])
            except (KeyError, TypeError, ValueError) as exc:
                failed("vhost metadata", rec, exc)
