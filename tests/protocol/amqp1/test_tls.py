"""AMQP 1.0 on the AMQP TLS port: Qpid Proton over TLS, logging in with its
client certificate (SASL EXTERNAL, offered only to a client that presented
one) or with PLAIN."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import BrokerThread
from tlshelp import tls_broker as start_tls_broker
from tlshelp import write_pki

proton = pytest.importorskip("proton")
from proton.utils import BlockingConnection  # noqa: E402

pytestmark = [pytest.mark.timeout(60)]

if not proton.SSL.present():
    pytest.skip("proton was built without TLS", allow_module_level=True)


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, str]:
    return write_pki(tmp_path / "pki", users=("alice",))


@pytest.fixture
def tls_broker(tmp_path: Path, pki: dict[str, str]) -> Iterator[BrokerThread]:
    b = start_tls_broker(tmp_path / "data", pki, users=("alice",))
    try:
        yield b
    finally:
        b.stop()


def _domain(pki: dict[str, str], user: str | None) -> proton.SSLDomain:
    domain = proton.SSLDomain(proton.SSLDomain.MODE_CLIENT)
    domain.set_trusted_ca_db(pki["ca"])
    # The chain is checked; the name is not (BlockingConnection does not give
    # proton the host name VERIFY_PEER_NAME needs).
    domain.set_peer_authentication(proton.SSLDomain.VERIFY_PEER)
    if user is not None:
        domain.set_credentials(pki[user], pki[f"{user}.key"], None)
    return domain


def _connected(broker: BrokerThread) -> list[tuple[str, str]]:
    def users() -> list[tuple[str, str]]:
        listener = broker.broker.listener("amqp1")
        return [
            (p.conn.user.name, p.conn.auth_mechanism)
            for p in listener.protocols  # type: ignore[attr-defined]
            if p.conn is not None and p.conn.user is not None
        ]

    return broker.call(users)


def test_external_logs_in_by_the_client_certificate(
    tls_broker: BrokerThread, pki: dict[str, str]
) -> None:
    port = tls_broker.amqp_listener.tls_port
    conn = BlockingConnection(
        f"amqps://localhost:{port}",
        ssl_domain=_domain(pki, "alice"),
        allowed_mechs="EXTERNAL",
        virtual_host="vhost:/",
        timeout=10,
    )
    try:
        assert _connected(tls_broker) == [("alice", "EXTERNAL")]
        info = tls_broker.call(
            lambda: [p.conn.info() for p in tls_broker.broker.listener("amqp1").protocols]  # type: ignore[attr-defined]
        )
        assert info[0]["ssl"] is True
    finally:
        conn.close()


def test_plain_over_tls_without_a_client_certificate(
    tls_broker: BrokerThread, pki: dict[str, str]
) -> None:
    port = tls_broker.amqp_listener.tls_port
    conn = BlockingConnection(
        f"amqps://localhost:{port}",
        ssl_domain=_domain(pki, None),
        user="guest",
        password="guest",
        allowed_mechs="PLAIN",
        virtual_host="vhost:/",
        timeout=10,
    )
    try:
        assert _connected(tls_broker) == [("guest", "PLAIN")]
    finally:
        conn.close()
