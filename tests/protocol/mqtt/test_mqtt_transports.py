"""MQTT with aiomqtt (asyncio), over TLS, and the listener settings."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import aiomqtt
import pytest
import trustme
from conftest import start_broker
from mqttclient import V5, V311, Client


def test_aiomqtt_round_trip(tmp_path: Path) -> None:
    b = start_broker(tmp_path / "data", sync=False)
    try:
        port = b.broker.listener("mqtt").port  # type: ignore[union-attr]

        async def main() -> list[tuple[str, bytes, int]]:
            async with aiomqtt.Client("127.0.0.1", port, identifier="aio-sub") as sub:
                await sub.subscribe("aio/#", qos=1)
                async with aiomqtt.Client(
                    "127.0.0.1", port, protocol=aiomqtt.ProtocolVersion.V5
                ) as pub:
                    for i in range(5):
                        await pub.publish(f"aio/{i}", f"m{i}".encode(), qos=1)
                got = []
                async for message in sub.messages:
                    got.append((str(message.topic), bytes(message.payload), message.qos))  # type: ignore[arg-type]
                    if len(got) == 5:
                        break
                return got

        got = asyncio.run(asyncio.wait_for(main(), 20))
        assert got == [(f"aio/{i}", f"m{i}".encode(), 1) for i in range(5)]
    finally:
        b.stop()


@pytest.fixture
def tls_files(tmp_path: Path) -> tuple[trustme.CA, Path, Path]:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    chain = tmp_path / "cert.pem"
    key = tmp_path / "key.pem"
    cert.private_key_pem.write_to_path(str(key))
    chain.write_bytes(b"".join(blob.bytes() for blob in cert.cert_chain_pems))
    return ca, chain, key


def test_mqtt_over_tls(tmp_path: Path, tls_files: tuple[trustme.CA, Path, Path]) -> None:
    ca, chain, key = tls_files
    b = start_broker(
        tmp_path / "data", sync=False, mqtt_tls_port=0, tls_cert=str(chain), tls_key=str(key)
    )
    try:
        listener = b.broker.listener("mqtt")
        tls_port = listener.tls_port  # type: ignore[union-attr]
        assert tls_port
        sub = Client(listener.port, protocol=V5)  # type: ignore[union-attr]
        sub.connect()
        sub.subscribe("secure/#", qos=1)
        pub = Client(tls_port, protocol=V5)
        ctx = ssl.create_default_context()
        ca.configure_trust(ctx)
        pub.paho.tls_set_context(ctx)
        pub.connect()
        pub.publish("secure/x", b"over tls", qos=1)
        assert sub.next().payload == b"over tls"
        conns = b.call(lambda: [c.info() for c in b.broker.connections])
        assert sorted(c["ssl"] for c in conns if c["protocol"].startswith("MQTT")) == [False, True]
        pub.close()
        sub.close()
    finally:
        b.stop()


def test_tls_port_without_certificate_fails_to_start(tmp_path: Path) -> None:
    with pytest.raises(OSError, match="tls_cert"):
        start_broker(tmp_path / "data", mqtt_tls_port=0)


def test_mqtt_listener_disabled(tmp_path: Path) -> None:
    b = start_broker(tmp_path / "data", mqtt_port=-1, prometheus_port=-1)
    try:
        listener = b.broker.listener("mqtt")
        assert listener is not None and listener.port == 0
    finally:
        b.stop()


@pytest.mark.parametrize("protocol", [V311, V5], ids=["3.1.1", "5"])
def test_mqtt_over_websocket_meets_tcp_clients(tmp_path: Path, protocol: int) -> None:
    b = start_broker(tmp_path / "data", sync=False)
    try:
        http = b.broker.listener("http")
        mqtt_listener = b.broker.listener("mqtt")
        assert http is not None and mqtt_listener is not None
        ws = Client(http.port, protocol=protocol, transport="websockets")
        ws.paho.ws_set_options(path="/mqtt")
        ws.connect()
        ws.subscribe("ws/#", qos=1)
        tcp = Client(mqtt_listener.port, protocol=protocol)
        tcp.connect()
        tcp.subscribe("tcp/#", qos=1)
        tcp.publish("ws/in", b"tcp -> ws", qos=1)
        ws.publish("tcp/in", b"ws -> tcp", qos=1)
        assert (ws.next().payload, tcp.next().payload) == (b"tcp -> ws", b"ws -> tcp")
        conns = b.call(lambda: [c.info() for c in b.broker.connections])
        transports = sorted(c["client_properties"]["transport"] for c in conns)
        assert transports == ["MQTT", "MQTT/WebSocket"]
        ws.close()
        tcp.close()
    finally:
        b.stop()
