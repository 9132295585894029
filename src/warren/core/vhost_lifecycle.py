"""A vhost's start and stop: its durable objects rebuilt, its stores handed over and closed.

:class:`VHostLifecycle` is a mixin of :class:`~warren.core.vhost.VHost`, which
declares the objects it restores and closes. At start, ``restore_definitions``
rebuilds the durable exchanges, queues and bindings from the definitions log
(their records: vhost_records.py), skipping and naming what cannot be applied;
at a clean stop, the broker takes every store and delivered mark to sync them
at once, then ``close`` closes the stores and the log.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from warren.core.exchange import Binding, Exchange, exchange_class
from warren.core.queue import Queue
from warren.core.queue_arguments import is_quorum, is_stream, max_priority
from warren.store.definitions import decode_arguments, exchange_key, queue_key

if TYPE_CHECKING:
    from warren.core.store import MessageStore
    from warren.core.vhost import VHost
    from warren.store.definitions import DefinitionsLog

__all__ = ["VHostLifecycle"]

log = logging.getLogger("warren.vhost")


class VHostLifecycle:
    """Restoring a vhost's definitions at start; its stores and marks at a clean stop."""

    name: str
    definitions: DefinitionsLog | None
    exchanges: dict[str, Exchange]
    queues: dict[str, Queue]

    # -- recovery ---------------------------------------------------------------------
    # Typed as the VHost it is part of: it builds objects owned by that vhost.
    def restore_definitions(self: VHost) -> list[str]:  # type: ignore[misc]
        """Recreate durable exchanges, queues and bindings from the definitions log.

        A record that cannot be applied is skipped and named in the list returned:
        the broker refuses to start over it, or goes on without it (store/damage.py).
        Its queue's directory stays: the record still claims it.
        """
        defs = self.definitions
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
                ex = cls(self.name, rec["name"], True, rec["auto_delete"], rec["internal"], args)
                ex.attach(self)
                self.exchanges[rec["name"]] = ex
                self.policy_rules.attach_exchange(ex)
            except Exception as exc:
                log.error("vhost '%s': cannot restore exchange %r: %s", self.name, rec, exc)
                problems.append(f"cannot restore exchange {rec.get('name', rec)!r:.200}: {exc}")
        for rec in list(defs.entries("q:")):
            try:
                name = rec["name"]
                args = decode_arguments(rec["arguments"])
                q: Queue
                if is_stream(args):
                    q = self._new_stream(name, args)
                elif is_quorum(args):
                    q = self._new_quorum(name, args)
                else:
                    q = Queue(
                        self,
                        name,
                        self._store_factory(self, name, True, max_priority(args)),
                        durable=True,
                        auto_delete=rec["auto_delete"],
                        arguments=args,
                    )
                self.queues[name] = q
                self.policy_rules.attach_queue(q)
                if q.message_count:
                    q.rebuild_expiry_index()
            except Exception as exc:
                log.error("vhost '%s': cannot restore queue %r: %s", self.name, rec, exc)
                problems.append(f"cannot restore queue {rec.get('name', rec)!r:.200}: {exc}")
        for key, rec in list(defs.live.items()):
            if not key.startswith('["b"'):
                continue
            if self._binding_of_deleted(rec):
                # A delete's leftover: a crash came between the delete of its
                # queue or exchange and of its bindings.
                log.info("vhost '%s': dropping a deleted object's binding %r", self.name, rec)
                defs.delete(key)
                continue
            try:
                source = self.exchanges[rec["source"]]
                dest: Queue | Exchange = (
                    self.queues[rec["destination"]]
                    if rec["destination_type"] == "queue"
                    else self.exchanges[rec["destination"]]
                )
                binding = Binding(
                    source, dest, rec["routing_key"], decode_arguments(rec["arguments"])
                )
                if source.bind(binding):
                    self._inbound.setdefault(id(dest), {})[(id(source), binding.key)] = binding
            except Exception as exc:
                log.error("vhost '%s': cannot restore binding %r: %s", self.name, rec, exc)
                problems.append(f"cannot restore binding {rec!r:.200}: {exc}")
        queues = [q for q in self.queues.values() if q.persistent]
        for ex in self.exchanges.values():
            if ex.key_log is not None:
                ex.restore_routed_keys(queues)
        return problems

    def _binding_of_deleted(self, rec: dict[str, Any]) -> bool:
        """Whether a binding record names an end its definitions log shows deleted."""
        defs = self.definitions
        assert defs is not None
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
        for q in self.queues.values():
            marks.update(q.delivered_marks())
        return marks

    def stores(self) -> list[MessageStore]:
        """Every store of its queues and exchanges (a clean stop syncs them at once)."""
        found: list[MessageStore] = [q.store for q in self.queues.values()]
        for ex in self.exchanges.values():
            found.extend(ex.stores())
        return found

    def close(self) -> int:
        """Close every exchange's and queue's store and the definitions log, each
        whatever the others raise (a full disk, a failed sync: logged); returns
        how many failed."""
        failed = 0
        closing: list[tuple[str, Callable[[], None]]] = [
            (f"exchange '{ex.name}'", ex.close) for ex in self.exchanges.values()
        ]
        closing += [(f"queue '{q.name}'", q.store.close) for q in self.queues.values()]
        if self.definitions is not None:
            closing.append(("the definitions log", self.definitions.close))
        for what, close in closing:
            try:
                close()
            except Exception:
                failed += 1
                log.exception("vhost '%s': closing %s failed", self.name, what)
        return failed
