"""Certificates for TLS tests (trustme) written as PEM files, and a broker with a
TLS listener that verifies client certificates and knows their users."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trustme
from conftest import BrokerThread, start_broker


def write_pki(directory: Path, users: tuple[str, ...] = ()) -> dict[str, str]:
    """A CA, a server certificate for 127.0.0.1/localhost and a client
    certificate per user (its common name), as files: ``ca``, ``server``,
    ``server.key``, ``<user>``, ``<user>.key``; and ``other-ca``, a CA that
    signed none of them."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(directory / "ca.pem"))
    files = {"ca": str(directory / "ca.pem")}
    leaves = [("server", ca.issue_cert("127.0.0.1", "localhost"))]
    leaves += [(u, ca.issue_cert(f"{u}.example", common_name=u)) for u in users]
    for name, leaf in leaves:
        leaf.private_key_pem.write_to_path(str(directory / f"{name}.key"))
        (directory / f"{name}.pem").write_bytes(b"".join(b.bytes() for b in leaf.cert_chain_pems))
        files[name] = str(directory / f"{name}.pem")
        files[f"{name}.key"] = str(directory / f"{name}.key")
    trustme.CA().cert_pem.write_to_path(str(directory / "other-ca.pem"))
    files["other-ca"] = str(directory / "other-ca.pem")
    return files


def tls_broker(
    data: Path, pki: dict[str, str], users: tuple[str, ...] = (), **settings: Any
) -> BrokerThread:
    """A broker with an AMQP TLS listener asking for client certificates, and
    ``users`` (with every permission on /) to log in with them (EXTERNAL);
    ``settings``: more broker settings (another TLS listener: ``stream_tls_port=0``)."""
    settings.setdefault("amqp_tls_port", 0)
    b = start_broker(
        data,
        sync=False,
        **settings,
        tls_cert=pki["server"],
        tls_key=pki["server.key"],
        tls_ca_cert=pki["ca"],
        tls_verify_peer=True,
    )

    def add_users() -> None:
        for user in users:
            b.broker.users.add_user(user, "unused-password")
            b.broker.users.set_permissions(user, "/")

    b.call(add_users)
    return b
