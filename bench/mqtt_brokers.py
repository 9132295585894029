"""Start Warren's or mosquitto's MQTT listener on a free port, for the MQTT benches.

Shared by bench/mqtt_compare.py and bench/mqtt_idle.py. A broker that cannot be
started (mosquitto not installed, Warren without ``--mqtt-port``) raises
:class:`BrokerUnavailable` with the reason, so the benches can skip it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parents[1]
MOSQUITTO = "/usr/sbin/mosquitto"
BROKERS = ("warren", "mosquitto")
#: Open-file limit given to the brokers (raised to /proc/sys/fs/nr_open when lower).
NOFILE = 1_048_576


T = TypeVar("T")


class BrokerUnavailable(Exception):
    """The broker is not installed or did not come up."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def nofile_limit() -> int:
    try:
        return min(NOFILE, int(Path("/proc/sys/fs/nr_open").read_text()))
    except (OSError, ValueError):
        return NOFILE


def _raise_nofile() -> None:
    """preexec_fn: lift the child's open-file limit (the hard limit needs root)."""
    n = nofile_limit()
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))
        return
    with contextlib.suppress(ValueError, OSError):
        _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def perf_env(src: Path | None = None) -> dict[str, str]:
    """The environment for ``python -m warren ...``: ``src`` (default this checkout's)
    first on PYTHONPATH."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(src or ROOT / "src") + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""
    )
    return env


def mosquitto_config(port: int, max_queued: int = 10_000_000) -> str:
    """A config for the benches: one loopback listener, anonymous, nothing persisted.

    ``max_queued_messages`` is high so a subscriber that falls behind loses nothing
    (mosquitto drops beyond it, QoS 1 included); ``max_inflight_messages`` stays at
    mosquitto's default of 20 (also the Receive Maximum it announces to MQTT 5 clients).
    """
    return (
        f"listener {port} 127.0.0.1\n"
        "allow_anonymous true\n"
        "persistence false\n"
        f"max_queued_messages {max_queued}\n"
        "max_connections -1\n"
        "log_dest stderr\n"
        "log_type error\n"
        "log_type warning\n"
    )


def _wait_port(proc: subprocess.Popen[bytes], port: int, log: Path, name: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-1500:] if log.exists() else ""
                last = tail.strip().splitlines()[-1] if tail.strip() else "(empty log)"
                with contextlib.suppress(OSError):
                    proc.kill()
                raise BrokerUnavailable(
                    f"{name} did not start (exit status {proc.poll()}): {last}\n{tail}"
                ) from None
            time.sleep(0.05)  # polling a child's listener: there is nothing to wait on


def version(name: str, warren_src: Path | None = None) -> str:
    if name == "mosquitto":
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(
                [MOSQUITTO, "-h"], capture_output=True, text=True, timeout=5
            ).stdout
            return out.splitlines()[0].replace("mosquitto version ", "")
        return "?"
    code = "import warren; print(f'{warren.__version__} ({warren.build_description()})')"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=30,
            env=perf_env(warren_src),
        )
        if out.returncode == 0:
            return out.stdout.strip()
    return "?"


@contextlib.contextmanager
def broker(name: str, warren_src: Path | None = None) -> Iterator[tuple[int, int]]:
    """Run broker ``name`` for the duration of the block; yields (pid, MQTT port).
    ``warren_src``: run Warren from that ``src`` directory (default: this checkout's)."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix=f"mqtt-bench-{name}-") as tmp:
        log = Path(tmp) / "broker.log"
        if name == "mosquitto":
            if not Path(MOSQUITTO).exists():
                raise BrokerUnavailable(
                    f"{MOSQUITTO} not found (apt-get install mosquitto, or make mosquitto)"
                )
            conf = Path(tmp) / "mosquitto.conf"
            conf.write_text(mosquitto_config(port))
            cmd = [MOSQUITTO, "-c", str(conf)]
        elif name == "warren":
            cli = (warren_src or ROOT / "src") / "warren" / "cli.py"
            cmd = [
                sys.executable,
                "-m",
                "warren",
                "--mqtt-port",
                str(port),
                # an older Warren (warren_src, a before/after) has no stream listener
                *(["--stream-port", "-1"] if "--stream-port" in cli.read_text() else []),
                "--prometheus-port",
                "-1",
                "--amqp-port",
                "0",
                "--http-port",
                "-1",
                "--ephemeral",
                "--log-level",
                "warning",
            ]
        else:
            raise BrokerUnavailable(f"unknown broker {name!r} (known: {', '.join(BROKERS)})")
        with open(log, "wb") as logf:
            proc = subprocess.Popen(
                cmd,
                stdout=logf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=perf_env(warren_src if name == "warren" else None),
                preexec_fn=_raise_nofile,  # noqa: PLW1509 (no threads yet)
            )
        try:
            _wait_port(proc, port, log, name)
            yield proc.pid, port
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def perf_command(*args: str) -> list[str]:
    """``warren perf ...`` run from this checkout."""
    return [sys.executable, "-m", "warren", "perf", *args]


def add_common_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--brokers", default="warren,mosquitto", help="default warren,mosquitto")
    ap.add_argument(
        "--warren-src",
        type=Path,
        metavar="DIR",
        help="run Warren from this src directory (e.g. another branch's checkout; "
        "default: this one's)",
    )


def parse_brokers(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in BROKERS]
    if unknown:
        raise SystemExit(f"unknown broker(s): {', '.join(unknown)} (known: {', '.join(BROKERS)})")
    return names


def on_broker(
    name: str, warren_src: Path | None, skipped: dict[str, str], fn: Callable[[int, int], T]
) -> T | None:
    """``fn(pid, port)`` on a fresh broker ``name``; None when it was skipped before or
    does not start (then the reason is put in ``skipped`` and said on stderr)."""
    if name in skipped:
        return None
    try:
        with broker(name, warren_src) as (pid, port):
            return fn(pid, port)
    except BrokerUnavailable as exc:
        skipped[name] = str(exc)
        print(f"skipping {name}: {exc}", file=sys.stderr)
        return None


def print_skipped(skipped: dict[str, str]) -> None:
    """After the table: the brokers that were skipped, and why (the first line)."""
    for name, why in skipped.items():
        print(f"\n{name}: skipped ({why.splitlines()[0]})")
