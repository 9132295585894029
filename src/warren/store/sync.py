"""Group commit: one fdatasync round covers every publisher waiting when it starts.

Publisher confirms (and tx.commit-ok) for persistent messages in durable queues
are sent only once the data is on disk. Syncing per message would cap
throughput at the disk's flush rate, so waiters gather while a round syncs,
and the next round covers all of them at once.

A round has two halves. On the event loop, each store flushes its buffers and
names what needs an fdatasync (``collect_sync``: duplicate descriptors, paths,
directories); that is cheap and needs the store's own thread. The slow half,
the fdatasync calls, runs on a thread: in C (``warren._syncworker``) a thread
that never takes the GIL and wakes the loop through a pipe; without the C
extension a ThreadPoolExecutor, whose thread has to take the GIL back from a
busy loop before the round can end.

A round syncs what confirms promise: the appended messages. Ack records are
written to the OS in the round (a killed broker keeps them) and made durable
by a lazy ack sync about once a second (ACK_SYNC_INTERVAL) on the executor:
an ack lost to a power cut means a redelivery, never a lost message, and it
would otherwise cost every round a second fdatasync.

A waiter is told ``ok`` False (a nack) exactly when its own stores failed: a
store whose first half raised, a failed fdatasync (which cannot be pinned on a
store: the whole round), or a store whose log dropped appends of the waiter's
write generations because a write-out failed (a full disk,
store/disk_budget.py). So a waiter holds the messages of one write generation
(``gen``) or a span of them, and its stores.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import warren
from warren.core.store import Syncable
from warren.store.disk_budget import UNMETERED, DiskBudget
from warren.store.mirror import FileMirror
from warren.store.sync_files import sync_files, sync_files_python

log = logging.getLogger("warren.store")


Callback = Callable[[bool], None]
# A waiter: its callback, stores, and the first and last write generation of its appends.
_Waiter = tuple[Callback, tuple[Syncable, ...], int, int]


def _lost(stores: tuple[Syncable, ...], first: int, last: int) -> bool:
    """Whether a store dropped appends of those generations (a failed write-out)."""
    for store in stores:
        lost_between = getattr(store, "lost_between", None)
        if lost_between is not None and lost_between(first, last):
            return True
    return False

#: (replication position, definitions writes): where change_mark() found things.
ChangeMark = tuple[int, int]


class Replication(FileMirror, Protocol):
    """Clustering's side of a confirm (cluster/leader.py's Replicator): the data
    directory's mirror (the broker hands it to its DataDir, which gives it to
    every store), and every change it hears of is an action numbered
    ``position``."""

    position: int

    def when_replicated(self, position: int, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the in-sync followers hold ``position`` on disk."""
        ...


#: Seconds between the lazy syncs of the ack files written by the rounds.
ACK_SYNC_INTERVAL = 1.0

_native = warren.native_module("_syncworker")


class GroupSync:
    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        enabled: bool = True,
        *,
        ack_sync_interval: float = ACK_SYNC_INTERVAL,
        native: bool = True,
        replication: Replication | None = None,
        budget: DiskBudget | None = None,
    ) -> None:
        """``native`` False runs the rounds on the executor even when the C worker
        is built (the tests run both). With ``replication`` a round's waiters are
        called once the followers have the round's writes too: the round's
        flush reports them (store/mirror.py), and the position after it is what
        they must acknowledge. ``budget`` (the data directory's, store/disk_budget.py)
        counts the write generations that waiters are grouped by."""
        self._loop = loop
        self.budget = budget if budget is not None else UNMETERED
        self.enabled = enabled
        self.replication = replication
        self.ack_sync_interval = ack_sync_interval
        self._stores: dict[int, Syncable] = {}
        self._callbacks: list[_Waiter] = []
        self._running = False
        self._scheduled = False
        # The round being synced: its waiters and stores, the ids of stores whose
        # first half failed, and the replication position its writes end at.
        self._inflight: tuple[list[_Waiter], list[Syncable], set[int], int] | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="warren-sync")
        self._worker: Any = None
        if enabled and native and _native is not None:
            self._worker = _native.SyncWorker()
            loop.add_reader(self._worker.fileno(), self._on_worker)
        self.rounds = 0
        self.ack_rounds = 0  # lazy ack syncs handed to the executor
        self.last_ack_sync: Future[None] | None = None  # the latest of them
        # Stores a round covered whose acks may still wait for an fdatasync, by
        # id: their sync_acks methods (stores without acks have none).
        self._ack_syncs: dict[int, Callable[[], None]] = {}
        self._ack_timer: asyncio.TimerHandle | None = None
        self._closed = False
        # drain()'s waiters: woken after each round's callbacks ran.
        self._drained: list[asyncio.Future[None]] = []
        #: Changes definitions logs have handed to the OS (definitions_written).
        self.definition_writes = 0

    @property
    def next_round(self) -> int:
        """Id of the round that the next after_sync/add joins."""
        return self.rounds + 1

    @property
    def gen(self) -> int:
        """The write generation now: appends made while it holds one value are
        written out (or dropped) together, and a round's start ends it. A waiter
        groups the messages of one generation (store/disk_budget.py)."""
        return self.budget.gen

    # -- definitions changes ------------------------------------------------------------
    # A declare, bind or delete is handed to the OS by the vhost's definitions log
    # as it is made (definitions_written); its reply waits until a round has
    # fdatasynced the log, and in a cluster until the in-sync followers hold it
    # too, or a queue declared just before a power cut or a failover is missing
    # afterwards. Every protocol's reply to such a change goes through
    # change_mark() and after_changes(); no sync runs on the event loop.
    def definitions_written(self, log: Syncable) -> None:
        """A definitions log handed a change to the OS: the next round syncs it
        (started now if nothing else would start it)."""
        if not self.enabled:
            return
        self.definition_writes += 1
        self._stores[id(log)] = log
        if not self._running and not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._start)

    def change_mark(self) -> ChangeMark:
        """Where the changes stand now: pass it to after_changes()."""
        replication = self.replication
        return (replication.position if replication is not None else 0, self.definition_writes)

    def after_changes(self, mark: ChangeMark, callback: Callable[[], None]) -> bool:
        """When changes were made since ``mark`` that are not yet on disk (or, in a
        cluster, not yet held by the followers), call ``callback`` once they are
        and return True; otherwise return False and do not call it."""
        position, writes = mark
        if writes != self.definition_writes:
            # The next round syncs every log written so far (and then waits for
            # the followers, as confirms do).
            def synced(ok: bool) -> None:
                if not ok:
                    log.error(
                        "a definitions change could not be made durable (fdatasync "
                        "failed); its reply is sent, but it may not survive a power cut"
                    )
                callback()

            self.after_sync((), synced)
            return True
        replication = self.replication
        if replication is None or replication.position == position:
            return False
        position = replication.position
        called_now = False

        def release() -> None:
            nonlocal called_now
            if waiting:
                callback()
            else:
                called_now = True

        waiting = False
        replication.when_replicated(position, release)
        if called_now:
            return False
        waiting = True
        return True

    async def changes_stored(self, mark: ChangeMark) -> None:
        """Return once the changes made since ``mark`` are on disk (and held by the
        followers)."""
        done: asyncio.Future[None] = self._loop.create_future()

        def release() -> None:
            if not done.done():
                done.set_result(None)

        if self.after_changes(mark, release):
            await done

    def add(self, stores: Iterable[Syncable]) -> None:
        """Include more stores in the round an earlier after_sync is waiting for."""
        for store in stores:
            self._stores[id(store)] = store

    def after_sync(
        self, stores: Iterable[Syncable], callback: Callback, since: int | None = None
    ) -> None:
        """Call ``callback(ok)`` once everything appended to ``stores`` so far is durable.

        ``ok`` is False when the stores could not make it durable: among them the
        appends made since write generation ``since`` (default: the current one,
        ``gen``) that a failed write-out dropped. Without sync (``sync = false``)
        the data is only handed to the OS, which survives a killed broker but not
        a power cut; the callback runs at once.
        """
        mine = tuple(stores)
        gen = self.budget.gen
        first = gen if since is None else since
        if not self.enabled:
            ok = True
            for store in mine:
                try:
                    store.flush()
                except OSError:
                    log.exception("flushing a queue store failed")
                    ok = False
            if ok and _lost(mine, first, gen):
                ok = False
            if self.replication is not None and ok:
                self.replication.when_replicated(self.replication.position, lambda: callback(True))
            else:
                callback(ok)
            return
        for store in mine:
            self._stores[id(store)] = store
        self._callbacks.append((callback, mine, first, gen))
        if not self._running and not self._scheduled:
            # Let the rest of this loop turn (the rest of the socket read, other
            # connections' reads) join the same round.
            self._scheduled = True
            self._loop.call_soon(self._start)

    def _start(self) -> None:
        self._scheduled = False
        if self._running or not (self._callbacks or self._stores) or self._closed:
            return
        stores = list(self._stores.values())
        callbacks = self._callbacks
        self._stores = {}
        self._callbacks = []
        self.budget.gen += 1  # what is appended from now on waits for the next round
        fds: list[int] = []
        paths: list[Path] = []
        dirs: list[Path] = []
        failed: set[int] = set()
        for store in stores:
            try:
                store.collect_sync(fds, paths, dirs)
            except Exception:
                log.exception("writing out a queue store failed; its publishes will be nacked")
                failed.add(id(store))
        self._running = True
        self.rounds += 1
        position = self.replication.position if self.replication is not None else 0
        self._inflight = (callbacks, stores, failed, position)
        if self._worker is not None:
            self._worker.submit(
                self.rounds,
                fds,
                [os.fsencode(p) for p in paths],
                [os.fsencode(d) for d in dirs],
            )
        else:
            future = self._executor.submit(sync_files_python, fds, paths, dirs)
            future.add_done_callback(
                lambda f: self._loop.call_soon_threadsafe(self._executor_done, f)
            )

    def _on_worker(self) -> None:
        for _job, error in self._worker.collect():
            if error is not None:
                log.error("fdatasync of a queue store failed; publishes will be nacked: %s", error)
            self._done(error is None)

    def _executor_done(self, future: Future[None]) -> None:
        try:
            future.result()
        except Exception:
            log.exception("fdatasync of a queue store failed; publishes will be nacked")
            self._done(False)
        else:
            self._done(True)

    def _done(self, synced: bool) -> None:
        inflight, self._inflight = self._inflight, None
        self._running = False
        if inflight is None:  # closed meanwhile
            return
        waiters, stores, failed, position = inflight
        results = [
            (
                callback,
                synced
                and not (failed and any(id(s) in failed for s in mine))
                and not _lost(mine, first, last),
            )
            for callback, mine, first, last in waiters
        ]
        if self.replication is None:
            _call_each(results)  # in the order they came: MQTT's acks keep theirs
        else:
            _call_each([r for r in results if not r[1]])
            good = [r for r in results if r[1]]
            if good:
                # The next round need not wait: its own position is later.
                self.replication.when_replicated(position, lambda: _call_each(good))
        ack_syncs = self._ack_syncs
        for store in stores:
            sync_acks = getattr(store, "sync_acks", None)
            if sync_acks is not None:
                ack_syncs[id(store)] = sync_acks
        if ack_syncs and self._ack_timer is None and not self._closed:
            self._ack_timer = self._loop.call_later(self.ack_sync_interval, self._sync_acks)
        if self._callbacks or self._stores:
            self._start()
        drained, self._drained = self._drained, []
        for waiter in drained:
            if not waiter.done():
                waiter.set_result(None)

    async def drain(self) -> None:
        """Run rounds until no waiter is left, each one's callback called. A clean
        stop drains before it closes the stores, so that what a round settles
        happens first: an MQTT QoS 2 release acks its message only once the
        session's record of it is synced, and a stop between the two would
        otherwise bring the message back after the restart."""
        while self._running or self._callbacks:
            waiter: asyncio.Future[None] = self._loop.create_future()
            self._drained.append(waiter)
            if not self._running:
                self._start()
            if not self._running:  # nothing to run after all (closed)
                waiter.cancel()
                return
            await waiter

    def _sync_acks(self) -> None:
        """Hand the pending ack syncs to the executor thread."""
        self._ack_timer = None
        if self._closed:
            return
        ack_syncs = list(self._ack_syncs.values())
        self._ack_syncs = {}
        self.ack_rounds += 1
        self.last_ack_sync = self._executor.submit(_sync_acks_all, ack_syncs)

    def close(self) -> None:
        """Finish the round in flight and stop the threads (the stores sync their
        acks when they close)."""
        self._closed = True
        if self._ack_timer is not None:
            self._ack_timer.cancel()
            self._ack_timer = None
        if self._worker is not None:
            self._loop.remove_reader(self._worker.fileno())
            self._worker.close()
        self._executor.shutdown(wait=True)


def _call_each(results: list[tuple[Callback, bool]]) -> None:
    for callback, ok in results:
        try:
            callback(ok)
        except Exception:
            log.exception("confirm callback failed")


def _sync_acks_all(ack_syncs: list[Callable[[], None]]) -> None:
    for sync_acks in ack_syncs:
        try:
            sync_acks()
        except Exception:
            log.exception("fdatasync of an ack file failed; those acks may be redelivered")


#: Stores sync_all collects at a time: each lends a duplicate descriptor, and
#: 10,000 queues' at once would pass the open-file limit.
SYNC_ALL_BATCH = 1000


def sync_all(stores: Iterable[Syncable]) -> None:
    """Every store's sync in batches, as a clean stop needs it: each store's first
    half, then one sync_files per batch (every file's writeback started before
    any is waited on), and each directory fsynced once at the end. Closing
    10,000 queues one sync each took 10,000 fdatasyncs and 20,000 directory
    fsyncs; the stores' own close then finds nothing left to sync. Raises
    OSError when a sync fails; a store whose first half failed is logged here
    and still closed (and says so) by its own close."""
    batch: list[Syncable] = []
    dirs: list[Path] = []
    for store in stores:
        batch.append(store)
        if len(batch) >= SYNC_ALL_BATCH:
            _sync_batch(batch, dirs)
            batch = []
    _sync_batch(batch, dirs)
    sync_files([], [], list(dict.fromkeys(dirs)))


def _sync_batch(stores: list[Syncable], dirs: list[Path]) -> None:
    fds: list[int] = []
    paths: list[Path] = []
    try:
        for store in stores:
            try:
                store.collect_sync(fds, paths, dirs)
            except OSError:
                log.exception("writing out a store at the stop failed")
    finally:
        sync_files(fds, paths, [])
