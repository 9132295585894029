"""A vhost's durable exchanges, queues and bindings as definitions-log records.

What VHost writes to its DefinitionsLog (store/definitions.py) as they are
declared and deleted, and reads back in ``restore_definitions``: the records'
fields, which bindings are durable enough to be recorded, and
:class:`DurableRecords`, the part of VHost (``vhost.records``) that writes them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from warren.core.errors import BrokerError, PreconditionFailed
from warren.core.exchange import Binding, Exchange
from warren.store.definitions import binding_key, encode_arguments, exchange_key, queue_key

if TYPE_CHECKING:
    from warren.core.queue import Queue
    from warren.core.vhost_parameters import DefinitionsWriter

__all__ = [
    "DurableRecords",
    "binding_is_durable",
    "binding_record",
    "exchange_record",
    "queue_record",
]

_T = TypeVar("_T")
_R = TypeVar("_R")


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


def _encoded(obj: _T, record: Callable[[_T], _R]) -> _R:
    """``record(obj)``; arguments that cannot be encoded (nested too deep for a
    field table) refuse the declaration."""
    try:
        return record(obj)
    except (ValueError, TypeError) as exc:
        raise PreconditionFailed(f"cannot store the arguments: {exc}") from None


class DurableRecords:
    """A vhost's durable objects written to its definitions log as they change
    (nothing for a transient vhost). A new object is recorded before the vhost
    holds it: one that cannot be recorded is closed, and must not exist."""

    def __init__(self, writer: DefinitionsWriter) -> None:
        self.writer = writer

    def exchange_declared(self, ex: Exchange) -> None:
        if ex.durable and self.writer.enabled:
            try:
                record = _encoded(ex, exchange_record)
                self.writer.write(f"exchange '{ex.name}'", exchange_key(ex.name), record)
            except BrokerError:
                ex.close()
                raise

    def exchange_deleted(self, ex: Exchange) -> None:
        if ex.durable and self.writer.enabled:
            what = f"the deletion of exchange '{ex.name}'"
            self.writer.write(what, exchange_key(ex.name), None)

    def queue_declared(self, q: Queue) -> None:
        """Record a new persistent queue (its directory stays for the next start
        to judge when this fails)."""
        if self.writer.enabled:
            try:
                self.writer.write(f"queue '{q.name}'", queue_key(q.name), _encoded(q, queue_record))
            except BrokerError:
                q.store.close()
                raise

    def queue_deleted(self, q: Queue) -> None:
        if q.persistent and self.writer.enabled:
            self.writer.write(f"the deletion of queue '{q.name}'", queue_key(q.name), None)

    def binding_added(self, binding: Binding) -> None:
        if self.writer.enabled and binding_is_durable(binding):
            key, record = _encoded(binding, binding_record)
            self.writer.write(f"a binding of exchange '{binding.source.name}'", key, record)

    def binding_dropped(self, binding: Binding) -> None:
        if self.writer.enabled and binding_is_durable(binding):
            what = f"the deletion of a binding of exchange '{binding.source.name}'"
            self.writer.write(what, binding_record(binding)[0], None)
