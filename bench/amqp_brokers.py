"""The AMQP brokers bench/compare.py measures, behind one interface.

- :class:`Warren`: ``python -m warren`` from this checkout, a child process on
  a scratch data dir.
- :class:`LavinMQ`: a ``lavinmq`` binary, a child process on a scratch data
  dir; measured only when a binary is found (:func:`find_lavinmq`).
- :class:`RabbitMQ`: Debian's rabbitmq-server (installed with apt-get when
  missing) as a private node of this script: its own node name, ports, Erlang
  port mapper and directories, so it never meets another RabbitMQ on the
  machine (the default node on 5672 included).

Each has a ``name``, a ``port``, the ``pid`` whose memory is read, ``start()``,
``stop()``, ``versions()`` (rows for the report) and ``describe()`` (how it was
started, for the report). ``fresh`` brokers are child processes that
``restart()`` can replace with a new one, so memory scenarios see an idle
footprint rather than a heap left over from the runs before.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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


#: The Warren sources the broker (and `warren perf`) run from: this checkout's
#: src/ unless a script's --warren-src moved it (set_warren_src).
_WARREN_SRC = [ROOT / "src"]


def set_warren_src(path: str | Path) -> Path:
    """Run Warren and `warren perf` from another checkout's src/ (e.g. a compiled
    build of main, or a branch), so before/after runs use the same bench scripts."""
    src = Path(path).resolve()
    if not (src / "warren" / "__init__.py").exists():
        raise SystemExit(f"--warren-src {path}: no warren package there")
    _WARREN_SRC[0] = src
    return src


def warren_src() -> Path:
    return _WARREN_SRC[0]


def stream_off(src: Path) -> list[str]:
    """``--stream-port -1`` (its 5552 may be RabbitMQ's) for a Warren at ``src`` that
    has the flag: an older checkout, run for a before/after, has neither it nor the
    listener."""
    has_flag = "--stream-port" in (src / "warren" / "cli.py").read_text()
    return ["--stream-port", "-1"] if has_flag else []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def perf_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(warren_src()) + os.pathsep + env.get("PYTHONPATH", "")
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
        #: Port 0: a free port at each start.
        self.pick_port = port == 0
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
        if self.pick_port:
            self.port = free_port()
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
            *stream_off(warren_src()),
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
    """A private RabbitMQ node: its own node name, AMQP and distribution ports,
    Erlang port mapper (ERL_EPMD_PORT), cookie (HOME) and directories under a
    scratch dir, stopped with its process group. Other engineers' RabbitMQ
    nodes on the machine (the default one on 5672 included) never see it."""

    name = "RabbitMQ"
    cpu_note = "RabbitMQ's Erlang VM uses as many schedulers as there are CPUs"
    SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"

    def __init__(self, port: int = 0, plugins: list[str] | None = None, config: str = "") -> None:
        super().__init__(port)
        #: Plugins enabled at the start (e.g. rabbitmq_amqp1_0: AMQP 1.0 on the AMQP port).
        self.plugins = plugins or []
        #: rabbitmq.conf's lines (e.g. rabbitmq_stream's listener).
        self.config = config
        self.proc: subprocess.Popen[bytes] | None = None
        self.tmp: tempfile.TemporaryDirectory[str] | None = None
        self._env: dict[str, str] = {}
        self._pid: int | None = None

    @property
    def pid(self) -> int | None:
        return self._pid

    @property
    def node(self) -> str:
        return self._env.get("RABBITMQ_NODENAME", "")

    def install(self) -> None:
        if os.path.exists(self.SERVER):
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
        self.tmp = tempfile.TemporaryDirectory(prefix="rabbitmq-bench-")
        base = Path(self.tmp.name)
        (base / "enabled_plugins").write_text("[" + ",".join(self.plugins) + "].\n")
        (base / "rabbitmq.conf").write_text(self.config)
        self.port = self.port or free_port()
        self._env = dict(
            os.environ,
            HOME=str(base),
            RABBITMQ_NODENAME=f"warrenbench{self.port}@localhost",
            RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_NODE_PORT=str(self.port),
            RABBITMQ_DIST_PORT=str(free_port()),
            RABBITMQ_MNESIA_BASE=str(base / "mnesia"),
            RABBITMQ_LOG_BASE=str(base / "log"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(base / "enabled_plugins"),
            RABBITMQ_CONFIG_FILE=str(base / "rabbitmq.conf"),
            RABBITMQ_LOGS="-",
            ERL_EPMD_PORT=str(free_port()),
        )
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))  # inherited, if allowed
        with open(base / "server.log", "wb") as logf:
            self.proc = subprocess.Popen(
                [self.SERVER],
                cwd=base,
                env=self._env,
                stdout=logf,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # the whole Erlang VM is stopped as one group
            )
        deadline = time.monotonic() + 120
        while True:
            text = (base / "server.log").read_text(errors="replace")
            if "Server startup complete" in text:
                break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"RabbitMQ did not start: {text[-2000:]}")
            time.sleep(0.3)
        self._pid = self._find_pid()
        log(f"RabbitMQ up on {self.port}, node {self.node}, beam.smp pid {self._pid}")

    def _find_pid(self) -> int | None:
        """beam.smp in the server's process group (the script starts it as a child)."""
        assert self.proc is not None
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = (entry / "stat").read_text()
                comm = stat[stat.index("(") + 1 : stat.rindex(")")]
                pgid = int(stat.rsplit(")", 1)[1].split()[2])
                if pgid == self.proc.pid and comm.startswith("beam"):
                    return int(entry.name)
        return None

    def ctl(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["/usr/lib/rabbitmq/bin/rabbitmqctl", "-n", self.node, *args],
            env=self._env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
        )

    def stop(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
            subprocess.run(
                ["epmd", "-kill"], env=self._env, capture_output=True, timeout=10, check=False
            )
            self.proc = None
            self._pid = None
        if self.tmp is not None:
            self.tmp.cleanup()
            self.tmp = None

    def versions(self) -> dict[str, str]:
        def ev(expr: str) -> str:
            r = self.ctl("eval", expr)
            return r.stdout.strip().strip('"') if r.returncode == 0 else "unknown"

        r = self.ctl("version")
        rabbit = r.stdout.strip() if r.returncode == 0 else "unknown"
        pkg = sh(["dpkg-query", "-W", "-f", "${Version}", "rabbitmq-server"]).stdout.strip()
        return {
            "RabbitMQ": rabbit + (f" (Debian package {pkg})" if pkg else ""),
            "Erlang/OTP": f"{ev('erlang:system_info(otp_release).')} "
            f"(ERTS {ev('erlang:system_info(version).')})",
        }

    def describe(self) -> str:
        return (
            "Debian's `rabbitmq-server` as a private node (its own node name, ports, "
            "epmd and scratch dirs; an empty rabbitmq.conf, "
            + (f"plugins {', '.join(self.plugins)}" if self.plugins else "no plugins")
            + f"), default configuration otherwise, open-file limit {self.fd_limit()}"
        )
