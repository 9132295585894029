"""store/sync.py's GroupSync on a real event loop and real segment stores, with
its rounds on the C SyncWorker (when built) and on the executor: the first
half of a round runs on the loop, confirms wait for the fdatasync of the
appends only, acks reach the OS in the round and their fdatasync follows
lazily, and a failed sync reports False to every waiter of its round."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from warren.core.message import Message
from warren.store import sync as sync_module
from warren.store.segment_store import SegmentStore
from warren.store.sync import GroupSync

PERSISTENT = b"\x10\x00\x02"


def _modes() -> list[Any]:
    modes = [pytest.param(False, id="executor")]
    if sync_module._native is not None:
        modes.append(pytest.param(True, id="c-worker"))
    return modes


MODES = _modes()


def _message(i: int) -> Message:
    return Message("", "q", PERSISTENT, b"body %d" % i, 1000 + i)


async def _round(syncer: GroupSync, stores: list[Any]) -> bool:
    done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    syncer.after_sync(stores, done.set_result)
    return await asyncio.wait_for(done, 10)


class _Recorder:
    """Wraps a real SegmentStore, noting the thread each half of a sync ran on."""

    def __init__(self, store: SegmentStore) -> None:
        self.store = store
        self.collect_threads: list[int] = []
        self.ack_threads: list[int] = []

    def flush(self) -> None:
        self.store.flush()

    def sync(self) -> None:
        self.store.sync()

    def collect_sync(self, fds: list[int], paths: list[Path], dirs: list[Path]) -> None:
        self.collect_threads.append(threading.get_ident())
        self.store.collect_sync(fds, paths, dirs)

    def sync_acks(self) -> None:
        self.ack_threads.append(threading.get_ident())
        self.store.sync_acks()


@pytest.mark.parametrize("native", MODES)
def test_confirms_wait_for_the_appends_and_acks_follow_lazily(native: bool, tmp_path: Path) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        syncer = GroupSync(loop, ack_sync_interval=0.0, native=native)
        store = SegmentStore(tmp_path / "q")
        recorder = _Recorder(store)
        try:
            for i in range(3):
                store.append(_message(i))
            assert store.dirty
            assert await _round(syncer, [recorder])
            assert not store.dirty
            assert recorder.collect_threads == [threading.get_ident()]

            seq, _msg, _redelivered = store.shift() or (0, None, False)
            store.ack(seq)
            store.append(_message(3))
            assert await _round(syncer, [recorder])
            # The ack is in its file (a killed broker keeps it) ...
            (ack_file,) = (tmp_path / "q").glob("acks.*")
            assert ack_file.stat().st_size == 12  # one batch: header, offset, CRC
            # ... and the lazy ack sync, due at once here, runs on the executor.
            while syncer.last_ack_sync is None:
                await asyncio.sleep(0)  # yields to the timer callback; no wall-clock wait
            await asyncio.wrap_future(syncer.last_ack_sync)
            assert recorder.ack_threads and recorder.ack_threads[0] != threading.get_ident()
            assert syncer.ack_rounds >= 1
        finally:
            store.close()
            syncer.close()

        reopened = SegmentStore(tmp_path / "q")
        try:
            assert reopened.ready_count == 3  # one of four acked
        finally:
            reopened.close()

    asyncio.run(main())


class _BadDescriptor:
    """A Syncable whose descriptor cannot be synced: the round must fail."""

    def flush(self) -> None:
        pass

    def sync(self) -> None:
        pass

    def collect_sync(self, fds: list[int], paths: list[Path], dirs: list[Path]) -> None:
        fds.append(100_000)  # above the open-file limit: never open, EBADF


@pytest.mark.parametrize("native", MODES)
def test_a_failed_round_reports_false_to_its_waiters_and_the_next_one_works(
    native: bool, tmp_path: Path
) -> None:
    async def main() -> None:
        syncer = GroupSync(asyncio.get_running_loop(), native=native)
        store = SegmentStore(tmp_path / "q")
        try:
            store.append(_message(0))
            assert not await _round(syncer, [store, _BadDescriptor()])
            store.append(_message(1))
            assert await _round(syncer, [store])
        finally:
            store.close()
            syncer.close()

    asyncio.run(main())


@pytest.mark.parametrize("native", MODES)
def test_waiters_arriving_during_a_round_share_the_next(native: bool, tmp_path: Path) -> None:
    async def main() -> None:
        syncer = GroupSync(asyncio.get_running_loop(), native=native)
        store = SegmentStore(tmp_path / "q")
        try:
            results: list[bool] = []
            all_in: asyncio.Future[None] = asyncio.get_running_loop().create_future()

            def note(ok: bool) -> None:
                results.append(ok)
                if len(results) == 10:
                    all_in.set_result(None)

            store.append(_message(0))
            first: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
            syncer.after_sync([store], first.set_result)
            await asyncio.sleep(0)  # the first round starts (call_soon)
            assert syncer.rounds == 1
            for i in range(1, 11):
                store.append(_message(i))
                syncer.after_sync([store], note)
            assert await first
            await asyncio.wait_for(all_in, 10)
            assert results == [True] * 10
            assert syncer.rounds == 2
        finally:
            store.close()
            syncer.close()

    asyncio.run(main())


@pytest.mark.parametrize("native", MODES)
def test_drain_runs_every_waiters_callback_before_it_returns(
    native: bool, tmp_path: Path
) -> None:
    """What a clean stop awaits before it closes the stores (Broker.stop): the
    round in flight and the waiters queued behind it, their callbacks called,
    including waiters a callback adds (an MQTT release's ack follows its sync)."""

    async def main() -> None:
        syncer = GroupSync(asyncio.get_running_loop(), native=native)
        store = SegmentStore(tmp_path / "q")
        called: list[str] = []
        try:
            store.append(_message(0))
            syncer.after_sync([store], lambda ok: called.append(f"first {ok}"))
            store.append(_message(1))

            def then(ok: bool) -> None:
                called.append(f"second {ok}")
                store.append(_message(2))
                syncer.after_sync([store], lambda ok: called.append(f"third {ok}"))

            syncer.after_sync([store], then)
            assert called == []  # nothing ran yet: the round starts on the next turn
            await syncer.drain()
            assert called == ["first True", "second True", "third True"]
            await syncer.drain()  # nothing left: returns at once
        finally:
            store.close()
            syncer.close()

    asyncio.run(main())
