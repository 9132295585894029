"""The parts VHost holds for its exclusive queues' owners (vhost_exclusive.py)
and its stores (vhost_stores.py), driven through the VHost as callers use it.

The loop is a list of callbacks the test runs: nothing waits for time.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from warren.core.errors import PreconditionFailed, ResourceLocked
from warren.core.store import MemoryStore
from warren.core.vhost import VHost


def _vhost() -> tuple[VHost, list[Callable[[], None]]]:
    soon: list[Callable[[], None]] = []
    return VHost("/", soon.append), soon


def test_a_closing_owner_takes_only_the_queues_it_still_owns() -> None:
    vhost, _ = _vhost()
    first, second = object(), object()
    vhost.declare_queue("q", durable=False, exclusive=True, owner=first)
    vhost.declare_queue("kept", durable=False, exclusive=True, owner=first)
    vhost.delete_queue("q", owner=first)
    vhost.declare_queue("q", durable=False, exclusive=True, owner=second)
    with pytest.raises(ResourceLocked, match="locked queue 'q' in vhost '/'"):
        vhost.get_queue("q", first)
    vhost.delete_exclusive_queues(first)
    assert sorted(vhost.queues) == ["q"]
    assert vhost.get_queue("q", second).exclusive_owner is second
    vhost.delete_exclusive_queues(second)
    assert vhost.queues == {}


class _CountingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.flushes = 0

    def flush(self) -> None:
        self.flushes += 1


def test_stores_written_in_a_turn_are_flushed_once_at_its_end() -> None:
    vhost, soon = _vhost()
    a, b = _CountingStore(), _CountingStore()
    for store in (a, b, a):
        vhost.store_written(store)
    assert len(soon) == 1  # one flush scheduled for the turn
    soon.pop()()
    assert (a.flushes, b.flushes) == (1, 1)
    vhost.store_written(a)
    assert len(soon) == 1


def test_a_vhost_without_stream_storage_refuses_streams() -> None:
    vhost, _ = _vhost()
    with pytest.raises(PreconditionFailed, match="streams need a data directory"):
        vhost.declare_queue("s", arguments={"x-queue-type": "stream"})
    assert "s" not in vhost.queues
