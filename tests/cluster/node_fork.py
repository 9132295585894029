"""Cluster nodes forked from a process that has imported Warren already
(multiprocessing's fork server), not started as `python -m warren` each time.

Importing Warren is most of a node's start (about 0.35 s of CPU of the 0.45 a
node spends until it is ready, pure Python): tests/cluster start some fifty
nodes. Each test process (pytest worker) starts one fork server, which imports
this module (and so warren.cli and warren.app) once; every node is a fork of it
running warren.cli.main with the node's arguments, its stdout and stderr on a
pipe the test reads: its own process, killed, stopped and paused by its pid as
before; a partition test's node joins its network namespace first. A script
that starts nodes needs multiprocessing's ``if __name__ == "__main__":`` guard
(the fork server imports the script's main module).

The fork server reaps the nodes, so their CPU time is the fork server's
children's, not the test process's: :func:`server_cpu` reads it for
tests/cputime.py.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import subprocess
import sys
from multiprocessing import reduction
from typing import IO, Any

#: The modules the fork server imports before it forks: Warren's server, once.
PRELOAD = [__name__, "warren.cli", "warren.app"]

_context = multiprocessing.get_context("forkserver")
_HERE = os.path.dirname(os.path.abspath(__file__))
CLONE_NEWNET = 0x40000000


class _Output:
    """The write end of a node's output pipe, as the forked node receives it."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[Any, ...]:
        # Only while Process.start() pickles: the fd goes with the fork request.
        return _rebuild, (reduction.DupFd(self.fd),)


def _rebuild(dup: Any) -> _Output:
    return _Output(dup.detach())


def _serve(argv: list[str], output: _Output, netns: str | None) -> None:
    """A forked node: in network namespace ``netns`` if given, its output on
    the pipe, then `warren` with ``argv``."""
    if netns is not None:
        _enter_netns(netns)
    os.dup2(output.fd, 1)
    os.dup2(output.fd, 2)
    os.close(output.fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    from warren.cli import main  # preloaded

    raise SystemExit(main(argv))


def _enter_netns(name: str) -> None:
    """Join the network namespace `ip netns add` made as ``name`` (what
    `ip netns exec` does for the network, the part a node needs)."""
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        setns = getattr(os, "setns", None)  # Python 3.12
        if setns is not None:
            setns(fd, CLONE_NEWNET)
        else:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.setns(fd, CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns {name}: {os.strerror(err)}")
    finally:
        os.close(fd)


class ForkedNode:
    """A forked node with what tests/cluster use of subprocess.Popen."""

    def __init__(self, argv: list[str], netns: str | None = None) -> None:
        """``netns``: the network namespace (`ip netns`'s name) it runs in."""
        if not _preloaded:
            _context.set_forkserver_preload(PRELOAD)
            _preloaded.append(True)
        read, write = os.pipe()
        # The fork server starts with this process's sys.path, and must find this
        # module by name (a test may have imported it and taken its directory out).
        added = _HERE not in sys.path
        if added:
            sys.path.append(_HERE)
        try:
            # daemon: terminated, not waited for forever, if a test process exits with it
            args = (argv, _Output(write), netns)
            self._process = _context.Process(target=_serve, args=args, daemon=True)
            self._process.start()
        finally:
            os.close(write)
            if added:
                sys.path.remove(_HERE)
        self.stdout: IO[str] = open(read, encoding="utf-8", errors="replace")  # noqa: SIM115
        assert self._process.pid is not None
        self.pid: int = self._process.pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._process.exitcode
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self.poll() is None:
            raise subprocess.TimeoutExpired(f"node {self.pid}", timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # never a reaped pid's successor
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


_preloaded: list[bool] = []
#: The fork server's last CPU reading (it stays counted once the server is gone).
_last_cpu = [0.0]


def server_cpu() -> float:
    """CPU seconds of the fork server and the nodes it has reaped (0 before it starts)."""
    from multiprocessing import forkserver

    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
    if pid is None:
        return _last_cpu[0]
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return _last_cpu[0]
    # utime, stime, cutime, cstime
    _last_cpu[0] = max(_last_cpu[0], sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK"))
    return _last_cpu[0]


try:
    import cputime  # tests/cputime.py: counted in WARREN_TEST_CPU's per-test seconds
except ImportError:  # the fork server's sys.path may lack tests/
    pass
else:
    if server_cpu not in cputime.EXTERNAL:
        cputime.EXTERNAL.append(server_cpu)
