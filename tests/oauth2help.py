"""OAuth 2 access tokens for tests: keys made here (cryptography), tokens
signed with PyJWT, a JWKS (and an OpenID configuration document that names
it) served by a local aiohttp app. No network."""

from __future__ import annotations

import json
import ssl
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

RESOURCE_SERVER = "rabbitmq"


class SigningKey:
    """A private key with its kid: signs tokens, gives its PEM and its JWK."""

    def __init__(self, kid: str, kind: str = "rsa") -> None:
        self.kid = kid
        if kind == "rsa":
            self.private: Any = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            self.alg = "RS256"
        else:
            self.private = ec.generate_private_key(ec.SECP256R1())
            self.alg = "ES256"

    def pem(self) -> bytes:
        return self.private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    def write_pem(self, directory: Path) -> str:
        path = directory / f"{self.kid}.pem"
        path.write_bytes(self.pem())
        return f"{self.kid}:{path}"

    def jwk(self) -> dict[str, Any]:
        algo = jwt.algorithms.RSAAlgorithm if self.alg == "RS256" else jwt.algorithms.ECAlgorithm
        data: dict[str, Any] = json.loads(algo.to_jwk(self.private.public_key()))
        data.update(kid=self.kid, use="sig", alg=self.alg)
        return data

    def token(
        self,
        now_s: int,
        scopes: list[str] | str = (),  # type: ignore[assignment]
        lifetime: int = 3600,
        sub: str = "alice",
        aud: Any = RESOURCE_SERVER,
        kid: str | None = None,
        **claims: Any,
    ) -> str:
        """A token valid from ``now_s`` for ``lifetime`` seconds; scopes unprefixed
        get ``rabbitmq.`` (a list) or are taken as they are (a string)."""
        if isinstance(scopes, str):
            scope: Any = scopes
        else:
            scope = [s if "." in s.split(":")[0] else f"{RESOURCE_SERVER}.{s}" for s in scopes]
        payload = {"sub": sub, "aud": aud, "iat": now_s, "exp": now_s + lifetime, "scope": scope}
        payload.update(claims)
        payload = {k: v for k, v in payload.items() if v is not None}
        headers = {"kid": self.kid if kid is None else kid}
        return jwt.encode(payload, self.private, algorithm=self.alg, headers=headers)


FULL = ["configure:*/*", "write:*/*", "read:*/*"]
#: Topic exchanges need scopes with a routing key part (RabbitMQ's rule).
TOPICS = ["write:*/*/*", "read:*/*/*"]


def jwks(*keys: SigningKey) -> dict[str, Any]:
    return {"keys": [k.jwk() for k in keys]}


async def serve_jwks(
    document: dict[str, Any], tls: ssl.SSLContext | None = None
) -> tuple[Any, str, list[int]]:
    """A JWKS endpoint on 127.0.0.1 (an aiohttp runner, its URL, a request
    counter); ``document`` is read at each request, so a test may change it.
    ``tls``: served over HTTPS with that server context."""
    idp = await serve_idp(document, tls)
    return idp.runner, idp.jwks_url, idp.jwks_hits


class IdentityProvider:
    """A local OpenID provider: ``/jwks`` and, for OpenID discovery, a
    configuration document at any path ending in ``openid-configuration``
    whose ``jwks_uri`` is ``jwks_path`` (a test may change it). ``requests``:
    the path and query of each discovery request."""

    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document
        self.runner: Any = None
        self.base = ""
        self.jwks_path = "/jwks"
        self.jwks_hits = [0]
        self.requests: list[str] = []

    @property
    def jwks_url(self) -> str:
        return self.base + "/jwks"


async def serve_idp(
    document: dict[str, Any], tls: ssl.SSLContext | None = None
) -> IdentityProvider:
    """An IdentityProvider served on 127.0.0.1 (HTTPS with ``tls``); its issuer
    is ``idp.base``."""
    from aiohttp import web

    idp = IdentityProvider(document)

    async def keys(_request: web.Request) -> web.Response:
        idp.jwks_hits[0] += 1
        return web.json_response(idp.document)

    async def configuration(request: web.Request) -> web.Response:
        if not request.path.endswith("openid-configuration"):
            raise web.HTTPNotFound()
        idp.requests.append(request.path_qs)
        return web.json_response({"issuer": idp.base, "jwks_uri": idp.base + idp.jwks_path})

    app = web.Application()
    app.router.add_get("/jwks", keys)
    app.router.add_get("/keys/{name}", keys)
    app.router.add_get("/{tail:.*}", configuration)
    idp.runner = web.AppRunner(app)
    await idp.runner.setup()
    site = web.TCPSite(idp.runner, "127.0.0.1", 0, ssl_context=tls)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    idp.base = f"{'http' if tls is None else 'https'}://127.0.0.1:{port}"
    return idp
