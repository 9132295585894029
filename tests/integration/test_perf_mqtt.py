"""`warren perf mqtt` and `mqtt-idle` against a real mosquitto on an ephemeral port.

The in-process API (``measure``) and the CLI (``python -m warren perf ...``) are
both exercised; QoS 1 runs must deliver every published message exactly once.
Skipped when Debian's mosquitto is not installed (``make mosquitto``).
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from conftest import BrokerThread
from free_ports import free_port
from test_perf import check_no_broker_imports, perf, warren_process

from warren.perf.mqtt import MQTTParams, measure, parse_uri
from warren.perf.mqtt_client import connect, disconnect, subscribe
from warren.perf.mqtt_workers import _Subscriber

MOSQUITTO = "/usr/sbin/mosquitto"


@pytest.fixture(scope="module")
def mosquitto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """mosquitto on a free port; yields the port once it has said it is running."""
    if not os.path.exists(MOSQUITTO):
        pytest.skip(f"{MOSQUITTO} is not installed (make mosquitto, or apt-get install mosquitto)")
    tmp = tmp_path_factory.mktemp("mosquitto")
    port = free_port()
    conf = tmp / "mosquitto.conf"
    conf.write_text(
        f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
        "max_queued_messages 1000000\nlog_dest stderr\nlog_type error\nlog_type warning\n"
        "log_type information\n"
    )
    proc = subprocess.Popen(
        [MOSQUITTO, "-c", str(conf)], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
    )
    assert proc.stderr is not None
    try:
        for line in proc.stderr:  # "... mosquitto version 2.0.11 running" once it listens
            if "running" in line:
                break
        else:
            pytest.fail(f"mosquitto exited without running (status {proc.wait()})")
        # Keep draining its log (a notice per connection) so mosquitto never blocks on it.
        threading.Thread(target=proc.stderr.read, daemon=True).start()
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(scope="module")
def warren_mqtt(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """`python -m warren` with its MQTT listener on a free port; yields that port.
    Skips while this checkout's Warren has no MQTT listener (no --mqtt-port)."""
    proc = warren_process(
        "--mqtt-port",
        "0",
        "--stream-port",
        "0",
        "--prometheus-port",
        "0",
        "--amqp-port",
        "0",
        "--http-port",
        "-1",
        "--ephemeral",
        stderr=subprocess.STDOUT,
    )
    assert proc.stdout is not None
    try:
        seen = []
        for line in proc.stdout:
            seen.append(line)
            m = re.search(r"listening on MQTT [^:]+:(\d+)", line)
            if m:
                break
        else:
            text = "".join(seen)
            if "--mqtt-port" in text:
                pytest.skip("Warren has no MQTT listener in this checkout (no --mqtt-port)")
            pytest.fail(f"warren exited without an MQTT listener (status {proc.wait()}):\n{text}")
        threading.Thread(target=proc.stdout.read, daemon=True).start()
        yield int(m.group(1))
    finally:
        proc.terminate()
        proc.wait(30)


def check_summary(s: dict[str, Any], qos: int, expected: int) -> None:
    assert "errors" not in s, s["errors"]
    assert s["published"] == expected
    assert s["publish_rate"] > 0 and s["receive_rate"] > 0 and s["duration_s"] > 0
    assert set(s["client_cpu"]) == {"publishers", "subscribers"}
    if qos:
        assert s["received"] == expected  # every message exactly once
        assert s["acked"] == expected and s["rejected"] == 0
        assert 1 <= s["inflight"] <= 1024
    else:
        assert 0 < s["received"] <= expected
        assert "acked" not in s


@pytest.mark.parametrize("protocol", [4, 5])
@pytest.mark.parametrize("qos", [0, 1])
def test_measure_in_process(mosquitto: int, protocol: int, qos: int) -> None:
    p = MQTTParams(port=mosquitto, protocol=protocol, qos=qos, count=3000, latency=True)
    s, status = measure(p)
    assert status == 0, s
    check_summary(s, qos, 3000)
    lat = s["latency_ms"]
    assert lat is not None and lat["samples"] == s["received"]
    assert 0 <= lat["p50"] <= lat["p99"] <= lat["max"]
    if protocol == 5 and qos:
        # mosquitto announces Receive Maximum 20 (its max_inflight_messages): the window obeys.
        assert s["receive_maximum"] == 20 and s["inflight"] == 20


@pytest.mark.parametrize("protocol", [4, 5])
def test_against_warren(warren_mqtt: int, protocol: int) -> None:
    s, status = measure(MQTTParams(port=warren_mqtt, protocol=protocol, qos=1, count=2000))
    assert status == 0, s
    check_summary(s, 1, 2000)
    r = perf("mqtt-idle", "--port", str(warren_mqtt), "--connections", "100", "--hold", "0.1")
    assert r.returncode == 0, r.stderr
    assert "connected 100 of 100" in r.stdout and "100 still connected" in r.stdout


def test_cli_json_two_publishers_two_subscribers(mosquitto: int) -> None:
    r = perf(
        "mqtt",
        "--uri",
        f"mqtt://127.0.0.1:{mosquitto}",
        "--qos",
        "1",
        "--protocol",
        "5",
        "-x",
        "2",
        "-y",
        "2",
        "--count",
        "1000",
        "--topic",
        "perf/two",
        "--persistent",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["published"] == 2000 and s["expected"] == 4000
    assert s["received"] == 4000 and s["acked"] == 2000
    assert len(s["client_cpu"]["publishers"]) == 2 and len(s["client_cpu"]["subscribers"]) == 2
    assert s["latency_ms"] is None  # no --latency
    assert s["params"]["clean_session"] is False and s["params"]["topic"] == "perf/two"


def test_cli_text_output(mosquitto: int) -> None:
    r = perf("mqtt", "--port", str(mosquitto), "--qos", "1", "--count", "2000", "--latency")
    assert r.returncode == 0, r.stderr
    assert "Summary" in r.stdout and "latency    p50" in r.stdout
    line = next(x for x in r.stdout.splitlines() if x.strip().startswith("received"))
    assert line.split()[1] == "2,000"


def test_cli_refuses_bad_parameters(mosquitto: int) -> None:
    r = perf("mqtt", "--port", str(mosquitto), "--latency", "--size", "4", "--count", "1")
    assert r.returncode == 2 and "--latency needs --size" in r.stderr
    r = perf("mqtt", "--port", "1", "--count", "1", "--json")  # nothing listens on port 1
    assert r.returncode == 1
    assert "ConnectionRefusedError" in json.loads(r.stdout)["errors"][0]


def test_idle_connections(mosquitto: int) -> None:
    r = perf(
        "mqtt-idle", "--port", str(mosquitto), "--connections", "200", "--hold", "0.2", "--json"
    )
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert (s["connections"], s["failed"], s["alive_at_end"]) == (200, 0, 200)
    assert s["processes"] == 1


def test_idle_ready_line_then_sigterm(mosquitto: int) -> None:
    proc = warren_process(
        "perf",
        "mqtt-idle",
        "--port",
        str(mosquitto),
        "--connections",
        "200",
        "--protocol",
        "5",
        "--ready",
        "--json",
    )
    assert proc.stdout is not None
    try:
        assert proc.stdout.readline().split() == ["READY", "200", "0"]
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    s = json.loads(out)
    assert s["connections"] == 200 and s["alive_at_end"] == 200


def test_parse_uri() -> None:
    assert parse_uri("mqtt://u:p%40ss@example.com:1884") == {
        "host": "example.com",
        "port": 1884,
        "username": "u",
        "password": "p@ss",
    }
    assert parse_uri("mqtt://localhost")["port"] == 1883
    with pytest.raises(ValueError):
        parse_uri("amqp://localhost")


def test_mqtt_perf_does_not_import_the_broker() -> None:
    check_no_broker_imports(
        "warren.perf.cli, warren.perf.mqtt, warren.perf.mqtt_idle",
        ("warren.broker", "warren.amqp.server", "warren.node", "warren.store"),
    )


def test_cli_help_lists_the_mqtt_commands() -> None:
    r = perf("--help")
    assert r.returncode == 0 and "mqtt-idle" in r.stdout and " mqtt " in r.stdout
    r = perf("mqtt", "--help")
    assert r.returncode == 0
    for option in ("--qos", "--inflight", "--persistent", "--latency", "--protocol", "--rate"):
        assert option in r.stdout


def queue_backlog(port: int, p: MQTTParams, client_id: str, n: int) -> None:
    """Leave ``n`` QoS 1 messages on ``p.topic`` queued for the persistent session
    ``client_id``: it subscribes, goes away, and a paho client publishes them."""
    import paho.mqtt.client as paho

    sock, _, rest = connect(p, client_id)
    subscribe(sock, p, rest)
    disconnect(sock, p.protocol)
    client = paho.Client(
        paho.CallbackAPIVersion.VERSION2,
        protocol=paho.MQTTv5 if p.protocol == 5 else paho.MQTTv311,
    )
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        infos = [client.publish(p.topic, b"%16d" % i, qos=1) for i in range(n)]
        for info in infos:
            info.wait_for_publish(10)
            assert info.is_published()
    finally:
        client.disconnect()
        client.loop_stop()


@pytest.mark.parametrize("protocol", [4, 5])
def test_subscriber_starts_on_its_persistent_sessions_backlog(
    broker_factory: Callable[..., BrokerThread], protocol: int
) -> None:
    """A --persistent subscriber whose session holds QoS 1 messages gets them right
    after CONNACK, before or with the SUBACK: it counts and acks them, where it used to
    drop those before the SUBACK unacked and leave those read with it until a next
    read that never came (the broker's window was full): a stall at 0."""
    broker = broker_factory(mqtt_prefetch=100)
    p = MQTTParams(
        port=broker.mqtt_port,
        protocol=protocol,
        qos=1,
        publishers=0,
        clean_session=False,
        client_id=f"backlog{protocol}",
        topic="perf/backlog",
    )
    sub_id = f"{p.client_id}-sub-0"  # the id the subscriber worker uses
    queue_backlog(broker.mqtt_port, p, sub_id, 300)

    # Drive the subscriber worker in a thread, the test playing its parent.
    parent, child = multiprocessing.Pipe()
    failures: list[BaseException] = []

    def work() -> None:
        try:
            _Subscriber(0, p, child).run()
        except BaseException as exc:  # reported to the test thread
            failures.append(exc)

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    try:
        assert parent.poll(10), failures
        assert parent.recv()[0] == "ready"
        parent.send(("go", time.monotonic_ns()))
        count = 0
        while count < 300:
            assert parent.poll(10), f"stalled at {count} of 300 messages"
            msg = parent.recv()
            assert msg[0] == "stats", msg
            count = msg[3]
        parent.send(("stop",))
        while (msg := parent.recv())[0] != "done":
            pass
        assert msg[3]["count"] == 300  # each once: all were acked, none redelivered
    finally:
        with contextlib.suppress(OSError):
            parent.send(("stop",))
        worker.join(10)
    assert not failures
