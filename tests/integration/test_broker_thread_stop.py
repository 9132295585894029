"""The suite's BrokerThread (tests/conftest.py) stops cleanly or says why not.

Its stop() used to run the broker's stop, then join the thread for 10 s and
close the loop whatever came of it: on a loop still running (a call on it
blocked) that raised "Cannot close a running event loop", which hid the cause.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from conftest import start_broker


def test_a_stop_on_a_blocked_loop_says_so_and_a_later_stop_finishes(tmp_path: Path) -> None:
    broker = start_broker(tmp_path / "data")
    release = threading.Event()
    try:
        broker.loop.call_soon_threadsafe(release.wait)  # a call that blocks the loop
        with pytest.raises(RuntimeError, match=r"did not stop within 0\.2 s .* left running"):
            broker.stop(timeout=0.2)
        assert not broker.loop.is_closed()  # left as it is, not closed under its thread
    finally:
        release.set()
    broker.stop()
    assert broker.loop.is_closed()
    broker.stop()  # idempotent


def test_a_stop_ends_the_thread_and_closes_the_loop(tmp_path: Path) -> None:
    broker = start_broker(tmp_path / "data")
    thread = broker._thread
    broker.stop()
    assert broker.loop.is_closed() and not thread.is_alive()
