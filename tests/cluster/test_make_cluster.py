"""`make cluster PORT=...` (tools/cluster.py): etcd and three named nodes on ports
derived from one base port, a table of them printed, each node answering on its
ports, and Ctrl-C (SIGINT) stopping everything cleanly."""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from types import ModuleType

import pika
import pytest
from etcd_proc import ETCD
from free_ports import free_port

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "cluster.py"


def _tool() -> ModuleType:
    # By its path: another module named "cluster" may be imported already.
    spec = importlib.util.spec_from_file_location("tools_cluster", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tool = _tool()


def test_the_default_base_port_stays_clear_of_make_run_and_etcd() -> None:
    used = set(tool.all_ports(tool.DEFAULT_BASE).values())
    assert len(used) == 2 + 3 * 7
    assert not used & {5672, 15672, 1883, 15692, 5552, 5679, 2379, 2380}
    assert tool.node_ports(30000, 2) == {
        "amqp": 30020,
        "http": 30021,
        "mqtt": 30022,
        "prometheus": 30023,
        "replication": 30024,
        "stream reads": 30025,
        "stream": 30026,
    }


def _free_base() -> int:
    for _ in range(50):
        base = free_port() // 10 * 10
        if base + 40 < 65536 and not any(map(tool.port_in_use, tool.all_ports(base).values())):
            return base
    raise AssertionError("no free block of ports")


class Output:
    """The tool's output lines, and a way to wait for one."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self._changed = threading.Condition()
        threading.Thread(target=self._read, args=(proc,), daemon=True).start()

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            with self._changed:
                self.lines.append(line)
                self._changed.notify_all()

    def wait_for(self, pattern: str, timeout: float = 60) -> str:
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for line in self.lines:
                    if regex.search(line):
                        return line
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"no {pattern!r} in:\n" + "".join(self.lines[-60:]))
                self._changed.wait(remaining)


@pytest.mark.skipif(ETCD is None, reason="etcd is not installed (make etcd)")
def test_make_cluster_with_a_base_port(tmp_path: Path) -> None:
    base = _free_base()
    proc = subprocess.Popen(
        [sys.executable, str(TOOL), "--dir", str(tmp_path / "cluster-data"), "--port", str(base)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT / "src")),
    )
    out = Output(proc)
    try:
        # The table: node name -> its ports.
        out.wait_for(
            r"^node\s+amqp\s+http\s+mqtt\s+prometheus\s+replication\s+stream reads\s+stream$"
        )
        for i in (1, 2, 3):
            ports = r"\s+".join(str(base + 10 * i + k) for k in range(7))
            out.wait_for(rf"^node{i}\s+{ports}$")
        out.wait_for(r"in-sync replicas: node\d, node\d$")  # the leader and both followers
        auth = "Basic " + base64.b64encode(b"guest:guest").decode()
        for i in (1, 2, 3):
            # AMQP on the node's port (a follower's passes through to the leader).
            params = pika.ConnectionParameters("127.0.0.1", base + 10 * i)
            with pika.BlockingConnection(params) as conn:
                conn.channel().queue_declare(f"from-node{i}", durable=True)
            request = urllib.request.Request(
                f"http://127.0.0.1:{base + 10 * i + 1}/api/cluster",
                headers={"Authorization": auth},
            )
            with urllib.request.urlopen(request, timeout=10) as resp:
                status = json.load(resp)
            assert status["in_sync_replicas"] == ["node1", "node2", "node3"]
            assert status["node"] in status["in_sync_replicas"]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
        for i in (1, 2, 3):
            out.wait_for(rf"^node{i} \| .*INFO warren.cli: stopped$", timeout=1)
        # Every port is free again: no node or etcd left behind.
        assert not [p for p in tool.all_ports(base).values() if tool.port_in_use(p)]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_a_base_port_in_use_is_refused_naming_the_port(tmp_path: Path) -> None:
    base = _free_base()
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", base + 21))  # node2's HTTP port
        taken.listen()
        result = subprocess.run(
            [sys.executable, str(TOOL), "--dir", str(tmp_path / "d"), "--port", str(base)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert result.returncode == 1
    assert f"in use: {base + 21} (node2 http)" in result.stderr
    assert "make cluster PORT=" in result.stderr
    assert not (tmp_path / "d").exists()


def test_a_node_from_before_names_keeps_its_id(tmp_path: Path) -> None:
    """A cluster-data made before nodes had names: renamed, no node would be in the
    stored in-sync replica set and none could lead; the old ids stay."""
    assert tool._node_name(tmp_path / "node1", "node1") == "node1"
    (tmp_path / "node1").mkdir()
    (tmp_path / "node1" / ".node_id").write_text("5f3a9c0d1e2b\n")
    assert tool._node_name(tmp_path / "node1", "node1") == "5f3a9c0d1e2b"
