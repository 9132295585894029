"""The group commit's file syncs held while a test looks (a reply held for a sync round)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from warren.store import sync


class HeldSyncs:
    """The group commit's file syncs, held on their thread until the test lets
    them go (as tests/store/powercut holds an fsync): the broker's own
    GroupSync, on its executor (the C sync worker left out), whose
    sync_files_python waits at a gate while ``hold`` is on. Made before the
    broker starts (GroupSync picks its worker then)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.gate = threading.Event()
        self.gate.set()
        #: Set when a round's file syncs reached the closed gate.
        self.waiting = threading.Event()
        real = sync.sync_files_python

        def held(*args: Any) -> None:
            if not self.gate.is_set():
                self.waiting.set()
                assert self.gate.wait(60), "the test never released the sync"
            real(*args)

        monkeypatch.setattr(sync, "_native", None)
        monkeypatch.setattr(sync, "sync_files_python", held)

    def hold(self) -> None:
        self.waiting.clear()
        self.gate.clear()

    def release(self) -> None:
        self.gate.set()
