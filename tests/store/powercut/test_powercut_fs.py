"""The power-cut file system itself: what a cut keeps and what it drops.

Each test does real system calls on the FUSE mount, cuts the power and looks at
the backing directory it left, which is what the broker finds at its next start.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from powercut_mount import PowerCutMount, power_fixture  # noqa: F401 (the fixtures)


def write(path: Path, data: bytes, sync: bool = False) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, data)
        if sync:
            os.fdatasync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def tree(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root``: file contents, None for directories."""
    found: dict[str, bytes | None] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            found[os.path.relpath(os.path.join(dirpath, name), root)] = None
        for name in filenames:
            path = os.path.join(dirpath, name)
            found[os.path.relpath(path, root)] = Path(path).read_bytes()
    return found


def test_only_fsynced_data_in_fsynced_directories_survives(power: PowerCutMount) -> None:
    (power.backing / "old").write_bytes(b"durable before the mount")
    mnt = power.mount()
    write(mnt / "old", b"+lost")
    write(mnt / "synced", b"kept", sync=True)
    write(mnt / "synced", b"+lost")
    fsync_dir(mnt)
    os.mkdir(mnt / "sub")
    write(mnt / "sub" / "f", b"in a directory whose own entry is durable", sync=True)
    fsync_dir(mnt / "sub")
    fsync_dir(mnt)
    write(mnt / "entry-not-synced", b"data synced, entry not", sync=True)
    os.mkdir(mnt / "sub" / "new")  # the entry never synced
    write(mnt / "sub" / "new" / "g", b"x", sync=True)
    fsync_dir(mnt / "sub" / "new")
    assert (mnt / "sub" / "new" / "g").read_bytes() == b"x"  # live, before the cut
    power.cut()
    assert power.frozen_at > 0
    power.unmount()
    assert tree(power.backing) == {
        "old": b"durable before the mount",
        "synced": b"kept",
        "sub": None,
        "sub/f": b"in a directory whose own entry is durable",
    }


def test_renames_and_unlinks_need_a_directory_fsync(power: PowerCutMount) -> None:
    for name in ("a", "b", "c"):
        (power.backing / name).write_bytes(name.encode())
    mnt = power.mount()
    os.unlink(mnt / "a")  # not durable: comes back
    write(mnt / "tmp", b"new b", sync=True)
    os.replace(mnt / "tmp", mnt / "b")  # not durable: the old b comes back
    os.rename(mnt / "c", mnt / "c2")
    fd = os.open(mnt / "c2", os.O_WRONLY)
    os.pwrite(fd, b"C", 0)  # an overwrite of durable bytes, never synced
    os.ftruncate(fd, 0)
    os.close(fd)
    assert not (mnt / "a").exists()
    power.cut()
    power.unmount()
    assert tree(power.backing) == {"a": b"a", "b": b"b", "c": b"c"}


def test_an_atomic_replace_with_both_fsyncs_survives(power: PowerCutMount) -> None:
    (power.backing / "f").write_bytes(b"old")
    mnt = power.mount()
    write(mnt / "f.tmp", b"new", sync=True)
    os.replace(mnt / "f.tmp", mnt / "f")
    fsync_dir(mnt)
    os.unlink(mnt / "f")  # after the directory fsync: not durable
    power.cut()
    power.unmount()
    assert tree(power.backing) == {"f": b"new"}


def test_a_clean_unmount_keeps_everything_and_the_next_mount_starts_from_it(
    power: PowerCutMount,
) -> None:
    mnt = power.mount()
    os.makedirs(mnt / "x" / "y")
    write(mnt / "x" / "y" / "z", b"never synced")
    power.unmount()
    assert tree(power.backing) == {"x": None, "x/y": None, "x/y/z": b"never synced"}
    mnt = power.mount()  # all of it durable now, as on a disk after a clean stop
    write(mnt / "x" / "y" / "z", b" + lost")
    power.cut()
    power.unmount()
    assert tree(power.backing) == {"x": None, "x/y": None, "x/y/z": b"never synced"}


def test_everything_fails_after_the_cut_and_an_armed_fsync_cuts_before_it(
    power: PowerCutMount,
) -> None:
    mnt = power.mount()
    write(mnt / "acks.1", b"1234", sync=True)
    assert power.fsyncs("acks.*") == 1
    power.arm_fsync("acks.*")
    fd = os.open(mnt / "acks.1", os.O_WRONLY | os.O_APPEND)
    os.write(fd, b"5678")
    try:
        os.fdatasync(fd)
    except OSError as exc:
        assert exc.errno == 5  # EIO: the power went before this fsync
    else:
        raise AssertionError("the armed fsync succeeded")
    assert power.frozen.wait(5)
    try:
        os.write(fd, b"more")
    except OSError as exc:
        assert exc.errno == 5
    else:
        raise AssertionError("a write after the cut succeeded")
    os.close(fd)
    power.unmount()
    assert tree(power.backing) == {}  # the entry of acks.1 was never made durable


def test_arming_by_operation_count(power: PowerCutMount) -> None:
    mnt = power.mount()
    power.arm_ops(3)
    with pytest.raises(OSError) as info:
        write(mnt / "f", b"1", sync=True)  # create, write, fsync: the third is refused
    assert info.value.errno == errno.EIO
    assert power.frozen.wait(5)
    power.unmount()
    assert tree(power.backing) == {}


def test_a_torn_cut_keeps_a_prefix_of_the_unsynced_tail(power: PowerCutMount) -> None:
    (power.backing / "log").write_bytes(b"durable;")
    mnt = power.mount(torn=True)
    write(mnt / "log", b"0123456789" * 100)  # appended, never synced
    power.cut()
    power.unmount()
    kept = (power.backing / "log").read_bytes()
    live = b"durable;" + b"0123456789" * 100
    assert live.startswith(kept) and len(kept) >= len(b"durable;")
