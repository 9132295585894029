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
        "stream",
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


# -- RabbitMQ 4.x's checks (its source: rabbit_mgmt_wm_health_check_*; 3.10 has none) -----


def test_the_metadata_store_checks(
    broker: BrokerThread, caplog: pytest.LogCaptureFixture
) -> None:
    api = Api(broker.http_port)
    assert api.get(f"{H}/metadata-store/initialized") == {"status": "ok"}
    assert api.get(f"{H}/metadata-store/initialized/with-data") == {"status": "ok"}
    assert api.request("DELETE", "/api/vhosts/%2F").status == 204  # the only vhost
    assert api.get(f"{H}/metadata-store/initialized") == {"status": "ok"}
    with caplog.at_level(logging.WARNING, logger="warren.http"):
        reply = api.request("GET", f"{H}/metadata-store/initialized/with-data")
    assert (reply.status, reply.json()) == (503, {
        "status": "failed",
        "reason": "Metadata store has not yet been initialized: it reports to have no "
        "virtual hosts",
    })
    assert "initialized/with-data failed: Metadata store" in caplog.text
    assert api.anonymous().request("GET", f"{H}/metadata-store/initialized").status == 401


def test_quorum_queues_without_an_elected_leader(
    broker: BrokerThread, caplog: pytest.LogCaptureFixture
) -> None:
    api = Api(broker.http_port)
    assert api.request("PUT", "/api/vhosts/other").status == 201
    for vhost, name in (("%2F", "qq-orders"), ("%2F", "qq-audit"), ("other", "qq-orders")):
        body = {"durable": True, "arguments": {"x-queue-type": "quorum"}}
        assert api.request("PUT", f"/api/queues/{vhost}/{name}", body).status == 201
    assert api.request("PUT", "/api/queues/%2F/classic-orders", {"durable": True}).status == 201
    leaders = f"{H}/quorum-queues-without-elected-leaders"
    paths = (
        f"{leaders}/all-vhosts/",
        f"{leaders}/all-vhosts/pattern/orders",
        f"{leaders}/vhost/%2F/",
        f"{leaders}/vhost/other/pattern/%5Eqq-",
        f"{leaders}/vhost/nowhere/",  # as RabbitMQ: no such vhost has no such queues
    )
    for path in paths:  # a single node leads every queue it has
        assert api.get(path) == {"status": "ok"}, path

    # A leader stepping down (its etcd lease lost) while its API still answers: its
    # cluster state (cluster/node.py's ClusterNode.status) says it no longer leads.
    def stepping_down() -> dict[str, object]:
        return {"enabled": True, "role": "candidate", "node": "n1"}

    broker.call(lambda: setattr(broker.broker, "cluster_status", stepping_down))

    def named(path: str) -> list[str]:
        reply = api.request("GET", path)
        assert reply.status == 503, reply
        body = reply.json()
        assert body["status"] == "failed"
        assert body["reason"] == "Detected quorum queues without an elected leader"
        return sorted(f"{q['virtual_host']} {q['name']}" for q in body["queues"])

    with caplog.at_level(logging.WARNING, logger="warren.http"):
        assert named(f"{leaders}/all-vhosts/") == ["/ qq-audit", "/ qq-orders", "other qq-orders"]
    assert "Detected quorum queues without an elected leader" in caplog.text
    assert named(f"{leaders}/all-vhosts/pattern/orders") == ["/ qq-orders", "other qq-orders"]
    assert named(f"{leaders}/vhost/%2F/") == ["/ qq-audit", "/ qq-orders"]
    assert named(f"{leaders}/vhost/other/pattern/%5Eqq-") == ["other qq-orders"]
    assert api.get(f"{leaders}/vhost/nowhere/") == {"status": "ok"}
    [one] = api.request("GET", f"{leaders}/vhost/other/").json()["queues"]
    assert one == {
        "readable_name": "queue 'qq-orders' in vhost 'other'",
        "name": "qq-orders",
        "virtual_host": "other",
        "type": "rabbit_quorum_queue",
    }
    reply = api.request("GET", f"{leaders}/all-vhosts/pattern/%28")
    assert reply.status == 400 and "invalid pattern '('" in reply.json()["reason"]


def test_reached_target_cluster_size_asks_for_no_credentials(
    tmp_path: Path, broker_factory: Factory
) -> None:
    api = Api(broker_factory(data_dir=tmp_path / "one").http_port).anonymous()
    reply = api.request("GET", f"{H}/reached-target-cluster-size")
    assert (reply.status, reply.json()) == (200, {"status": "ok"})
    assert reply.headers["Cache-Control"] == "no-cache, no-store, max-age=0, must-revalidate"
    b = broker_factory(data_dir=tmp_path / "two", clustering_target_cluster_size_hint=3)
    reply = Api(b.http_port).anonymous().request("GET", f"{H}/reached-target-cluster-size")
    assert (reply.status, reply.json()) == (503, {
        "status": "failed",
        "reason": "target cluster size not reached: 1 of 3 nodes are online",
        "online": 1,
        "target": 3,
    })
    # Credentials are not needed, and not checked either: other paths still are.
    assert Api(b.http_port).anonymous().request("GET", f"{H}/alarms").status == 401
