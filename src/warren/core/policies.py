"""Policies and operator policies: validation, matching and merging as RabbitMQ 3.10 does.

A policy applies optional arguments to the queues and exchanges whose name its
pattern matches. One policy and at most one operator policy apply to an object:
the matching one of highest priority. Operator policies may set only a few
numeric queue limits; where both set one, the lower value wins.

The rules and texts follow RabbitMQ 3.10's ``rabbit_policy.erl`` (matching,
merging), ``rabbit_policies.erl`` (the value checks), ``rabbit_mirror_queue_misc``
and ``rabbit_queue_location_validator`` (the ``ha-*`` and
``queue-master-locator`` keys, accepted and checked but without effect in
Warren), and ``rabbit_amqqueue_process.erl`` (how a classic queue combines a
policy with its own ``x-`` arguments, :func:`effective_queue_settings`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from warren.core.runtime_parameters import ValidationFailed, is_int, json_p

__all__ = [
    "APPLY_TO",
    "CLASSIC_UNSUPPORTED_KEYS",
    "OPERATOR_POLICY_KEYS",
    "POLICY_KEYS",
    "QUEUE_SETTING_KEYS",
    "QUORUM_UNSUPPORTED_KEYS",
    "Policy",
    "best_match",
    "effective_definition",
    "effective_queue_settings",
    "policy_value",
    "validate_policy",
]

#: The apply-to values: RabbitMQ 3.10's three, and the queue types' names that
#: 3.12 and 4.x take too (rabbit_policy:apply_to_validation/2).
APPLY_TO = ("all", "exchanges", "queues", "classic_queues", "quorum_queues", "streams")
#: A queue type's own apply-to value (its policy_apply_to_name/0 in RabbitMQ).
_TYPE_APPLY_TO = {"classic": "classic_queues", "quorum": "quorum_queues", "stream": "streams"}

_MAX_SEGMENT_SIZE = 3_000_000_000  # ?MAX_STREAM_MAX_SEGMENT_SIZE in rabbit.hrl
_MAX_AGE = re.compile(r"([0-9]*)(.*)", re.DOTALL)
_MAX_AGE_UNITS = ("Y", "M", "D", "h", "m", "s")


def _check(ok: Callable[[Any], bool], text: str) -> Callable[[Any], str | None]:
    return lambda value: None if ok(value) else f"{json_p(value)} {text}"


def _int_at_least(low: int) -> Callable[[Any], bool]:
    return lambda v: is_int(v) and v >= low


def _one_of(*choices: Any) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, str) and v in choices


def _valid_max_age(value: Any) -> bool:
    # rabbit_amqqueue:check_max_age/1; RabbitMQ crashes on a non-string or a
    # value without digits where Warren reports the value as invalid.
    if not isinstance(value, str):
        return False
    m = _MAX_AGE.match(value)
    assert m is not None
    digits, unit = m.groups()
    return bool(digits) and int(digits) > 0 and unit in _MAX_AGE_UNITS


# rabbit_policies:validate_policy0/2, one check per key.
_CORE_CHECKS: dict[str, Callable[[Any], str | None]] = {
    "alternate-exchange": _check(
        lambda v: isinstance(v, str), "is not a valid alternate exchange name"
    ),
    "dead-letter-exchange": _check(
        lambda v: isinstance(v, str), "is not a valid dead letter exchange name"
    ),
    "dead-letter-routing-key": _check(
        lambda v: isinstance(v, str), "is not a valid dead letter routing key"
    ),
    "dead-letter-strategy": _check(
        _one_of("at-most-once", "at-least-once"), "is not a valid dead letter strategy"
    ),
    "message-ttl": _check(_int_at_least(0), "is not a valid message TTL"),
    "expires": _check(_int_at_least(1), "is not a valid queue expiry"),
    "max-length": _check(_int_at_least(0), "is not a valid maximum length"),
    "max-length-bytes": _check(_int_at_least(0), "is not a valid maximum length in bytes"),
    "max-in-memory-length": _check(_int_at_least(0), "is not a valid maximum memory in bytes"),
    "max-in-memory-bytes": _check(_int_at_least(0), "is not a valid maximum memory in bytes"),
    "queue-mode": _check(_one_of("default", "lazy"), "is not a valid queue-mode value"),
    "queue-version": _check(
        lambda v: is_int(v) and v in (1, 2), "is not a valid queue-version value"
    ),
    "overflow": _check(
        _one_of("drop-head", "reject-publish", "reject-publish-dlx"),
        "is not a valid overflow value",
    ),
    # RabbitMQ 4.x: a negative limit lifts a quorum queue's default one.
    "delivery-limit": _check(is_int, "is not a valid delivery limit"),
    "max-age": _check(_valid_max_age, "is not a valid max age"),
    "stream-max-segment-size-bytes": _check(
        lambda v: is_int(v) and 0 <= v <= _MAX_SEGMENT_SIZE, "is not a valid segment size"
    ),
    "queue-leader-locator": _check(
        _one_of("client-local", "balanced", "random", "least-leaders"),
        "is not a valid queue leader locator value",
    ),
    "initial-cluster-size": _check(_int_at_least(0), "is not a valid cluster size"),
}

# rabbit_federation_parameters:validate_policy/1 (the federation plugin's keys).
_FEDERATION_KEYS = ("federation-upstream-set", "federation-upstream", "federation-upstream-pattern")
for _key in _FEDERATION_KEYS:
    _CORE_CHECKS[_key] = (
        lambda key: lambda v: None
        if isinstance(v, str)
        else f"{key} should be binary, actually was {json_p(v)}"
    )(_key)

_HA_KEYS = (
    "ha-mode",
    "ha-params",
    "ha-sync-mode",
    "ha-sync-batch-size",
    "ha-promote-on-shutdown",
    "ha-promote-on-failure",
)
_QUEUE_MASTER_LOCATOR = "queue-master-locator"

#: Every key a policy may set in RabbitMQ 3.10 (core, mirroring, master locator).
POLICY_KEYS = frozenset(_CORE_CHECKS) | frozenset(_HA_KEYS) | {_QUEUE_MASTER_LOCATOR}

#: The keys an operator policy may set (rabbit_policies: operator_policy_validator).
OPERATOR_POLICY_KEYS = frozenset(
    {
        "expires",
        "message-ttl",
        "max-length",
        "max-length-bytes",
        "max-in-memory-length",
        "max-in-memory-bytes",
        "delivery-limit",
    }
)

#: Keys merged by taking the lower value when a policy and an operator policy
#: both set them (the policy_merge_strategy registrations in rabbit_policies).
_MIN_MERGED = OPERATOR_POLICY_KEYS

#: A policy setting any of these does not apply to a classic queue at all
#: (rabbit_classic_queue:capabilities/0, unsupported_policies, checked by
#: rabbit_policy:matches/2 through rabbit_queue_type:is_policy_applicable/2).
#: Unlike RabbitMQ's classic queues, Warren's queues honour delivery-limit, so
#: a policy setting it applies (it is not in this set).
CLASSIC_UNSUPPORTED_KEYS = frozenset(
    {
        "max-age",
        "stream-max-segment-size-bytes",
        "queue-leader-locator",
        "initial-cluster-size",
        "dead-letter-strategy",
    }
)

#: A policy setting any of these applies to no quorum queue
#: (rabbit_quorum_queue:capabilities/0, unsupported_policies).
QUORUM_UNSUPPORTED_KEYS = frozenset(
    {
        "max-priority",
        "queue-mode",
        *_HA_KEYS,
        _QUEUE_MASTER_LOCATOR,
        "max-age",
        "stream-max-segment-size-bytes",
        "initial-cluster-size",
    }
)

_NONE = object()  # Erlang's 'none': a key the definition does not set


def _ha_p(value: Any) -> str:
    return "none" if value is _NONE else json_p(value)


def _ha_params_error(mode: str, params: Any) -> str | None:
    """The ha-params check of the ha-mode's module (rabbit_mirror_queue_mode_*)."""
    if mode == "all":
        return None if params is _NONE else 'ha-mode="all" does not take parameters'
    if mode == "exactly":
        if is_int(params) and params > 0:
            return None
        return f'ha-mode="exactly" takes an integer, {_ha_p(params)} given'
    if isinstance(params, list):
        if not params:
            return 'ha-mode="nodes" list must be non-empty'
        bad = [p for p in params if not isinstance(p, str)]
        if bad:
            return f'ha-mode="nodes" takes a list of strings, {json_p(bad)} was not a string'
        return None
    return f'ha-mode="nodes" takes a list, {_ha_p(params)} given'


def _ha_error(definition: Mapping[str, Any]) -> str | None:
    """rabbit_mirror_queue_misc:validate_policy/1."""
    mode, params, sync_mode, batch, on_shutdown, on_failure = (
        definition.get(k, _NONE) for k in _HA_KEYS
    )
    if mode is _NONE:
        return (
            "ha-mode must be specified to specify ha-params, ha-sync-mode or ha-promote-on-shutdown"
        )
    if mode not in ("all", "exactly", "nodes"):
        return f"{json_p(mode)} is not a valid ha-mode value"
    error = _ha_params_error(mode, params)
    if error is not None:
        return error
    if sync_mode is not _NONE and sync_mode not in ("automatic", "manual"):
        return f'ha-sync-mode must be "manual" or "automatic", got {json_p(sync_mode)}'
    if batch is not _NONE and not (is_int(batch) and batch > 0):
        return f"ha-sync-batch-size takes an integer greater than 0, {json_p(batch)} given"
    for key, value in (
        ("ha-promote-on-shutdown", on_shutdown),
        ("ha-promote-on-failure", on_failure),
    ):
        if value is not _NONE and value not in ("always", "when-synced"):
            return f'{key} must be "always" or "when-synced", got {json_p(value)}'
    return None


def _definition_error(definition: Any, operator: bool) -> str | None:
    """rabbit_policy:validation/3: the definition's keys, each checked by its validator."""
    if isinstance(definition, list):
        if not definition:
            return "no policy provided"
        return f"definition must be a dictionary: {json_p(definition)}"
    if not isinstance(definition, dict):
        validator = "operator_policy_validator" if operator else "policy_validator"
        return (
            f"parse error while reading policy definition: {json_p(definition)}. "
            f"Validator: {validator}."
        )
    if not definition:
        return "no policy provided"
    allowed = OPERATOR_POLICY_KEYS if operator else POLICY_KEYS
    # RabbitMQ sees the keys in sorted order; the first bad value is reported.
    for key in sorted(definition):
        if key in allowed and key in _CORE_CHECKS:
            error = _CORE_CHECKS[key](definition[key])
            if error is not None:
                return error
    if not operator:
        if any(key in definition for key in _HA_KEYS):
            error = _ha_error(definition)
            if error is not None:
                return error
        if _QUEUE_MASTER_LOCATOR in definition:
            locator = definition[_QUEUE_MASTER_LOCATOR]
            if locator not in ("min-masters", "client-local", "random"):
                return f"{json_p(locator)} invalid queue-master-locator value"
    if not operator and sum(k in definition for k in _FEDERATION_KEYS) > 1:
        return (
            "cannot specify federation-upstream, federation-upstream-set or "
            "federation-upstream-pattern together"
        )
    unknown = [(k, definition[k]) for k in sorted(definition) if k not in allowed]
    if unknown:
        return f"{json_p(unknown)} are not recognised policy settings"
    return None


def _pattern_error(pattern: Any) -> tuple[re.Pattern[str] | None, str | None]:
    if not isinstance(pattern, str):
        return None, f"pattern should be a binary but was {json_p(pattern)}"
    try:
        return re.compile(pattern), None
    except re.error as exc:
        # RabbitMQ shows PCRE's message and offset; Python's are close, not equal.
        reason = f'{{"{exc.msg}",{exc.pos or 0}}}'
        return None, f"pattern should be regular expression but is invalid: {reason}"


@dataclass(frozen=True)
class Policy:
    """A validated policy or operator policy of one vhost.

    Build one with :func:`validate_policy`. ``definition`` holds JSON values
    under RabbitMQ's policy keys (``message-ttl``, ``alternate-exchange`` ...).
    """

    name: str
    pattern: str
    definition: dict[str, Any]
    priority: int = 0
    apply_to: str = "all"
    operator: bool = False
    regex: re.Pattern[str] = field(compare=False, repr=False, default=re.compile(""))

    def __hash__(self) -> int:
        return hash((self.name, self.operator, self.pattern, self.priority))

    def get(self, key: str, default: Any = None) -> Any:
        return self.definition.get(key, default)

    def matches(self, kind: str, name: str, queue_type: str = "classic") -> bool:
        """Whether this policy applies to the ``kind`` ("queue" or "exchange") named ``name``.

        The pattern is searched for anywhere in the name (``re:run``), and a
        policy setting a key the queue's type does not support applies to no
        queue of that type (quorum queues: QUORUM_UNSUPPORTED_KEYS; the others
        are classic queues here).
        """
        apply_to = self.apply_to
        if apply_to not in ("all", kind + "s") and (
            kind != "queue" or apply_to != _TYPE_APPLY_TO.get(queue_type)
        ):
            return False
        if kind == "queue":
            unsupported = (
                QUORUM_UNSUPPORTED_KEYS if queue_type == "quorum" else CLASSIC_UNSUPPORTED_KEYS
            )
            if not unsupported.isdisjoint(self.definition):
                return False
        return self.regex.search(name) is not None

    def as_json(self) -> dict[str, Any]:
        """The fields RabbitMQ lists and exports (without the vhost)."""
        return {
            "name": self.name,
            "pattern": self.pattern,
            "apply-to": self.apply_to,
            "definition": dict(self.definition),
            "priority": self.priority,
        }


def validate_policy(
    name: str,
    pattern: Any,
    definition: Any,
    priority: Any = 0,
    apply_to: Any = "all",
    *,
    operator: bool = False,
) -> Policy:
    """A Policy, or ValidationFailed with RabbitMQ's explanations in its order.

    RabbitMQ checks the definition, apply-to, pattern and priority, and
    reports every failing one, last checked first.
    """
    errors: list[str] = []
    if not isinstance(priority, int | float) or isinstance(priority, bool):
        errors.append(f"priority should be a number, actually was {json_p(priority)}")
    regex, error = _pattern_error(pattern)
    if error is not None:
        errors.insert(0, error)
    if apply_to not in APPLY_TO:
        shown = apply_to if isinstance(apply_to, str) else json_p(apply_to)
        errors.insert(  # 4.x's text (3.10: "should be 'queues', 'exchanges' or 'all'")
            0,
            f"apply-to '{shown}' unrecognised; should be one of: 'queues', "
            "'classic_queues',  'quorum_queues', 'streams', 'exchanges', or 'all'",
        )
    error = _definition_error(definition, operator)
    if error is not None:
        errors.insert(0, error)
    if errors:
        raise ValidationFailed(errors)
    assert regex is not None
    return Policy(
        name=name,
        pattern=pattern,
        definition=dict(definition),
        priority=priority,
        apply_to=apply_to,
        operator=operator,
        regex=regex,
    )


def best_match(
    policies: Iterable[Policy], kind: str, name: str, queue_type: str = "classic"
) -> Policy | None:
    """The matching policy of highest priority.

    RabbitMQ breaks a tie between equal priorities by its table's hash order
    (neither name nor insertion order); Warren takes the first name in
    sorted order, so the choice is at least stable.
    """
    best: Policy | None = None
    for p in policies:
        if not p.matches(kind, name, queue_type):
            continue
        if (
            best is None
            or p.priority > best.priority
            or (p.priority == best.priority and p.name < best.name)
        ):
            best = p
    return best


def _merge(key: str, value: Any, op_value: Any) -> Any:
    """rabbit_policy:merge_policy_value/3: the lower value for the numeric limits."""
    # Only the numeric limits can be in both; for anything else (booleans in
    # RabbitMQ's code) the operator policy's value is taken.
    return min(value, op_value) if key in _MIN_MERGED else op_value


def policy_value(key: str, policy: Policy | None, operator_policy: Policy | None) -> Any:
    """rabbit_policy:get/2: ``key`` of the policy and operator policy together, or None."""
    value = None if policy is None else policy.definition.get(key)
    op_value = None if operator_policy is None else operator_policy.definition.get(key)
    if value is None:
        return op_value
    if op_value is None:
        return value
    return _merge(key, value, op_value)


def effective_definition(
    policy: Policy | None, operator_policy: Policy | None
) -> dict[str, Any] | None:
    """rabbit_policy:merge_operator_definitions/2 (the management API's
    ``effective_policy_definition``); None when neither applies."""
    if policy is None and operator_policy is None:
        return None
    keys = set(policy.definition if policy else ()) | set(
        operator_policy.definition if operator_policy else ()
    )
    return {key: policy_value(key, policy, operator_policy) for key in sorted(keys)}


def _resolve_min(policy_value: Any, arg_value: Any) -> Any:
    return min(policy_value, arg_value)


def _resolve_delivery_limit(policy_value: Any, arg_value: Any) -> Any:
    """RabbitMQ 4.x's quorum queues (resolve_delivery_limit): when either is
    negative (no limit) the higher wins, so a limit set on one side beats -1 on
    the other; otherwise the lower. An argument that is not an integer is ignored."""
    if not is_int(arg_value):
        return policy_value
    if policy_value < 0 or arg_value < 0:
        return max(policy_value, arg_value)
    return min(policy_value, arg_value)


def _resolve_arg(policy_value: Any, arg_value: Any) -> Any:
    return arg_value


def _resolve_policy(policy_value: Any, arg_value: Any) -> Any:
    return policy_value


#: How a queue's own ``x-<key>`` argument and the (merged) policy value combine
#: when both are set, per key:
#:
#: ==========================  ==============  ==========================================
#: key                         both set        from RabbitMQ 3.10
#: ==========================  ==============  ==========================================
#: expires                     lower value     rabbit_amqqueue_process:process_args_policy
#: message-ttl                 lower value     (res_min)
#: max-length                  lower value     (res_min)
#: max-length-bytes            lower value     (res_min)
#: dead-letter-exchange        argument        (res_arg)
#: dead-letter-routing-key     argument        (res_arg)
#: overflow                    argument        (res_arg)
#: delivery-limit              lower value     rabbit_quorum_queue (4.x: the higher
#:                                             when one is negative, no limit)
#: dead-letter-strategy        argument        rabbit_quorum_queue
#: max-age                     policy          rabbit_stream_queue (policy_precedence)
#: ==========================  ==============  ==========================================
_RESOLVE: dict[str, Callable[[Any, Any], Any]] = {
    "expires": _resolve_min,
    "dead-letter-exchange": _resolve_arg,
    "dead-letter-routing-key": _resolve_arg,
    "message-ttl": _resolve_min,
    "max-length": _resolve_min,
    "max-length-bytes": _resolve_min,
    "overflow": _resolve_arg,
    "delivery-limit": _resolve_delivery_limit,
    "dead-letter-strategy": _resolve_arg,
    "max-age": _resolve_policy,
}

#: The keys :func:`effective_queue_settings` reports.
QUEUE_SETTING_KEYS = tuple(_RESOLVE)


def _plain(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return value


def effective_queue_settings(
    arguments: Mapping[str, Any], policy: Policy | None, operator_policy: Policy | None
) -> dict[str, Any]:
    """What a queue with these ``x-`` arguments, policy and operator policy enforces.

    Keys are policy-style (``message-ttl``, ``dead-letter-exchange`` ...); a
    setting neither source gives is absent. Per key, as
    rabbit_queue_type_util:args_policy_lookup/3 does: the policy value is
    first the policy's and operator policy's merged (the lower value wins for
    the numeric limits, rabbit_policy:get/2); then, if the queue has the
    argument too, the table above decides.
    """
    settings: dict[str, Any] = {}
    for key, resolve in _RESOLVE.items():
        pol = policy_value(key, policy, operator_policy)
        arg = _plain(arguments.get("x-" + key))
        if pol is None and arg is None:
            continue
        if pol is None:
            settings[key] = arg
        elif arg is None:
            settings[key] = pol
        else:
            settings[key] = resolve(pol, arg)
    return settings
