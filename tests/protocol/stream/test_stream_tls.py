"""The stream protocol over TLS ([stream] tls_port, RabbitMQ's 5551) with rstream:
publish and consume, a login by client certificate (EXTERNAL), clients that
speak the wrong thing on either port turned away without a connection, and a
cluster follower's link to it (replica_server.py with [clustering] tls's context).
(Which port opens by default: tests/core/test_config.py.)"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import BrokerThread
from rstream import (
    AMQPMessage,
    Producer,
    SlasMechanism,
)
from streamhelp import HOST, first_messages
from tlshelp import tls_broker, write_pki

from warren.config import Config
from warren.stream_protocol.leader_link import LeaderLink
from warren.stream_protocol.replica_server import ReplicaStreamServer
from warren.tls import replication_contexts

pytestmark = [pytest.mark.timeout(60)]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return write_pki(tmp_path_factory.mktemp("pki"), users=("alice",))


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory, pki: dict[str, str]) -> Iterator[BrokerThread]:
    """Plain and TLS stream ports (ephemeral); client certificates asked for, not
    required; alice, a user who logs in with hers."""
    b = tls_broker(
        tmp_path_factory.mktemp("stream-tls") / "data", pki, ("alice",), stream_tls_port=0
    )
    try:
        yield b
    finally:
        b.stop()


def ports(b: BrokerThread) -> tuple[int, int]:
    """The stream listener's (plain, TLS) ports."""
    listener = b.broker.listener("stream")
    assert listener is not None
    return listener.port, listener.tls_port  # type: ignore[attr-defined]


def client_tls(pki: dict[str, str], user: str | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=pki["ca"])
    if user is not None:
        ctx.load_cert_chain(pki[user], pki[f"{user}.key"])
    return ctx


def stream_connections(b: BrokerThread) -> int:
    listener = b.broker.listener("stream")
    return b.call(lambda: len(listener.protocols))  # type: ignore[union-attr]


def stream_users(b: BrokerThread) -> set[str]:
    """Who the open stream connections logged in as."""
    listener = b.broker.listener("stream")

    def users() -> set[str]:
        conns = [p.conn for p in listener.protocols]  # type: ignore[union-attr]
        return {c.user.name for c in conns if c is not None and c.user is not None}

    return b.call(users)


def tls_client_works(port: int, pki: dict[str, str]) -> bool:
    async def run() -> bool:
        producer = Producer(
            HOST, port, ssl_context=client_tls(pki), username="guest", password="guest"
        )
        async with producer as p:
            return not await p.stream_exists("no-such-stream")

    return asyncio.run(run())


async def consume(port: int, tls: ssl.SSLContext, stream: str, n: int) -> list[bytes]:
    return [bytes(m.body) for _, m in await first_messages(port, stream, n, ssl_context=tls)]


def test_publish_and_consume_over_tls(broker: BrokerThread, pki: dict[str, str]) -> None:
    _, tls_port = ports(broker)
    tls = client_tls(pki)

    async def run() -> list[bytes]:
        producer = Producer(HOST, tls_port, ssl_context=tls, username="guest", password="guest")
        async with producer as p:
            await p.create_stream("tls-s")
            client = await p.default_client
            leader, _ = await client.query_leader_and_replicas("tls-s")
            assert (leader.host, leader.port) == (HOST, tls_port)  # Metadata: the port reached
            for i in range(3):
                await p.send_wait("tls-s", AMQPMessage(body=f"t{i}".encode()))
        return await consume(tls_port, tls, "tls-s", 3)

    assert asyncio.run(run()) == [b"t0", b"t1", b"t2"]
    assert "tls-s" in broker.queues("/")


def test_a_client_certificate_logs_in_with_external(
    broker: BrokerThread, pki: dict[str, str]
) -> None:
    _, tls_port = ports(broker)

    async def run() -> set[str]:
        producer = Producer(
            HOST,
            tls_port,
            ssl_context=client_tls(pki, "alice"),
            username="",
            password="",
            sasl_configuration_mechanism=SlasMechanism.MechanismExternal,
        )
        async with producer as p:
            await p.create_stream("tls-alice")
            await p.send_wait("tls-alice", AMQPMessage(body=b"from alice"))
            return stream_users(broker)

    assert asyncio.run(run()) == {"alice"}
    assert "tls-alice" in broker.queues("/")


def peer_properties() -> bytes:
    """A stream protocol PeerProperties request (key 0x0011, version 1), in plain."""
    body = struct.pack(">HHII", 0x0011, 1, 1, 0)  # correlation id 1, no properties
    return struct.pack(">I", len(body)) + body


def closed_by_peer(sock: socket.socket) -> bool:
    """Reads until the broker ends the connection: True once it has (EOF or reset)."""
    try:
        while sock.recv(4096):
            pass
    except ConnectionResetError:
        pass
    return True


def test_a_plain_client_on_the_tls_port_is_turned_away(
    broker: BrokerThread, pki: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    """The failed handshake closes the connection: no answer in plain, no stream
    connection made, nothing logged as an error (a port scan is not one)."""
    _, tls_port = ports(broker)
    before = stream_connections(broker)
    with caplog.at_level(logging.INFO):
        with socket.create_connection((HOST, tls_port), timeout=20) as sock:
            sock.sendall(peer_properties())
            assert closed_by_peer(sock)
        assert stream_connections(broker) == before  # (a call through the broker's loop)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert tls_client_works(tls_port, pki)  # and the port serves TLS clients as before


def test_a_tls_client_on_the_plain_port_is_turned_away(
    broker: BrokerThread, pki: dict[str, str]
) -> None:
    plain_port, _ = ports(broker)
    before = stream_connections(broker)
    with (
        socket.create_connection((HOST, plain_port), timeout=20) as raw,
        pytest.raises((ssl.SSLError, ConnectionResetError, ssl.SSLEOFError)),
    ):
        # Its ClientHello read as a frame's size is far over the 8 KiB allowed
        # before Open: the broker closes the connection, the handshake fails.
        client_tls(pki).wrap_socket(raw, server_hostname=HOST)
    assert stream_connections(broker) == before
    assert tls_client_works(ports(broker)[1], pki)


def open_link(port: int, pki: dict[str, str], ca: str, data: Path) -> list[str]:
    """A follower's link to ``port`` through ReplicaStreamServer's transport, with
    the replication's client context trusting ``ca``, until it opens or is lost:
    why it was lost (nothing: it opened)."""
    config = Config(tls_cert=pki["server"], tls_key=pki["server.key"], tls_ca_cert=ca)
    _server_side, client = replication_contexts(config)
    lost: list[str] = []

    async def run() -> None:
        server = ReplicaStreamServer(
            config, data, lambda: "", HOST, link=(f"{HOST}:{port}", client)
        )
        link = LeaderLink(
            "guest", "guest", "/", "t", lambda _: None, lambda _, why: lost.append(why)
        )
        server._connect(link, server.connection("t"))
        while link.state == 0:  # the handshake: wait for its end (a condition)
            await asyncio.sleep(0.01)
        link.close()
        await server.stop()

    asyncio.run(run())
    return lost


def test_a_follower_links_to_the_tls_port_verified_by_the_cluster_ca(
    broker: BrokerThread, pki: dict[str, str], tmp_path: Path
) -> None:
    _, tls_port = ports(broker)
    assert open_link(tls_port, pki, pki["ca"], tmp_path) == []  # logged in, opened
    # A leader whose certificate the cluster's CA did not sign: no link.
    [why] = open_link(tls_port, pki, pki["other-ca"], tmp_path)
    assert "CERTIFICATE_VERIFY_FAILED" in why
