"""The broker's OAuth 2 backend: core/oauth2.py's TokenVerifier with its keys
loaded, PEM files at construction and the JWKS URL fetched with aiohttp.

The JWKS is fetched at the start and again when a token names a kid no key has
(a rotated key), at most once per ``[oauth2] jwks_min_refetch_interval``
seconds on the broker's clock. Logins are synchronous and never wait for the
network: the login with the unknown kid is refused, and the logins after the
fetch find the key (docs/security.md). The JWKS URL's certificate is verified
against ``[oauth2] https.cacertfile`` (else the system's CAs) unless
``https.peer_verification = verify_none``. Each ``resource_servers.<name>``
gets its settings from config_oauth2.py, inheriting the root's as RabbitMQ does.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar

from warren.config import Config, ConfigError
from warren.config_oauth2 import ResourceServer
from warren.core.clock import Clock
from warren.core.oauth2 import KeySet, OAuth2Settings, TokenVerifier, load_key

log = logging.getLogger(__name__)
T = TypeVar("T")


class OAuth2Backend:
    """Owns the verifier and the JWKS fetches."""

    def __init__(self, config: Config, clock: Clock) -> None:
        self.config = config
        self.clock = clock
        extra = config.oauth2_extra
        self.keys = KeySet(unknown=self._unknown_kid)
        self.keys.static.update(_load_keys((*config.oauth2_signing_keys, *extra.signing_keys)))
        root = OAuth2Settings(
            resource_server_id=config.oauth2_resource_server_id,
            scope_prefix=config.oauth2_scope_prefix,
            verify_aud=config.oauth2_verify_aud,
            issuer=config.oauth2_issuer,
            preferred_username_claims=config.oauth2_preferred_username_claims,
            additional_scopes_key=config.oauth2_additional_scopes_key or extra.extra_scopes_source,
            default_key=config.oauth2_default_key,
            scope_aliases=extra.scope_aliases,
            resource_server_type=extra.resource_server_type,
        )
        others = [_resource_server(root, server) for server in extra.resource_servers]
        self.verifier = TokenVerifier(root, self.keys, clock.now_ms, others)
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
                http.get(url, ssl=self._tls()) as response,
            ):
                response.raise_for_status()
                body = await response.read()
            count = self.keys.load_jwks(body)
            self.fetches += 1
            log.info("OAuth 2: %d signing keys fetched from %s", count, url)
        except (TimeoutError, aiohttp.ClientError, ValueError, AttributeError, OSError) as exc:
            log.warning("OAuth 2: JWKS not fetched from %s: %s", url, exc)

    def _tls(self) -> ssl.SSLContext | bool:
        """The JWKS request's TLS ([oauth2] https.*); an http URL ignores it."""
        extra = self.config.oauth2_extra
        if not extra.https_peer_verification:
            return False
        context = ssl.create_default_context(cafile=extra.https_cacertfile)
        context.check_hostname = extra.https_hostname_verification
        return context

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


def _load_keys(entries: Iterable[str]) -> dict[str, Any]:
    """``kid:path`` key files (PEM or JWK, core/oauth2.py's load_key) by kid."""
    keys: dict[str, Any] = {}
    for entry in entries:
        kid, _, path = entry.partition(":")
        try:
            keys[kid.strip()] = load_key(Path(path.strip()).read_bytes())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"[oauth2] signing_keys: {kid}: {path}: {exc}") from None
    return keys


def _resource_server(root: OAuth2Settings, server: ResourceServer) -> OAuth2Settings:
    """A ``resource_servers.<name>``: what it leaves unset is the root's, but for
    its scope prefix (``<id>.`` unless the root's is set) and its keys (the
    root's, JWKS included, unless it has signing_keys of its own)."""
    keys = KeySet(static=_load_keys(server.signing_keys)) if server.signing_keys else None
    return OAuth2Settings(
        resource_server_id=server.id,
        scope_prefix=_own(server.scope_prefix, root.scope_prefix),
        verify_aud=_own(server.verify_aud, root.verify_aud),
        issuer=_own(server.issuer, root.issuer),
        preferred_username_claims=_own(
            server.preferred_username_claims, root.preferred_username_claims
        ),
        additional_scopes_key=_own(server.additional_scopes_key, root.additional_scopes_key),
        default_key=_own(server.default_key, root.default_key),
        scope_aliases=_own(server.scope_aliases, root.scope_aliases),
        resource_server_type=_own(server.resource_server_type, root.resource_server_type),
        keys=keys,
    )


def _own(value: T | None, inherited: T) -> T:
    return inherited if value is None else value


def oauth2_backend(config: Config, clock: Clock) -> OAuth2Backend | None:
    """The backend when ``[oauth2]`` (a resource server id, or resource_servers)
    is configured and in ``auth_backends``."""
    extra = config.oauth2_extra
    if not (config.oauth2_resource_server_id or extra.resource_servers):
        return None
    if "oauth2" not in config.auth_backends:
        return None
    if not (config.oauth2_jwks_url or config.oauth2_signing_keys or extra.signing_keys) and not (
        extra.resource_servers and all(s.signing_keys for s in extra.resource_servers)
    ):
        raise ConfigError("[oauth2] resource_server_id needs jwks_url or signing_keys")
    return OAuth2Backend(config, clock)
