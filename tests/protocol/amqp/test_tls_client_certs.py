"""Client certificates on the TLS listeners: tls_ca_cert, tls_verify_peer,
tls_fail_if_no_peer_cert, AMQP's EXTERNAL mechanism and MQTT's certificate login
(RabbitMQ's rabbitmq_auth_mechanism_ssl and mqtt.ssl_cert_login)."""

from __future__ import annotations

import socket
import ssl
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
import trustme
from conftest import BrokerThread, start_broker
from mqttclient import V5, V311, Client

from warren.config import Config, ConfigError
from warren.tls import TLSContexts, cert_login, distinguished_name


@pytest.fixture
def ca() -> trustme.CA:
    return trustme.CA()


def _write(tmp_path: Path, name: str, cert: trustme.LeafCert) -> tuple[str, str]:
    chain = tmp_path / f"{name}.pem"
    key = tmp_path / f"{name}.key"
    cert.private_key_pem.write_to_path(str(key))
    chain.write_bytes(b"".join(blob.bytes() for blob in cert.cert_chain_pems))
    return str(chain), str(key)


def _broker(tmp_path: Path, ca: trustme.CA, **settings: Any) -> BrokerThread:
    chain, key = _write(tmp_path, "server", ca.issue_cert("127.0.0.1", "localhost"))
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    settings.setdefault("tls_verify_peer", True)
    return start_broker(
        tmp_path / "data",
        sync=False,
        amqp_tls_port=0,
        mqtt_tls_port=0,
        tls_cert=chain,
        tls_key=key,
        tls_ca_cert=str(ca_file),
        **settings,
    )


@pytest.fixture
def optional_broker(tmp_path: Path, ca: trustme.CA) -> Iterator[BrokerThread]:
    b = _broker(tmp_path, ca)
    try:
        yield b
    finally:
        b.stop()


def client_context(ca: trustme.CA, cert: trustme.LeafCert | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ca.configure_trust(ctx)
    if cert is not None:
        cert.configure_cert(ctx)
    return ctx


def params(
    b: BrokerThread, ctx: ssl.SSLContext, credentials: Any = None
) -> pika.ConnectionParameters:
    return pika.ConnectionParameters(
        "127.0.0.1",
        b.amqp_listener.tls_port,
        credentials=credentials or pika.PlainCredentials("guest", "guest"),
        ssl_options=pika.SSLOptions(ctx, "127.0.0.1"),
        connection_attempts=1,
    )


def start_mechanisms(port: int, ctx: ssl.SSLContext | None, host: str = "127.0.0.1") -> bytes:
    """The mechanisms field of the broker's connection.start."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        sock: socket.socket = ctx.wrap_socket(raw, server_hostname=host) if ctx else raw
        sock.sendall(b"AMQP\x00\x00\x09\x01")
        data = b""
        while len(data) < 7 or len(data) < 8 + struct.unpack(">I", data[3:7])[0]:
            chunk = sock.recv(65536)
            assert chunk
            data += chunk
    payload = data[7 : 7 + struct.unpack(">I", data[3:7])[0]]
    pos = 4 + 2  # class and method ids, version major and minor
    (table_len,) = struct.unpack(">I", payload[pos : pos + 4])
    pos += 4 + table_len
    (mech_len,) = struct.unpack(">I", payload[pos : pos + 4])
    return payload[pos + 4 : pos + 4 + mech_len]


def test_external_offered_only_with_a_verified_certificate(
    optional_broker: BrokerThread, ca: trustme.CA
) -> None:
    b = optional_broker
    with_cert = client_context(ca, ca.issue_cert("guest", common_name="guest"))
    assert start_mechanisms(b.amqp_listener.tls_port, with_cert) == b"EXTERNAL AMQPLAIN PLAIN"
    assert start_mechanisms(b.amqp_listener.tls_port, client_context(ca)) == b"AMQPLAIN PLAIN"
    assert start_mechanisms(b.amqp_listener.port, None) == b"AMQPLAIN PLAIN"


def test_management_api_lists_external_as_enabled(optional_broker: BrokerThread) -> None:
    import json
    import urllib.request
    from base64 import b64encode

    http = optional_broker.broker.listener("http")
    assert http is not None
    req = urllib.request.Request(f"http://127.0.0.1:{http.port}/api/nodes")
    req.add_header("Authorization", "Basic " + b64encode(b"guest:guest").decode())
    with urllib.request.urlopen(req, timeout=10) as resp:
        (node,) = json.load(resp)
    mechanisms = {m["name"]: m["enabled"] for m in node["auth_mechanisms"]}
    assert mechanisms == {"PLAIN": True, "AMQPLAIN": True, "EXTERNAL": True}


def test_optional_certificate_missing_plain_still_works(
    optional_broker: BrokerThread, ca: trustme.CA
) -> None:
    conn = pika.BlockingConnection(params(optional_broker, client_context(ca)))
    assert conn.channel().queue_declare("", exclusive=True).method.queue
    conn.close()


def test_external_logs_in_as_the_common_name(optional_broker: BrokerThread, ca: trustme.CA) -> None:
    b = optional_broker

    def add_alice() -> None:
        b.broker.users.add_user("alice", "unused-password")
        b.broker.users.set_permissions("alice", "/")

    b.call(add_alice)
    ctx = client_context(ca, ca.issue_cert("alice.example", common_name="alice"))
    conn = pika.BlockingConnection(params(b, ctx, pika.credentials.ExternalCredentials()))
    assert conn.channel().queue_declare("", exclusive=True).method.queue
    (info,) = b.call(lambda: [c.info() for c in b.broker.connections])
    assert info["user"] == "alice" and info["auth_mechanism"] == "EXTERNAL"
    conn.close()
    # The same certificate may still log in with a password, as another user.
    conn = pika.BlockingConnection(params(b, ctx))
    conn.close()


def test_external_logs_in_as_the_distinguished_name(tmp_path: Path, ca: trustme.CA) -> None:
    """RabbitMQ's default ssl_cert_login_from: the whole subject, RFC 4514 order
    (cryptography's rfc4514_string is the oracle for these plain attributes)."""
    from cryptography import x509

    leaf = ca.issue_cert(
        "bob.example", common_name="bob", organization_name="Example", organization_unit_name="Ops"
    )
    dn = x509.load_pem_x509_certificate(leaf.cert_chain_pems[0].bytes()).subject.rfc4514_string()
    assert dn == "CN=bob,OU=Ops,O=Example"
    b = _broker(tmp_path, ca, tls_cert_login_from="distinguished_name")
    try:

        def add_user() -> None:
            b.broker.users.add_user(dn, "unused-password")
            b.broker.users.set_permissions(dn, "/")

        b.call(add_user)
        ctx = client_context(ca, leaf)
        conn = pika.BlockingConnection(params(b, ctx, pika.credentials.ExternalCredentials()))
        conn.channel().queue_declare("", exclusive=True)
        (info,) = b.call(lambda: [c.info() for c in b.broker.connections])
        assert info["user"] == dn and info["auth_mechanism"] == "EXTERNAL"
        conn.close()
        listener = b.broker.listener("mqtt")
        mqtt = Client(listener.tls_port, protocol=V5)  # type: ignore[union-attr]
        mqtt.paho.tls_set_context(ctx)
        mqtt.connect()
        users = b.call(lambda: [c.info()["user"] for c in b.broker.connections])
        assert users == [dn]
        mqtt.close()
    finally:
        b.stop()


def test_external_with_an_unknown_user_is_refused(
    optional_broker: BrokerThread, ca: trustme.CA
) -> None:
    ctx = client_context(ca, ca.issue_cert("nobody.example", common_name="nobody"))
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as info:
        pika.BlockingConnection(
            params(optional_broker, ctx, pika.credentials.ExternalCredentials())
        )
    assert "ACCESS_REFUSED" in str(info.value) and "EXTERNAL" in str(info.value)


def test_external_refusal_counts_as_a_failed_login(tmp_path: Path, ca: trustme.CA) -> None:
    b = _broker(tmp_path, ca, auth_failures_per_minute=1)
    try:
        ctx = client_context(ca, ca.issue_cert("nobody.example", common_name="nobody"))
        with pytest.raises(pika.exceptions.ProbableAuthenticationError):
            pika.BlockingConnection(params(b, ctx, pika.credentials.ExternalCredentials()))
        # One failure per minute allowed: the right password is refused unchecked now.
        with pytest.raises(pika.exceptions.ProbableAuthenticationError):
            pika.BlockingConnection(params(b, client_context(ca)))
    finally:
        b.stop()


def test_external_without_a_certificate_is_unsupported(
    optional_broker: BrokerThread, ca: trustme.CA
) -> None:
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(
            params(optional_broker, client_context(ca), pika.credentials.ExternalCredentials())
        )


def test_required_certificate_missing_fails_the_handshake(tmp_path: Path, ca: trustme.CA) -> None:
    b = _broker(tmp_path, ca, tls_fail_if_no_peer_cert=True)
    try:
        with pytest.raises((pika.exceptions.AMQPConnectionError, ssl.SSLError, OSError)):
            conn = pika.BlockingConnection(params(b, client_context(ca)))
            conn.channel()
        # A certificate from another CA is refused too; one from the CA is let in.
        other = trustme.CA()
        with pytest.raises((pika.exceptions.AMQPConnectionError, ssl.SSLError, OSError)):
            ctx = client_context(ca, other.issue_cert("guest", common_name="guest"))
            conn = pika.BlockingConnection(params(b, ctx))
            conn.channel()
        ctx = client_context(ca, ca.issue_cert("guest", common_name="guest"))
        conn = pika.BlockingConnection(params(b, ctx, pika.credentials.ExternalCredentials()))
        conn.close()
    finally:
        b.stop()


@pytest.mark.parametrize("protocol", [V311, V5])
def test_mqtt_login_by_certificate(
    optional_broker: BrokerThread, ca: trustme.CA, protocol: int
) -> None:
    b = optional_broker
    listener = b.broker.listener("mqtt")
    tls_port = listener.tls_port  # type: ignore[union-attr]

    def add_carol() -> None:
        b.broker.users.add_user("carol", "unused-password")
        b.broker.users.set_permissions("carol", "/")

    b.call(add_carol)
    client = Client(tls_port, protocol=protocol)
    client.paho.tls_set_context(client_context(ca, ca.issue_cert("c", common_name="carol")))
    client.connect()
    users = b.call(lambda: [c.info()["user"] for c in b.broker.connections if c.info()["ssl"]])
    assert users == ["carol"]
    client.close()
    stranger = Client(tls_port, protocol=protocol)
    stranger.paho.tls_set_context(client_context(ca, ca.issue_cert("d", common_name="dave")))
    _flags, rc, _props = stranger.connect()
    assert rc.is_failure  # bad user name or password (3.1.1: 4)
    stranger.close()


def test_cert_login_names() -> None:
    cert = {
        "subject": ((("organizationName", "x"),), (("commonName", "alice"),)),
        "subjectAltName": (("IP Address", "127.0.0.1"), ("email", "a@example.com")),
    }
    assert cert_login(cert) == "alice"
    assert cert_login(cert, "subject_alternative_name") == "a@example.com"
    assert cert_login(cert, "distinguished_name") == "CN=alice,O=x"
    assert cert_login({"subject": ()}) == ""
    assert cert_login(None) is None and cert_login({}) is None


def test_distinguished_name_escaping_and_attribute_names() -> None:
    """RFC 4514 escaping as RabbitMQ's rabbit_ssl does it, multi-valued RDNs with
    "+", RabbitMQ's names for e-mail and domain components."""
    subject = (
        (("domainComponent", "com"),),
        (("domainComponent", "example"),),
        (("organizationName", "Smith, Jones & Co"), ("organizationalUnitName", "R+D")),
        (("emailAddress", "a@b.c"),),
        (("commonName", " #lead;trail "),),
        (("localityName", "Zürich~"),),
        (("1.2.3.4", "x<y>z\\\"q\n"),),
    )
    assert distinguished_name(subject) == (
        "1.2.3.4=x\\<y\\>z\\\\\\\"q\\0A,"
        "L=Z\\C3\\BCrich\\7E,"
        "CN=\\ #lead\\;trail\\ ,"
        "EMAILADDRESS=a@b.c,"
        "O=Smith\\, Jones & Co+OU=R\\+D,"
        "DC=example,DC=com"
    )


def test_client_certificate_settings_checked(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="tls_ca_cert"):
        Config(tls_verify_peer=True).validate()
    with pytest.raises(ConfigError, match="tls_verify_peer"):
        Config(tls_ca_cert="ca.pem", tls_fail_if_no_peer_cert=True).validate()
    with pytest.raises(ConfigError, match="tls_cert_login_from"):
        Config(tls_cert_login_from="cn").validate()
    ini = tmp_path / "warren.ini"
    ini.write_text(
        "[main]\ntls_ca_cert = /etc/ca.pem\ntls_verify_peer = true\n"
        "tls_fail_if_no_peer_cert = true\ntls_cert_login_from = subject_alternative_name\n"
    )
    config = Config.from_ini(ini)
    assert config.tls_ca_cert == "/etc/ca.pem" and config.tls_fail_if_no_peer_cert
    assert config.tls_verify_peer and config.tls_cert_login_from == "subject_alternative_name"


def test_sni_selects_the_certificate_by_host_name(tmp_path: Path, ca: trustme.CA) -> None:
    sni = tmp_path / "sni"
    sni.mkdir()
    _write(sni, "broker.example", ca.issue_cert("broker.example"))
    _write(sni, "_wildcard.example.net", ca.issue_cert("*.example.net"))
    (sni / "lonely.example.pem").write_text("no key beside it: ignored")
    b = _broker(tmp_path, ca, tls_verify_peer=False, tls_sni_certs=str(sni))
    try:

        def connect(host: str) -> None:
            ctx = client_context(ca)
            p = params(b, ctx)
            p.ssl_options = pika.SSLOptions(ctx, host)
            pika.BlockingConnection(p).close()

        connect("broker.example")  # its own certificate
        connect("a.example.net")  # the wildcard one
        connect("localhost")  # tls_cert (issued for 127.0.0.1 and localhost)
        with pytest.raises((pika.exceptions.AMQPConnectionError, ssl.SSLError)):
            connect("other.example")  # tls_cert does not name it
    finally:
        b.stop()


def test_sni_directory_must_exist(tmp_path: Path, ca: trustme.CA) -> None:
    with pytest.raises(OSError, match="tls_sni_certs"):
        _broker(tmp_path, ca, tls_verify_peer=False, tls_sni_certs=str(tmp_path / "nosuch"))


def test_sni_certificates_verify_clients_too(tmp_path: Path, ca: trustme.CA) -> None:
    sni = tmp_path / "sni"
    sni.mkdir()
    _write(sni, "broker.example", ca.issue_cert("broker.example"))
    b = _broker(tmp_path, ca, tls_sni_certs=str(sni))
    try:
        port = b.amqp_listener.tls_port
        ctx = client_context(ca, ca.issue_cert("guest", common_name="guest"))
        assert start_mechanisms(port, ctx, "broker.example") == b"EXTERNAL AMQPLAIN PLAIN"
        assert start_mechanisms(port, client_context(ca), "broker.example") == b"AMQPLAIN PLAIN"
    finally:
        b.stop()


def test_reload_reads_the_sni_directory_again(tmp_path: Path, ca: trustme.CA) -> None:
    sni = tmp_path / "sni"
    sni.mkdir()
    chain, key = _write(tmp_path, "server", ca.issue_cert("127.0.0.1"))
    contexts = TLSContexts(Config(tls_cert=chain, tls_key=key, tls_sni_certs=str(sni)))
    ctx = contexts.context("the AMQP TLS port")
    before = ctx.sni_callback
    _write(sni, "new.example", ca.issue_cert("new.example"))
    assert contexts.reload() and ctx.sni_callback is not before
    (sni / "new.example.key").write_text("not a key")
    with pytest.raises(OSError, match="new.example.pem/new.example.key in tls_sni_certs"):
        contexts.reload()
