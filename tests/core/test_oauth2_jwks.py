"""The JWKS side of OAuth 2 (warren/oauth2_backend.py): fetched at the start
from a local aiohttp server, fetched again for an unknown kid, at most once per
interval on the broker's clock; over HTTPS, verified as [oauth2] https.* say."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path
from typing import Any

import pytest
import trustme
from oauth2help import FULL, SigningKey, jwks, serve_jwks

from warren.config import Config
from warren.config_oauth2 import OAuth2Extra
from warren.core.clock import ManualClock
from warren.core.oauth2 import TokenRefused
from warren.oauth2_backend import OAuth2Backend


def test_jwks_fetched_then_refetched_for_an_unknown_kid() -> None:
    old, new = SigningKey("old"), SigningKey("new", "ec")
    document = jwks(old)

    async def scenario() -> None:
        runner, url, hits = await serve_jwks(document)
        clock = ManualClock()
        clock.attach(asyncio.get_running_loop())
        config = Config(
            oauth2_resource_server_id="rabbitmq",
            oauth2_jwks_url=url,
            oauth2_jwks_min_refetch_interval=30,
        )
        backend = OAuth2Backend(config, clock)
        try:
            await backend.start()
            now = clock.now_ms() // 1000
            assert hits[0] == 1
            assert backend.verifier.verify(old.token(now, FULL)).username == "alice"
            # The identity provider rotates its key: the first login with the new
            # kid is refused and starts a fetch; the next one finds the key.
            # (The start's fetch counts against the interval too.)
            document["keys"] = [new.jwk()]
            clock.advance(30_000)
            now = clock.now_ms() // 1000
            token = new.token(now, FULL, sub="bob")
            with pytest.raises(TokenRefused, match="unknown signing key id 'new'"):
                backend.verifier.verify(token)
            await backend.wait_fetched()
            assert hits[0] == 2
            assert backend.verifier.verify(token).username == "bob"
            # Unknown kids within the interval fetch nothing more...
            for _ in range(5):
                with pytest.raises(TokenRefused):
                    backend.verifier.verify(old.token(now, FULL, kid="gone"))
                await backend.wait_fetched()
            assert hits[0] == 2
            # ...and once it has passed, one more fetch.
            clock.advance(30_000)
            with pytest.raises(TokenRefused):
                backend.verifier.verify(old.token(now, FULL, kid="gone"))
            await backend.wait_fetched()
            assert hits[0] == 3
        finally:
            await backend.stop()
            await runner.cleanup()

    asyncio.run(scenario())


def test_an_unreachable_jwks_is_logged_not_fatal() -> None:
    async def scenario() -> None:
        config = Config(
            oauth2_resource_server_id="rabbitmq", oauth2_jwks_url="http://127.0.0.1:9/jwks"
        )
        backend = OAuth2Backend(config, ManualClock())
        await backend.start()
        assert backend.fetches == 0 and backend.keys.fetched == {}

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("https", "fetched"),
    [
        ({"https_cacertfile": "ca"}, True),  # the identity provider's CA
        ({}, False),  # the system's CAs do not know trustme's
        ({"https_cacertfile": "other-ca"}, False),
        ({"https_peer_verification": False}, True),  # verify_none
        # The certificate names 127.0.0.1, not localhost: wildcard checks the name.
        ({"https_cacertfile": "ca", "host": "localhost-only"}, False),
        ({"https_cacertfile": "ca", "host": "localhost-only", "names": False}, True),
    ],
)
def test_jwks_over_https_verified_with_the_configured_ca(
    tmp_path: Path, https: dict[str, Any], fetched: bool
) -> None:
    """[oauth2] https.cacertfile / peer_verification / hostname_verification,
    against a JWKS served with a trustme certificate."""
    ca, other = trustme.CA(), trustme.CA()
    files = {"ca": tmp_path / "ca.pem", "other-ca": tmp_path / "other.pem"}
    ca.cert_pem.write_to_path(str(files["ca"]))
    other.cert_pem.write_to_path(str(files["other-ca"]))
    host = https.pop("host", "127.0.0.1")
    names = https.pop("names", True)
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost" if host == "localhost-only" else "127.0.0.1").configure_cert(server)
    if "https_cacertfile" in https:
        https["https_cacertfile"] = str(files[https["https_cacertfile"]])
    key = SigningKey("k")

    async def scenario() -> None:
        runner, url, hits = await serve_jwks(jwks(key), tls=server)
        config = Config(
            oauth2_resource_server_id="rabbitmq",
            oauth2_jwks_url=url,
            oauth2_extra=OAuth2Extra(https_hostname_verification=names, **https),
        )
        backend = OAuth2Backend(config, ManualClock())
        try:
            await backend.start()
            assert (backend.fetches, hits[0]) == ((1, 1) if fetched else (0, 0))
            assert ("k" in backend.keys.fetched) is fetched
        finally:
            await backend.stop()
            await runner.cleanup()

    asyncio.run(scenario())


def test_each_identity_provider_has_its_jwks(tmp_path: Path) -> None:
    """oauth_providers.<name>.*: the root resource server uses
    default_oauth_provider's JWKS, billing its own provider's (named in any
    case), each with its issuer; an unknown kid refetches its provider's only."""
    key_a, key_b = SigningKey("a-1"), SigningKey("b-1", "ec")

    async def scenario() -> None:
        runner_a, url_a, hits_a = await serve_jwks(jwks(key_a))
        runner_b, url_b, hits_b = await serve_jwks(jwks(key_b))
        ini = tmp_path / "w.ini"
        ini.write_text(
            "[oauth2]\nresource_server_id = rabbitmq\njwks_min_refetch_interval = 0\n"
            f"default_oauth_provider = idp_a\noauth_providers.idp_a.jwks_uri = {url_a}\n"
            f"oauth_providers.idp_b.jwks_url = {url_b}\n"
            "oauth_providers.idp_b.issuer = https://b.example\n"
            "resource_servers.billing.oauth_provider_id = IDP_B\n"
        )
        clock = ManualClock()
        clock.attach(asyncio.get_running_loop())
        backend = OAuth2Backend(Config.from_ini(ini), clock)
        verify = backend.verifier.verify
        try:
            await backend.start()
            assert (hits_a[0], hits_b[0], backend.fetches) == (1, 1, 2)
            now = clock.now_ms() // 1000
            assert verify(key_a.token(now, FULL)).username == "alice"
            billing = key_b.token(now, "billing.read:*/*", aud="billing", iss="https://b.example")
            assert verify(billing).scopes == ["read:*/*"]
            with pytest.raises(TokenRefused, match="issuer"):
                verify(key_b.token(now, FULL, aud="billing"))
            # B's key is not the root's: A's JWKS is fetched again, B's is not.
            with pytest.raises(TokenRefused, match="unknown signing key id 'b-1'"):
                verify(key_b.token(now, FULL))
            await backend.wait_fetched()
            assert (hits_a[0], hits_b[0]) == (2, 1)
        finally:
            await backend.stop()
            await runner_a.cleanup()
            await runner_b.cleanup()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("lines", "why"),
    [
        ("resource_servers.x.oauth_provider_id = nobody\n", "no oauth_providers.nobody"),
        ("default_oauth_provider = nobody\n", "no oauth_providers.nobody"),
        ("oauth_providers.p.token_endpoint = x\n", "unknown identity provider setting"),
        ("oauth_providers.p.https.peer_verification = no\n", "verify_peer or verify_none"),
    ],
)
def test_identity_provider_settings_refused(tmp_path: Path, lines: str, why: str) -> None:
    from warren.config import ConfigError

    ini = tmp_path / "w.ini"
    ini.write_text(f"[oauth2]\nresource_server_id = rabbitmq\n{lines}")
    with pytest.raises(ConfigError, match=why):
        Config.from_ini(ini)
