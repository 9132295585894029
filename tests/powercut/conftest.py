"""The power-cut file system as a fixture (tests/powercut/powercut_fs.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from powercut_mount import PowerCutMount, force_unmount, unavailable


@pytest.fixture
def power(tmp_path: Path) -> Iterator[PowerCutMount]:
    """A backing directory that can lose power; mount() it, cut() it, unmount() it."""
    reason = unavailable()
    if reason is not None:
        pytest.skip(f"power-cut file system unavailable: {reason}")
    mount = PowerCutMount(tmp_path)
    try:
        yield mount
    finally:
        try:
            mount.unmount()
        finally:
            force_unmount(mount.mountpoint)
