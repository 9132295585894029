"""The PROXY protocol on real listeners (warren/proxy_accept.py): clients go
through a forwarder that sends a header first (tests/proxyhelp.py), as behind
HAProxy, and the broker shows the header's client as the connection's peer;
a connection without a valid header in time is closed."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pika
import pytest
from conftest import BrokerThread, new_event_loop, start_broker
from httphelp import Api, wait_for
from proxyhelp import Forwarder, v1_header, v2_header
from tlshelp import write_pki

from warren.amqp.replica_server import ReplicaReadServer
from warren.config import Config
from warren.core.clock import ManualClock
from warren.proxy_accept import ProxyHeaderProtocol
from warren.stream_protocol.replica_server import ReplicaStreamServer

CLIENT = ("203.0.113.9", 41234)


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, str]:
    return write_pki(tmp_path / "pki")


@pytest.fixture
def warren(tmp_path: Path, pki: dict[str, str]) -> Iterator[BrokerThread]:
    """Every listener but the management API's takes a PROXY header (the API is
    how the test reads the listings)."""
    b = start_broker(
        tmp_path / "data",
        clock=ManualClock(),
        proxy_protocol=True,
        http_proxy_protocol=False,
        amqp_tls_port=0,
        tls_cert=pki["server"],
        tls_key=pki["server.key"],
    )

    def add_user() -> None:
        b.broker.users.add_user("alice", "secret")
        b.broker.users.set_permissions("alice", "/")

    b.call(add_user)
    try:
        yield b
    finally:
        b.stop()


def api(b: BrokerThread) -> Api:
    return Api(b.broker.listener("http").port)


def peers(b: BrokerThread, protocol_part: str) -> list[tuple[str, int]]:
    path = "/api/stream/connections" if protocol_part == "stream" else "/api/connections"
    items: list[dict[str, Any]] = api(b).get(path)
    return [
        (i["peer_host"], i["peer_port"])
        for i in items
        if protocol_part.lower() in str(i["protocol"]).lower()
    ]


def pika_params(port: int, user: str = "alice", **kw: Any) -> pika.ConnectionParameters:
    return pika.ConnectionParameters(
        "127.0.0.1", port, credentials=pika.PlainCredentials(user, "secret"), **kw
    )


def test_amqp_v1_and_v2_give_the_peer(warren: BrokerThread) -> None:
    for header in (v1_header(CLIENT, ("192.0.2.1", 5672)), v2_header(CLIENT)):
        with Forwarder(warren.port, lambda h=header: h) as fwd:
            conn = pika.BlockingConnection(pika_params(fwd.port))
            try:
                ch = conn.channel()
                ch.queue_declare("q")
                ch.basic_publish("", "q", b"hi")
                assert wait_for(lambda: peers(warren, "AMQP 0-9-1")) == [CLIENT]
            finally:
                conn.close()
            wait_for(lambda: not peers(warren, "AMQP 0-9-1"))


def test_amqps_reads_the_header_before_the_tls_handshake(
    warren: BrokerThread, pki: dict[str, str]
) -> None:
    tls_port = warren.amqp_listener.tls_port
    context = ssl.create_default_context(cafile=pki["ca"])
    with Forwarder(tls_port, lambda: v2_header(CLIENT, tlvs=b"\x20\x00\x02ab")) as fwd:
        conn = pika.BlockingConnection(
            pika_params(fwd.port, ssl_options=pika.SSLOptions(context, "127.0.0.1"))
        )
        try:
            conn.channel().queue_declare("tls-q")
            items = api(warren).get("/api/connections")
            assert [(i["peer_host"], i["peer_port"], i["ssl"]) for i in items] == [(*CLIENT, True)]
        finally:
            conn.close()


def test_local_keeps_the_socket_address_and_loopback_users_see_the_proxied_one(
    warren: BrokerThread,
) -> None:
    with Forwarder(warren.port, lambda: v2_header(None)) as fwd:
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", fwd.port))
        try:
            ((host, _),) = peers(warren, "AMQP 0-9-1")
            assert host == "127.0.0.1"
        finally:
            conn.close()
    # guest may log in over loopback only: through a proxy, the client's address counts.
    remote = Forwarder(warren.port, lambda: v1_header(CLIENT, ("192.0.2.1", 5672)))
    with remote as fwd, pytest.raises(pika.exceptions.ProbableAuthenticationError):
        pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", fwd.port))


def test_mqtt_gives_the_peer(warren: BrokerThread) -> None:
    mqtt_port = warren.broker.listener("mqtt").port
    with Forwarder(mqtt_port, lambda: v1_header(CLIENT, ("192.0.2.1", 1883))) as fwd:
        client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="proxied")
        client.username_pw_set("alice", "secret")
        client.connect("127.0.0.1", fwd.port)
        client.loop_start()
        try:
            assert wait_for(lambda: peers(warren, "MQTT")) == [CLIENT]
        finally:
            client.disconnect()
            client.loop_stop()


def test_stream_gives_the_peer_and_advertises_the_proxy(warren: BrokerThread) -> None:
    """The header's destination (the proxy's address) is the connection's local
    one, so the stream protocol advertises it: rstream's publisher connection
    comes back through the proxy."""
    from rstream import AMQPMessage, Producer

    stream_port = warren.broker.listener("stream").port

    async def run(port: int) -> list[tuple[str, int]]:
        async with Producer("127.0.0.1", port, username="alice", password="secret") as p:
            await p.create_stream("proxied-stream")
            await p.send_wait("proxied-stream", AMQPMessage(body=b"x"))
            return await asyncio.to_thread(peers, warren, "stream")

    with Forwarder(stream_port, lambda: v2_header(CLIENT, ("127.0.0.1", fwd.port))) as fwd:
        assert set(asyncio.run(run(fwd.port))) == {CLIENT}


def test_http_with_proxy_protocol(tmp_path: Path, pki: dict[str, str]) -> None:
    b = start_broker(
        tmp_path / "http-data",
        clock=ManualClock(),
        http_proxy_protocol=True,
        http_tls_port=0,
        tls_cert=pki["server"],
        tls_key=pki["server.key"],
    )
    try:
        http = b.broker.listener("http")
        with Forwarder(http.port, lambda: v1_header(("127.0.0.5", 999), ("127.0.0.1", 1))) as fwd:
            assert Api(fwd.port).get("/api/whoami")["name"] == "guest"
        with Forwarder(http.tls_port, lambda: v2_header(("127.0.0.6", 998))) as fwd:
            context = ssl.create_default_context(cafile=pki["ca"])
            with pytest.raises(urllib.error.HTTPError) as refused:  # no credentials given
                urllib.request.urlopen(
                    f"https://127.0.0.1:{fwd.port}/api/overview", context=context
                )
            assert refused.value.code == 401
        # Without a header, the request line is not one: closed.
        assert closed_at_once(http.port, b"GET /api/overview HTTP/1.1\r\n\r\n")
    finally:
        b.stop()


def closed_at_once(port: int, data: bytes) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(data)
        try:
            return sock.recv(100) == b""
        except ConnectionResetError:
            return True


@pytest.mark.parametrize("what", ["amqp", "mqtt", "stream"])
def test_garbage_header_is_refused(warren: BrokerThread, what: str) -> None:
    port = warren.broker.listener(what).port
    assert closed_at_once(port, b"AMQP\x00\x00\x09\x01" + bytes(20))
    assert closed_at_once(port, b"PROXY TCP4 1.2.3.4 nonsense\r\n")


def header_deadlines(b: BrokerThread) -> list[int]:
    """When the broker's pending PROXY header deadlines fall due."""
    clock = b.clock

    def due() -> list[int]:
        return [
            t.when
            for t in clock._timers
            if not t.cancelled
            and type(getattr(t.callback, "__self__", None)) is ProxyHeaderProtocol
        ]

    return b.call(due)


def test_no_header_in_time_is_closed_by_the_node_clock(warren: BrokerThread) -> None:
    start = warren.clock.now_ms()
    with socket.create_connection(("127.0.0.1", warren.port), timeout=30) as sock:
        sock.sendall(b"PROXY TCP4 ")  # a start, never finished
        (due,) = wait_for(lambda: header_deadlines(warren))
        assert due == start + 5000  # [main] proxy_protocol_timeout's default
        warren.advance(4999)
        sock.settimeout(0.3)
        with pytest.raises(TimeoutError):
            sock.recv(1)  # still open
        warren.advance(1)
        sock.settimeout(30)
        with contextlib.suppress(ConnectionResetError):
            assert sock.recv(1) == b""


def test_a_stop_closes_connections_still_sending_their_header(tmp_path: Path) -> None:
    b = start_broker(tmp_path / "data", clock=ManualClock(), proxy_protocol=True)
    stopped = False
    try:
        ports = [b.port, b.broker.listener("mqtt").port, b.broker.listener("http").port]
        socks = [socket.create_connection(("127.0.0.1", p), timeout=30) for p in ports]
        for sock in socks:
            sock.sendall(b"PROXY TCP4 ")
        wait_for(lambda: len(header_deadlines(b)) == 3)
        b.stop()
        stopped = True
        for sock in socks:
            with sock, contextlib.suppress(ConnectionResetError):
                assert sock.recv(1) == b""
    finally:
        if not stopped:
            b.stop()


def test_prometheus_with_proxy_protocol(tmp_path: Path) -> None:
    b = start_broker(tmp_path / "data", clock=ManualClock(), prometheus_proxy_protocol=True)
    try:
        port = b.broker.listener("http/prometheus").port
        header = lambda: v1_header(("127.0.0.5", 999), ("127.0.0.1", 1))  # noqa: E731
        with (
            Forwarder(port, header) as fwd,
            urllib.request.urlopen(f"http://127.0.0.1:{fwd.port}/metrics") as reply,
        ):
            assert b"rabbitmq_build_info" in reply.read()
        assert closed_at_once(port, b"GET /metrics HTTP/1.1\r\n\r\n")
        # The management port keeps its own choice ([main]'s: off).
        assert Api(b.broker.listener("http").port).get("/api/whoami")["name"] == "guest"
    finally:
        b.stop()


class ReadPorts:
    """A follower's two read services on an empty data directory, on a loop of
    their own thread, with [clustering] proxy_protocol on."""

    def __init__(self, data_dir: Path) -> None:
        data_dir.mkdir()
        config = Config(
            data_dir=str(data_dir),
            clustering_stream_read_port=0,
            clustering_stream_protocol_read_port=0,
            clustering_proxy_protocol=True,
        )
        self.loop = new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.amqp = ReplicaReadServer(config, data_dir, lambda: "amqp://leader:5672")
        self.stream = ReplicaStreamServer(config, data_dir, lambda: "leader:5552", "127.0.0.1")
        self.run(self.amqp.start())
        self.run(self.stream.start())

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def names(self, server: Any) -> list[str]:
        async def names() -> list[str]:
            return [p.conn.name for p in server.protocols if p.conn is not None]

        return list(self.run(names()))

    def stop(self) -> None:
        self.run(self.amqp.stop())
        self.run(self.stream.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def test_a_followers_read_ports_with_proxy_protocol(tmp_path: Path) -> None:
    from rstream import Consumer

    ports = ReadPorts(tmp_path / "follower")
    try:
        header = lambda: v1_header(("127.0.0.5", 999), ("127.0.0.1", 1))  # noqa: E731
        with (
            Forwarder(ports.amqp.port, header) as fwd,
            pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", fwd.port)) as c,
        ):
            assert c.is_open
            assert ports.names(ports.amqp) == ["127.0.0.5:999"]
        with Forwarder(ports.stream.port, lambda: v2_header(("127.0.0.6", 998))) as fwd:

            async def open_close() -> None:
                consumer = Consumer("127.0.0.1", fwd.port, username="guest", password="guest")
                await consumer.start()
                assert ports.names(ports.stream) == ["127.0.0.6:998"]
                await consumer.close()

            asyncio.run(open_close())
        # Without a header, what a client sends first is not one: closed.
        assert closed_at_once(ports.amqp.port, b"AMQP\x00\x00\x09\x01")
        assert closed_at_once(ports.stream.port, bytes(20))
    finally:
        ports.stop()
