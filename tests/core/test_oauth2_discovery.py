"""OpenID discovery (warren/oauth2_backend.py): an identity provider with an
``issuer`` and no JWKS URL reads the ``jwks_uri`` of its OpenID configuration
document before each JWKS fetch, at ``discovery_endpoint_path`` with
``discovery_endpoint_params`` when set, over the provider's TLS; against a
local provider (tests/oauth2help.py)."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import pytest
import trustme
from oauth2help import FULL, SigningKey, jwks, serve_idp

from warren.config import Config, ConfigError
from warren.config_oauth2 import OAuth2Extra
from warren.core.clock import ManualClock
from warren.core.oauth2 import TokenRefused
from warren.oauth2_backend import OAuth2Backend, discovery_url, oauth2_backend


@pytest.mark.parametrize(
    ("issuer", "path", "params", "url"),
    [
        ("https://idp", None, (), "https://idp/.well-known/openid-configuration"),
        ("https://idp/realms/x/", None, (), "https://idp/realms/x/.well-known/openid-configuration"),
        ("https://idp/r", "conf", (), "https://idp/r/conf"),
        ("https://idp/r", "/c", (("a", "1"), ("b", "x y")), "https://idp/r/c?a=1&b=x+y"),
        ("https://idp/r?t=1", None, (("a", "1"),), "https://idp/r/.well-known/openid-configuration?t=1&a=1"),
    ],
)  # fmt: skip
def test_the_discovery_url_is_built_as_rabbitmqs(
    issuer: str, path: str | None, params: tuple[tuple[str, str], ...], url: str
) -> None:
    assert discovery_url(issuer, path, params) == url


def test_the_jwks_url_is_discovered_from_the_issuer_and_followed() -> None:
    old, new = SigningKey("old"), SigningKey("new", "ec")

    async def scenario() -> None:
        idp = await serve_idp(jwks(old))
        clock = ManualClock()
        clock.attach(asyncio.get_running_loop())
        config = Config(
            oauth2_resource_server_id="rabbitmq",
            oauth2_issuer=idp.base,
            oauth2_jwks_min_refetch_interval=0,
        )
        backend = oauth2_backend(config, clock)  # an issuer alone is enough
        assert backend is not None
        try:
            await backend.start()
            assert idp.requests == ["/.well-known/openid-configuration"]
            assert idp.jwks_hits[0] == 1 and backend.fetches == 1
            now = clock.now_ms() // 1000
            assert backend.verifier.verify(old.token(now, FULL, iss=idp.base)).username == "alice"
            # The provider moves its keys: the refetch for the unknown kid
            # discovers again and follows the new jwks_uri.
            idp.jwks_path = "/keys/rotated"
            idp.document = jwks(new)
            token = new.token(now, FULL, iss=idp.base)
            with pytest.raises(TokenRefused, match="unknown signing key id 'new'"):
                backend.verifier.verify(token)
            await backend.wait_fetched()
            assert len(idp.requests) == 2 and idp.jwks_hits[0] == 2
            assert backend.providers[""].discovered == idp.base + "/keys/rotated"
            assert backend.verifier.verify(token).username == "alice"
        finally:
            await backend.stop()
            await idp.runner.cleanup()

    asyncio.run(scenario())


def test_a_providers_discovery_path_and_params(tmp_path: Path) -> None:
    key = SigningKey("k")

    async def scenario() -> None:
        idp = await serve_idp(jwks(key))
        ini = tmp_path / "w.ini"
        ini.write_text(
            "[oauth2]\nresource_server_id = rabbitmq\ndefault_oauth_provider = kc\n"
            f"oauth_providers.kc.issuer = {idp.base}/realms/prod\n"
            "oauth_providers.kc.discovery_endpoint_path = openid-configuration\n"
            "oauth_providers.kc.discovery_endpoint_params.appid = warren\n"
        )
        backend = OAuth2Backend(Config.from_ini(ini), ManualClock())
        try:
            await backend.start()
            assert idp.requests == ["/realms/prod/openid-configuration?appid=warren"]
            assert "k" in backend.keys.fetched
        finally:
            await backend.stop()
            await idp.runner.cleanup()

    asyncio.run(scenario())


def test_root_discovery_settings(tmp_path: Path) -> None:
    ini = tmp_path / "w.ini"
    ini.write_text(
        "[oauth2]\nresource_server_id = rabbitmq\nissuer = https://idp\n"
        "discovery_endpoint_path = /oidc\ndiscovery_endpoint_params.a = 1\n"
    )
    backend = OAuth2Backend(Config.from_ini(ini), ManualClock())
    assert backend.providers[""].discovery_url == "https://idp/oidc?a=1"
    ini.write_text("[oauth2]\nresource_server_id = rabbitmq\ndiscovery_endpoint_params. = 1\n")
    with pytest.raises(ConfigError, match="discovery_endpoint_params"):
        Config.from_ini(ini)


def test_key_files_and_an_issuer_discover_at_the_first_unknown_kid(tmp_path: Path) -> None:
    """With key files, as RabbitMQ: nothing fetched at the start; an unknown kid
    discovers the JWKS."""
    filed, published = SigningKey("filed"), SigningKey("published")

    async def scenario() -> None:
        idp = await serve_idp(jwks(published))
        clock = ManualClock()
        clock.attach(asyncio.get_running_loop())
        config = Config(
            oauth2_resource_server_id="rabbitmq",
            oauth2_issuer=idp.base,
            oauth2_signing_keys=(filed.write_pem(tmp_path),),
        )
        backend = OAuth2Backend(config, clock)
        try:
            await backend.start()
            assert idp.requests == [] and backend.fetches == 0
            now = clock.now_ms() // 1000
            assert backend.verifier.verify(filed.token(now, FULL, iss=idp.base))
            token = published.token(now, FULL, iss=idp.base)
            with pytest.raises(TokenRefused, match="unknown signing key id"):
                backend.verifier.verify(token)
            await backend.wait_fetched()
            assert len(idp.requests) == 1
            assert backend.verifier.verify(token).username == "alice"
        finally:
            await backend.stop()
            await idp.runner.cleanup()

    asyncio.run(scenario())


def test_discovery_uses_the_providers_tls(tmp_path: Path) -> None:
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server)
    key = SigningKey("k")

    async def scenario() -> None:
        idp = await serve_idp(jwks(key), tls=server)
        try:
            for cafile, fetched in ((None, False), (str(tmp_path / "ca.pem"), True)):
                config = Config(
                    oauth2_resource_server_id="rabbitmq",
                    oauth2_issuer=idp.base,
                    oauth2_extra=OAuth2Extra(https_cacertfile=cafile),
                )
                backend = OAuth2Backend(config, ManualClock())
                await backend.start()
                assert ("k" in backend.keys.fetched) is fetched
                await backend.stop()
            assert len(idp.requests) == 1  # the system's CAs refused the first
        finally:
            await idp.runner.cleanup()

    asyncio.run(scenario())


def test_a_document_without_jwks_uri_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        from aiohttp import web

        async def handle(_request: web.Request) -> web.Response:
            return web.json_response({"issuer": "x"})

        app = web.Application()
        app.router.add_get("/.well-known/openid-configuration", handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        config = Config(
            oauth2_resource_server_id="rabbitmq", oauth2_issuer=f"http://127.0.0.1:{port}"
        )
        backend = OAuth2Backend(config, ManualClock())
        try:
            await backend.start()
            assert backend.fetches == 0
        finally:
            await backend.stop()
            await runner.cleanup()

    asyncio.run(scenario())
    assert "names no jwks_uri" in caplog.text
