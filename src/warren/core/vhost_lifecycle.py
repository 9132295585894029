"""A vhost's start and stop: its durable objects rebuilt, its stores handed over and closed.

:class:`VHostLifecycle` is a part the :class:`~warren.core.vhost.VHost` holds;
it sees the vhost through :class:`LifecycleHost`, the few members it needs.
At start, ``restore_definitions`` rebuilds the runtime parameters, then the
durable exchanges, queues and bindings from the definitions log (their records:
vhost_records.py), skipping and naming what cannot be applied; at a clean stop,
the broker takes every store and delivered mark to sync them at once, then
``close`` closes the stores and the log.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from warren.core.exchange import Binding, Exchange, exchange_class
from warren.core.queue import Queue
from warren.store.definitions import decode_arguments, exchange_key, queue_key

if TYPE_CHECKING:
    from warren.core.store import MessageStore
    from warren.core.vhost_parameters import (
        ComponentParameters,
        Limits,
        Policies,
        VHostMetadata,
    )
    from warren.store.definitions import DefinitionsLog

__all__ = ["LifecycleHost", "VHostLifecycle"]

log = logging.getLogger("warren.vhost")


class LifecycleHost(Protocol):
    """What the lifecycle needs of its vhost: its tables, its parameter parts, and
    the constructors of its exchanges and queues (which attach them to it)."""

    name: str
    definitions: DefinitionsLog | None
    exchanges: dict[str, Exchange]
    queues: dict[str, Queue]
    policy_rules: Policies
    limiter: Limits
    parameters: ComponentParameters
    metadata: VHostMetadata

    def new_exchange(
        self,
        cls: type[Exchange],
        name: str,
        durable: bool,
        auto_delete: bool,
        internal: bool,
        arguments: dict[str, Any],
    ) -> Exchange: ...

    def new_queue(
        self,
        name: str,
        arguments: dict[str, Any],
        *,
        durable: bool = True,
        auto_delete: bool = False,
        owner: object | None = None,
        persistent: bool = True,
    ) -> Queue: ...

    def add_restored_binding(self, binding: Binding) -> None: ...


class VHostLifecycle:
    """Restoring a vhost's definitions at start; its stores and marks at a clean stop."""

    def __init__(self, host: LifecycleHost) -> None:
        self.host = host

    # -- recovery ---------------------------------------------------------------------
    def restore_definitions(self) -> list[str]:
        """Recreate durable exchanges, queues and bindings from the definitions log.

        A record that cannot be applied is skipped and named in the list returned:
        the broker refuses to start over it, or goes on without it (store/damage.py).
        Its queue's directory stays: the record still claims it.
        """
        host = self.host
        defs = host.definitions
        problems: list[str] = []
        if defs is None:
            return problems
        problems = self.restore_parameters()  # policies first: objects are matched as they return
        for rec in list(defs.entries("e:")):
            try:
                cls = exchange_class(rec["type"])
                if cls is None:
                    raise ValueError(f"unknown exchange type {rec['type']!r}")
                args = decode_arguments(rec["arguments"])
                ex = host.new_exchange(
                    cls, rec["name"], True, rec["auto_delete"], rec["internal"], args
                )
                host.exchanges[rec["name"]] = ex
                host.policy_rules.attach_exchange(ex)
            except Exception as exc:
                log.error("vhost '%s': cannot restore exchange %r: %s", host.name, rec, exc)
                problems.append(f"cannot restore exchange {rec.get('name', rec)!r:.200}: {exc}")
        for rec in list(defs.entries("q:")):
            try:
                name = rec["name"]
                args = decode_arguments(rec["arguments"])
                q = host.new_queue(name, args, auto_delete=rec["auto_delete"])
                host.queues[name] = q
                host.policy_rules.attach_queue(q)
                if q.message_count:
                    q.rebuild_expiry_index()
            except Exception as exc:
                log.error("vhost '%s': cannot restore queue %r: %s", host.name, rec, exc)
                problems.append(f"cannot restore queue {rec.get('name', rec)!r:.200}: {exc}")
        for key, rec in list(defs.live.items()):
            if not key.startswith('["b"'):
                continue
            if self._binding_of_deleted(defs, rec):
                # A delete's leftover: a crash came between the delete of its
                # queue or exchange and of its bindings.
                log.info("vhost '%s': dropping a deleted object's binding %r", host.name, rec)
                defs.delete(key)
                continue
            try:
                source = host.exchanges[rec["source"]]
                dest: Queue | Exchange = (
                    host.queues[rec["destination"]]
                    if rec["destination_type"] == "queue"
                    else host.exchanges[rec["destination"]]
                )
                binding = Binding(
                    source, dest, rec["routing_key"], decode_arguments(rec["arguments"])
                )
                host.add_restored_binding(binding)
            except Exception as exc:
                log.error("vhost '%s': cannot restore binding %r: %s", host.name, rec, exc)
                problems.append(f"cannot restore binding {rec!r:.200}: {exc}")
        queues = [q for q in host.queues.values() if q.persistent]
        for ex in host.exchanges.values():
            if ex.key_log is not None:
                ex.restore_routed_keys(queues)
        return problems

    def restore_parameters(self) -> list[str]:
        """Load policies, parameters, limits and metadata from the definitions log,
        before the queues and exchanges are restored (they are matched as they are
        recreated); what could not be loaded, named."""
        host = self.host
        defs = host.definitions
        problems: list[str] = []
        if defs is None:
            return problems

        def failed(what: str, rec: Any, exc: Exception) -> None:
            log.error("vhost '%s': cannot restore %s %r: %s", host.name, what, rec, exc)
            problems.append(f"cannot restore {what} {rec!r:.200}: {exc}")

        host.policy_rules.restore(defs, failed)
        host.parameters.restore(defs, failed)
        host.limiter.restore(defs, failed)
        host.metadata.restore(defs, failed)
        for ex in host.exchanges.values():
            host.policy_rules.attach_exchange(ex)
        return problems

    @staticmethod
    def _binding_of_deleted(defs: DefinitionsLog, rec: dict[str, Any]) -> bool:
        """Whether a binding record names an end its definitions log shows deleted."""
        try:
            dest = (queue_key if rec["destination_type"] == "queue" else exchange_key)(
                rec["destination"]
            )
            return exchange_key(rec["source"]) in defs.deleted or dest in defs.deleted
        except (KeyError, TypeError):
            return False

    # -- a clean stop -----------------------------------------------------------------
    def delivered_marks(self) -> dict[Path, int]:
        """Every durable queue's delivered marks (Queue.delivered_marks)."""
        marks: dict[Path, int] = {}
        for q in self.host.queues.values():
            marks.update(q.delivered_marks())
        return marks

    def stores(self) -> list[MessageStore]:
        """Every store of its queues and exchanges (a clean stop syncs them at once)."""
        found: list[MessageStore] = [q.store for q in self.host.queues.values()]
        for ex in self.host.exchanges.values():
            found.extend(ex.stores())
        return found

    def close(self) -> int:
        """Close every exchange's and queue's store and the definitions log, each
        whatever the others raise (a full disk, a failed sync: logged); returns
        how many failed."""
        host = self.host
        failed = 0
        closing: list[tuple[str, Callable[[], None]]] = [
            (f"exchange '{ex.name}'", ex.close) for ex in host.exchanges.values()
        ]
        closing += [(f"queue '{q.name}'", q.store.close) for q in host.queues.values()]
        if host.definitions is not None:
            closing.append(("the definitions log", host.definitions.close))
        for what, close in closing:
            try:
                close()
            except Exception:
                failed += 1
                log.exception("vhost '%s': closing %s failed", host.name, what)
        return failed
