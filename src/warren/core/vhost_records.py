"""A vhost's durable exchanges, queues and bindings as definitions-log records.

What VHost writes to its DefinitionsLog (store/definitions.py) as they are
declared and deleted, and reads back in ``restore_definitions``: the records'
fields, and which bindings are durable enough to be recorded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from warren.core.exchange import Binding, Exchange
from warren.store.definitions import binding_key, encode_arguments

if TYPE_CHECKING:
    from warren.core.queue import Queue

__all__ = [
    "binding_event",
    "binding_is_durable",
    "binding_record",
    "exchange_event",
    "exchange_record",
    "queue_record",
]


def binding_is_durable(binding: Binding) -> bool:
    """Whether a binding outlives a restart: its source and destination both do."""
    dest = binding.destination
    if isinstance(dest, Exchange):
        return binding.source.durable and dest.durable
    return binding.source.durable and dest.persistent


def exchange_record(ex: Exchange) -> dict[str, Any]:
    """A durable exchange's record (key: store.definitions.exchange_key)."""
    return {
        "name": ex.name,
        "type": ex.type,
        "auto_delete": ex.auto_delete,
        "internal": ex.internal,
        "arguments": encode_arguments(ex.arguments),
    }


def queue_record(q: Queue) -> dict[str, Any]:
    """A durable queue's record (key: store.definitions.queue_key)."""
    return {
        "name": q.name,
        "auto_delete": q.auto_delete,
        "arguments": encode_arguments(q.arguments),
    }


def binding_record(binding: Binding) -> tuple[str, dict[str, Any]]:
    """A durable binding's key and record."""
    args = encode_arguments(binding.arguments)
    kind = binding.destination_kind
    key = binding_key(
        binding.source.name, kind, binding.destination.name, binding.routing_key, args
    )
    return key, {
        "source": binding.source.name,
        "destination": binding.destination.name,
        "destination_type": kind,
        "routing_key": binding.routing_key,
        "arguments": args,
    }


def exchange_event(ex: Exchange) -> dict[str, Any]:
    """exchange.created's properties (RabbitMQ's event exchange's; core/events.py)."""
    return {
        "name": ex.name,
        "type": ex.type,
        "durable": ex.durable,
        "auto_delete": ex.auto_delete,
        "internal": ex.internal,
        "arguments": ex.arguments,
    }


def binding_event(binding: Binding) -> dict[str, Any]:
    """binding.created's and binding.deleted's properties (RabbitMQ's names)."""
    return {
        "source_name": binding.source.name,
        "source_kind": "exchange",
        "destination_name": binding.destination.name,
        "destination_kind": binding.destination_kind,
        "routing_key": binding.routing_key,
        "arguments": binding.arguments,
    }
