"""Warren cluster nodes as real processes (`warren` with [clustering], each
forked from a process that has imported Warren: tests/forkserver.py)."""

from __future__ import annotations

import queue
import re
import subprocess
import threading
import time
from pathlib import Path

import forkserver
import pika
from etcd_proc import free_port
from forkserver import Child

SRC = Path(__file__).resolve().parents[2] / "src"

PERSISTENT = pika.BasicProperties(delivery_mode=2)

# Notified whenever any node logs a line (wait_any).
_logged = threading.Condition()


class Node:
    def __init__(
        self,
        base: Path,
        name: str,
        etcd_url: str,
        prefix: str = "test",
        http: bool = False,
        host: str = "127.0.0.1",
        settings: dict[str, dict[str, str]] | None = None,
        netns: str | None = None,
    ) -> None:
        """``host``: the address every port binds to; ``settings``: more INI
        keys by section; ``netns``: the network namespace it runs in
        (netns.Network.namespaces)."""
        self.name = name
        self.host = host
        self.netns = netns
        self.data_dir = base / name
        self.amqp_port = free_port()
        self.repl_port = free_port()
        self.http_port = free_port() if http else -1
        #: Its stream read service's port while it follows.
        self.stream_read_port = free_port()
        self.config = base / f"{name}.ini"
        self.log_file = base / f"{name}.node.log"
        sections: dict[str, dict[str, object]] = {
            "main": {
                "data_dir": self.data_dir,
                "log_level": "info",
                # guest logs in from the test's clients on other hosts of a netns.Network.
                "loopback_users": "guest" if host == "127.0.0.1" else "",
            },
            "amqp": {"bind": host, "port": self.amqp_port},
            "mgmt": {"bind": host, "port": self.http_port},
            "mqtt": {"port": -1},
            "stream": {"port": -1, "tls_port": -1},
            "prometheus": {"port": -1},
            "clustering": {
                "enabled": "true",
                "etcd_endpoints": etcd_url,
                "etcd_prefix": prefix,
                "bind": host,
                "port": self.repl_port,
                "lease_ttl": 2,
                "stream_read_port": self.stream_read_port,
            },
        }
        for section, keys in (settings or {}).items():
            sections.setdefault(section, {}).update(keys)
        self.config.write_text(
            "".join(
                f"[{section}]\n" + "".join(f"{key} = {value}\n" for key, value in keys.items())
                for section, keys in sections.items()
            )
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.log: list[str] = []
        self.proc: Child | None = None

    @property
    def node_id(self) -> str:
        """Its cluster id (the node writes it into its data directory on first start)."""
        return (self.data_dir / ".node_id").read_text().strip()

    def start(self) -> Node:
        """`warren -c <its config>` in a fork of a process that has imported
        Warren already (tests/forkserver.py: a node's start without the imports),
        in its network namespace if it has one."""
        self.proc = forkserver.spawn(
            ["-c", str(self.config)], stdout=forkserver.PIPE, stderr=forkserver.STDOUT, netns=self.netns
        )
        threading.Thread(target=self._read, args=(self.proc,), daemon=True).start()
        return self

    def _read(self, proc: Child) -> None:
        assert proc.stdout is not None
        # Also kept in <base>/<name>.node.log: tests/conftest.py adds the tail of
        # every such log to a failed test's report.
        with self.log_file.open("a") as kept:
            for line in proc.stdout:
                kept.write(line)
                kept.flush()
                with _logged:
                    self.log.append(line)
                    _logged.notify_all()
                self.lines.put(line)

    def wait_for(self, pattern: str, timeout: float = 60) -> str:
        """Block until the node logs a line matching ``pattern`` (read from its output)."""
        deadline = time.monotonic() + timeout
        regex = re.compile(pattern)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(
                    f"{self.name} did not log {pattern!r}; its log:\n" + "".join(self.log[-40:])
                )
            try:
                line = self.lines.get(timeout=remaining)
            except queue.Empty:
                continue
            if regex.search(line):
                return line

    @property
    def address(self) -> tuple[str, int]:
        """Where clients reach its AMQP port."""
        return self.host, self.amqp_port

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def marks(nodes: list[Node]) -> dict[int, int]:
    """Where each node's log stands now (for wait_any's ``since``)."""
    with _logged:
        return {id(node): len(node.log) for node in nodes}


def wait_any(
    nodes: list[Node], pattern: str, timeout: float = 60, since: dict[int, int] | None = None
) -> Node:
    """The first of ``nodes`` to log a line matching ``pattern`` after ``since``
    (marks() taken before the action that should cause it; default: now)."""
    regex = re.compile(pattern)
    marks = dict(since) if since is not None else {id(node): len(node.log) for node in nodes}
    deadline = time.monotonic() + timeout
    with _logged:
        while True:
            for node in nodes:
                for line in node.log[marks[id(node)] :]:
                    if regex.search(line):
                        return node
                marks[id(node)] = len(node.log)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                logs = "".join(f"--- {node.name}\n" + "".join(node.log[-25:]) for node in nodes)
                raise AssertionError(f"no node logged {pattern!r}; their logs:\n{logs}")
            _logged.wait(remaining)


def start_cluster(nodes: list[Node]) -> Node:
    """Start the nodes, the first as leader; return it once all others are in sync
    (each node's ``ready:`` line is checked on the way)."""
    first = nodes[0].start()
    ready = first.wait_for(r"ready: leader ")  # its own listeners are up
    assert f": AMQP {first.host}:{first.amqp_port}" in ready, ready
    for node in nodes[1:]:
        node.start()
    for node in nodes[1:]:
        # Its relayed ports serve once it holds the leader's data.
        ready = node.wait_for(r"ready: follower ")
        assert f" of {first.node_id}: AMQP {node.host}:{node.amqp_port}" in ready, ready
    if len(nodes) > 1:
        first.wait_for(r"in-sync replicas: " + ", ".join([r"\w+"] * (len(nodes) - 1)) + "$")
    return first


def open_channel(
    address: tuple[str, int],
) -> tuple[pika.BlockingConnection, pika.adapters.blocking_connection.BlockingChannel]:
    conn = pika.BlockingConnection(pika.ConnectionParameters(*address))
    return conn, conn.channel()


def publish_jobs(address: tuple[str, int], start: int, count: int) -> None:
    """Confirmed persistent messages job-<start>... to the durable queue "jobs"."""
    conn, ch = open_channel(address)
    ch.queue_declare("jobs", durable=True)
    ch.confirm_delivery()
    for i in range(start, start + count):
        ch.basic_publish("", "jobs", b"job-%d" % i, PERSISTENT)
    conn.close()


def job_bodies(address: tuple[str, int]) -> set[bytes]:
    """Every message in "jobs", taken."""
    conn, ch = open_channel(address)
    bodies = set()
    while True:
        method, _props, body = ch.basic_get("jobs", auto_ack=True)
        if method is None:
            break
        bodies.add(body)
    conn.close()
    return bodies
