"""TLS on the AMQP (amqps) and management (HTTPS) listeners, with a throwaway CA.

MQTT over TLS is in tests/protocol/mqtt/test_mqtt_transports.py; all three share
warren.tls.server_context and the ``[main] tls_*`` settings.
"""

from __future__ import annotations

import json
import ssl
import urllib.request
from base64 import b64encode
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
import trustme
from conftest import BrokerThread, start_broker

from warren.config import Config, ConfigError


@pytest.fixture
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def cert_files(tmp_path: Path, ca: trustme.CA) -> tuple[Path, Path]:
    cert = ca.issue_cert("127.0.0.1", "localhost")
    chain = tmp_path / "cert.pem"
    key = tmp_path / "key.pem"
    cert.private_key_pem.write_to_path(str(key))
    chain.write_bytes(b"".join(blob.bytes() for blob in cert.cert_chain_pems))
    return chain, key


@pytest.fixture
def tls_broker(tmp_path: Path, cert_files: tuple[Path, Path]) -> Iterator[BrokerThread]:
    chain, key = cert_files
    b = start_broker(
        tmp_path / "data",
        amqp_tls_port=0,
        http_tls_port=0,
        prometheus_tls_port=0,
        tls_cert=str(chain),
        tls_key=str(key),
    )
    try:
        yield b
    finally:
        b.stop()


def client_context(ca: trustme.CA) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ca.configure_trust(ctx)
    return ctx


def test_amqps_round_trip_and_listing(tls_broker: BrokerThread, ca: trustme.CA) -> None:
    amqp = tls_broker.amqp_listener
    assert amqp.tls_port and amqp.tls_port != amqp.port
    params = pika.ConnectionParameters(
        "127.0.0.1",
        amqp.tls_port,
        credentials=pika.PlainCredentials("guest", "guest"),
        ssl_options=pika.SSLOptions(client_context(ca), "127.0.0.1"),
    )
    conn = pika.BlockingConnection(params)
    ch = conn.channel()
    ch.queue_declare("secure")
    ch.confirm_delivery()
    ch.basic_publish("", "secure", b"over tls")
    assert ch.basic_get("secure", auto_ack=True)[2] == b"over tls"
    listed = tls_broker.call(lambda: [c.info() for c in tls_broker.broker.connections])
    (info,) = listed
    assert info["ssl"] is True and info["ssl_protocol"].startswith("TLSv1.")
    assert info["port"] == amqp.tls_port
    conn.close()


def test_plain_amqp_still_served_next_to_amqps(tls_broker: BrokerThread) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(tls_broker.url))
    assert conn.channel().queue_declare("", exclusive=True).method.queue
    info = tls_broker.call(lambda: [c.info() for c in tls_broker.broker.connections])
    assert [i["ssl"] for i in info] == [False]
    conn.close()


def test_untrusted_client_cannot_complete_the_handshake(tls_broker: BrokerThread) -> None:
    """A client that does not trust the CA fails the handshake; the broker goes on."""
    params = pika.ConnectionParameters(
        "127.0.0.1",
        tls_broker.amqp_listener.tls_port,
        ssl_options=pika.SSLOptions(ssl.create_default_context(), "127.0.0.1"),
        connection_attempts=1,
    )
    with pytest.raises((pika.exceptions.AMQPConnectionError, ssl.SSLError)):
        pika.BlockingConnection(params)
    conn = pika.BlockingConnection(pika.URLParameters(tls_broker.url))
    conn.close()


def test_prometheus_metrics_over_https(tls_broker: BrokerThread, ca: trustme.CA) -> None:
    """[prometheus] tls_port (RabbitMQ's prometheus.ssl.port) next to the plain port."""
    prometheus = tls_broker.broker.listener("http/prometheus")
    assert prometheus is not None and prometheus.tls_port  # type: ignore[attr-defined]
    url = f"https://127.0.0.1:{prometheus.tls_port}/metrics"  # type: ignore[attr-defined]
    with urllib.request.urlopen(url, timeout=10, context=client_context(ca)) as resp:
        assert b"rabbitmq_identity_info{" in resp.read()
    with urllib.request.urlopen(f"http://127.0.0.1:{prometheus.port}/metrics", timeout=10) as resp:
        assert resp.status == 200


def test_https_management_api(tls_broker: BrokerThread, ca: trustme.CA) -> None:
    http = tls_broker.broker.listener("http")
    assert http is not None and http.tls_port  # type: ignore[attr-defined]
    req = urllib.request.Request(f"https://127.0.0.1:{http.tls_port}/api/overview")  # type: ignore[attr-defined]
    req.add_header("Authorization", "Basic " + b64encode(b"guest:guest").decode())
    with urllib.request.urlopen(req, timeout=10, context=client_context(ca)) as resp:
        overview = json.load(resp)
    assert overview["node"].startswith("warren@")


def test_tls_min_version_13_refuses_tls_12(
    tmp_path: Path, cert_files: tuple[Path, Path], ca: trustme.CA
) -> None:
    chain, key = cert_files
    b = start_broker(
        tmp_path / "data",
        amqp_tls_port=0,
        tls_cert=str(chain),
        tls_key=str(key),
        tls_min_version="1.3",
    )
    try:
        ctx = client_context(ca)
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
        params = pika.ConnectionParameters(
            "127.0.0.1",
            b.amqp_listener.tls_port,
            ssl_options=pika.SSLOptions(ctx, "127.0.0.1"),
            connection_attempts=1,
        )
        with pytest.raises((pika.exceptions.AMQPConnectionError, ssl.SSLError)):
            pika.BlockingConnection(params)
        ok = client_context(ca)
        conn = pika.BlockingConnection(
            pika.ConnectionParameters(
                "127.0.0.1", b.amqp_listener.tls_port, ssl_options=pika.SSLOptions(ok, "127.0.0.1")
            )
        )
        conn.close()
    finally:
        b.stop()


def test_tls_port_without_a_certificate_refuses_to_start(tmp_path: Path) -> None:
    with pytest.raises(OSError, match="AMQP TLS port needs tls_cert and tls_key"):
        start_broker(tmp_path / "data", amqp_tls_port=0)


def test_tls_settings_from_ini(tmp_path: Path) -> None:
    ini = tmp_path / "warren.ini"
    ini.write_text(
        "[main]\ntls_cert = /etc/warren/cert.pem\ntls_key = /etc/warren/key.pem\n"
        "tls_min_version = 1.3\ntls_ciphers = ECDHE+AESGCM\n"
        "[amqp]\ntls_port = 5671\n[mgmt]\ntls_port = 15671\n[mqtt]\ntls_port = 8883\n"
    )
    c = Config.from_ini(ini)
    assert (c.amqp_tls_port, c.http_tls_port, c.mqtt_tls_port) == (5671, 15671, 8883)
    assert (c.tls_min_version, c.tls_ciphers) == ("1.3", "ECDHE+AESGCM")
    ini.write_text("[main]\ntls_min_version = 1.1\n")
    with pytest.raises(ConfigError, match="tls_min_version"):
        Config.from_ini(ini)


def test_certificate_reload_keeps_open_connections(
    tmp_path: Path, cert_files: tuple[Path, Path], ca: trustme.CA
) -> None:
    """The certificate files replaced and reloaded (what SIGHUP does): new handshakes
    get the new certificate, a connection made before keeps working; a broken pair
    is refused and the running certificate stays."""
    chain, key = cert_files
    b = start_broker(tmp_path / "data", amqp_tls_port=0, tls_cert=str(chain), tls_key=str(key))
    try:
        port = b.amqp_listener.tls_port

        def connect(trust: trustme.CA) -> pika.BlockingConnection:
            return pika.BlockingConnection(
                pika.ConnectionParameters(
                    "127.0.0.1",
                    port,
                    ssl_options=pika.SSLOptions(client_context(trust), "127.0.0.1"),
                    connection_attempts=1,
                )
            )

        before = connect(ca)
        other_ca = trustme.CA()
        new = other_ca.issue_cert("127.0.0.1")
        new.private_key_pem.write_to_path(str(key))
        chain.write_bytes(b"".join(blob.bytes() for blob in new.cert_chain_pems))
        b.call(b.broker.reload_tls)
        connect(other_ca).close()  # the new certificate
        with pytest.raises((pika.exceptions.AMQPConnectionError, ssl.SSLError)):
            connect(ca)  # the old CA no longer matches
        before.channel().queue_declare("", exclusive=True)  # the old connection goes on
        before.close()
        key.write_text("not a key")
        b.call(b.broker.reload_tls)  # logged, ignored
        connect(other_ca).close()
    finally:
        b.stop()


def test_sighup_reloads_the_certificate(tmp_path: Path, cert_files: tuple[Path, Path]) -> None:
    """`kill -HUP` on a running `warren`: the reload is logged, the broker stays up."""
    import signal

    from procs import start_warren

    chain, key = cert_files
    proc, _ = start_warren(
        tmp_path / "data", "--amqp-tls-port", "0", "--tls-cert", str(chain), "--tls-key", str(key)
    )
    try:
        assert proc.stdout is not None
        proc.send_signal(signal.SIGHUP)
        for line in proc.stdout:
            if "TLS certificate reloaded" in line:
                break
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(15)
    assert proc.returncode == 0
