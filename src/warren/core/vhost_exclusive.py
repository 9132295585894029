"""Exclusive queues: which connection owns which, and what the others get.

An exclusive queue belongs to the connection that declared it: any other
connection gets RabbitMQ's 405 RESOURCE_LOCKED for it, and it goes when that
connection closes. :class:`ExclusiveQueues` is the part of
:class:`~warren.core.vhost.VHost` (``vhost.exclusive``) that keeps the names
each connection declared, so a close finds them without a scan of every queue.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from warren.core.errors import ResourceLocked

if TYPE_CHECKING:
    from warren.core.queue import Queue

__all__ = ["ExclusiveQueues"]


class ExclusiveQueues:
    """The exclusive queues' owners: the lock check and each owner's queues."""

    def __init__(self, vhost_name: str, queues: dict[str, Queue]) -> None:
        self.vhost_name = vhost_name
        self.queues = queues  # the vhost's, changed by it
        # The names of the exclusive queues each owner declared (some may be gone).
        self._owned: dict[object, list[str]] = {}

    def locked(self, name: str) -> ResourceLocked:
        """The error for a queue another connection owns (or declared otherwise)."""
        return ResourceLocked(
            f"cannot obtain exclusive access to locked queue '{name}' in vhost "
            f"'{self.vhost_name}'. It could be originally declared on another connection "
            "or the exclusive property value does not match that of the original declaration."
        )

    def check(self, q: Queue, owner: object | None) -> None:
        """Raise ResourceLocked unless ``q`` is not exclusive or ``owner`` owns it."""
        if q.exclusive_owner is not None and q.exclusive_owner is not owner:
            raise self.locked(q.name)

    def add(self, q: Queue) -> None:
        """Note a new queue's owner, if it has one."""
        if q.exclusive_owner is not None:
            self._owned.setdefault(q.exclusive_owner, []).append(q.name)

    def take(self, owner: object) -> list[str]:
        """The names of the queues ``owner`` still owns, forgotten here (it closes)."""
        names = self._owned.pop(owner, ())
        return [
            n for n in names if (q := self.queues.get(n)) is not None and q.exclusive_owner is owner
        ]
