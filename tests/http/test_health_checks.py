"""Health checks that look at real state: the TLS listeners' certificates, the
ports bound, the connection limit (the answers for a healthy broker are compared
with RabbitMQ's in test_mgmt_compat.py)."""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable
from pathlib import Path

import pika
import pytest
import trustme
from conftest import BrokerThread
from cryptography import x509
from httphelp import Api

H = "/api/health/checks"
Factory = Callable[..., BrokerThread]


def _cert(tmp_path: Path, days: int) -> tuple[str, str, datetime.datetime]:
    """A server certificate that expires in ``days`` days: chain, key, expiry."""
    now = datetime.datetime.now(datetime.UTC)
    leaf = trustme.CA().issue_cert(
        "127.0.0.1", not_before=now - datetime.timedelta(days=1),
        not_after=now + datetime.timedelta(days=days),
    )
    chain, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    leaf.private_key_pem.write_to_path(str(key))
    chain.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
    expires = x509.load_pem_x509_certificate(chain.read_bytes()).not_valid_after_utc
    return str(chain), str(key), expires


def test_certificate_expiration_reads_the_tls_listeners_certificate(
    tmp_path: Path, broker_factory: Factory, caplog: pytest.LogCaptureFixture
) -> None:
    chain, key, expires = _cert(tmp_path, days=10)
    b = broker_factory(amqp_tls_port=0, tls_cert=chain, tls_key=key)
    api = Api(b.http_port)
    assert api.get(f"{H}/certificate-expiration/1/weeks") == {"status": "ok"}
    with caplog.at_level(logging.WARNING, logger="warren.http"):
        reply = api.request("GET", f"{H}/certificate-expiration/2/WEEKS")
    assert reply.status == 503
    stamp = f"{expires:%Y-%m-%d} {expires.hour}:{expires:%M:%S}"
    assert reply.json() == {
        "status": "failed",
        "reason": "Certificates expiring",
        "expired": [
            {
                "node": api.get("/api/overview")["node"],
                "protocol": "amqp/ssl",
                "interface": b.amqp_listener.bind,
                "port": b.amqp_listener.tls_port,
                "certfile": chain,
                "cacertfile": None,
                "certfile_expires_on": [stamp],
                "cacertfile_expires_on": [],
            }
        ],
    }
    assert "certificate-expiration/2/WEEKS failed: Certificates expiring" in caplog.text
    assert api.request("GET", f"{H}/certificate-expiration/1/months").status == 503


def test_certificate_expiration_without_tls_is_ok(broker: BrokerThread) -> None:
    assert Api(broker.http_port).get(f"{H}/certificate-expiration/100/years") == {"status": "ok"}


def test_listener_checks_know_the_tls_ports(tmp_path: Path, broker_factory: Factory) -> None:
    chain, key, _ = _cert(tmp_path, days=400)
    b = broker_factory(amqp_tls_port=0, http_tls_port=0, tls_cert=chain, tls_key=key)
    api = Api(b.http_port)
    tls_port = b.amqp_listener.tls_port
    assert api.get(f"{H}/port-listener/{tls_port}") == {"status": "ok", "port": tls_port}
    for name, protocol in (("amqps", "amqp/ssl"), ("AMQP091", "amqp"), ("https", "https"),
                           ("management", "http")):
        assert api.get(f"{H}/protocol-listener/{name}") == {"status": "ok", "protocol": protocol}
    # RabbitMQ 4.x's form: several protocols, comma-separated.
    both = api.get(f"{H}/protocol-listener/amqps,http")
    assert both["status"] == "ok" and {"amqp/ssl", "http"} <= set(both["protocols"])
    reply = api.request("GET", f"{H}/protocol-listener/amqp,stomp,mqtts")
    assert reply.status == 503 and reply.json()["missing"] == ["stomp", "mqtt/ssl"]
    reply = api.request("GET", f"{H}/protocol-listener/mqtts")
    assert reply.status == 503
    assert reply.json()["missing"] == "mqtt/ssl"
    assert set(reply.json()["protocols"]) == {
        "amqp",
        "amqp/ssl",
        "mqtt",
        "http",
        "https",
        "http/prometheus",
    }


def test_connection_limit_checks(broker_factory: Factory) -> None:
    b = broker_factory(max_connections=1)
    api = Api(b.http_port)
    for check in ("below-node-connection-limit", "ready-to-serve-clients", "is-in-service"):
        assert api.get(f"{H}/{check}") == {"status": "ok"}
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    try:
        reply = api.request("GET", f"{H}/below-node-connection-limit")
        assert (reply.status, reply.json()) == (
            503, {"status": "failed", "reason": "node connection limit is reached"})
        reply = api.request("GET", f"{H}/ready-to-serve-clients")
        assert (reply.status, reply.json()) == (503, {
            "status": "failed", "reason": "node connection limit is reached", "connections": 1})
    finally:
        conn.close()
    assert api.get(f"{H}/below-node-connection-limit") == {"status": "ok"}



def test_the_older_node_health_check_names_this_node(broker: BrokerThread) -> None:
    api = Api(broker.http_port)
    node = api.get("/api/overview")["node"]
    assert api.get(f"/api/healthchecks/node/{node}") == {"status": "ok"}
