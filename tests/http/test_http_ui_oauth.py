"""The web UI's OpenID Connect login at the API level (http/ui_oauth.py): what
/api/auth tells the UI, the discovery document and the code exchange Warren
relays to the provider (tests/oidcprovider.py), and what it refuses to relay.
tests/ui/test_ui_oauth.py goes through the same in Chromium."""

from __future__ import annotations

import base64
import hashlib
import secrets
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode

import pytest
from conftest import BrokerThread, start_broker
from httphelp import Api, Reply
from oauth2help import FULL
from oidcprovider import Grant, OidcProvider

from warren.core.clock import ManualClock
from warren.http.ui_oauth import DISCOVERY_TTL_MS

pytestmark = pytest.mark.timeout(60)

CLIENT, SECRET = "warren-ui", "s3cret"
FORM = {"Content-Type": "application/x-www-form-urlencoded"}


@pytest.fixture(scope="module")
def oidc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[OidcProvider, BrokerThread]]:
    holder: list[BrokerThread] = []
    provider = OidcProvider(
        CLIENT,
        ["http://127.0.0.1/"],
        now_s=lambda: holder[0].clock.now_ms() // 1000,
        secret=SECRET,
        scopes={"alice": ["tag:monitoring", *FULL]},
    ).start()
    try:
        broker = start_broker(
            tmp_path_factory.mktemp("http-ui-oauth") / "data",
            clock=ManualClock(),
            oauth2_resource_server_id="rabbitmq",
            oauth2_jwks_url=f"{provider.url}/jwks",
            mgmt_oauth_enabled=True,
            mgmt_oauth_client_id=CLIENT,
            mgmt_oauth_client_secret=SECRET,
            mgmt_oauth_provider_url=provider.url,
        )
        holder.append(broker)
        try:
            yield provider, broker
        finally:
            broker.stop()
    finally:
        provider.stop()


def grant(provider: OidcProvider) -> tuple[str, str]:
    """A code the provider gave (as its authorize page would) and its PKCE verifier."""
    verifier = secrets.token_urlsafe(32)
    digest = hashlib.sha256(verifier.encode()).digest()
    challenge = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
    code = secrets.token_urlsafe(8)
    provider.grants[code] = Grant("alice", challenge, "http://127.0.0.1/", "openid")
    return code, verifier


def exchange(broker: BrokerThread, **form: str) -> Reply:
    api = Api(broker.http_port).anonymous()
    return api.request("POST", "/api/auth/token", raw=urlencode(form).encode(), headers=FORM)


def test_auth_settings_name_the_provider_not_the_secret(
    oidc: tuple[OidcProvider, BrokerThread],
) -> None:
    provider, broker = oidc
    settings = Api(broker.http_port).anonymous().get("/api/auth")
    assert settings["oauth_enabled"] is True and settings["enable_uaa"] is False
    assert settings["oauth_client_id"] == CLIENT
    assert settings["oauth_provider_url"] == provider.url
    assert settings["oauth_scopes"] == "openid profile"
    assert settings["oauth_disable_basic_auth"] is True
    assert settings["oauth_resource_servers"]["rabbitmq"]["oauth_client_id"] == CLIENT
    assert SECRET not in str(settings)


def test_discovery_document_is_relayed(oidc: tuple[OidcProvider, BrokerThread]) -> None:
    provider, broker = oidc
    document = Api(broker.http_port).anonymous().get("/api/auth/openid-configuration")
    assert document == {
        "issuer": provider.url,
        "authorization_endpoint": f"{provider.url}/authorize",
        "end_session_endpoint": f"{provider.url}/logout",
        "code_challenge_methods_supported": ["S256"],
    }


def test_code_exchange_gives_a_token_the_api_takes(
    oidc: tuple[OidcProvider, BrokerThread],
) -> None:
    provider, broker = oidc
    code, verifier = grant(provider)
    reply = exchange(
        broker,
        grant_type="authorization_code",
        code=code,
        redirect_uri="http://127.0.0.1/",
        code_verifier=verifier,
        client_id="not-this-one",
    )
    assert reply.status == 200, reply
    assert reply.headers["Cache-Control"] == "no-store"
    # Warren's client id and secret went, whatever the browser sent.
    sent = provider.token_requests[-1]
    assert (sent["client_id"], sent["client_secret"]) == (CLIENT, SECRET)
    token = reply.json()["access_token"]
    bearer = {"Authorization": f"Bearer {token}"}
    me = Api(broker.http_port).anonymous().request("GET", "/api/whoami", headers=bearer)
    assert me.status == 200, me
    assert me.json()["name"] == "alice" and me.json()["tags"] == ["monitoring"]


def test_a_wrong_verifier_is_the_provider_s_refusal(
    oidc: tuple[OidcProvider, BrokerThread],
) -> None:
    provider, broker = oidc
    code, _ = grant(provider)
    reply = exchange(
        broker,
        grant_type="authorization_code",
        code=code,
        redirect_uri="http://127.0.0.1/",
        code_verifier="x" * 43,
    )
    assert reply.status == 400
    assert reply.json() == {
        "error": "invalid_grant",
        "error_description": "PKCE verification failed",
    }


@pytest.mark.parametrize(
    ("form", "status", "error"),
    [
        ({"grant_type": "refresh_token", "refresh_token": "r"}, 400, "unsupported_grant_type"),
        (
            {"grant_type": "password", "username": "a", "password": "b"},
            400,
            "unsupported_grant_type",
        ),
        (
            {"grant_type": "authorization_code", "code": "c", "redirect_uri": "u"},
            400,
            "invalid_request",
        ),
        ({"grant_type": "authorization_code", "code": "c" * 20_000}, 413, "bad_request"),
    ],
)
def test_only_code_exchanges_are_relayed(
    oidc: tuple[OidcProvider, BrokerThread], form: dict[str, str], status: int, error: str
) -> None:
    provider, broker = oidc
    before = len(provider.token_requests)
    reply = exchange(broker, **form)
    assert (reply.status, reply.json()["error"]) == (status, error)
    assert len(provider.token_requests) == before


def test_without_oauth_enabled_nothing_is_relayed(broker: BrokerThread) -> None:
    api = Api(broker.http_port).anonymous()
    assert api.get("/api/auth")["oauth_enabled"] is False
    assert api.request("GET", "/api/auth/openid-configuration").status == 404
    assert exchange(broker, grant_type="authorization_code").status == 404


def test_an_unreachable_provider_is_a_502(tmp_path: Path) -> None:
    broker = start_broker(
        tmp_path / "data",
        oauth2_resource_server_id="rabbitmq",
        oauth2_signing_keys=(),
        oauth2_jwks_url="http://127.0.0.1:1/jwks",
        mgmt_oauth_enabled=True,
        mgmt_oauth_client_id=CLIENT,
        mgmt_oauth_provider_url="http://127.0.0.1:1",
    )
    try:
        reply = Api(broker.http_port).anonymous().request("GET", "/api/auth/openid-configuration")
        assert reply.status == 502
        assert reply.json()["reason"].startswith("the OAuth 2 provider did not answer")
    finally:
        broker.stop()


def test_discovery_is_read_again_after_five_minutes(
    oidc: tuple[OidcProvider, BrokerThread],
) -> None:
    """Kept DISCOVERY_TTL_MS on the broker's clock: a provider's change shows then."""
    provider, broker = oidc
    api = Api(broker.http_port).anonymous()
    broker.advance(DISCOVERY_TTL_MS)
    assert "end_session_endpoint" in api.get("/api/auth/openid-configuration")
    provider.logout_endpoint = False
    try:
        broker.advance(DISCOVERY_TTL_MS - 1)
        assert "end_session_endpoint" in api.get("/api/auth/openid-configuration")
        broker.advance(1)
        assert "end_session_endpoint" not in api.get("/api/auth/openid-configuration")
    finally:
        provider.logout_endpoint = True
        broker.advance(DISCOVERY_TTL_MS)
