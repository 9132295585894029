"""OAuth 2 access tokens for tests: keys made here (cryptography), tokens
signed with PyJWT, a JWKS served by a local aiohttp app. No network."""

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
    from aiohttp import web

    hits = [0]

    async def handle(_request: web.Request) -> web.Response:
        hits[0] += 1
        return web.json_response(document)

    app = web.Application()
    app.router.add_get("/jwks", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    scheme = "http" if tls is None else "https"
    return runner, f"{scheme}://127.0.0.1:{port}/jwks", hits
