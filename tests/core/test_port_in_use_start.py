"""A start refused because one of its listeners' ports is in use leaves the data
dir as it was: on a new dir it writes nothing (no users.json, cluster id,
vhosts.json, delivered marks or "/" vhost, so the next start still seeds
guest), and a dir with data stays byte for byte as the last stop left it. The
broker binds every port before it reads the data dir (broker_lifecycle.py,
bound_port.py); a client that connects meanwhile waits in the backlog and is
answered by the started broker only.

Each listener kind is taken in turn by a plain socket, through the embedded
Broker API and through the `warren` command. The HTTP port also carries MQTT
and AMQP over WebSocket: it is the ``http`` case.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
import trustme
from conftest import BrokerThread, data_tree, start_broker
from free_ports import free_port
from httphelp import Api
from procs import SRC

from warren import Config
from warren.bound_port import BindError
from warren.cli import main as warren_main

# The start's order (bound_port.py, broker_lifecycle.py) is interpreted in
# both builds: once, in the compiled pass (tests/passes.py).
pytestmark = [pytest.mark.timeout(120), pytest.mark.passes("compiled")]

#: Each kind of listener port: its setting, its flag, and how a refusal names it.
KINDS: dict[str, tuple[str, str, str]] = {
    "amqp": ("amqp_port", "--amqp-port", "AMQP"),
    "amqps": ("amqp_tls_port", "--amqp-tls-port", "AMQP/TLS"),
    "mqtt": ("mqtt_port", "--mqtt-port", "MQTT"),
    "mqtts": ("mqtt_tls_port", "--mqtt-tls-port", "MQTT/TLS"),
    "http": ("http_port", "--http-port", "HTTP"),  # and MQTT, AMQP over WebSocket
    "https": ("http_tls_port", "--http-tls-port", "HTTPS"),
    "prometheus": ("prometheus_port", "--prometheus-port", "Prometheus"),
    "prometheus-https": ("prometheus_tls_port", "--prometheus-tls-port", "Prometheus HTTPS"),
    "stream": ("stream_port", "--stream-port", "stream"),
    "stream-tls": ("stream_tls_port", "--stream-tls-port", "stream/TLS"),
}


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    directory = tmp_path_factory.mktemp("certs")
    cert = trustme.CA().issue_cert("127.0.0.1", "localhost")
    chain, key = directory / "cert.pem", directory / "key.pem"
    chain.write_bytes(b"".join(blob.bytes() for blob in cert.cert_chain_pems))
    cert.private_key_pem.write_to_path(str(key))
    return str(chain), str(key)


def every_listener(certs: tuple[str, str], **ports: int) -> dict[str, Any]:
    """Settings for every listener, TLS ones too, on ephemeral ports unless given."""
    settings: dict[str, Any] = {setting: 0 for setting, _, _ in KINDS.values()}
    settings.update(ports, tls_cert=certs[0], tls_key=certs[1])
    settings.update(auth_failure_delay=0, auth_failures_per_minute=0)
    return settings


@pytest.fixture
def busy() -> Iterator[socket.socket]:
    """A plain listening socket, as another server holds it. Its port is
    free_port()'s, below the kernel's ephemeral range: the tests close it and
    start a broker there, and an ephemeral port could meanwhile be taken by
    any process's port-0 bind (it was, in make test)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", free_port()))
        sock.listen()
        yield sock


#: Valid definitions: applied, they would replace guest on a new dir.
DEFINITIONS = {
    "users": [{"name": "eve", "password": "pw", "tags": "administrator"}],
    "vhosts": [{"name": "/"}, {"name": "v9"}],
    "permissions": [{"user": "eve", "vhost": "v9", "configure": ".*", "write": ".*", "read": ".*"}],
    "queues": [{"name": "q9", "vhost": "v9", "durable": True}],
}


def definitions(tmp_path: Path) -> str:
    path = tmp_path / "defs.json"
    path.write_text(json.dumps(DEFINITIONS))
    return str(path)


def refused(
    data: Path, kind: str, port: int, certs: tuple[str, str], **settings: Any
) -> BindError:
    """Start a broker whose ``kind`` port is ``port`` (in use): its BindError, once
    every port it bound is free again."""
    setting, _, what = KINDS[kind]
    settings.update(every_listener(certs, **{setting: port}))
    b = BrokerThread(Config(data_dir=str(data), **settings))
    try:
        with pytest.raises(BindError) as info:
            b.start()
        # What it had bound is closed: each of its ports can be bound again.
        for listener in b.broker.listeners:
            for bound in {listener.port, getattr(listener, "tls_port", 0)} - {0, port}:
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", bound))
    finally:
        b.stop()
    exc = info.value
    assert (exc.errno, exc.what, exc.port) == (errno.EADDRINUSE, what, port)
    assert f"cannot listen on {what} 127.0.0.1:{port}" in str(exc)
    return exc


@pytest.mark.parametrize("with_definitions", [False, True], ids=["plain", "definitions"])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_port_in_use_on_a_new_dir_writes_nothing(
    tmp_path: Path, kind: str, with_definitions: bool, certs: tuple[str, str], busy: socket.socket
) -> None:
    """Nothing written, and with definitions none applied: the start after,
    without them, still seeds guest."""
    data = tmp_path / "data"
    port = busy.getsockname()[1]
    extra = {"load_definitions": definitions(tmp_path)} if with_definitions else {}
    refused(data, kind, port, certs, **extra)
    assert not data.exists()
    busy.close()
    # The port free, the same start is a first start: guest/guest on "/".
    b = start_broker(data, **every_listener(certs, **{KINDS[kind][0]: port}))
    try:
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        assert conn.is_open
        conn.close()
        assert b.call(lambda: (sorted(b.broker.vhosts), sorted(b.broker.users.users))) == (
            ["/"],
            ["guest"],
        )
    finally:
        b.stop()


def _fill(b: BrokerThread) -> None:
    """A user, a vhost and its permissions, a durable queue with persistent
    messages (one of them delivered and acknowledged), a retained MQTT message."""
    api = Api(b.http_port)
    for path, body in [
        ("users/alice", {"password": "s3cret", "tags": "management"}),
        ("vhosts/v1", {}),
        ("permissions/v1/alice", {"configure": ".*", "write": ".*", "read": ".*"}),
    ]:
        reply = api.request("PUT", f"/api/{path}", body)
        assert reply.status in (201, 204), reply
    conn = pika.BlockingConnection(
        pika.URLParameters(f"amqp://alice:s3cret@127.0.0.1:{b.port}/v1")
    )
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("q1", durable=True)
    for i in range(5):
        ch.basic_publish("", "q1", b"m%d" % i, pika.BasicProperties(delivery_mode=2))
    method, _, _ = ch.basic_get("q1")
    assert method is not None
    ch.basic_ack(method.delivery_tag)
    conn.close()


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_port_in_use_leaves_a_dir_with_data_as_it_was(
    tmp_path: Path, kind: str, certs: tuple[str, str], busy: socket.socket
) -> None:
    data = tmp_path / "data"
    b = start_broker(data, **every_listener(certs))
    try:
        _fill(b)
    finally:
        b.stop()
    before = data_tree(data)
    assert {"users.json", "vhosts.json", "cluster_id.json", "delivered.json"} <= set(before)
    port = busy.getsockname()[1]
    # With definitions that would add eve, v9 and its queue, were they applied.
    refused(data, kind, port, certs, load_definitions=definitions(tmp_path))
    after = data_tree(data)
    assert sorted(after) == sorted(before)
    assert [name for name in before if after[name] != before[name]] == []
    busy.close()
    b = start_broker(data, **every_listener(certs, **{KINDS[kind][0]: port}))
    try:
        assert b.call(lambda: (sorted(b.broker.vhosts), sorted(b.broker.users.users))) == (
            ["/", "v1"],
            ["alice", "guest"],
        )
        conn = pika.BlockingConnection(
            pika.URLParameters(f"amqp://alice:s3cret@127.0.0.1:{b.port}/v1")
        )
        ch = conn.channel()
        assert ch.queue_declare("q1", durable=True, passive=True).method.message_count == 4
        conn.close()
    finally:
        b.stop()


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_command_refuses_a_port_in_use_and_writes_nothing(
    tmp_path: Path,
    kind: str,
    certs: tuple[str, str],
    busy: socket.socket,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The `warren` command's flags, start and exit status. One kind runs as a
    process of its own; the others call the command's main() here, the same
    code without a new interpreter importing the broker (0.5 s of CPU each)."""
    data = tmp_path / "data"
    port = busy.getsockname()[1]
    args = ["-D", str(data), "--tls-cert", certs[0], "--tls-key", certs[1]]
    for other, (_, flag, _) in KINDS.items():
        args += [flag, str(port if other == kind else 0)]
    if kind == "amqp":
        done = subprocess.run(
            [sys.executable, "-m", "warren", *args],
            capture_output=True,
            text=True,
            env=dict(os.environ, PYTHONPATH=str(SRC)),
            timeout=60,
        )
        status, out, err = done.returncode, done.stdout, done.stderr
    else:
        status = warren_main(args)
        out, err = capsys.readouterr()
    assert status == 1, out + err
    what = KINDS[kind][2]
    assert f"warren: cannot listen on {what} 127.0.0.1:{port}: address already in use" in err
    assert not data.exists()


def test_a_client_that_connects_during_the_restore_meets_the_started_broker(
    tmp_path: Path, certs: tuple[str, str]
) -> None:
    """Held at reading its definitions (a FIFO), the broker has bound its ports
    and serves none: a client's connection waits in the backlog unanswered. The
    definitions given, the same connections are answered by the broker with
    them applied (eve, its only user, logs in; guest is not there)."""
    fifo = tmp_path / "defs.json"
    os.mkfifo(fifo)
    config = Config(
        data_dir=str(tmp_path / "data"), load_definitions=str(fifo), **every_listener(certs)
    )
    b = BrokerThread(config)
    b._thread.start()
    started = asyncio.run_coroutine_threadsafe(b.broker.start(), b.loop)
    clients: list[socket.socket] = []
    try:
        with open(fifo, "w") as writer:  # returns once the broker opens it: ports bound
            amqp = socket.create_connection(("127.0.0.1", b.broker.amqp_port), timeout=30)
            http = socket.create_connection(("127.0.0.1", b.http_port), timeout=30)
            clients += [amqp, http]
            amqp.sendall(b"AMQP\x00\x00\x09\x01")
            auth = "Basic ZXZlOnB3"  # eve:pw
            http.sendall(
                f"GET /api/whoami HTTP/1.1\r\nHost: x\r\nAuthorization: {auth}\r\n"
                "Connection: close\r\n\r\n".encode()
            )
            for client in clients:  # nothing answers while the start is held
                client.setblocking(False)
                with pytest.raises(BlockingIOError):
                    client.recv(1)
                client.settimeout(30)
            assert not started.done()
            writer.write(
                json.dumps(
                    {
                        "users": [{"name": "eve", "password": "pw", "tags": "administrator"}],
                        "vhosts": [{"name": "/"}],
                        "permissions": [
                            {"user": "eve", "vhost": "/", "configure": ".*", "write": ".*",
                             "read": ".*"}
                        ],
                    }
                )
            )
        started.result(60)
        # connection.start (class 10, method 10) on channel 0, as to any client.
        frame = b""
        while len(frame) < 11 and (chunk := amqp.recv(11 - len(frame))):
            frame += chunk
        assert frame[:3] == b"\x01\x00\x00" and frame[7:11] == b"\x00\x0a\x00\x0a"
        reply = b""
        while chunk := http.recv(65536):
            reply += chunk
        assert reply.startswith(b"HTTP/1.1 200"), reply[:200]
        assert json.loads(reply.split(b"\r\n\r\n", 1)[1])["name"] == "eve"
        assert b.call(lambda: sorted(b.broker.users.users)) == ["eve"]
    finally:
        for client in clients:
            client.close()
        if not started.done():  # a failure above: let a held start go on, then stop it
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # no reader: the start is not held there
                pass
            else:
                os.write(fd, b"{}")
                os.close(fd)
        b.stop()
