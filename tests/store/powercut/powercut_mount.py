"""Drives tests/store/powercut/powercut_fs.py: mount a backing directory, cut the power, unmount.

The ``power`` fixture (import ``power_fixture`` into a test module: a
conftest.py here would shadow tests/conftest.py for the modules that import
from it) gives a ``PowerCutMount(tmp_path)``, which owns ``tmp_path/backing`` (the disk), mounts it at
``tmp_path/mnt`` with mount(), and after cut() (or an armed trigger) the
unmount() leaves the backing directory as the power cut would have: the next
mount() starts from there. The file system runs in a process of its own, so
that its Python work does not compete with the test's clients for one GIL,
forked (like the tests' brokers) by the tests' fork server (tests/forkserver.py).
"""

from __future__ import annotations

import ctypes.util
import os
import queue
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import forkserver
import pytest
from forkserver import Child

HERE = Path(__file__).resolve().parent
#: The file system's script (its process: ``python powercut_fs.py ARGS``).
FS_SCRIPT = HERE / "powercut_fs.py"


def unavailable() -> str | None:
    """Why the power-cut file system cannot run here (None: it can)."""
    try:
        import mfusepy  # noqa: F401
    except ImportError as exc:
        return f"mfusepy (the test extra) cannot be imported: {exc}"
    except OSError as exc:  # libfuse not found
        return f"libfuse3 is missing (make fuse installs Debian's fuse3): {exc}"
    if ctypes.util.find_library("fuse3") is None and ctypes.util.find_library("fuse") is None:
        return "libfuse is missing (make fuse installs Debian's fuse3)"
    if not hasattr(os, "pidfd_open"):
        return "no pidfd_open (Linux only), which the fork server (tests/forkserver.py) needs"
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse does not exist"
    if os.geteuid() != 0 and shutil.which("fusermount3") is None:
        return "not root and no fusermount3 (make fuse installs Debian's fuse3)"
    return None


class PowerCutMount:
    def __init__(self, base: Path, seed: int = 0) -> None:
        self.backing = base / "backing"
        self.mountpoint = base / "mnt"
        self.store = base / "inodes"
        self.seed = seed
        self.backing.mkdir(parents=True, exist_ok=True)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        self._proc: Child | None = None
        self._lines: queue.Queue[str] = queue.Queue()
        self.frozen = threading.Event()
        self.held = threading.Event()
        self.frozen_at = 0  # the mutating operations done when the power went
        self.mounts = 0

    @property
    def mounted(self) -> bool:
        return self._proc is not None

    def mount(self, torn: bool = False) -> Path:
        """Mount the backing directory; returns the mount point."""
        assert self._proc is None, "already mounted"
        self.frozen.clear()
        self.held.clear()
        self._lines = queue.Queue()
        self.mounts += 1
        args = [str(self.backing), str(self.mountpoint), str(self.store)]
        args += ["--seed", str(self.seed * 1000 + self.mounts)]
        if torn:
            args.append("--torn")
        self._proc = forkserver.spawn(
            args, script=FS_SCRIPT, env=dict(os.environ), stdin=forkserver.PIPE,
            stdout=forkserver.PIPE, preload=["powercut_fs"], sys_path=[HERE],
        )
        threading.Thread(target=self._read, args=(self._proc, self._lines), daemon=True).start()
        self._expect("mounted", 20)
        return self.mountpoint

    def _read(self, proc: Child, lines: queue.Queue[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.strip()
            if line.startswith("frozen"):
                self.frozen_at = int(line.split()[1])
                self.frozen.set()
            elif line.startswith("held"):
                self.held.set()
            else:
                lines.put(line)
        lines.put("")  # the process ended

    def _expect(self, prefix: str, timeout: float = 10) -> str:
        line = self._lines.get(timeout=timeout)
        if not line.startswith(prefix):
            raise RuntimeError(f"power-cut file system: expected {prefix!r}, got {line!r}")
        return line

    def _send(self, command: str) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        self._proc.stdin.write(command + "\n")
        self._proc.stdin.flush()

    def arm_ops(self, n: int) -> None:
        """Cut the power before the n-th next mutating operation."""
        self._send(f"arm ops {n}")
        self._expect("armed")

    def arm_fsync(self, pattern: str, skip: int = 0, after: bool = False) -> None:
        """Cut the power before the (skip+1)-th next fsync of a file matching ``pattern``
        (fnmatch on its path from the mount root, no leading slash: ``*/acks.*``), or
        with ``after`` just after it."""
        self._send(f"arm {'synced' if after else 'fsync'} {pattern} {skip}")
        self._expect("armed")

    def hold_fsync(self, pattern: str) -> None:
        """Hold the next fsync of a file matching ``pattern`` (``held`` is set when it
        comes) until release(), which lets it through and cuts the power after it."""
        self._send(f"arm hold {pattern}")
        self._expect("armed")

    def release(self) -> None:
        self._send("release")
        if not self.frozen.wait(10):
            raise RuntimeError("power-cut file system did not freeze after the held fsync")

    def await_fsyncs(self, pattern: str, n: int, timeout: float = 30) -> None:
        """Return once ``n`` fsyncs of files matching ``pattern`` were done."""
        self._send(f"await {pattern} {n}")
        self._expect("reached", timeout)

    def fsyncs(self, pattern: str) -> int:
        """How many fsyncs of files matching ``pattern`` were done since the mount."""
        self._send(f"count {pattern}")
        return int(self._expect("count").split()[1])

    def cut(self) -> None:
        """Cut the power now: every later operation fails with EIO."""
        self._send("cut")
        if not self.frozen.wait(10):
            raise RuntimeError("power-cut file system did not freeze")

    def unmount(self) -> None:
        """Unmount; after a cut the backing directory is left as the cut left it.
        Whatever ran on the mount must be dead (kill -9) or done first."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            self._send_to(proc, "unmount")
            self._expect("done", 60)
            proc.wait(10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(60)
            force_unmount(self.mountpoint)

    @staticmethod
    def _send_to(proc: Child, command: str) -> None:
        assert proc.stdin is not None
        proc.stdin.write(command + "\n")
        proc.stdin.flush()
        proc.stdin.close()


def force_unmount(mountpoint: Path) -> None:
    """Leave no mount behind (a file system process that died leaves a dead one)."""
    with open("/proc/self/mounts", encoding="utf-8") as f:
        mounted = any(line.split()[1] == str(mountpoint) for line in f)
    if mounted:
        subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True)


@pytest.fixture(name="power")
def power_fixture(tmp_path: Path) -> Iterator[PowerCutMount]:
    """A backing directory that can lose power; mount() it, cut() it, unmount() it.
    Skips, saying why, where FUSE cannot run."""
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
