"""The `warren` command as a real process: starts, serves, stops cleanly on signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pika
import pika.exceptions
import pytest
from procs import SRC, start_warren


def _start(tmp_path: Path, *args: str) -> tuple[subprocess.Popen[str], int]:
    # The real `python -m warren` process: what these tests are about.
    proc, port = start_warren(tmp_path / "data", *args, fork=False)
    assert isinstance(proc, subprocess.Popen)
    return proc, port


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_cleanly_and_clients_get_320(tmp_path: Path, sig: signal.Signals) -> None:
    proc, port = _start(tmp_path)
    try:
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
        ch = conn.channel()
        ch.queue_declare("q1")
        ch.basic_publish("", "q1", b"x")
        assert ch.basic_get("q1", auto_ack=True)[2] == b"x"
        proc.send_signal(sig)
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
            while True:
                conn.process_data_events(time_limit=1)
        assert info.value.reply_code == 320
        assert "CONNECTION_FORCED" in info.value.reply_text
        assert proc.wait(15) == 0
        assert proc.stdout is not None
        assert "Warren stopped" in proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_data_dir_created_and_config_file_read(tmp_path: Path) -> None:
    ini = tmp_path / "warren.ini"
    ini.write_text("[amqp]\nframe_max = 8192\nchannel_max = 7\n")
    proc, port = _start(tmp_path, "--config", str(ini))
    try:
        assert (tmp_path / "data").is_dir()
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
        try:
            assert conn._impl.params.frame_max == 8192
            assert conn._impl.params.channel_max == 7
        finally:
            conn.close()
    finally:
        proc.terminate()
        assert proc.wait(15) == 0


def test_port_in_use_exits_with_clear_message(tmp_path: Path) -> None:
    proc, port = _start(tmp_path)
    try:
        env = dict(os.environ, PYTHONPATH=str(SRC))
        second = subprocess.run(
            [
                sys.executable,
                "-m",
                "warren",
                "--amqp-port",
                str(port),
                "--http-port",
                "0",
                "--mqtt-port",
                "-1",
                "--stream-port",
                "-1",
                "--prometheus-port",
                "-1",
                "-D",
                str(tmp_path / "d2"),
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=30,
        )
        assert second.returncode == 1
        assert str(port) in second.stderr
    finally:
        proc.terminate()
        proc.wait(15)


def test_ephemeral_keeps_data_in_a_temporary_dir_removed_at_exit(tmp_path: Path) -> None:
    """--ephemeral: the broker works as usual (durable queues included), its data
    lives in a fresh temporary directory, and that directory is gone after exit;
    a --data-dir given too is left untouched."""
    import re

    given = tmp_path / "data"
    env = dict(os.environ, PYTHONPATH=str(SRC))
    proc = subprocess.Popen(
        [sys.executable, "-m", "warren", "--ephemeral", "-D", str(given)]
        + ["--amqp-port", "0", "--http-port", "0", "--mqtt-port", "0", "--stream-port", "0", "--prometheus-port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        data_dir = port = None
        for line in proc.stdout:
            if m := re.search(r"ephemeral: data in (\S+),", line):
                data_dir = Path(m.group(1))
            if m := re.search(r"listening on AMQP [^:]+:(\d+)", line):
                port = int(m.group(1))
                break
        assert data_dir is not None and port is not None
        assert data_dir.is_dir() and data_dir != given
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
        ch = conn.channel()
        ch.queue_declare("kept-until-exit", durable=True)
        ch.basic_publish("", "kept-until-exit", b"x", pika.BasicProperties(delivery_mode=2))
        conn.close()
        assert any(data_dir.iterdir())
        proc.terminate()
        assert proc.wait(15) == 0
        assert not data_dir.exists()
        assert not given.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
