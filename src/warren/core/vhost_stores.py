"""A vhost's stores: where its queues and exchanges keep messages, and the
flush of their buffered writes once per loop turn.

:class:`VHostStores` is a part :class:`~warren.core.vhost.VHost` holds
(``vhost.stores``). It makes a new queue's or exchange's store with the
factories the broker gives (store_factory.py: segment files under the data
directory), or in memory when none is given (a vhost in tests). Stores buffer
their writes; the ones written during a loop turn are noted here and flushed
once at its end, so what the broker has processed survives a killed process
without a write syscall per message.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from warren.core.errors import PreconditionFailed
from warren.core.store import MemoryStore, MessageStore
from warren.core.stream import StreamLog
from warren.store.priority_store import PriorityStore
from warren.store.quorum_store import QuorumPriorityStore

if TYPE_CHECKING:
    from warren.core.vhost import VHost

__all__ = [
    "QUORUM",
    "ExchangeStoreFactory",
    "StoreFactory",
    "StreamStoreFactory",
    "VHostStores",
    "memory_exchange_store",
    "memory_store",
]

log = logging.getLogger("warren.vhost")

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


def memory_exchange_store(vhost: VHost, name: str, persistent: bool) -> MessageStore:
    return MemoryStore()


def memory_store(vhost: VHost, name: str, persistent: bool, priorities: int) -> MessageStore:
    if priorities == QUORUM:
        return QuorumPriorityStore(lambda level: MemoryStore())
    if priorities:
        return PriorityStore(priorities, lambda level: MemoryStore())
    return MemoryStore()


class VHostStores:
    """Making a vhost's queue, stream and exchange stores; flushing what was written."""

    def __init__(
        self,
        vhost: VHost,
        call_soon: Callable[[Callable[[], None]], Any],
        store_factory: StoreFactory = memory_store,
        exchange_store_factory: ExchangeStoreFactory = memory_exchange_store,
        stream_store_factory: StreamStoreFactory | None = None,
    ) -> None:
        self.vhost = vhost  # what the factories are given
        self._call_soon = call_soon
        self._store_factory = store_factory
        self._exchange_store_factory = exchange_store_factory
        self._stream_store_factory = stream_store_factory
        self._written: dict[int, MessageStore] = {}

    def queue_store(self, name: str, persistent: bool, priorities: int) -> MessageStore:
        """A queue's store: ``priorities`` is its x-max-priority, 0, or QUORUM."""
        return self._store_factory(self.vhost, name, persistent, priorities)

    def stream_log(self, name: str, arguments: dict[str, Any]) -> StreamLog:
        """A stream queue's log; a vhost without a data directory refuses streams."""
        if self._stream_store_factory is None:
            raise PreconditionFailed(
                f"invalid arg 'x-queue-type' for queue '{name}' in vhost '{self.vhost.name}': "
                "streams need a data directory (this vhost has none)"
            )
        return self._stream_store_factory(self.vhost, name, arguments)

    def exchange_store(self, exchange: str, persistent: bool) -> MessageStore:
        """A store of the exchange's own (x-delayed-message keeps its held messages there)."""
        return self._exchange_store_factory(self.vhost, exchange, persistent)

    def written(self, store: MessageStore) -> None:
        """Note a store with buffered writes, flushed at the end of this loop turn."""
        if not self._written:
            self._call_soon(self.flush)
        self._written[id(store)] = store

    def flush(self) -> None:
        """Flush every store written since the last flush."""
        stores, self._written = self._written, {}
        for store in stores.values():
            try:
                store.flush()
            except OSError:
                log.exception("vhost '%s': flushing a queue store failed", self.vhost.name)
