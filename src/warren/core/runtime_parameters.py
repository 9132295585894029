"""Runtime parameters as RabbitMQ validates them: the shared error and vhost limits.

Policies, operator policies and vhost limits are what RabbitMQ calls runtime
parameters: JSON values set per vhost and checked by a validator before they
take effect. A refused value raises :class:`ValidationFailed` with
RabbitMQ's explanation (``-1 is not a valid maximum length``), whose values
are written as Erlang's ``~p`` writes the decoded JSON (``<<"abc">>`` for a
string, ``null``, ``[{<<"foo">>,1}]``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from warren.core.erlang_format import term_p

__all__ = [
    "LIMIT_KEYS",
    "QUEUE_TYPES",
    "ParameterComponent",
    "ValidationFailed",
    "json_p",
    "limit",
    "validate_default_queue_type",
    "validate_limits",
]

#: The vhost limits RabbitMQ 3.10 knows (rabbit_vhost_limit:vhost_limit_validation/0).
LIMIT_KEYS = ("max-connections", "max-queues")


class ValidationFailed(ValueError):
    """A runtime parameter RabbitMQ would refuse.

    ``errors`` are RabbitMQ's explanations in its order; ``str()`` is the
    text ``rabbitmqctl`` prints (``Validation failed``, a blank line, one
    explanation per line).
    """

    def __init__(self, errors: Iterable[str]) -> None:
        self.errors = list(errors)
        super().__init__("Validation failed\n\n" + "\n".join(self.errors))


def json_p(value: Any) -> str:
    """``~p`` of a JSON value as RabbitMQ decodes it (strings are binaries)."""
    if value is None:
        return "null"
    if isinstance(value, bool | int | float | str | bytes):
        return term_p(value)
    if isinstance(value, tuple):
        return "{" + ",".join(json_p(v) for v in value) + "}"
    if isinstance(value, list):
        return "[" + ",".join(json_p(v) for v in value) + "]"
    if isinstance(value, dict):
        items = sorted(value.items(), key=lambda kv: str(kv[0]))
        return "#{" + ",".join(f"{json_p(k)} => {json_p(v)}" for k, v in items) + "}"
    return repr(value)


def is_int(value: Any) -> bool:
    """An Erlang integer: JSON ``1``, not ``1.0`` and not ``true``."""
    return isinstance(value, int) and not isinstance(value, bool)


def unrecognised(terms: list[tuple[str, Any]], where: str) -> str:
    """rabbit_parameter_validation:proplist/3's text for keys no constraint names."""
    return f"Unrecognised terms {json_p(terms)} in {where}"


def validate_limits(limits: Any) -> dict[str, int]:
    """Check a vhost-limits value as RabbitMQ 3.10 does; the limits as a new dict.

    Both limits are optional integers; a negative one means "no limit" and is
    kept as given, as RabbitMQ keeps it.
    """
    if not isinstance(limits, dict):
        raise ValidationFailed([f"limits not a list {json_p(limits)}"])
    errors: list[str] = []
    for key in LIMIT_KEYS:  # RabbitMQ reports the last constraint's error first
        if key in limits and not is_int(limits[key]):
            errors.insert(0, f"{key} should be a number, actually was {json_p(limits[key])}")
    rest = sorted((k, v) for k, v in limits.items() if k not in LIMIT_KEYS)
    if rest:
        errors.insert(0, unrecognised(rest, "limits"))
    if errors:
        raise ValidationFailed(errors)
    return {key: limits[key] for key in LIMIT_KEYS if key in limits}


#: The queue types a vhost's default_queue_type may name (RabbitMQ's short aliases).
QUEUE_TYPES = ("classic", "quorum", "stream")


def validate_default_queue_type(value: Any) -> str | None:
    """A vhost's ``default_queue_type`` (RabbitMQ 3.11+ vhost metadata) as RabbitMQ
    4.x validates it (rabbit_queue_type:validate_default_queue_type): None when it
    is not set (``undefined``, null); ValueError with RabbitMQ's text otherwise."""
    if value is None or value == "undefined":
        return None
    if value == "":
        raise ValueError("default_queue_type must not be an empty string")
    if isinstance(value, str):
        if value in QUEUE_TYPES:
            return value
        raise ValueError(f"{value} is not a valid queue type")
    raise ValueError(f"{json_p(value)} is not a valid default_queue_type value")


def limit(limits: dict[str, int], key: str) -> int | None:
    """The limit in force for ``key``: None when unset or negative (no limit)."""
    value = limits.get(key)
    if value is None or value < 0:
        return None
    return value


class ParameterComponent(Protocol):
    """A runtime-parameter component beyond policies and limits (``shovel``,
    ``federation-upstream``): it checks a value before it is stored and acts on
    the stored values. The broker keeps them by name (Broker.parameter_components)
    and the core stores their values in the vhost's definitions log."""

    name: str

    def validate(self, vhost: str, name: str, value: Any) -> Any:
        """The value to store, or ValidationFailed with RabbitMQ's texts."""
        ...

    def apply(self, vhost: str, name: str, value: Any | None) -> None:
        """Act on a stored value (at start, and when set); None: it was cleared."""
        ...

    def status(self) -> list[dict[str, Any]]:
        """What the management API reports of what it runs (e.g. /api/shovels)."""
        ...

    def restart(self, vhost: str, name: str) -> bool:
        """Restart what runs for that parameter; whether there was one."""
        ...

    async def close(self) -> None:
        """Stop everything it runs (the broker is stopping)."""
        ...
