"""Group commit: one fdatasync round covers every publisher waiting when it starts.

Publisher confirms (and tx.commit-ok) for persistent messages in durable queues
are sent only once the data is on disk. Syncing per message would cap
throughput at the disk's flush rate, so waiters gather while a sync runs on a
worker thread, and the next round covers all of them at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

log = logging.getLogger("warren.store")


class Syncable(Protocol):
    def sync(self) -> None: ...

    def flush(self) -> None: ...


Callback = Callable[[bool], None]


class GroupSync:
    def __init__(self, loop: asyncio.AbstractEventLoop, enabled: bool = True) -> None:
        self._loop = loop
        self.enabled = enabled
        self._stores: dict[int, Syncable] = {}
        self._callbacks: list[Callback] = []
        self._running = False
        self._scheduled = False
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="warren-sync")
        self.rounds = 0

    @property
    def next_round(self) -> int:
        """Id of the round that the next after_sync/add joins."""
        return self.rounds + 1

    def add(self, stores: Iterable[Syncable]) -> None:
        """Include more stores in the round an earlier after_sync is waiting for."""
        for store in stores:
            self._stores[id(store)] = store

    def after_sync(self, stores: Iterable[Syncable], callback: Callback) -> None:
        """Call ``callback(ok)`` once everything appended to ``stores`` so far is durable.

        Without sync (``sync = false``) the data is only handed to the OS, which
        survives a killed broker but not a power cut; the callback runs at once.
        """
        if not self.enabled:
            ok = True
            for store in stores:
                try:
                    store.flush()
                except OSError:
                    log.exception("flushing a queue store failed")
                    ok = False
            callback(ok)
            return
        for store in stores:
            self._stores[id(store)] = store
        self._callbacks.append(callback)
        if not self._running and not self._scheduled:
            # Let the rest of this loop turn (the rest of the socket read, other
            # connections' reads) join the same round.
            self._scheduled = True
            self._loop.call_soon(self._start)

    def _start(self) -> None:
        self._scheduled = False
        if self._running or not self._callbacks:
            return
        stores = list(self._stores.values())
        callbacks = self._callbacks
        self._stores = {}
        self._callbacks = []
        self._running = True
        self.rounds += 1
        future = self._executor.submit(_sync_all, stores)
        future.add_done_callback(
            lambda f: self._loop.call_soon_threadsafe(self._done, f, callbacks)
        )

    def _done(self, future: Future[bool], callbacks: list[Callback]) -> None:
        self._running = False
        ok = future.result()
        for callback in callbacks:
            try:
                callback(ok)
            except Exception:
                log.exception("confirm callback failed")
        if self._callbacks:
            self._start()

    def close(self) -> None:
        self._executor.shutdown(wait=True)


def _sync_all(stores: list[Syncable]) -> bool:
    ok = True
    for store in stores:
        try:
            store.sync()
        except Exception:
            log.exception("fdatasync of a queue store failed; publishes will be nacked")
            ok = False
    return ok
