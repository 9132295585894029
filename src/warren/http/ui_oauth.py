"""The web UI's login through an OpenID Connect provider ([mgmt] oauth_*,
RabbitMQ's management.oauth_*): /api/auth says what the login page offers,
and Warren relays the two requests the browser would otherwise send to the
provider itself: its discovery document and the authorization code exchange.

Relayed so that the UI keeps its Content-Security-Policy (``connect-src
'self'``: the browser only navigates to the provider, it never fetches from
it), the provider needs no CORS rule for the broker's origin, and a client
secret stays on the server (RabbitMQ relays token requests for that reason
too). The code exchange is only ever sent to the token endpoint of the
configured provider, with the configured client id.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

import aiohttp
from aiohttp import web

from warren.http.api_ui import AUTH_SETTINGS
from warren.http.replies import ApiError, json_response

if TYPE_CHECKING:
    from warren.config import Config
    from warren.node import Node

log = logging.getLogger("warren.http")

#: How long a fetched discovery document is used, on the broker's clock.
DISCOVERY_TTL_MS = 300_000
#: What a code exchange's form may weigh (a code, a verifier, a redirect URI).
MAX_TOKEN_REQUEST = 16 * 1024
#: What the UI reads of the discovery document.
DISCOVERY_FIELDS = (
    "issuer",
    "authorization_endpoint",
    "end_session_endpoint",
    "code_challenge_methods_supported",
)
#: The code exchange's fields the browser gives; Warren adds client_id (and the secret).
EXCHANGE_FIELDS = ("code", "redirect_uri", "code_verifier")


def auth_settings(config: Config) -> dict[str, Any]:
    """GET /api/auth's answer: RabbitMQ 3.13's keys (its UI reads them too)."""
    if not config.mgmt_oauth_enabled:
        return dict(AUTH_SETTINGS)
    client = {
        "oauth_provider_url": config.mgmt_oauth_provider_url,
        "oauth_client_id": config.mgmt_oauth_client_id,
        "oauth_scopes": config.mgmt_oauth_scopes,
    }
    rs_id = config.oauth2_resource_server_id
    return {
        **AUTH_SETTINGS,
        "oauth_enabled": True,
        **client,
        "oauth_disable_basic_auth": config.mgmt_oauth_disable_basic_auth,
        "oauth_resource_servers": {rs_id: {"id": rs_id, **client}},
    }


class UiOAuth:
    """The public (credential-less) /api/auth routes."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self._discovery: dict[str, Any] | None = None
        self._fetched_ms = 0

    def add_routes(self, app: web.Application) -> None:
        """Before /api's catch-all route: these are answered without credentials."""
        app.router.add_get("/api/auth", self.settings)
        app.router.add_get("/api/auth/openid-configuration", self.openid_configuration)
        app.router.add_post("/api/auth/token", self.token)

    async def settings(self, _: web.Request) -> web.StreamResponse:
        """Read by the UI (Warren's and RabbitMQ's) before its login form."""
        return json_response(auth_settings(self.node.config))

    async def openid_configuration(self, _: web.Request) -> web.StreamResponse:
        try:
            document = await self._document()
        except ApiError as exc:
            return exc.response()
        return json_response({k: document[k] for k in DISCOVERY_FIELDS if k in document})

    async def token(self, request: web.Request) -> web.StreamResponse:
        """The authorization code exchange, relayed to the provider's token
        endpoint with the configured client id (and secret); its answer as it is."""
        try:
            form = await self._exchange_form(request)
            endpoint = (await self._document()).get("token_endpoint")
            if not isinstance(endpoint, str) or not endpoint:
                raise ApiError(502, "bad_gateway", "the provider names no token_endpoint")
            return await self._post(endpoint, form)
        except ApiError as exc:
            return exc.response()

    async def _exchange_form(self, request: web.Request) -> dict[str, str]:
        config = self.node.config
        if not config.mgmt_oauth_enabled:
            raise ApiError(404, "Object Not Found", "OAuth 2 login is not enabled")
        if (request.content_length or 0) > MAX_TOKEN_REQUEST:
            raise ApiError(413, "bad_request", "request too large")
        body = await request.content.read(MAX_TOKEN_REQUEST + 1)
        if len(body) > MAX_TOKEN_REQUEST:
            raise ApiError(413, "bad_request", "request too large")
        try:
            given = dict(parse_qsl(body.decode(), strict_parsing=bool(body)))
        except (UnicodeDecodeError, ValueError):
            raise ApiError(400, "invalid_request", "not a form") from None
        if given.get("grant_type") != "authorization_code":
            raise ApiError(400, "unsupported_grant_type", "only authorization_code is relayed")
        missing = [k for k in EXCHANGE_FIELDS if not given.get(k)]
        if missing:
            raise ApiError(400, "invalid_request", f"missing {', '.join(missing)}")
        form = {"grant_type": "authorization_code", **{k: given[k] for k in EXCHANGE_FIELDS}}
        form["client_id"] = config.mgmt_oauth_client_id
        if config.mgmt_oauth_client_secret:
            form["client_secret"] = config.mgmt_oauth_client_secret
        return form

    async def _document(self) -> dict[str, Any]:
        """The provider's discovery document, fetched at most every DISCOVERY_TTL_MS."""
        config = self.node.config
        if not config.mgmt_oauth_enabled:
            raise ApiError(404, "Object Not Found", "OAuth 2 login is not enabled")
        now = self.node.clock.now_ms()
        if self._discovery is not None and now - self._fetched_ms < DISCOVERY_TTL_MS:
            return self._discovery
        url = config.mgmt_oauth_discovery_url
        try:
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http,
                http.get(url) as response,
            ):
                response.raise_for_status()
                document = json.loads(await response.read())
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            log.warning("OAuth 2 login: discovery document not read from %s: %s", url, exc)
            raise ApiError(
                502, "bad_gateway", f"the OAuth 2 provider did not answer: {exc}"
            ) from None
        if not isinstance(document, dict) or not isinstance(
            document.get("authorization_endpoint"), str
        ):
            raise ApiError(502, "bad_gateway", "the provider names no authorization_endpoint")
        self._discovery, self._fetched_ms = document, now
        return document

    async def _post(self, endpoint: str, form: dict[str, str]) -> web.StreamResponse:
        try:
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http,
                http.post(endpoint, data=form, headers={"Accept": "application/json"}) as reply,
            ):
                body = await reply.read()
                status = reply.status
        except (TimeoutError, aiohttp.ClientError) as exc:
            log.warning("OAuth 2 login: token endpoint %s did not answer: %s", endpoint, exc)
            raise ApiError(
                502, "bad_gateway", f"the OAuth 2 provider did not answer: {exc}"
            ) from None
        if status != 200:
            log.warning(
                "OAuth 2 login: the token endpoint refused a code: %d %r", status, body[:200]
            )
        return web.Response(
            status=status,
            body=body,
            content_type="application/json",
            headers={"Cache-Control": "no-store"},
        )
