"""A small OpenID Connect provider for tests of the web UI's OAuth 2 login:
discovery, an authorize page that asks for a user name and redirects back with
a code, a token endpoint that checks the PKCE verifier (S256) and the client,
a JWKS, and a logout endpoint. Tokens are signed with PyJWT (oauth2help's
SigningKey) and dated on the broker's clock. Runs in a thread (http.server), so
a browser, the broker and the test can all reach it. It records what it was
asked, for the tests to check."""

from __future__ import annotations

import base64
import hashlib
import html
import json
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from oauth2help import RESOURCE_SERVER, SigningKey, jwks


@dataclass
class Grant:
    """An authorization code not yet exchanged."""

    username: str
    challenge: str
    redirect_uri: str
    scope: str


@dataclass
class OidcProvider:
    """``client_id`` with ``redirect_uris``; ``secret``: a confidential client's."""

    client_id: str
    redirect_uris: list[str]
    #: Seconds from the broker's clock, for iat and exp.
    now_s: Callable[[], int]
    secret: str | None = None
    #: Scopes (unprefixed) each user's access token carries.
    scopes: dict[str, list[str]] = field(default_factory=dict)
    lifetime: int = 600
    #: Its discovery document names its logout (end_session_endpoint).
    logout_endpoint: bool = True
    key: SigningKey = field(default_factory=lambda: SigningKey("oidc-1"))
    grants: dict[str, Grant] = field(default_factory=dict)
    #: Every token request's form, and every logout's query.
    token_requests: list[dict[str, str]] = field(default_factory=list)
    logouts: list[dict[str, str]] = field(default_factory=list)
    url: str = ""

    def start(self) -> OidcProvider:
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

            def do_GET(self) -> None:  # noqa: N802
                provider.get(self)

            def do_POST(self) -> None:  # noqa: N802
                provider.post(self)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    # -- what it answers --------------------------------------------------------------
    def discovery(self) -> dict[str, Any]:
        document = {
            "issuer": self.url,
            "authorization_endpoint": f"{self.url}/authorize",
            "token_endpoint": f"{self.url}/token",
            "jwks_uri": f"{self.url}/jwks",
            "response_types_supported": ["code"],
            "code_challenge_methods_supported": ["S256"],
        }
        if self.logout_endpoint:
            document["end_session_endpoint"] = f"{self.url}/logout"
        return document

    def get(self, req: BaseHTTPRequestHandler) -> None:
        parts = urlsplit(req.path)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        if parts.path == "/.well-known/openid-configuration":
            _json(req, 200, self.discovery())
        elif parts.path == "/jwks":
            _json(req, 200, jwks(self.key))
        elif parts.path == "/authorize":
            self.authorize_page(req, query)
        elif parts.path == "/logout":
            self.logouts.append(query)
            target = query.get("post_logout_redirect_uri", "")
            if target not in self.redirect_uris:
                _json(req, 400, {"error": "invalid_request"})
            else:
                _redirect(req, target)
        else:
            _json(req, 404, {"error": "not_found"})

    def post(self, req: BaseHTTPRequestHandler) -> None:
        length = int(req.headers.get("Content-Length") or 0)
        form = {k: v[0] for k, v in parse_qs(req.rfile.read(length).decode()).items()}
        if req.path == "/authorize":
            self.authorize(req, form)
        elif req.path == "/token":
            self.token_requests.append(form)
            status, body = self.token(form)
            _json(req, status, body)
        else:
            _json(req, 404, {"error": "not_found"})

    def authorize_page(self, req: BaseHTTPRequestHandler, query: dict[str, str]) -> None:
        """The login page: the authorization request checked, then a user name asked."""
        problem = self._authorization_problem(query)
        if problem:
            _page(req, 400, f"<p id=problem>{html.escape(problem)}</p>")
            return
        hidden = "".join(
            f'<input type=hidden name="{k}" value="{html.escape(v)}">'
            for k, v in query.items()
            if k in ("client_id", "redirect_uri", "state", "code_challenge", "scope")
        )
        _page(
            req,
            200,
            '<form method=post action="/authorize" id=idp-login>'
            f"{hidden}<label>User <input name=username></label>"
            "<button type=submit>Sign in</button></form>",
        )

    def _authorization_problem(self, query: dict[str, str]) -> str | None:
        if query.get("client_id") != self.client_id:
            return "unknown client_id"
        if query.get("redirect_uri") not in self.redirect_uris:
            return f"redirect_uri not registered: {query.get('redirect_uri')}"
        if query.get("response_type") != "code":
            return "response_type must be code"
        if query.get("code_challenge_method") != "S256" or not query.get("code_challenge"):
            return "PKCE with S256 is required"
        if not query.get("state"):
            return "no state"
        return None

    def authorize(self, req: BaseHTTPRequestHandler, form: dict[str, str]) -> None:
        code = secrets.token_urlsafe(16)
        self.grants[code] = Grant(
            form["username"], form["code_challenge"], form["redirect_uri"], form.get("scope", "")
        )
        query = urlencode({"code": code, "state": form["state"]})
        _redirect(req, f"{form['redirect_uri']}?{query}")

    def token(self, form: dict[str, str]) -> tuple[int, dict[str, Any]]:
        """RFC 6749's code exchange with RFC 7636's check of the verifier."""
        if form.get("grant_type") != "authorization_code":
            return 400, {"error": "unsupported_grant_type"}
        if form.get("client_id") != self.client_id or (
            self.secret is not None and form.get("client_secret") != self.secret
        ):
            return 401, {"error": "invalid_client"}
        grant = self.grants.pop(form.get("code", ""), None)
        if grant is None or grant.redirect_uri != form.get("redirect_uri"):
            return 400, {"error": "invalid_grant", "error_description": "unknown code"}
        digest = hashlib.sha256(form.get("code_verifier", "").encode()).digest()
        if base64.urlsafe_b64encode(digest).rstrip(b"=").decode() != grant.challenge:
            return 400, {"error": "invalid_grant", "error_description": "PKCE verification failed"}
        now = self.now_s()
        scopes = self.scopes.get(grant.username, [])
        access = self.key.token(
            now,
            scopes,
            lifetime=self.lifetime,
            sub=grant.username,
            iss=self.url,
            preferred_username=grant.username,
        )
        id_token = self.key.token(
            now, scopes="", lifetime=self.lifetime, sub=grant.username, aud=self.client_id
        )
        return 200, {
            "access_token": access,
            "id_token": id_token,
            "token_type": "Bearer",
            "expires_in": self.lifetime,
            "scope": grant.scope,
        }


def _json(req: BaseHTTPRequestHandler, status: int, body: Any) -> None:
    data = json.dumps(body).encode()
    req.send_response(status)
    req.send_header("Content-Type", "application/json")
    req.send_header("Content-Length", str(len(data)))
    req.end_headers()
    req.wfile.write(data)


def _page(req: BaseHTTPRequestHandler, status: int, body: str) -> None:
    data = (
        '<!doctype html><html><head><meta charset=utf-8><link rel=icon href="data:,">'
        f"<title>Test provider</title></head><body>{body}</body></html>"
    ).encode()
    req.send_response(status)
    req.send_header("Content-Type", "text/html; charset=utf-8")
    req.send_header("Content-Length", str(len(data)))
    req.end_headers()
    req.wfile.write(data)


def _redirect(req: BaseHTTPRequestHandler, location: str) -> None:
    req.send_response(302)
    req.send_header("Location", location)
    req.send_header("Content-Length", "0")
    req.end_headers()


__all__ = ["RESOURCE_SERVER", "OidcProvider"]
