"""The tests' fork server: Warren processes forked from an interpreter that has
imported Warren once, instead of a fresh ``python -m warren`` each time.

A Python start plus ``import warren.app`` is some 0.35 s of CPU, most of a
broker's start; the suite starts brokers (cluster nodes, the power-cut tests'
brokers and file systems, procs.py's kill -9 brokers) a few hundred times. Each
pytest process starts one server, lazily (:func:`spawn`). It imports Warren
(and what a request names in ``preload``) once, then forks a child per request:
a process of its own with the given argv, environment, working directory,
standard streams and, if asked, network namespace (a partition test's node),
that runs what ``python -m MODULE ARGS`` (or ``python SCRIPT ARGS``) runs, from
``__main__`` on, and exits as that interpreter would (exit status, atexit
handlers, non-daemon threads joined). kill -9 kills it like any process.

The test side talks to the server over a Unix socket (SCM_RIGHTS carries the
child's standard streams) and gets a :class:`Child`, which reads like a
``subprocess.Popen``: pid, poll(), wait(), send_signal(), terminate(), kill(),
returncode, stdin/stdout/stderr text pipes. Its pidfd signals the child (never
a reused pid); the server, the children's parent, reaps each and writes its
exit status to a pipe of the child's, which the test side waits on.

Children die with the server (PR_SET_PDEATHSIG), and the server ends, killing
what is left, when the test process goes away (the socket's end). Their CPU
time is the server's children's: :func:`server_cpu` adds it to
tests/cputime.py's counts through ``EXTERNAL``.

:func:`fork_here` forks the calling process instead, for a process that is
itself a preloaded runner (tests/doc_snippets.py's, inside its namespaces).

Run as ``python forkserver.py FD``: FD is its end of the socket pair.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib
import json
import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import threading
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"

#: What a broker's start imports (warren/__main__.py, then cli._serve's deferred
#: imports): the server loads them before its first fork.
WARREN_MODULES = ("warren.cli", "warren.app", "warren.definitions_document", "warren.store.damage")
CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1

#: The stream values spawn() takes (subprocess's).
PIPE, DEVNULL, STDOUT = subprocess.PIPE, subprocess.DEVNULL, subprocess.STDOUT
Stream = int | IO[Any] | None


# -- the child ----------------------------------------------------------------------------------


def _prctl_deathsig(sig: int) -> None:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig)


def _enter_netns(name: str) -> None:
    """Join the network namespace `ip netns add` made as ``name`` (what
    `ip netns exec` does for the network, the part a node needs)."""
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        setns = getattr(os, "setns", None)  # Python 3.12
        if setns is not None:
            setns(fd, CLONE_NEWNET)
        elif ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns {name}: {os.strerror(err)}")
    finally:
        os.close(fd)


def _child(job: Mapping[str, Any], fds: Sequence[int], parent: int, close: Sequence[int]) -> None:
    """In a fresh fork: become the job's process and run it; never returns.

    ``fds`` are the child's ends of its streams, for ``job["streams"]`` (0, 1, 2);
    ``close``: the forking process's fds the child must not hold."""
    code = 1
    try:
        _prctl_deathsig(signal.SIGKILL)
        if os.getppid() != parent:  # the parent ended before prctl
            os._exit(1)
        for fd in close:
            os.close(fd)
        for target, fd in zip(job["streams"], fds, strict=True):
            os.dup2(fd, target)
        for fd in set(fds) - {0, 1, 2}:
            os.close(fd)
        if job.get("netns"):
            _enter_netns(job["netns"])
        if job.get("cwd"):
            os.chdir(job["cwd"])
        os.environ.clear()
        os.environ.update(job["env"])
        import atexit

        atexit._clear()  # the forking process's own
        code = run_main(job)
    except BaseException:  # noqa: BLE001 - never return into the forking process
        traceback.print_exc()
    finally:
        os._exit(code)


def run_main(job: Mapping[str, Any]) -> int:
    """Run ``python -m MODULE ARGS`` (job["module"]) or ``python SCRIPT ARGS``
    (job["script"]; sys.path as given in "sys_path_exact", else "sys_path"
    before the interpreter's) in this process as that interpreter would, from ``__main__``
    on, and end as it would (atexit, threads joined): the exit status."""
    code = 0
    try:
        if job.get("sys_path_exact") is not None:  # the caller worked it out
            sys.path[:] = job["sys_path_exact"]
        else:
            sys.path[:0] = job.get("sys_path", [])
            if job.get("script"):
                sys.path.insert(0, str(Path(job["script"]).parent))
        if job.get("module"):
            sys.argv = [job["module"], *job["args"]]
            runpy.run_module(job["module"], run_name="__main__", alter_sys=True)
        else:
            sys.argv = [job["script"], *job["args"]]
            runpy.run_path(job["script"], run_name="__main__")
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - as the interpreter reports an uncaught one
        traceback.print_exc()
        code = 1
    with contextlib.suppress(BaseException):
        threading._shutdown()  # type: ignore[attr-defined]  # joins non-daemon threads
    import atexit

    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()
    return code


def fork_here(job: Mapping[str, Any], fds: Sequence[int], close: Sequence[int] = ()) -> int:
    """Fork this process into the job (:func:`spawn` builds one: module or script,
    args, env, cwd, streams, netns, sys_path) with ``fds`` as its streams; the
    caller reaps the returned pid. For a process that has preloaded what the
    job needs (the server; tests/doc_snippets.py's runner)."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        _child(job, fds, parent, close)
    return pid


# -- the server ---------------------------------------------------------------------------------


def _preload(names: Sequence[str], loaded: set[str]) -> None:
    for name in names:
        if name not in loaded:
            loaded.add(name)
            try:
                importlib.import_module(name)
            except Exception:  # the child imports again, and its output says why
                traceback.print_exc()


def serve(sock: socket.socket) -> None:
    """Fork a child per request until the test side closes the socket; then kill
    and reap what is left."""
    children: dict[int, tuple[int, int]] = {}  # pidfd -> (pid, status pipe's write end)
    loaded: set[str] = set()
    _preload([*WARREN_MODULES, "uvloop"], loaded)
    try:
        while True:
            ready, _, _ = select.select([sock.fileno(), *children], [], [])
            for fd in ready:
                if fd in children:
                    pid, status = children.pop(fd)
                    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
                    os.write(status, str(code).encode())
                    os.close(status)
                    os.close(fd)
            if sock.fileno() not in ready:
                continue
            msg, fds, _flags, _addr = socket.recv_fds(sock, 1 << 16, 3)
            if not msg:
                return
            job = json.loads(msg)
            sys.path[:0] = [p for p in job.get("sys_path", []) if p not in sys.path]
            _preload(job.get("preload", []), loaded)
            # What the server imported lives as long as any child: the cyclic GC
            # need not walk it in each (gc.freeze's advice for a forking server).
            gc.freeze()
            status_r, status_w = os.pipe()
            busy = [sock.fileno(), status_r, status_w, *children, *(w for _, w in children.values())]
            pid = fork_here(job, fds, close=busy)
            for fd in fds:
                os.close(fd)
            pidfd = os.pidfd_open(pid)
            children[pidfd] = (pid, status_w)
            socket.send_fds(sock, [str(pid).encode()], [pidfd, status_r])
            os.close(status_r)
    finally:
        for fd, (pid, status) in children.items():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(fd)
            os.close(status)


def main() -> None:
    serve(socket.socket(fileno=int(sys.argv[1])))


# -- the test side ------------------------------------------------------------------------------


def env_with_src() -> dict[str, str]:
    """os.environ with this checkout's src/ first on PYTHONPATH."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH", "")) if p)
    return env


class Child:
    """A forked child, with what the tests use of subprocess.Popen."""

    def __init__(
        self, args: list[str], pid: int, pidfd: int, status: int,
        streams: tuple[IO[str] | None, IO[str] | None, IO[str] | None],
    ) -> None:
        self.args = args
        self.pid = pid
        self._pidfd = pidfd
        self._status = status
        self.stdin, self.stdout, self.stderr = streams
        self.returncode: int | None = None
        self._lock = threading.Lock()

    def poll(self) -> int | None:
        self._wait(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def _wait(self, timeout: float | None) -> bool:
        # Not under the lock: another thread may signal it meanwhile.
        if self.returncode is None:
            try:
                ready = select.select([self._status], [], [], timeout)[0]
            except (OSError, ValueError):  # another thread's wait closed it
                ready = []
            if ready:
                with self._lock:
                    if self.returncode is None:
                        text = os.read(self._status, 32)
                        # No status: the server ended without reaping it (it killed it).
                        self.returncode = int(text) if text else -signal.SIGKILL
                        os.close(self._status)
                        os.close(self._pidfd)
        return self.returncode is not None

    def send_signal(self, sig: int) -> None:
        with self._lock:
            if self.returncode is None:
                with contextlib.suppress(ProcessLookupError):  # ended, not yet waited for
                    signal.pidfd_send_signal(self._pidfd, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: float | None = None) -> tuple[str | None, str | None]:
        """Reads stdout and stderr (pipes) to their end, then waits."""
        if self.stdin is not None:
            self.stdin.close()
        out = self.stdout.read() if self.stdout is not None else None
        err = self.stderr.read() if self.stderr is not None else None
        self.wait(timeout)
        return out, err


class Server:
    """The test side of one fork server."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), str(theirs.fileno())],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, pass_fds=[theirs.fileno()],
            env=env_with_src(),
        )
        theirs.close()
        self._sock = ours
        self._lock = threading.Lock()
        self.last_cpu = 0.0

    @property
    def pid(self) -> int:
        return self._proc.pid

    def request(self, job: Mapping[str, Any], fds: Sequence[int]) -> tuple[int, int, int]:
        """Send a job with the child's stream fds: (pid, pidfd, status fd)."""
        with self._lock:
            socket.send_fds(self._sock, [json.dumps(job).encode()], list(fds))
            msg, got, _flags, _addr = socket.recv_fds(self._sock, 64, 2)
        if not msg or len(got) != 2:
            raise RuntimeError("the tests' fork server ended")
        return int(msg), got[0], got[1]

    def close(self) -> None:
        """End the server (it kills and reaps any child left) and wait for it."""
        self._sock.close()
        try:
            self._proc.wait(60)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


_server: Server | None = None
_server_lock = threading.Lock()


def server() -> Server:
    """This process's fork server, started on first use, ended at exit."""
    global _server
    with _server_lock:
        if _server is None:
            _server = Server()
            import atexit

            atexit.register(stop)
        return _server


def stop() -> None:
    """End the fork server, if one runs: its CPU is this process's children's from here on."""
    global _server
    with _server_lock:
        if _server is not None:
            _server.close()
            _server = None


def _stream(value: Stream, target: int, mode: str) -> tuple[int, IO[str] | None, list[int]]:
    """(the child's fd for ``target``, the parent's end as a text stream, fds to close)."""
    if value is None:  # inherited, as subprocess does
        fd = os.dup(target)
        return fd, None, [fd]
    if value == PIPE:
        r, w = os.pipe()
        ours, theirs = (w, r) if mode == "w" else (r, w)
        f = open(ours, mode, buffering=1 if mode == "w" else -1, encoding="utf-8", errors="replace")  # noqa: SIM115
        return theirs, f, [theirs]
    if value == DEVNULL:
        fd = os.open(os.devnull, os.O_RDWR)
        return fd, None, [fd]
    return (value if isinstance(value, int) else value.fileno()), None, []


def spawn(
    args: Sequence[str],
    *,
    module: str | None = "warren",
    script: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    stdin: Stream = None,
    stdout: Stream = None,
    stderr: Stream = None,
    netns: str | None = None,
    preload: Sequence[str] = (),
    sys_path: Sequence[str | Path] = (),
) -> Child:
    """``python -m MODULE ARGS`` (``python SCRIPT ARGS`` with ``script``) as a fork
    of this process's fork server. Streams as subprocess.Popen's (PIPE, DEVNULL,
    STDOUT for stderr, an fd or file; None inherits this process's), pipes in
    text mode; ``env`` defaults to os.environ with src/ on PYTHONPATH; ``netns``:
    `ip netns`'s name of the network namespace it runs in; ``preload``: modules
    the server imports before forking (once); ``sys_path``: put before sys.path."""
    if env is None:
        env = env_with_src()
    fds: list[int] = []
    targets: list[int] = []
    to_close: list[int] = []
    pipes: list[IO[str] | None] = []
    try:
        for target, value, mode in ((0, stdin, "w"), (1, stdout, "r"), (2, stderr, "r")):
            if target == 2 and value == STDOUT:
                fds.append(fds[1])
                targets.append(2)
                pipes.append(None)
                continue
            fd, pipe, close = _stream(value, target, mode)
            to_close += close
            pipes.append(pipe)
            fds.append(fd)
            targets.append(target)
        job = {
            "module": None if script is not None else module,
            "script": str(script) if script is not None else None,
            "args": list(args), "env": dict(env), "cwd": str(cwd) if cwd is not None else None,
            "streams": targets, "netns": netns, "preload": list(preload),
            "sys_path": [str(p) for p in sys_path],
        }
        pid, pidfd, status = server().request(job, fds)
    except BaseException:
        for p in pipes:
            if p is not None:
                p.close()
        raise
    finally:
        for fd in set(to_close):
            os.close(fd)
    name = str(script) if script is not None else f"-m {module}"
    return Child([sys.executable, name, *args], pid, pidfd, status, (pipes[0], pipes[1], pipes[2]))


def server_cpu() -> float:
    """CPU seconds of the running fork server and the children it has reaped (0
    when none runs: once ended and waited for, they are this process's children's)."""
    s = _server
    if s is None:
        return 0.0
    try:
        with open(f"/proc/{s.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return s.last_cpu
    # utime, stime, cutime, cstime
    s.last_cpu = sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    return s.last_cpu


try:
    import cputime  # tests/cputime.py: counted in WARREN_TEST_CPU's per-test seconds
except ImportError:  # the server's own sys.path has tests/ first; a caller's may not
    pass
else:
    if server_cpu not in cputime.EXTERNAL:
        cputime.EXTERNAL.append(server_cpu)


if __name__ == "__main__":
    main()
