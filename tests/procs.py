"""Running `python -m warren` as a real process for tests that need signals or kill -9."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def start_warren(data_dir: Path, *args: str) -> tuple[subprocess.Popen[str], int]:
    """Start the server on an ephemeral port; returns the process and the bound port."""
    env = dict(os.environ, PYTHONPATH=str(SRC))
    proc = subprocess.Popen(
        [sys.executable, "-m", "warren", "--amqp-port", "0", "--http-port", "0", "--mqtt-port", "0", "-D", str(data_dir)]
        + list(args),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        m = re.search(r"listening on AMQP [^:]+:(\d+)", line)
        if m:
            return proc, int(m.group(1))
    proc.wait(5)
    raise RuntimeError(f"warren exited without listening (status {proc.returncode})")
