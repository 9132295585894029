"""The broker's OAuth 2 backend: core/oauth2.py's TokenVerifier with its keys
loaded, key files at construction and the JWKS URL fetched with aiohttp, for
[oauth2]'s own identity provider and each ``oauth_providers.<name>``.

The JWKS is fetched at the start and again when a token names a kid no key has
(a rotated key), at most once per ``[oauth2] jwks_min_refetch_interval``
seconds on the broker's clock. Logins are synchronous and never wait for the
network: the login with the unknown kid is refused, and the logins after the
fetch find the key (docs/security.md). The JWKS URL's certificate is verified
against ``[oauth2] https.cacertfile`` (else the system's CAs) unless
``https.peer_verification = verify_none``. Each ``resource_servers.<name>``
gets its settings from config_oauth2.py, inheriting the root's as RabbitMQ does,
and its keys from its identity provider (``oauth_provider_id``). A provider with
an ``issuer`` and no JWKS URL finds it by OpenID discovery, as RabbitMQ 4: each
fetch reads ``<issuer>/.well-known/openid-configuration`` (or the configured
``discovery_endpoint_path`` and ``discovery_endpoint_params``) for its
``jwks_uri`` first, so a provider that moves its keys is followed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlencode, urlsplit, urlunsplit

from warren.config import Config, ConfigError
from warren.config_oauth2 import OAuthProvider, ResourceServer
from warren.core.clock import Clock
from warren.core.oauth2 import KeySet, OAuth2Settings, TokenVerifier, load_key

log = logging.getLogger(__name__)
T = TypeVar("T")


class Provider:
    """One identity provider: its keys (key files, and the JWKS fetched from its
    URL at the start and again for an unknown kid, at most once per
    jwks_min_refetch_interval), its issuer and default key. The root one is
    [oauth2]'s own settings; ``oauth_providers.<name>`` add others."""

    def __init__(self, backend: OAuth2Backend, settings: OAuthProvider) -> None:
        self.backend = backend
        self.settings = settings
        self.keys = KeySet(unknown=self._unknown_kid)
        self.keys.static.update(_load_keys(settings.signing_keys))
        self._last_fetch_ms: int | None = None
        self._fetching: asyncio.Task[None] | None = None
        #: JWKS documents fetched so far (tests and the log read it).
        self.fetches = 0
        #: The JWKS URL the last discovery found (None: none yet, or not discovered).
        self.discovered: str | None = None

    @property
    def discovery_url(self) -> str | None:
        """Where OpenID discovery reads the JWKS URL: None with a jwks_url or no issuer."""
        settings = self.settings
        if settings.jwks_url or not settings.issuer:
            return None
        return discovery_url(
            settings.issuer, settings.discovery_endpoint_path, settings.discovery_endpoint_params
        )

    async def start(self) -> None:
        # Discovery at the start only for a provider with no key files: one with
        # them discovers its JWKS at the first unknown kid, as RabbitMQ does.
        if self.settings.jwks_url or (self.discovery_url and not self.keys.static):
            self._last_fetch_ms = self.backend.clock.now_ms()
            await self.fetch()

    async def stop(self) -> None:
        task, self._fetching = self._fetching, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def fetch(self) -> None:
        """Fetch the JWKS (its URL found by discovery first when not configured)
        and replace the fetched keys (kept as they were on an error)."""
        import aiohttp

        url = self.settings.jwks_url or self.discovery_url
        assert url is not None
        try:
            timeout = aiohttp.ClientTimeout(total=10)
            async with aiohttp.ClientSession(timeout=timeout) as http:
                if not self.settings.jwks_url:
                    url = _jwks_uri(await self._get(http, url), url)
                    self.discovered = url
                body = await self._get(http, url)
            count = self.keys.load_jwks(body)
            self.fetches += 1
            log.info("OAuth 2: %d signing keys fetched from %s", count, url)
        except (TimeoutError, aiohttp.ClientError, ValueError, AttributeError, OSError) as exc:
            log.warning("OAuth 2: JWKS not fetched from %s: %s", url, exc)

    async def _get(self, http: Any, url: str) -> bytes:
        async with http.get(url, ssl=self._tls()) as response:
            response.raise_for_status()
            body: bytes = await response.read()
            return body

    def _tls(self) -> ssl.SSLContext | bool:
        """The JWKS request's TLS (https.*); an http URL ignores it."""
        settings = self.settings
        if not settings.https_peer_verification:
            return False
        context = ssl.create_default_context(cafile=settings.https_cacertfile)
        context.check_hostname = settings.https_hostname_verification
        return context

    def _unknown_kid(self, kid: str) -> None:
        """A token named a key we lack: refetch, unless fetched too recently."""
        if not (self.settings.jwks_url or self.discovery_url) or self._fetching is not None:
            return
        now = self.backend.clock.now_ms()
        interval = self.backend.config.oauth2_jwks_min_refetch_interval * 1000
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
        task = self._fetching
        if task is not None:
            await asyncio.shield(task)


class OAuth2Backend:
    """Owns the verifier and the identity providers (their JWKS fetches)."""

    def __init__(self, config: Config, clock: Clock) -> None:
        self.config = config
        self.clock = clock
        extra = config.oauth2_extra
        own = OAuthProvider(
            id="",
            jwks_url=config.oauth2_jwks_url,
            issuer=config.oauth2_issuer,
            signing_keys=(*config.oauth2_signing_keys, *extra.signing_keys),
            default_key=config.oauth2_default_key,
            https_cacertfile=extra.https_cacertfile,
            https_peer_verification=extra.https_peer_verification,
            https_hostname_verification=extra.https_hostname_verification,
            algorithms=extra.algorithms,
            discovery_endpoint_path=extra.discovery_endpoint_path,
            discovery_endpoint_params=extra.discovery_endpoint_params,
        )
        #: The identity providers by lowercased name; "": [oauth2]'s own settings.
        self.providers = {"": Provider(self, own)}
        for settings in extra.oauth_providers:
            self.providers[settings.id.lower()] = Provider(self, settings)
        root_provider = self._provider(extra.default_oauth_provider or "")
        #: The root provider's keys (with the JWKS URL's).
        self.keys = root_provider.keys
        root = OAuth2Settings(
            resource_server_id=config.oauth2_resource_server_id,
            scope_prefix=config.oauth2_scope_prefix,
            verify_aud=config.oauth2_verify_aud,
            issuer=root_provider.settings.issuer,
            preferred_username_claims=config.oauth2_preferred_username_claims,
            additional_scopes_key=config.oauth2_additional_scopes_key or extra.extra_scopes_source,
            default_key=root_provider.settings.default_key,
            scope_aliases=extra.scope_aliases,
            resource_server_type=extra.resource_server_type,
            keys=root_provider.keys,
            algorithms=root_provider.settings.algorithms,
            require_exp=extra.require_exp,
        )
        others = [self._resource_server(root, server) for server in extra.resource_servers]
        if any(s.resource_server_id == root.resource_server_id for s in others):
            raise ConfigError(
                f"[oauth2] a resource server has the id of resource_server_id "
                f"({root.resource_server_id})"
            )
        self.verifier = TokenVerifier(root, self.keys, clock.now_ms, others)

    @property
    def fetches(self) -> int:
        """JWKS documents fetched so far, all providers' (tests and the log read it)."""
        return sum(p.fetches for p in self.providers.values())

    async def start(self) -> None:
        """Fetch the JWKS once before clients come; a failure is logged, not fatal
        (the identity provider may come up later: the next unknown kid refetches)."""
        for provider in self.providers.values():
            await provider.start()

    async def stop(self) -> None:
        for provider in self.providers.values():
            await provider.stop()

    async def wait_fetched(self) -> None:
        """Until the refetches under way are done (tests)."""
        for provider in self.providers.values():
            await provider.wait_fetched()

    def _provider(self, name: str) -> Provider:
        provider = self.providers.get(name.lower())
        if provider is None:
            raise ConfigError(f"[oauth2] no oauth_providers.{name.lower()}")
        return provider

    def _resource_server(self, root: OAuth2Settings, server: ResourceServer) -> OAuth2Settings:
        """A ``resource_servers.<name>``: what it leaves unset is the root's, but for
        its scope prefix (``<id>.`` unless the root's is set); its keys, issuer and
        default key are its identity provider's (``oauth_provider_id``, else the
        root's), or with signing_keys of its own, those keys alone."""
        named = server.oauth_provider_id
        provider = self._provider(named) if named is not None else None
        if provider is None:
            keys, issuer, default_key = root.keys, root.issuer, root.default_key
            algorithms = root.algorithms
        else:
            settings = provider.settings
            keys, issuer, default_key = provider.keys, settings.issuer, settings.default_key
            algorithms = settings.algorithms
        if server.signing_keys:
            keys = KeySet(static=_load_keys(server.signing_keys))
        return OAuth2Settings(
            resource_server_id=server.id,
            scope_prefix=_own(server.scope_prefix, root.scope_prefix),
            verify_aud=_own(server.verify_aud, root.verify_aud),
            issuer=_own(server.issuer, issuer),
            preferred_username_claims=_own(
                server.preferred_username_claims, root.preferred_username_claims
            ),
            additional_scopes_key=_own(server.additional_scopes_key, root.additional_scopes_key),
            default_key=_own(server.default_key, default_key),
            scope_aliases=_own(server.scope_aliases, root.scope_aliases),
            resource_server_type=_own(server.resource_server_type, root.resource_server_type),
            keys=keys,
            algorithms=algorithms,
            require_exp=_own(server.require_exp, root.require_exp),
        )


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


def discovery_url(issuer: str, path: str | None, params: Iterable[tuple[str, str]] = ()) -> str:
    """The OpenID configuration document's URL, built as RabbitMQ's oauth2_client:
    the path (default /.well-known/openid-configuration) after the issuer's own
    path, the parameters after the issuer's query."""
    parts = urlsplit(issuer)
    tail = path or "/.well-known/openid-configuration"
    tail = tail if tail.startswith("/") else "/" + tail
    query = "&".join(q for q in (parts.query, urlencode(list(params))) if q)
    return urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/") + tail, query, ""))


def _jwks_uri(document: bytes, url: str) -> str:
    """The ``jwks_uri`` of an OpenID configuration document (ValueError: none)."""
    try:
        uri = json.loads(document).get("jwks_uri")
    except (ValueError, AttributeError):
        raise ValueError(f"{url} is not an OpenID configuration document") from None
    if not isinstance(uri, str) or not uri:
        raise ValueError(f"{url} names no jwks_uri")
    return uri


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
    has_keys = [  # an issuer: its JWKS URL is discovered
        config.oauth2_jwks_url or config.oauth2_issuer,
        config.oauth2_signing_keys or extra.signing_keys,
        *(p.jwks_url or p.issuer or p.signing_keys for p in extra.oauth_providers),
        *(s.signing_keys for s in extra.resource_servers),
    ]
    if not any(has_keys):
        raise ConfigError("[oauth2] resource_server_id needs jwks_url, issuer or signing_keys")
    return OAuth2Backend(config, clock)
