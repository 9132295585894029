"""Knowing when a started `warren` can be used: its `ready:` line, and
`warren ctl await-startup` (rabbitmqctl await_startup), against real processes."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from free_ports import free_port
from procs import SRC

from warren.ctl.client import EXIT_CONNECT, Client, CtlError
from warren.ctl.startup import await_startup

pytestmark = pytest.mark.timeout(90)

ENV = dict(os.environ, PYTHONPATH=str(SRC))


def _accepts(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.connect(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _warren(data_dir: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "warren", "-D", str(data_dir), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=ENV,
    )


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    proc.communicate(timeout=30)


def test_the_ready_line_comes_once_every_listener_is_up(tmp_path: Path) -> None:
    proc = _warren(
        tmp_path / "d",
        *("--amqp-port", "0", "--mqtt-port", "0", "--stream-port", "0", "--http-port", "0", "--prometheus-port", "0"),
    )
    try:
        assert proc.stdout is not None
        listening: list[int] = []
        ready = ""
        for line in proc.stdout:
            m = re.search(r"listening on .*:(\d+)$", line.strip())
            if m:
                listening.append(int(m.group(1)))
            if " ready: " in line:
                ready = line.split(" ready: ", 1)[1].strip()
                break
        assert ready, f"no ready line (exit status {proc.poll()})"
        where = dict(re.findall(r"(\S+) 127\.0\.0\.1:(\d+)", ready))
        assert set(where) == {"AMQP", "MQTT", "stream", "HTTP", "Prometheus"}
        ports = [int(p) for p in where.values()]
        assert sorted(ports) == sorted(listening)  # every listener, each logged before
        assert all(_accepts(p) for p in ports)  # and accepting when the line is out
    finally:
        _stop(proc)


def test_await_startup_returns_once_a_broker_started_later_listens(tmp_path: Path) -> None:
    amqp, mqtt, http, prometheus = (free_port() for _ in range(4))
    url = f"http://127.0.0.1:{http}"
    waiter = subprocess.Popen(
        [sys.executable, "-m", "warren", "ctl", "--url", url, "await-startup", "--timeout", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    broker: subprocess.Popen[str] | None = None
    try:
        # The waiter is already polling a port nothing listens on yet.
        broker = _warren(
            tmp_path / "d",
            *("--amqp-port", str(amqp), "--mqtt-port", str(mqtt), "--stream-port", "-1"),
            *("--http-port", str(http), "--prometheus-port", str(prometheus)),
        )
        out, err = waiter.communicate(timeout=60)
        assert waiter.returncode == 0, err
        assert out == f"{url}: started\n"
        # Once it returns, every listener is up (HTTP, the one it asks, starts last).
        assert all(_accepts(p) for p in (amqp, mqtt, http, prometheus))
        # A refused login ends the wait at once, with its own status.
        refused = subprocess.run(
            [sys.executable, "-m", "warren", "ctl", "--url", url, "--password", "wrong",
             "await-startup", "--timeout", "60"],
            capture_output=True, text=True, env=ENV, timeout=30,
        )  # fmt: skip
        assert refused.returncode == 3, refused.stderr
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.communicate()
        if broker is not None:
            _stop(broker)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_await_startup_gives_up_after_its_timeout_with_the_reason() -> None:
    port = free_port()  # nothing listens there: every attempt is refused
    clock = FakeClock()
    client = Client(f"http://127.0.0.1:{port}", "guest", "guest")
    with pytest.raises(CtlError) as caught:
        await_startup(client, 2.0, clock=clock, sleep=clock.sleep)
    assert caught.value.status == EXIT_CONNECT
    assert caught.value.message == (
        f"the broker at http://127.0.0.1:{port} did not answer within 2s "
        f"(last: cannot connect to http://127.0.0.1:{port}: Connection refused)"
    )
    assert clock.now == pytest.approx(102.0)  # waited out the timeout, no longer
    assert len(clock.slept) >= 20 and max(clock.slept) <= 0.1  # polling every 0.1 s


def test_await_startup_is_in_the_help() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "warren", "ctl", "--help"],
        capture_output=True, text=True, env=ENV, timeout=30,
    )  # fmt: skip
    assert "await-startup" in done.stdout
