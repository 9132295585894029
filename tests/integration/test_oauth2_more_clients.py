"""Issue 33's OAuth 2 features with real clients over sockets, the broker set up
from an INI file's [oauth2] section: scope aliases of an extra scopes claim
(Keycloak's roles), rich authorization requests, an HMAC key, a second resource
server with its own key and prefix (pika); MQTT 5's OAUTH2-JWT method (paho 2);
a JWKS served over HTTPS with a trustme certificate."""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jwt
import pika
import pytest
import trustme
from conftest import BrokerThread, start_broker
from mqttclient import V5, Client
from oauth2help import FULL, TOPICS, SigningKey, jwks, serve_jwks
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from warren.config import Config
from warren.core.clock import ManualClock

pytestmark = [pytest.mark.timeout(120)]

RSA = SigningKey("rsa-1")
EC = SigningKey("billing-ec", "ec")
SECRET = b"the identity provider's shared secret, at least 32 bytes"


def config_settings(ini: Path) -> dict[str, Any]:
    """The [oauth2] fields an INI file sets, as start_broker settings."""
    config = Config.from_ini(ini)
    return {
        name: getattr(config, name)
        for name in vars(config)
        if name.startswith("oauth2_") and getattr(config, name) != getattr(Config(), name)
    }


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerThread]:
    tmp = tmp_path_factory.mktemp("oauth2")
    k = base64.urlsafe_b64encode(SECRET).rstrip(b"=").decode()
    (tmp / "hmac.json").write_text(json.dumps({"kty": "oct", "k": k, "alg": "HS256"}))
    ini = tmp / "warren.ini"
    ini.write_text(
        "[oauth2]\n"
        "resource_server_id = rabbitmq\n"
        f"signing_keys = {RSA.write_pem(tmp)}, shared:{tmp / 'hmac.json'}\n"
        "extra_scopes_source = realm_access.roles\n"
        "scope_aliases.1.alias = Producer\n"
        "scope_aliases.1.scope = rabbitmq.configure:*/* rabbitmq.write:*/* rabbitmq.read:*/*\n"
        "resource_server_type = rabbitmq-type\n"
        "resource_servers.billing.scope_prefix = bill:\n"
        f"resource_servers.billing.signing_keys = {EC.write_pem(tmp)}\n"
    )
    b = start_broker(tmp / "data", clock=ManualClock(), **config_settings(ini))
    try:
        yield b
    finally:
        b.stop()


def now(b: BrokerThread) -> int:
    return b.clock.now_ms() // 1000


def login(b: BrokerThread, token: str) -> pika.BlockingConnection:
    credentials = pika.PlainCredentials("ignored", token)
    return pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", b.port, credentials=credentials)
    )


def declare(conn: pika.BlockingConnection, queue: str) -> bool:
    """Whether the user may declare ``queue`` (403 closes the channel)."""
    try:
        conn.channel().queue_declare(queue)
    except pika.exceptions.ChannelClosedByBroker as exc:
        assert exc.reply_code == 403
        return False
    return True


def test_pika_alias_from_keycloak_roles(broker: BrokerThread) -> None:
    conn = login(broker, RSA.token(now(broker), "", realm_access={"roles": ["Producer"]}))
    assert declare(conn, "aliased")
    conn.close()
    conn = login(broker, RSA.token(now(broker), ["read:*/*"], realm_access={"roles": ["x"]}))
    assert not declare(conn, "not-aliased")
    conn.close()


def test_pika_rich_authorization_request(broker: BrokerThread) -> None:
    details = [
        {
            "type": "rabbitmq-type",
            "locations": ["cluster:rabbitmq/vhost:%2F/queue:rar-*"],
            "actions": ["configure", "read", "write"],
        }
    ]
    conn = login(broker, RSA.token(now(broker), "", authorization_details=details))
    assert declare(conn, "rar-1") and not declare(conn, "other")
    conn.close()


def test_pika_hmac_signed_token(broker: BrokerThread) -> None:
    claims = {
        "sub": "svc",
        "aud": "rabbitmq",
        "exp": now(broker) + 600,
        "scope": "rabbitmq.configure:*/* rabbitmq.write:*/* rabbitmq.read:*/*",
    }
    conn = login(broker, jwt.encode(claims, SECRET, algorithm="HS256", headers={"kid": "shared"}))
    assert declare(conn, "hmac")
    conn.close()
    forged = jwt.encode(
        claims, b"another secret, at least 32 bytes long", "HS256", {"kid": "shared"}
    )
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        login(broker, forged)


def test_pika_second_resource_server(broker: BrokerThread) -> None:
    scopes = "bill:configure:*/* bill:write:*/* bill:read:*/* rabbitmq.configure:*/*"
    conn = login(broker, EC.token(now(broker), scopes, aud="billing"))
    assert declare(conn, "billing-q")
    conn.close()
    # The root's scopes do not count for billing, nor does the root's key.
    conn = login(
        broker, EC.token(now(broker), "rabbitmq.configure:*/* bill:read:*/*", aud="billing")
    )
    assert not declare(conn, "root-scope")
    conn.close()
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        login(broker, RSA.token(now(broker), scopes, aud="billing"))


def test_paho_mqtt5_oauth2_jwt_method(broker: BrokerThread) -> None:
    props = Properties(PacketTypes.CONNECT)
    props.AuthenticationMethod = "OAUTH2-JWT"
    props.AuthenticationData = RSA.token(now(broker), [*FULL, *TOPICS]).encode()
    client = Client(broker.mqtt_port, "jwt", V5)
    _flags, rc, connack = client.connect(properties=props)
    assert not rc.is_failure and connack.AuthenticationMethod == "OAUTH2-JWT"
    client.subscribe("t/1")
    client.publish("t/1", b"x")
    assert client.next().payload == b"x"
    client.close()
    props.AuthenticationData = RSA.token(now(broker) - 7200, FULL).encode()
    refused = Client(broker.mqtt_port, "late", V5)
    assert refused.connect(properties=props)[1].value == 0x86  # Bad user name or password
    refused.close()


def test_jwks_over_https_with_the_configured_ca(tmp_path: Path) -> None:
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server)
    key = SigningKey("jwks-tls")
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    serve = serve_jwks(jwks(key), tls=server)
    runner, url, hits = asyncio.run_coroutine_threadsafe(serve, loop).result(10)
    ini = tmp_path / "warren.ini"
    ini.write_text(
        f"[oauth2]\nresource_server_id = rabbitmq\njwks_url = {url}\n"
        f"https.cacertfile = {tmp_path / 'ca.pem'}\nhttps.peer_verification = verify_peer\n"
    )
    b = start_broker(tmp_path / "data", clock=ManualClock(), **config_settings(ini))
    try:
        assert url.startswith("https://") and hits[0] == 1
        login(b, key.token(now(b), FULL)).close()
    finally:
        b.stop()
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
