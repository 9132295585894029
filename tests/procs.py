"""`python -m warren` as a process of its own, for tests that need signals or kill -9.

The broker is forked from the tests' fork server (tests/forkserver.py: the
same command without a fresh interpreter importing Warren again), unless
``fork=False``: tests about the `python -m warren` process itself (its
interpreter's start, signals as a shell sends them) start the real one."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import forkserver
from forkserver import Child

SRC = Path(__file__).resolve().parents[1] / "src"

#: What start_warren returns: a forked child or, with fork=False, a real process.
Process = subprocess.Popen[str] | Child


def start_warren(data_dir: Path, *args: str, fork: bool = True) -> tuple[Process, int]:
    """Start the server on ephemeral ports; returns the process and the AMQP port."""
    return _start(data_dir, "AMQP", args, fork)


def start_warren_mqtt(data_dir: Path, *args: str, fork: bool = True) -> tuple[Process, int]:
    """Like start_warren, but returns the MQTT listener's port."""
    return _start(data_dir, "MQTT", args, fork)


def start_warren_stream(data_dir: Path, *args: str, fork: bool = True) -> tuple[Process, int]:
    """Like start_warren, but returns the stream protocol listener's port."""
    return _start(data_dir, "stream", args, fork)


def _start(data_dir: Path, protocol: str, args: tuple[str, ...], fork: bool) -> tuple[Process, int]:
    env = dict(os.environ, PYTHONPATH=str(SRC))
    argv = ["--amqp-port", "0", "--http-port", "0", "--mqtt-port", "0", "--stream-port", "0",
            "--prometheus-port", "0", "-D", str(data_dir), *args]
    proc: Process
    if fork:
        proc = forkserver.spawn(argv, env=env, stdout=forkserver.PIPE, stderr=forkserver.STDOUT)
    else:
        proc = subprocess.Popen(
            [sys.executable, "-m", "warren", *argv],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        )
    assert proc.stdout is not None
    for line in proc.stdout:
        m = re.search(rf"listening on {protocol} [^:]+:(\d+)", line)
        if m:
            return proc, int(m.group(1))
    proc.wait(5)
    raise RuntimeError(f"warren exited without listening on {protocol} (status {proc.returncode})")
