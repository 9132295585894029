"""The harness's pytest fixture, defined once: a test module binds a broker
with the settings it needs by name, instead of writing its own fixture.

    broker = harness_fixture(sync=False)   # module level: a fixture named broker

(A function that makes the fixture, not a conftest.py: tests/ subdirectories
have no __init__.py, so a second module named conftest would collide.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.broker import Harness
from warren.core.clock import ManualClock


def harness_fixture(manual_clock: bool = False, **settings: Any) -> Callable[..., Any]:
    """A fixture giving a Harness on the test's ``tmp_path / "data"`` with these
    broker settings, stopped after the test; ``manual_clock``: on a ManualClock
    of its own (moved with ``advance``). Its name is the module attribute it is
    bound to."""

    @pytest.fixture
    def fixture(tmp_path: Path) -> Iterator[Harness]:
        clock = ManualClock() if manual_clock else None
        with Harness(tmp_path / "data", clock=clock, **settings) as harness:
            yield harness

    return fixture
