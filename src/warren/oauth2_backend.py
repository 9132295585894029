"""The broker's OAuth 2 backend: core/oauth2.py's TokenVerifier with its keys
loaded, PEM files at construction and the JWKS URL fetched with aiohttp.

The JWKS is fetched at the start and again when a token names a kid no key has
(a rotated key), at most once per ``[oauth2] jwks_min_refetch_interval``
seconds on the broker's clock. Logins are synchronous and never wait for the
network: the login with the unknown kid is refused, and the logins after the
fetch find the key (docs/security.md).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from warren.config import Config, ConfigError
from warren.core.clock import Clock
from warren.core.oauth2 import KeySet, OAuth2Settings, TokenVerifier, load_pem_key

log = logging.getLogger(__name__)


class OAuth2Backend:
    """Owns the verifier and the JWKS fetches."""

    def __init__(self, config: Config, clock: Clock) -> None:
        self.config = config
        self.clock = clock
        self.keys = KeySet(unknown=self._unknown_kid)
        for entry in config.oauth2_signing_keys:
            kid, _, path = entry.partition(":")
            try:
                self.keys.static[kid.strip()] = load_pem_key(Path(path.strip()).read_bytes())
            except (OSError, ValueError) as exc:
                raise ConfigError(f"[oauth2] signing_keys: {kid}: {path}: {exc}") from None
        settings = OAuth2Settings(
            resource_server_id=config.oauth2_resource_server_id,
            scope_prefix=config.oauth2_scope_prefix,
            verify_aud=config.oauth2_verify_aud,
            issuer=config.oauth2_issuer,
            preferred_username_claims=config.oauth2_preferred_username_claims,
            additional_scopes_key=config.oauth2_additional_scopes_key,
            default_key=config.oauth2_default_key,
        )
        self.verifier = TokenVerifier(settings, self.keys, clock.now_ms)
        self._last_fetch_ms: int | None = None
        self._fetching: asyncio.Task[None] | None = None
        #: JWKS documents fetched so far (tests and the log read it).
        self.fetches = 0

    async def start(self) -> None:
        """Fetch the JWKS once before clients come; a failure is logged, not fatal
        (the identity provider may come up later: the next unknown kid refetches)."""
        if self.config.oauth2_jwks_url:
            self._last_fetch_ms = self.clock.now_ms()
            await self.fetch()

    async def stop(self) -> None:
        task, self._fetching = self._fetching, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def fetch(self) -> None:
        """Fetch the JWKS and replace the fetched keys (kept as they were on an error)."""
        import aiohttp

        url = self.config.oauth2_jwks_url
        assert url is not None
        try:
            timeout = aiohttp.ClientTimeout(total=10)
            async with (
                aiohttp.ClientSession(timeout=timeout) as http,
                http.get(url) as response,
            ):
                response.raise_for_status()
                body = await response.read()
            count = self.keys.load_jwks(body)
            self.fetches += 1
            log.info("OAuth 2: %d signing keys fetched from %s", count, url)
        except (TimeoutError, aiohttp.ClientError, ValueError, AttributeError) as exc:
            log.warning("OAuth 2: JWKS not fetched from %s: %s", url, exc)

    def _unknown_kid(self, kid: str) -> None:
        """A token named a key we lack: refetch, unless fetched too recently."""
        if not self.config.oauth2_jwks_url or self._fetching is not None:
            return
        now = self.clock.now_ms()
        interval = self.config.oauth2_jwks_min_refetch_interval * 1000
        if self._last_fetch_ms is not None and now - self._last_fetch_ms < interval:
            return
        self._last_fetch_ms = now
        log.info("OAuth 2: unknown signing key id %r, fetching the JWKS again", kid)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._fetching = loop.create_task(self._refetch())

    async def _refetch(self) -> None:
        try:
            await self.fetch()
        finally:
            self._fetching = None

    async def wait_fetched(self) -> None:
        """Until a refetch under way is done (tests)."""
        task = self._fetching
        if task is not None:
            await asyncio.shield(task)


def oauth2_backend(config: Config, clock: Clock) -> OAuth2Backend | None:
    """The backend when ``[oauth2]`` is configured and in ``auth_backends``."""
    if not config.oauth2_resource_server_id or "oauth2" not in config.auth_backends:
        return None
    if not config.oauth2_jwks_url and not config.oauth2_signing_keys:
        raise ConfigError("[oauth2] resource_server_id needs jwks_url or signing_keys")
    return OAuth2Backend(config, clock)
