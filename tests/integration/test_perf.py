"""`warren perf` against an embedded Warren: throughput, connection-count, queue-count.

The perf tools run as real subprocesses (`python -m warren perf ...`), as a user
would run them; results are read from their --json output and checked against
the broker's own state.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

import pytest
from conftest import BrokerThread
from paths import SRC

from warren.client import URI, Client
from warren.perf.report import bucket, bucket_value_us, percentiles_ms
from warren.perf.throughput import ThroughputParams, plan

ENV = dict(os.environ, PYTHONPATH=str(SRC))


def perf(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "warren", "perf", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV,
    )


def warren_process(*args: str, **popen: Any) -> subprocess.Popen[str]:
    """``python -m warren ARGS`` from this checkout, its output as text (stdout and
    stderr pipes unless ``popen`` says otherwise)."""
    popen.setdefault("stdout", subprocess.PIPE)
    popen.setdefault("stderr", subprocess.PIPE)
    return subprocess.Popen([sys.executable, "-m", "warren", *args], text=True, env=ENV, **popen)


def check_no_broker_imports(modules: str, forbidden: tuple[str, ...]) -> None:
    """Importing ``modules`` (comma-separated) in a fresh interpreter loads none of ``forbidden``."""
    code = (
        f"import sys, {modules}; print(sorted(m for m in sys.modules if m.startswith('warren.')))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV)
    assert r.returncode == 0, r.stderr
    for name in forbidden:
        assert f"'{name}" not in r.stdout


def perf_json(*args: str) -> dict[str, Any]:
    r = perf(*args, "--json")
    assert r.returncode == 0, f"status {r.returncode}\n{r.stdout}\n{r.stderr}"
    result: dict[str, Any] = json.loads(r.stdout)
    return result


def queue_names(broker: BrokerThread) -> list[str]:
    return broker.call(lambda: sorted(broker.broker.vhosts["/"].queues))


def check_throughput(s: dict[str, Any], published: int, consumed: int) -> None:
    assert s["published"] == published
    assert s["consumed"] == consumed
    assert s["publish_rate"] > 0
    assert s["consume_rate"] > 0
    assert s["duration_s"] > 0
    lat = s["latency_ms"]
    assert lat is not None
    assert 0 <= lat["p50"] <= lat["p95"] <= lat["p99"] <= lat["max"]
    assert lat["samples"] == consumed
    assert "errors" not in s


def test_throughput_no_confirms_no_ack(broker: BrokerThread) -> None:
    s = perf_json("throughput", "--uri", broker.url, "-x", "1", "-y", "1", "-C", "2000")
    check_throughput(s, 2000, 2000)
    assert s["params"]["pmessages"] == 2000
    assert s["params"]["uri"] == broker.url
    assert "confirmed" not in s
    # The queue perf declared is gone again.
    assert "perf-test" not in queue_names(broker)


def test_throughput_confirms_and_multi_ack(broker: BrokerThread) -> None:
    s = perf_json(
        "throughput", "--uri", broker.url, "-C", "2000", "-c", "100", "-a", "100", "-q", "500"
    )
    check_throughput(s, 2000, 2000)
    assert s["confirmed"] == 2000
    assert s["nacked"] == 0


def test_throughput_persistent_durable(broker: BrokerThread) -> None:
    s = perf_json(
        "throughput",
        "--uri",
        broker.url,
        "-C",
        "1000",
        "-p",
        "--durable",
        "-c",
        "200",
        "-a",
        "50",
        "-q",
        "200",
        "--queue",
        "perf-durable",
    )
    check_throughput(s, 1000, 1000)
    assert s["confirmed"] == 1000
    assert s["queues"] == ["perf-durable"]


def test_throughput_fanout_to_three_queues(broker: BrokerThread) -> None:
    s = perf_json("throughput", "--uri", broker.url, "--queues", "3", "-C", "2000", "-a", "100")
    check_throughput(s, 2000, 6000)
    assert s["queues"] == ["perf-test-1", "perf-test-2", "perf-test-3"]
    assert len(s["client_cpu"]["consumers"]) == 3
    names = queue_names(broker)
    assert not [n for n in names if n.startswith("perf-test")]
    exchanges = broker.call(lambda: list(broker.broker.vhosts["/"].exchanges))
    assert "perf-fanout" not in exchanges


def test_throughput_several_publishers_and_consumers(broker: BrokerThread) -> None:
    s = perf_json(
        "throughput", "--uri", broker.url, "-x", "2", "-y", "2", "-C", "1000", "-s", "4096"
    )
    check_throughput(s, 2000, 2000)
    assert len(s["client_cpu"]["publishers"]) == 2
    assert len(s["client_cpu"]["consumers"]) == 2


def test_throughput_small_bodies_carry_no_latency(broker: BrokerThread) -> None:
    s = perf_json("throughput", "--uri", broker.url, "-s", "4", "-C", "500")
    assert s["published"] == s["consumed"] == 500
    assert s["latency_ms"] is None


def test_throughput_for_a_fixed_time_with_text_output(broker: BrokerThread) -> None:
    r = perf("throughput", "--uri", broker.url, "-z", "2", "-r", "2000")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    live = [line for line in lines if "msg/s" in line and line.strip()[0].isdigit()]
    assert live, r.stdout
    assert any(line.startswith("Summary") for line in lines)
    summary = [line for line in lines if line.strip().startswith("published")]
    published = int(summary[-1].split()[1].replace(",", ""))
    # Rate-limited to 2000 msg/s for 2 s.
    assert 2000 <= published <= 4400


def test_throughput_publisher_alone_drops_into_an_unbound_exchange(broker: BrokerThread) -> None:
    s = perf_json(
        "throughput",
        "--uri",
        broker.url,
        "-y",
        "0",
        "-e",
        "perf-sink",
        "-t",
        "fanout",
        "-C",
        "3000",
    )
    assert s["published"] == 3000
    assert s["consumed"] == 0
    assert s["queues"] == []


def test_connection_count(broker: BrokerThread) -> None:
    proc = warren_process(
        "perf",
        "connection-count",
        "--uri",
        broker.url,
        "--connections",
        "20",
        "--channels",
        "2",
        "--consumers",
        "2",
        "--pid",
        str(os.getpid()),  # the embedded broker lives in this process
        "--settle",
        "0",
        "--hold",
        "60",
    )
    try:
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if line.startswith("holding"):
                break
        text = "".join(seen)
        assert "opened 20 connections, 40 channels, 80 consumers" in text, text
        assert "VmRSS" in text and "RssAnon" in text

        def state() -> tuple[int, int, int, int]:
            b = broker.broker
            conns = list(b.connections)
            queues = [q for q in b.vhosts["/"].queues.values() if q.exclusive_owner is not None]
            return (
                len(conns),
                sum(len(c.channels) for c in conns),
                len(queues),
                sum(q.consumer_count for q in queues),
            )

        assert broker.call(state) == (20, 40, 80, 80)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)

    # Closing the connections deletes their exclusive queues: wait on the broker's
    # own per-socket "closed" futures rather than polling.
    async def all_closed() -> None:
        pending = [p.closed for p in broker.amqp_listener.protocols]
        if pending:
            await asyncio.wait(pending, timeout=10)

    broker.run(all_closed())
    assert broker.call(lambda: len(broker.broker.connections)) == 0
    assert not [n for n in queue_names(broker) if n.startswith("amq.gen-")]


def test_connection_count_json_and_pid_note(broker: BrokerThread) -> None:
    s = perf_json("connection-count", "--uri", broker.url, "--connections", "10", "--settle", "0")
    assert (s["connections"], s["channels"], s["consumers"]) == (10, 10, 0)
    assert s["close_unanswered"] == 0  # the broker answered every connection.close
    assert s["open_s"] > 0
    assert s["rss_kib"] is None  # no --pid
    r = perf("connection-count", "--uri", broker.url, "--connections", "5", "--settle", "0")
    assert r.returncode == 0
    assert "--pid" in r.stdout  # the note about memory figures


def test_close_waits_no_longer_than_asked_for_a_silent_broker() -> None:
    """A peer that never answers connection.close costs close_end its timeout,
    however many reads it would take (connection-count shares one wait among all
    its connections)."""
    with socket.create_server(("127.0.0.1", 0)) as silent:
        client = Client(f"amqp://guest:guest@127.0.0.1:{silent.getsockname()[1]}/")
        client.sock = socket.create_connection(silent.getsockname())
        accepted, _ = silent.accept()
        with accepted:
            client.close_begin()
            start = time.monotonic()
            assert client.close_end(timeout=0.3) is False
            waited = time.monotonic() - start
            assert client.sock is None  # dropped
            assert accepted.recv(1024)[:1] == b"\x01"  # connection.close went out
    assert 0.3 <= waited < 3


def test_queue_count(broker: BrokerThread) -> None:
    s = perf_json(
        "queue-count",
        "--uri",
        broker.url,
        "--queues",
        "300",
        "--durable",
        "--keep",
        "--settle",
        "0",
        "--pid",
        str(os.getpid()),
    )
    assert s["queues"] == 300
    assert s["declare_s"] > 0
    assert s["rss_kib"]["VmRSS"] > 0 and s["rss_kib"]["RssAnon"] > 0
    names = [n for n in queue_names(broker) if n.startswith("perf-q-")]
    assert len(names) == 300
    durable = broker.call(lambda: all(broker.broker.vhosts["/"].queues[n].durable for n in names))
    assert durable
    # Without --keep the same command deletes them again (re-declaring is idempotent).
    s = perf_json(
        "queue-count", "--uri", broker.url, "--queues", "300", "--durable", "--settle", "0"
    )
    assert s["queues"] == 300 and s["delete_s"] >= 0
    assert not [n for n in queue_names(broker) if n.startswith("perf-q-")]


def test_cli_entry_points() -> None:
    server = subprocess.run(
        [sys.executable, "-m", "warren", "--help"], capture_output=True, text=True, env=ENV
    )
    assert server.returncode == 0
    assert "--amqp-port" in server.stdout and "warren perf --help" in server.stdout
    r = perf("--help")
    assert r.returncode == 0
    for command in ("throughput", "connection-count", "queue-count"):
        assert command in r.stdout
    r = perf("throughput", "--help")
    assert r.returncode == 0 and "--pmessages" in r.stdout and "--confirm" in r.stdout
    r = perf("throughput", "--uri", "amqp://guest:guest@127.0.0.1:1/", "-C", "1")
    assert r.returncode == 1 and "setup failed" in r.stderr


def test_perf_does_not_import_the_broker() -> None:
    check_no_broker_imports(
        "warren.perf.cli, warren.perf.throughput, warren.perf.connections, warren.perf.queues",
        ("warren.broker", "warren.amqp.server", "warren.amqp.connection", "warren.store"),
    )


# -- pure helpers ----------------------------------------------------------------------------


def test_histogram_percentiles_are_close() -> None:
    hist: dict[int, int] = {}
    for us in range(1, 100_001):  # 1 us .. 100 ms, uniform
        k = bucket(us)
        hist[k] = hist.get(k, 0) + 1
    pct = percentiles_ms(hist)
    assert pct is not None
    assert pct["p50"] == pytest.approx(50.0, rel=0.02)
    assert pct["p95"] == pytest.approx(95.0, rel=0.02)
    assert pct["p99"] == pytest.approx(99.0, rel=0.02)
    assert pct["samples"] == 100_000
    for us in (0, 1, 127, 128, 129, 1000, 123_456, 10**9):
        assert bucket_value_us(bucket(us)) == pytest.approx(us, rel=0.016, abs=0.5)
    assert percentiles_ms({}) is None


def test_uri_and_plan_defaults() -> None:
    u = URI.parse("amqp://user:p%40ss@example.com:5673/%2Fvh")
    assert (u.host, u.port, u.user, u.password, u.vhost) == (
        "example.com",
        5673,
        "user",
        "p@ss",
        "/vh",
    )
    assert URI.parse("amqp://localhost/").vhost == "/"
    assert URI.parse("amqp://localhost").port == 5672
    assert URI.parse("amqps://localhost/").port == 5671  # tests/protocol/amqp/test_client_tls.py
    with pytest.raises(ValueError):
        URI.parse("http://localhost/")

    p = plan(ThroughputParams())
    assert (p.exchange, p.routing_key, p.queue_names, p.bind) == (
        "",
        "perf-test",
        ("perf-test",),
        False,
    )
    p = plan(ThroughputParams(queues=2, consumers=2))
    assert (p.exchange, p.exchange_type, p.declare_exchange) == ("perf-fanout", "fanout", True)
    assert p.consumer_queues == ("perf-test-1", "perf-test-1", "perf-test-2", "perf-test-2")
    p = plan(ThroughputParams(consumers=0))
    assert p.queue_names == ()
    p = plan(ThroughputParams(exchange="amq.direct", routing_key="rk"))
    assert (p.bind, p.declare_exchange, p.routing_key) == (True, False, "rk")
