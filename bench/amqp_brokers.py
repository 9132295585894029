"""The AMQP brokers bench/compare.py measures, behind one interface.

- :class:`Warren`: ``python -m warren`` from this checkout, a child process on
  a scratch data dir.
- :class:`LavinMQ`: a ``lavinmq`` binary, a child process on a scratch data
  dir; measured only when a binary is found (:func:`find_lavinmq`).
- :class:`RabbitMQ`: Debian's rabbitmq-server on its default port, installed
  with apt-get when missing and left running if it already was.

Each has a ``name``, a ``port``, the ``pid`` whose memory is read, ``start()``,
``stop()``, ``versions()`` (rows for the report) and ``describe()`` (how it was
started, for the report). ``fresh`` brokers are child processes that
``restart()`` can replace with a new one, so memory scenarios see an idle
footprint rather than a heap left over from the runs before.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import resource
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

WARREN_PORT = 5673
RABBITMQ_PORT = 5672
LAVINMQ_PORT = 5674
#: Open-file limit for RabbitMQ started here (what Debian's systemd unit sets).
NOFILE = 65536


def log(msg: str) -> None:
    print(f"[compare {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def sh(
    cmd: list[str], timeout: float = 120, check: bool = False
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, check=check, stdin=subprocess.DEVNULL
    )


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1):
        return True
    return False


def perf_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    return env


def display(cmd: list[str]) -> str:
    """A command as the report shows it: `warren perf ...` instead of the interpreter path."""
    if cmd[:3] == [sys.executable, "-m", "warren"]:
        cmd = ["warren", *cmd[3:]]
    return shlex.join(cmd)


class Broker:
    """What compare.py needs of a broker; see the module docstring."""

    name = ""
    #: A child process that restart() replaces with a fresh one.
    fresh = False
    #: How the broker uses the CPUs, for the report.
    cpu_note = ""
    #: Files the broker keeps open for each (empty) queue, where that is known.
    files_per_queue = 0

    def __init__(self, port: int) -> None:
        self.port = port

    @property
    def pid(self) -> int | None:
        raise NotImplementedError

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def restart(self) -> None:
        self.stop()
        self.start()

    def versions(self) -> dict[str, str]:
        return {}

    def describe(self) -> str:
        raise NotImplementedError

    def fd_limit(self) -> str:
        """The broker process's open-file limit (soft), from /proc."""
        if self.pid is None:
            return "unknown"
        with contextlib.suppress(OSError), open(f"/proc/{self.pid}/limits") as f:
            for line in f:
                if line.startswith("Max open files"):
                    return line.split()[3]
        return "unknown"


class ChildBroker(Broker):
    """A broker run as a child of this script on a scratch data dir, stopped with SIGTERM."""

    fresh = True
    tmp_prefix = "bench-"

    def __init__(self, port: int) -> None:
        super().__init__(port)
        self.proc: subprocess.Popen[bytes] | None = None
        self.tmp: tempfile.TemporaryDirectory[str] | None = None
        self.cmd: list[str] = []
        self.data_dir = Path()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def command(self, tmp: Path) -> list[str]:
        """The command line; ``self.data_dir`` is set (under ``tmp``) before this is called."""
        raise NotImplementedError

    def env(self) -> dict[str, str] | None:
        return None

    def start(self) -> None:
        if port_open(self.port):
            raise RuntimeError(f"port {self.port} is already in use")
        self.tmp = tempfile.TemporaryDirectory(prefix=self.tmp_prefix)
        tmp = Path(self.tmp.name)
        self.data_dir = tmp / "data"
        self.cmd = self.command(tmp)
        with open(tmp / "broker.log", "wb") as logf:
            self.proc = subprocess.Popen(
                self.cmd,
                stdout=logf,
                stderr=subprocess.STDOUT,
                env=self.env(),
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + 30
        while not port_open(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log_tail()
                self.stop()
                raise RuntimeError(f"{self.name} did not start; log: {tail}")
            time.sleep(0.2)
        log(f"{self.name} up, pid {self.proc.pid}, data dir {self.data_dir}")

    def log_tail(self) -> str:
        if self.tmp is None:
            return ""
        with contextlib.suppress(OSError):
            return (Path(self.tmp.name) / "broker.log").read_text(errors="replace")[-2000:]
        return ""

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
        if self.tmp is not None:
            self.tmp.cleanup()
            self.tmp = None

    def shown_command(self) -> str:
        return display(self.cmd).replace(str(self.data_dir), "<tmp dir>")


class Warren(ChildBroker):
    name = "Warren"
    tmp_prefix = "warren-bench-"
    cpu_note = "Warren is one Python process"

    def __init__(self, port: int = WARREN_PORT) -> None:
        super().__init__(port)

    def command(self, tmp: Path) -> list[str]:
        return [
            sys.executable,
            "-m",
            "warren",
            "--amqp-port",
            str(self.port),
            "--http-port",
            "-1",  # no management listener: RabbitMQ's may hold 15672
            "--mqtt-port",
            "-1",
            "--prometheus-port",
            "-1",
            "-D",
            str(self.data_dir),
            "--log-level",
            "warning",
        ]

    def env(self) -> dict[str, str] | None:
        return perf_env()

    def describe(self) -> str:
        return f"`{self.shown_command()}` (default configuration otherwise, uvloop when installed)"


def find_lavinmq(option: str | None) -> tuple[str | None, str]:
    """The LavinMQ binary to run: ``--lavinmq PATH``, else $LAVINMQ, else ``lavinmq`` on
    PATH. Returns (path, where it came from) or (None, why there is none)."""
    if option is not None:
        source = "--lavinmq"
        candidate = option
    elif os.environ.get("LAVINMQ"):
        source = "$LAVINMQ"
        candidate = os.environ["LAVINMQ"]
    else:
        found = shutil.which("lavinmq")
        if found is None:
            return None, "no --lavinmq PATH, no $LAVINMQ, and no lavinmq on PATH"
        return found, "lavinmq on PATH"
    path = shutil.which(candidate) if os.sep not in candidate else candidate
    if path is None or not os.access(path, os.X_OK) or not os.path.isfile(path):
        return None, f"{source} {candidate!r} is not an executable file"
    return path, source


class LavinMQ(ChildBroker):
    """LavinMQ with its built-in defaults: an empty config file (so no
    /etc/lavinmq/lavinmq.ini is read), loopback only, no HTTP listener."""

    name = "LavinMQ"
    tmp_prefix = "lavinmq-bench-"
    cpu_note = "LavinMQ is one Crystal process (one thread: v1 is built without -Dpreview_mt)"
    files_per_queue = 2  # v1: a message segment and an acks file per queue

    def __init__(self, binary: str, port: int = LAVINMQ_PORT) -> None:
        super().__init__(port)
        self.binary = binary

    def command(self, tmp: Path) -> list[str]:
        config = tmp / "lavinmq.ini"
        config.write_text("")
        return [
            self.binary,
            "--config",
            str(config),
            "--data-dir",
            str(self.data_dir),
            "--bind",
            "127.0.0.1",
            "--amqp-port",
            str(self.port),
            "--http-port",
            "-1",  # no management listener
            "--http-unix-path",  # lavinmqctl's socket, /tmp/lavinmqctl.sock by default
            str(tmp / "lavinmqctl.sock"),
            "--log-level",
            "warn",
        ]

    def shown_command(self) -> str:
        tmp = str(self.data_dir.parent)
        text = shlex.join([os.path.basename(self.cmd[0]), *self.cmd[1:]])
        return text.replace(str(self.data_dir), "<tmp dir>").replace(tmp, "<tmp>")

    def describe(self) -> str:
        return (
            f"`{self.shown_command()}` (built-in defaults otherwise; the empty config file "
            f"keeps any /etc/lavinmq/lavinmq.ini out), open-file limit {self.fd_limit()}"
        )

    def versions(self) -> dict[str, str]:
        r = sh([self.binary, "--build-info"], timeout=30)
        lines = [line.strip() for line in r.stdout.splitlines() if line.strip()]
        if r.returncode != 0 or not lines:
            return {"LavinMQ": "unknown"}
        version = lines[0].removeprefix("LavinMQ ").strip()
        crystal = next((x.split(" (")[0] for x in lines if x.startswith("Crystal ")), "")
        llvm = next((x.replace(":", "") for x in lines if x.startswith("LLVM")), "")
        flags = next((x.split(":", 1)[1].strip() for x in lines if x.startswith("Build flags")), "")
        built = ", ".join(x for x in (crystal, llvm, f"build flags {flags}" if flags else "") if x)
        return {"LavinMQ": version + (f" ({built})" if built else "")}


class RabbitMQ(Broker):
    name = "RabbitMQ"
    cpu_note = "RabbitMQ's Erlang VM uses as many schedulers as there are CPUs"

    def __init__(self, port: int = RABBITMQ_PORT) -> None:
        super().__init__(port)
        self.started_here = False
        self._pid: int | None = None

    @property
    def pid(self) -> int | None:
        return self._pid

    def running(self) -> bool:
        if shutil.which("rabbitmqctl") is None:
            return False
        return sh(["rabbitmqctl", "-q", "status"], timeout=60).returncode == 0

    def install(self) -> None:
        if shutil.which("rabbitmq-server") is not None:
            return
        log("installing rabbitmq-server with apt-get")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        cmd = ["apt-get", "install", "-y", "rabbitmq-server"]
        if subprocess.run(cmd, env=env).returncode != 0:
            log("apt-get install failed; running apt-get update and trying again")
            subprocess.run(["apt-get", "update"], env=env, check=True)
            subprocess.run(cmd, env=env, check=True)

    def start(self) -> None:
        self.install()
        if self.running():
            log("RabbitMQ is already running; it will be left running")
        else:
            log("starting RabbitMQ (rabbitmq-server -detached)")
            subprocess.run(
                ["rabbitmq-server", "-detached"], check=True, capture_output=True, **self._as_user()
            )
            self.started_here = True
            deadline = time.monotonic() + 120
            while True:
                r = sh(["rabbitmqctl", "await_startup", "--timeout", "30"], timeout=60)
                if r.returncode == 0:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"RabbitMQ did not start: {r.stderr.strip()}")
                time.sleep(1)
        self._pid = self._find_pid()
        deadline = time.monotonic() + 30
        while not port_open(self.port):
            if time.monotonic() > deadline:
                raise RuntimeError(f"RabbitMQ is not listening on {self.port}")
            time.sleep(0.5)
        log(f"RabbitMQ up, beam.smp pid {self._pid}")

    def _as_user(self) -> dict[str, Any]:
        """Run as the rabbitmq user with 65,536 file descriptors, like Debian's systemd unit.

        Started by root, Debian's wrapper script `su`s to rabbitmq, and pam_limits
        then leaves the node 1,024 descriptors: RabbitMQ refuses connections after
        about 830. The packaged systemd unit sets LimitNOFILE=65536; this does the
        same (the wrapper, run as rabbitmq, starts the node directly).
        """
        if os.geteuid() != 0:
            return {}
        try:
            pw = pwd.getpwnam("rabbitmq")
        except KeyError:
            return {}
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))  # inherited
        return {
            "user": pw.pw_uid,
            "group": pw.pw_gid,
            "extra_groups": [],
            "cwd": pw.pw_dir,
            "env": dict(os.environ, HOME=pw.pw_dir),
        }

    def _find_pid(self) -> int | None:
        r = sh(["rabbitmqctl", "eval", "os:getpid()."], timeout=60)
        text = r.stdout.strip().strip('"')
        if r.returncode == 0 and text.isdigit():
            return int(text)
        r = sh(["pidof", "beam.smp"])
        pids = r.stdout.split()
        return int(pids[0]) if len(pids) == 1 else None

    def stop(self) -> None:
        if self.started_here:
            log("stopping RabbitMQ (it was started by this script)")
            # shutdown waits until the Erlang VM has exited; stop is the fallback
            if sh(["rabbitmqctl", "shutdown"], timeout=180).returncode != 0:
                sh(["rabbitmqctl", "stop"], timeout=180)
            self.started_here = False

    def versions(self) -> dict[str, str]:
        def ev(expr: str) -> str:
            r = sh(["rabbitmqctl", "eval", expr], timeout=60)
            return r.stdout.strip().strip('"') if r.returncode == 0 else "unknown"

        r = sh(["rabbitmqctl", "version"], timeout=60)
        rabbit = r.stdout.strip() if r.returncode == 0 else "unknown"
        pkg = sh(["dpkg-query", "-W", "-f", "${Version}", "rabbitmq-server"]).stdout.strip()
        return {
            "RabbitMQ": rabbit + (f" (Debian package {pkg})" if pkg else ""),
            "Erlang/OTP": f"{ev('erlang:system_info(otp_release).')} "
            f"(ERTS {ev('erlang:system_info(version).')})",
        }

    def describe(self) -> str:
        if self.started_here:
            return (
                "`rabbitmq-server -detached` as the rabbitmq user, Debian's default "
                f"configuration, open-file limit {self.fd_limit()} (Debian's systemd unit "
                f"asks for {NOFILE:,}; this machine's hard limit may be lower)"
            )
        return (
            "already running when the script started (left as it was); "
            f"open-file limit {self.fd_limit()}"
        )
