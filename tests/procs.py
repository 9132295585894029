"""Running `python -m warren` as a real process for tests that need signals or kill -9."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def start_warren(data_dir: Path, *args: str) -> tuple[subprocess.Popen[str], int]:
    """Start the server on ephemeral ports; returns the process and the AMQP port."""
    return _start(data_dir, "AMQP", args)


def start_warren_mqtt(data_dir: Path, *args: str) -> tuple[subprocess.Popen[str], int]:
    """Like start_warren, but returns the MQTT listener's port."""
    return _start(data_dir, "MQTT", args)


def start_warren_stream(data_dir: Path, *args: str) -> tuple[subprocess.Popen[str], int]:
    """Like start_warren, but returns the stream protocol listener's port."""
    return _start(data_dir, "stream", args)


def _start(
    data_dir: Path, protocol: str, args: tuple[str, ...]
) -> tuple[subprocess.Popen[str], int]:
    env = dict(os.environ, PYTHONPATH=str(SRC))
    proc = subprocess.Popen(
        [sys.executable, "-m", "warren", "--amqp-port", "0", "--http-port", "0", "--mqtt-port", "0", "--stream-port", "0", "--prometheus-port", "0", "-D", str(data_dir)]
        + list(args),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        m = re.search(rf"listening on {protocol} [^:]+:(\d+)", line)
        if m:
            return proc, int(m.group(1))
    proc.wait(5)
    raise RuntimeError(f"warren exited without listening on {protocol} (status {proc.returncode})")
