"""A cluster with TLS between its parts: etcd over https with client certificates
(etcd's --client-cert-auth) and replication over mutual TLS ([clustering] tls),
every certificate from one test CA (trustme)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme
from etcd_proc import ETCD, EtcdProcess
from nodes import Node, job_bodies, marks, publish_jobs, start_cluster, wait_any

from warren import Config
from warren.cluster.etcd import EtcdClient, EtcdError
from warren.tls import etcd_context


@dataclass
class Certs:
    ca: Path
    cert: Path
    key: Path


def _issue(ca: trustme.CA, where: Path, name: str) -> Certs:
    """A certificate for 127.0.0.1 (server and client use) and the CA bundle
    (written once: a running etcd may read it again at any moment, and a file
    being rewritten read as no CA at all, refusing every client for good)."""
    leaf = ca.issue_cert("127.0.0.1")
    certs = Certs(where / "ca.pem", where / f"{name}.pem", where / f"{name}.key")
    if not certs.ca.exists():
        ca.cert_pem.write_to_path(str(certs.ca))
    leaf.cert_chain_pems[0].write_to_path(str(certs.cert))
    leaf.private_key_pem.write_to_path(str(certs.key))
    return certs


@pytest.fixture
def tls_etcd(tmp_path: Path) -> Iterator[tuple[EtcdProcess, trustme.CA]]:
    if ETCD is None:
        pytest.skip("etcd is not installed (make etcd installs Debian's etcd-server)")
    ca = trustme.CA()
    server = _issue(ca, tmp_path, "etcd")
    proc = EtcdProcess(tmp_path / "etcd", tls=(server.cert, server.key, server.ca))
    try:
        yield proc, ca
    finally:
        proc.stop()


def _client(endpoint: str, **settings: object) -> EtcdClient:
    config = Config(clustering_etcd_endpoints=(endpoint,), **settings)  # type: ignore[arg-type]
    return EtcdClient([endpoint], tls=etcd_context(config))


def test_etcd_over_https_takes_only_certified_clients(
    tls_etcd: tuple[EtcdProcess, trustme.CA], tmp_path: Path
) -> None:
    etcd, ca = tls_etcd
    mine = _issue(ca, tmp_path, "node")
    (tmp_path / "other").mkdir()
    other = _issue(trustme.CA(), tmp_path / "other", "node")

    async def main() -> None:
        ok = _client(
            etcd.url,
            clustering_etcd_ca_cert=str(mine.ca),
            clustering_etcd_cert=str(mine.cert),
            clustering_etcd_key=str(mine.key),
        )
        no_cert = _client(etcd.url, clustering_etcd_ca_cert=str(mine.ca))
        untrusting = _client(
            etcd.url,
            clustering_etcd_ca_cert=str(other.ca),
            clustering_etcd_cert=str(mine.cert),
            clustering_etcd_key=str(mine.key),
        )
        try:
            await ok.put("k", b"v")
            got = await ok.get("k")
            assert got is not None and got.value == b"v"
            with pytest.raises(EtcdError):  # etcd asks for a client certificate
                await no_cert.get("k")
            with pytest.raises(EtcdError, match="CERTIFICATE_VERIFY_FAILED"):
                await untrusting.get("k")
        finally:
            for client in (ok, no_cert, untrusting):
                await client.close()

    asyncio.run(main())


def test_a_cluster_over_tls_replicates_and_fails_over(
    tls_etcd: tuple[EtcdProcess, trustme.CA], tmp_path: Path
) -> None:
    etcd, ca = tls_etcd
    nodes = []
    for i in range(2):
        certs = _issue(ca, tmp_path, f"n{i}")
        files = {"ca": str(certs.ca), "cert": str(certs.cert), "key": str(certs.key)}
        settings = {
            "main": {
                "tls_cert": files["cert"],
                "tls_key": files["key"],
                "tls_ca_cert": files["ca"],
            },
            "clustering": {
                "tls": "true",
                "etcd_ca_cert": files["ca"],
                "etcd_cert": files["cert"],
                "etcd_key": files["key"],
            },
        }
        nodes.append(Node(tmp_path, f"n{i}", etcd.url, settings=settings))
    try:
        leader = start_cluster(nodes)
        publish_jobs(leader.address, 0, 50)  # confirmed once the follower has them
        follower = nodes[1]
        before = marks([follower])
        leader.kill()
        wait_any([follower], "elected leader", timeout=30, since=before)
        follower.wait_for("listening on AMQP")
        assert job_bodies(follower.address) == {b"job-%d" % i for i in range(50)}
    finally:
        for node in nodes:
            node.stop()
