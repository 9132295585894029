"""A fork server for the power-cut tests' processes: `warren` and the FUSE file system.

The power-cut tests start a `warren` process (and a file system process) some
75 times; most of each start's CPU was the interpreter importing Warren again
(about 0.35 s of a broker's 0.45 s). This server imports once, then forks a
child for each start: a process of its own, with the given environment,
standard streams and command line, that runs what ``python -m warren ARGS``
(or ``python powercut_fs.py ARGS``) runs, from ``__main__`` on, and exits as
that interpreter would (atexit handlers, threads joined). kill -9 kills it like
any process. The server is the children's parent and reaps them, so their CPU
time reaches the test's process (tests/cputime.py) when the server ends: the
``fork_server`` fixture (powercut_mount.py) ends it with the test module.

The test side sends each start over a Unix socket (SCM_RIGHTS carries the
child's standard streams) and gets back the child's pid and a pidfd, through
which it waits for the child's end (Linux 5.3 and later).

Run as ``python powercut_spawn.py FD``: FD is its end of the socket pair.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[2] / "src"

#: What a broker's start imports (warren/__main__.py, then cli._serve's deferred
#: imports), loaded in the server before its first broker fork.
WARREN_MODULES = ("warren.cli", "warren.app", "warren.definitions_document", "warren.store.damage")


# -- the server ---------------------------------------------------------------------------------


@dataclass
class Job:
    """What a forked child runs: ``kind`` (warren or fuse) with its command line."""

    kind: str
    args: list[str]


def _preload_warren() -> None:
    import importlib

    for name in WARREN_MODULES:
        importlib.import_module(name)
    with contextlib.suppress(ImportError):
        import uvloop  # noqa: F401 (cli._loop_factory's, when installed)


def _serve(sock: socket.socket) -> Job | None:
    """Fork a child per request until the test side closes the socket; the child
    returns its job from here, the server None once its children are reaped."""
    children: dict[int, int] = {}  # pidfd -> pid
    warren_loaded = False
    try:
        while True:
            ready, _, _ = select.select([sock, *children], [], [])
            for fd in ready:
                if fd in children:
                    os.waitpid(children.pop(fd), 0)
                    os.close(fd)
            if sock not in ready:
                continue
            msg, fds, _flags, _addr = socket.recv_fds(sock, 1 << 16, 3)
            if not msg:
                return None
            request = json.loads(msg)
            if request["kind"] == "warren" and not warren_loaded:
                warren_loaded = True
                try:
                    _preload_warren()
                except Exception:  # the child imports again, and its log says why
                    traceback.print_exc()
            # What the server imported lives as long as any child: the cyclic GC
            # need not walk it in each (gc.freeze's advice for a forking server;
            # warren freezes what its restore made the same way).
            gc.freeze()
            pid = os.fork()
            if pid == 0:
                sock.close()
                for fd in children:
                    os.close(fd)
                for target, fd in zip(request["streams"], fds, strict=True):
                    os.dup2(fd, target)
                for fd in fds:
                    if fd not in (0, 1, 2):
                        os.close(fd)
                os.environ.clear()
                os.environ.update(request["env"])
                return Job(request["kind"], request["args"])
            for fd in fds:
                os.close(fd)
            pidfd = os.pidfd_open(pid)
            children[pidfd] = pid
            socket.send_fds(sock, [str(pid).encode()], [pidfd])
    finally:
        if os.getpid() == _SERVER_PID:  # the server, ending: no child outlives it
            for fd, pid in children.items():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                os.close(fd)


def _run(job: Job) -> None:
    """The child: run the job as its own interpreter would run it as __main__."""
    if job.kind == "warren":
        import runpy

        sys.argv = ["warren", *job.args]
        runpy.run_module("warren", run_name="__main__", alter_sys=True)
    else:
        import powercut_fs

        sys.argv = [powercut_fs.__file__, *job.args]
        powercut_fs.main()


_SERVER_PID = os.getpid()


def main() -> None:
    sock = socket.socket(fileno=int(sys.argv[1]))
    import powercut_fs  # noqa: F401 (and mfusepy: every mount is a fork)

    job = _serve(sock)
    if job is not None:
        _run(job)  # SystemExit from warren's __main__ ends the child as usual


# -- the test side ------------------------------------------------------------------------------


class Child:
    """A forked child: the few things of subprocess.Popen that the tests use. Its
    exit status stays the server's (nothing here reads one)."""

    def __init__(self, pid: int, pidfd: int, stdin: IO[str] | None, stdout: IO[str] | None) -> None:
        self.pid = pid
        self._pidfd = pidfd
        self.stdin = stdin
        self.stdout = stdout
        self.ended = False

    def poll(self) -> bool | None:
        """None while it runs, else True."""
        return True if self._wait(0) else None

    def wait(self, timeout: float | None = None) -> None:
        if not self._wait(timeout):
            raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0)

    def _wait(self, timeout: float | None) -> bool:
        if not self.ended:
            ready, _, _ = select.select([self._pidfd], [], [], timeout)
            if ready:
                self.ended = True
                os.close(self._pidfd)
        return self.ended

    def send_signal(self, signum: int) -> None:
        if not self.ended:
            with contextlib.suppress(ProcessLookupError):  # already reaped by the server
                signal.pidfd_send_signal(self._pidfd, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Spawner:
    """The test side of one fork server."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = dict(os.environ, PYTHONPATH=str(SRC))
        self._proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), str(theirs.fileno())],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, pass_fds=[theirs.fileno()], env=env,
        )
        theirs.close()
        self._sock = ours
        self._lock = threading.Lock()

    def spawn(
        self, kind: str, args: Sequence[str], env: dict[str, str], stdin: bool = False, stderr_too: bool = False
    ) -> Child:
        """Start ``kind`` (warren, fuse) with ``args``: its stdout a pipe to read,
        with its stderr when ``stderr_too``; its stdin a pipe to write to if asked."""
        child_ends: list[int] = []
        streams: list[int] = []
        pin = None
        if stdin:
            r, w = os.pipe()
            child_ends.append(r)
            streams.append(0)
            pin = open(w, "w", buffering=1, encoding="utf-8")  # noqa: SIM115 (the Child's)
        r, w = os.pipe()
        child_ends.append(w)
        streams.append(1)
        if stderr_too:
            child_ends.append(w)
            streams.append(2)
        pout = open(r, encoding="utf-8")  # noqa: SIM115 (the Child's)
        request = {"kind": kind, "args": list(args), "env": env, "streams": streams}
        try:
            with self._lock:
                socket.send_fds(self._sock, [json.dumps(request).encode()], child_ends)
                msg, fds, _flags, _addr = socket.recv_fds(self._sock, 64, 1)
        finally:
            for fd in set(child_ends):
                os.close(fd)
        if not msg or not fds:
            raise RuntimeError("the power-cut tests' fork server ended")
        return Child(int(msg), fds[0], pin, pout)

    def close(self) -> None:
        """End the server (it kills and reaps any child left) and wait for it: its
        children's CPU time is the test process's from here on."""
        self._sock.close()
        try:
            self._proc.wait(60)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


_current: Spawner | None = None


def spawner() -> Spawner:
    """The fork server of the running test module (``spawner_fixture``)."""
    global _current
    if _current is None:
        _current = Spawner()
    return _current


def stop() -> None:
    """End the fork server, if one runs (the end of a test module)."""
    global _current
    if _current is not None:
        _current.close()
        _current = None


if __name__ == "__main__":
    main()
