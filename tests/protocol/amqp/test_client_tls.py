"""The blocking AMQP client that `warren perf` and the Spark data source use:
amqps:// with RabbitMQ's URI parameters, certificate checks and EXTERNAL,
against Warren's own TLS listener."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import BrokerThread, start_broker
from tlshelp import tls_broker as make_tls_broker
from tlshelp import write_pki

from warren.amqp import spec
from warren.client import URI, AMQPError, Client


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return write_pki(tmp_path_factory.mktemp("pki"), users=("alice",))


@pytest.fixture(scope="module")
def tls_broker(
    tmp_path_factory: pytest.TempPathFactory, pki: dict[str, str]
) -> Iterator[BrokerThread]:
    b = make_tls_broker(tmp_path_factory.mktemp("tls") / "data", pki, users=("alice",))
    try:
        yield b
    finally:
        b.stop()


def _connected_user(b: BrokerThread, name: str) -> tuple[str, str]:
    """(user, auth mechanism) of the broker's connection named ``name``."""

    def find() -> tuple[str, str]:
        for conn in b.broker.connections:
            info = conn.info()
            if info.get("client_properties", {}).get("connection_name") == name:
                return str(info["user"]), str(info["auth_mechanism"])
        raise AssertionError(f"no connection named {name!r}")

    return b.call(find)


def test_uri_parameters_parse() -> None:
    uri = URI.parse(
        "amqps://u:p@example.com/v?cacertfile=/c.pem&certfile=/me.pem&keyfile=/me.key"
        "&verify=verify_peer&server_name_indication=broker.example&auth_mechanism=external"
        "&heartbeat=7&connection_timeout=2500"
    )
    assert (uri.host, uri.port, uri.vhost, uri.mechanism) == ("example.com", 5671, "v", "EXTERNAL")
    assert uri.tls is not None
    assert (uri.tls.ca_file, uri.tls.cert_file, uri.tls.key_file) == (
        "/c.pem",
        "/me.pem",
        "/me.key",
    )
    assert uri.tls.verify and uri.tls.server_name == "broker.example"
    assert (uri.heartbeat, uri.connect_timeout_s) == (7, 2.5)
    assert URI.parse("amqps://h?server_name_indication=disable").tls.server_name == ""  # type: ignore[union-attr]
    assert URI.parse("amqp://h").tls is None


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("http://h/", "unsupported URI scheme 'http'"),
        ("amqp://h/?cacertfile=/c.pem", "need an amqps:// URI"),
        ("amqps://h/?verify=maybe", "verify: expected verify_peer or verify_none"),
        ("amqps://h/?frobnicate=1", "unknown URI parameter 'frobnicate'"),
        ("amqps://h/?auth_mechanism=external", "needs amqps:// with a client certificate"),
        ("amqps://h/?auth_mechanism=scram", "expected plain or external"),
        ("amqps://h/?heartbeat=x", "heartbeat: expected a non-negative integer"),
        ("amqps://h/?keyfile=/k", "keyfile needs certfile"),
    ],
)
def test_bad_uris_are_refused(uri: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        URI.parse(uri)


def test_amqps_with_the_ca_verifies_the_server(
    tls_broker: BrokerThread, pki: dict[str, str]
) -> None:
    port = tls_broker.amqp_listener.tls_port
    with Client(f"amqps://guest:guest@127.0.0.1:{port}/?cacertfile={pki['ca']}", name="t1") as c:
        c.channel_open(1)
        assert c.queue_declare(1, "", exclusive=True)
        assert _connected_user(tls_broker, "t1") == ("guest", "PLAIN")
        assert isinstance(c.sock, ssl.SSLSocket)


def test_a_server_the_ca_did_not_sign_is_refused(
    tls_broker: BrokerThread, pki: dict[str, str]
) -> None:
    port = tls_broker.amqp_listener.tls_port
    with pytest.raises(ssl.SSLCertVerificationError, match="certificate verify failed"):
        Client(f"amqps://127.0.0.1:{port}/?cacertfile={pki['other-ca']}").connect()
    # verify_none is the explicit way out (the chain is then not checked at all).
    with Client(f"amqps://127.0.0.1:{port}/?verify=verify_none", name="t2"):
        assert _connected_user(tls_broker, "t2") == ("guest", "PLAIN")


def test_the_server_name_is_checked(tls_broker: BrokerThread, pki: dict[str, str]) -> None:
    port = tls_broker.amqp_listener.tls_port
    base = f"amqps://127.0.0.1:{port}/?cacertfile={pki['ca']}"
    with pytest.raises(ssl.SSLCertVerificationError, match="mismatch|match"):
        Client(base + "&server_name_indication=broker.elsewhere").connect()
    with Client(base + "&server_name_indication=localhost", name="t3"):
        assert _connected_user(tls_broker, "t3")[0] == "guest"


def test_external_logs_in_by_the_client_certificate(
    tls_broker: BrokerThread, pki: dict[str, str]
) -> None:
    port = tls_broker.amqp_listener.tls_port
    url = (
        f"amqps://127.0.0.1:{port}/?cacertfile={pki['ca']}&certfile={pki['alice']}"
        f"&keyfile={pki['alice.key']}&auth_mechanism=external"
    )
    with Client(url, name="t4") as c:
        c.channel_open(1)
        assert _connected_user(tls_broker, "t4") == ("alice", "EXTERNAL")


def test_external_on_a_server_that_does_not_offer_it_is_refused(pki: dict[str, str]) -> None:
    # A plain TCP broker offers no EXTERNAL at all: the client says so.
    b = start_broker(Path(pki["ca"]).parent / "plain-data", sync=False)
    try:
        uri = URI(host="127.0.0.1", port=b.port, mechanism="EXTERNAL")
        with pytest.raises(AMQPError, match="no EXTERNAL mechanism") as info:
            Client(uri).connect()
        assert info.value.reply_code == spec.ACCESS_REFUSED
    finally:
        b.stop()
