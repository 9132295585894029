"""The JWKS side of OAuth 2 (warren/oauth2_backend.py): fetched at the start
from a local aiohttp server, fetched again for an unknown kid, at most once per
interval on the broker's clock."""

from __future__ import annotations

import asyncio

import pytest
from oauth2help import FULL, SigningKey, jwks, serve_jwks

from warren.config import Config
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
