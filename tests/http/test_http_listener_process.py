"""The `warren` command with its HTTP listener: the port it logs, and a busy port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from httphelp import Api
from procs import SRC, start_warren

pytestmark = pytest.mark.timeout(60)


def test_the_command_serves_the_api_on_the_port_it_logs(tmp_path: Path) -> None:
    proc, amqp_port = start_warren(tmp_path / "d")
    try:
        assert proc.stdout is not None
        http_port = 0
        for line in proc.stdout:
            if "started:" in line:
                http_port = int(line.split("http port ")[1].split(",")[0].split()[0])
                break
        assert http_port
        health = Api(http_port).get(f"/api/health/checks/port-listener/{amqp_port}")
        assert health == {"status": "ok", "port": amqp_port}
    finally:
        proc.terminate()
        proc.wait(30)


def test_a_busy_http_port_stops_the_start_with_a_clear_message(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "warren", "--amqp-port", "0", "--mqtt-port", "0", "--stream-port", "0", "--prometheus-port", "0", "--http-port", str(port),
             "-D", str(tmp_path / "d")],
            capture_output=True,
            text=True,
            env=dict(os.environ, PYTHONPATH=str(SRC)),
            timeout=30,
        )
    assert done.returncode == 1
    assert f"cannot listen on HTTP 127.0.0.1:{port}: address already in use" in done.stderr
