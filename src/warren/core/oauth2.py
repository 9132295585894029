"""OAuth 2.0 access tokens (JWT) as passwords, checked as RabbitMQ's
rabbit_auth_backend_oauth2 checks them.

Every protocol logs in through ClientSession.login, which hands a password that
looks like a JWT here first when ``[oauth2]`` is configured (``auth_backends``
orders the chain). The signature is verified with PyJWT against the keys in a
KeySet: key files from the config (PEM public keys; JWK JSON, which may be a
symmetric HMAC secret), and the JWKS the broker fetches
(warren/oauth2_backend.py: I/O stays out of the core); PyJWT is imported at
the first token, not with the core. The claims are checked on the broker's
clock, not PyJWT's, so expiry follows the one clock (ManualClock in tests).
Scopes become an ordinary User for the token's life (never stored):
``<prefix>configure:<vhost>/<name>`` ... as per-vhost Permission regexes,
``<prefix>tag:<tag>`` as tags. A token's scopes are gathered as RabbitMQ's
normalize_token_scope: the ``scope`` claim, a requesting party token's
``authorization.permissions.scopes``, the additional_scopes_key claims, scope
aliases, rich authorization requests (core/oauth2_rar.py), then the prefix
filter. Several resource servers may share the broker: the token's ``aud``
picks one (resolve_resource_server), with its own prefix, settings and keys.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from warren.core.oauth2_rar import rar_scopes
from warren.core.users import CONFIGURE, READ, WRITE, Permission, TopicPermission, User

#: Asymmetric algorithms: a public key is never taken as an HMAC secret.
ALGORITHMS = (
    "RS256", "RS384", "RS512", "PS256", "PS384", "PS512",
    "ES256", "ES384", "ES512", "EdDSA",
)  # fmt: skip
#: Symmetric ones: only for a secret configured as one (a JWK of kty oct or MAC,
#: never one from the JWKS URL).
HMAC_ALGORITHMS = ("HS256", "HS384", "HS512")
#: UAA's names for them, as RabbitMQ's uaa_jwt_decoder maps them.
_UAA_ALGORITHMS = {
    "HMACSHA256": "HS256", "HMACSHA384": "HS384", "HMACSHA512": "HS512",
    "SHA256withRSA": "RS256", "SHA512withRSA": "RS512",
}  # fmt: skip
#: Where a requesting party token (UMA: Keycloak, WSO2) keeps its scopes.
RPT_SCOPES = "authorization.permissions.scopes"
#: RabbitMQ's limit on the scopes of one token.
MAX_SCOPES = 2048
_JWT_RE = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*")


def looks_like_jwt(password: str | None) -> bool:
    """Three base64url parts: the only passwords the oauth2 backend checks."""
    return password is not None and _JWT_RE.fullmatch(password) is not None


class TokenRefused(Exception):
    """Why a token is not accepted; the text is logged, the client sees a login refusal."""


@dataclass(frozen=True)
class OAuth2Settings:
    """The ``[oauth2]`` section, RabbitMQ's ``auth_oauth2.*`` names."""

    resource_server_id: str
    #: Scopes start with it (RabbitMQ's default: the resource server id and a dot).
    scope_prefix: str | None = None
    verify_aud: bool = True
    #: The ``iss`` a token must carry (None: not checked).
    issuer: str | None = None
    #: Claims the user name is taken from, first present wins (then sub, client_id).
    preferred_username_claims: tuple[str, ...] = ()
    #: Space-separated claim paths (``a.b.c``) whose values are scopes too.
    additional_scopes_key: str | None = None
    #: The key of a token whose header names no ``kid``.
    default_key: str | None = None
    #: A scope -> the scopes it stands for (prefixed, as in a token).
    scope_aliases: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: The ``type`` of the rich authorization requests this server reads (None: none).
    resource_server_type: str | None = None
    #: This resource server's own keys (None: the verifier's).
    keys: KeySet | None = None
    #: The signature algorithms its tokens may use (None: any its keys allow).
    algorithms: tuple[str, ...] | None = None
    #: A token without ``exp`` is refused (RabbitMQ 4's require_exp); off, it
    #: lasts as long as its connection.
    require_exp: bool = True

    @property
    def prefix(self) -> str:
        if self.scope_prefix is not None:
            return self.scope_prefix
        return self.resource_server_id + "."


@dataclass
class KeySet:
    """Signing keys by kid: ``static`` from PEM files, ``fetched`` from the JWKS
    URL (replaced as a whole on each fetch). ``unknown`` is called with a kid no
    key has, so the owner refetches the JWKS (rate limited there)."""

    static: dict[str, Any] = field(default_factory=dict)
    fetched: dict[str, Any] = field(default_factory=dict)
    unknown: Callable[[str], None] | None = None

    def get(self, kid: str) -> Any | None:
        key = self.static.get(kid)
        return key if key is not None else self.fetched.get(kid)

    def load_jwks(self, document: str | bytes | Mapping[str, Any]) -> int:
        """Replace the fetched keys by a JWKS document's; returns how many.
        Symmetric keys are skipped: a secret is not published."""
        import jwt

        data = json.loads(document) if isinstance(document, (str, bytes)) else document
        keys: dict[str, Any] = {}
        for entry in data.get("keys", []):
            if not isinstance(entry, dict) or entry.get("use", "sig") != "sig":
                continue
            if entry.get("kty") in ("oct", "MAC"):
                continue
            try:
                key = jwt.PyJWK(entry)
            except jwt.PyJWTError:
                continue  # an algorithm or key type PyJWT cannot use: skip it
            keys[str(entry.get("kid", ""))] = key
        self.fetched = keys
        return len(keys)


def load_key(data: bytes) -> Any:
    """A signing key file: a JWK (JSON: ``{"kty": "oct", "k": ...}``, UAA's
    ``{"kty": "MAC", "value": ...}``, or a public key) or PEM."""
    if not data.lstrip().startswith(b"{"):
        return load_pem_key(data)
    import jwt

    try:
        jwk = json.loads(data)
    except ValueError as exc:
        raise ValueError(f"not a JWK: {exc}") from None
    if not isinstance(jwk, dict):
        raise ValueError("not a JWK: not a JSON object")
    if jwk.get("kty") == "MAC":  # UAA's raw secret
        value = jwk.get("value")
        if not isinstance(value, str):
            raise ValueError("a MAC key needs a value")
        secret = base64.urlsafe_b64encode(value.encode()).rstrip(b"=").decode()
        jwk = {**jwk, "kty": "oct", "k": secret}
        del jwk["value"]
    if jwk.get("alg") in _UAA_ALGORITHMS:
        jwk["alg"] = _UAA_ALGORITHMS[jwk["alg"]]
    if jwk.get("kty") == "oct" and "alg" not in jwk:
        jwk["alg"] = "HS256"
    try:
        return jwt.PyJWK(jwk)
    except jwt.PyJWTError as exc:
        raise ValueError(f"not a usable JWK: {exc}") from None


def load_pem_key(pem: bytes) -> Any:
    """A public key (or a certificate's) from PEM."""
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    if b"CERTIFICATE" in pem:
        return x509.load_pem_x509_certificate(pem).public_key()
    return load_pem_public_key(pem)


@dataclass
class Token:
    """A verified token: who it names, what its scopes grant, until when."""

    username: str
    scopes: list[str]
    tags: list[str]
    #: ``exp`` in ms on the broker's clock; None: no ``exp`` (require_exp off).
    expires_ms: int | None
    claims: dict[str, Any]


class TokenVerifier:
    """Checks tokens: the resource server the ``aud`` names, the signature with
    its keys, then exp, nbf, iss, on ``now_ms``. ``settings`` is the root
    resource server (``[oauth2]``; its id may be empty when only
    ``resource_servers`` are configured), ``others`` the ``resource_servers``."""

    def __init__(
        self,
        settings: OAuth2Settings,
        keys: KeySet,
        now_ms: Callable[[], int],
        others: Iterable[OAuth2Settings] = (),
    ) -> None:
        self.settings = settings
        self.keys = keys
        self.now_ms = now_ms
        self.servers = [s for s in (settings, *others) if s.resource_server_id]

    def verify(self, token: str) -> Token:
        import jwt

        try:
            header = jwt.get_unverified_header(token)
            unverified = jwt.decode(token, options={"verify_signature": False})
        except jwt.PyJWTError as exc:
            raise TokenRefused(f"provided token is invalid: {exc}") from None
        server = resolve_resource_server(unverified.get("aud"), self.servers)
        kid = header.get("kid") or server.default_key
        if not kid:
            raise TokenRefused("no key id in the token and no default_key")
        keys = server.keys if server.keys is not None else self.keys
        key = keys.get(kid)
        if key is None:
            if keys.unknown is not None:
                keys.unknown(kid)
            raise TokenRefused(f"unknown signing key id '{kid}'")
        allowed = [a for a in _algorithms_for(key) if a in (server.algorithms or (a,))]
        if not allowed:
            raise TokenRefused(f"the key '{kid}' verifies none of the allowed algorithms")
        try:
            claims = jwt.decode(
                token,
                key=key,
                algorithms=allowed,
                options={
                    "verify_exp": False,
                    "verify_nbf": False,
                    "verify_iat": False,
                    "verify_aud": False,
                    "verify_iss": False,
                },
            )
        except jwt.InvalidSignatureError:
            raise TokenRefused("signature_invalid") from None
        except (jwt.PyJWTError, TypeError, ValueError) as exc:
            raise TokenRefused(f"provided token is invalid: {exc}") from None
        return self._checked(claims, server)

    def _checked(self, claims: dict[str, Any], settings: OAuth2Settings) -> Token:
        now_s = self.now_ms() // 1000
        exp = claims.get("exp")
        if exp is None:
            if settings.require_exp:
                raise TokenRefused("Provided JWT token has no exp claim")
        elif not isinstance(exp, (int, float)) or isinstance(exp, bool):
            raise TokenRefused("Provided JWT token has an invalid exp claim: value is not a number")
        elif int(exp) <= now_s:
            raise TokenRefused(
                f"Provided JWT token has expired at timestamp {int(exp)} (validated at {now_s})"
            )
        nbf = claims.get("nbf")
        if isinstance(nbf, (int, float)) and int(nbf) > now_s:
            raise TokenRefused(f"Provided JWT token is not valid before {int(nbf)}")
        if settings.issuer is not None and claims.get("iss") != settings.issuer:
            raise TokenRefused(f"invalid issuer: {claims.get('iss')!r}")
        scopes = _scopes(claims, settings)
        if len(scopes) > MAX_SCOPES:
            raise TokenRefused("too_many_scopes")
        tags = sorted({s[4:] for s in scopes if s.startswith("tag:") and s[4:]})
        expires_ms = None if exp is None else int(exp) * 1000
        return Token(_username(settings, claims), scopes, tags, expires_ms, claims)


def resolve_resource_server(aud: Any, servers: list[OAuth2Settings]) -> OAuth2Settings:
    """The resource server a token is for, as RabbitMQ's
    rabbit_oauth2_resource_server: the one its ``aud`` (a list, or a string of
    space-separated ids) names; when it names none (or there is no ``aud``), the
    only one with verify_aud off."""
    auds = aud.split() if isinstance(aud, str) else aud if isinstance(aud, list) else []
    named = [s for s in servers if s.resource_server_id in auds]
    if len(named) > 1:
        raise TokenRefused("invalid_aud: aud_matched_many_resource_servers_only_one_allowed")
    if named:
        return named[0]
    lax = [s for s in servers if not s.verify_aud]
    if len(lax) == 1:
        return lax[0]
    if lax:
        raise TokenRefused(f"invalid_aud: {aud!r}: too_many_resources_with_verify_aud_false")
    raise TokenRefused(f"invalid_aud: {aud!r}: no_matching_aud_found")


def _scopes(claims: dict[str, Any], settings: OAuth2Settings) -> list[str]:
    """The token's scopes with the prefix dropped (others are not ours), in
    RabbitMQ's order: the scope claim, a requesting party token's, the
    additional claims, the aliases of all those, the authorization details."""
    raw = _scope_list(claims.get("scope"))
    rs_id = settings.resource_server_id
    for path in (RPT_SCOPES, *(settings.additional_scopes_key or "").split()):
        for value in _claim_values(claims, [p for p in path.split(".") if p]):
            raw.extend(_additional(value, rs_id))
    aliases = settings.scope_aliases
    if aliases:
        raw.extend(alias for scope in list(raw) for alias in aliases.get(scope, ()))
    raw.extend(rar_scopes(claims, rs_id, settings.resource_server_type))
    prefix = settings.prefix
    return sorted({s[len(prefix) :] for s in raw if s.startswith(prefix)})


def _algorithms_for(key: Any) -> list[str]:
    """The algorithms a key may verify: a token's header cannot pick another
    family (an RSA key is never tried as an EC or HMAC one)."""
    import jwt

    if isinstance(key, jwt.PyJWK):
        name = key.algorithm_name
        return [name] if name in ALGORITHMS or name in HMAC_ALGORITHMS else []
    from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa

    # isinstance, not the class name: cryptography's EC key class is ECPublicKey.
    if isinstance(key, rsa.RSAPublicKey):
        return [a for a in ALGORITHMS if a[:2] in ("RS", "PS")]
    if isinstance(key, ec.EllipticCurvePublicKey):
        return [a for a in ALGORITHMS if a.startswith("ES")]
    if isinstance(key, (ed25519.Ed25519PublicKey, ed448.Ed448PublicKey)):
        return ["EdDSA"]
    return []


def _scope_list(value: Any) -> list[str]:
    if isinstance(value, str):
        return value.split()
    if isinstance(value, list):
        return [s for s in value if isinstance(s, str)]
    return []


def _additional(value: Any, rs_id: str) -> list[str]:
    """A value found at an additional_scopes_key path: a list, a space-separated
    string, or a map whose resource server id entry lists unprefixed scopes."""
    if isinstance(value, dict):
        inner = value.get(rs_id)
        return [f"{rs_id}.{s}" for s in _scope_list(inner)]
    return _scope_list(value)


def _claim_values(node: Any, path: list[str]) -> Iterable[Any]:
    if not path:
        yield node
    elif isinstance(node, dict):
        if path[0] in node:
            yield from _claim_values(node[path[0]], path[1:])
    elif isinstance(node, list):
        for item in node:
            yield from _claim_values(item, path)


def _username(settings: OAuth2Settings, claims: Mapping[str, Any]) -> str:
    for claim in (*settings.preferred_username_claims, "sub", "client_id"):
        value = claims.get(claim)
        if isinstance(value, str) and value:
            return value
    return "unknown"


# -- scopes to permissions ---------------------------------------------------------------
def wildcard_regex(pattern: str) -> str:
    """RabbitMQ's scope wildcard (``*``: any text; each part URL-decoded) as a regex."""
    return ".*".join(re.escape(unquote(part)) for part in pattern.split("*"))


def _parse(scope: str) -> tuple[str, str, str, str | None] | None:
    """(kind, vhost pattern, name pattern, routing key pattern or None) of
    ``configure:vhost/name[/routing key]``."""
    kind, sep, rest = scope.partition(":")
    if not sep or kind not in (CONFIGURE, WRITE, READ):
        return None
    parts = rest.split("/")
    if len(parts) not in (2, 3):
        return None
    return kind, parts[0], parts[1], parts[2] if len(parts) == 3 else None


def _matches(pattern: str, subject: str) -> bool:
    return re.fullmatch(wildcard_regex(pattern), subject, re.DOTALL) is not None


_VARIABLE = re.compile(r"\{([^{}.*]*)\}")


def expand(scopes: Iterable[str], vhost: str, claims: Mapping[str, Any]) -> list[str]:
    """RabbitMQ's scope variables for one vhost: ``{vhost}`` is its name, any
    other ``{claim}`` the token's string claim (the name itself if none)."""

    def value(m: re.Match[str]) -> str:
        name = m.group(1)
        if name == "vhost":
            return vhost
        found = claims.get(name)
        return found if isinstance(found, str) else name

    return [_VARIABLE.sub(value, s) if "{" in s else s for s in scopes]


def permissions_for(
    scopes: Iterable[str], vhosts: Iterable[str], claims: Mapping[str, Any] | None = None
) -> dict[str, Permission]:
    """Per vhost, the permission the scopes grant: each kind's name patterns as
    one alternation (empty: nothing). A vhost any scope matches gets access, as
    rabbit_oauth2_scope:vhost_access/2."""
    scopes = list(scopes)
    result: dict[str, Permission] = {}
    for vhost in vhosts:
        grants = [g for g in map(_parse, expand(scopes, vhost, claims or {})) if g is not None]
        patterns: dict[str, list[str]] = {CONFIGURE: [], WRITE: [], READ: []}
        matched = False
        for kind, vhost_pattern, name_pattern, _ in grants:
            if _matches(vhost_pattern, vhost):
                matched = True
                patterns[kind].append(f"(?s:{wildcard_regex(name_pattern)})")
        if matched:
            result[vhost] = Permission(
                configure="|".join(patterns[CONFIGURE]),
                write="|".join(patterns[WRITE]),
                read="|".join(patterns[READ]),
            )
    return result


class TopicScopes:
    """A token's topic permission on an exchange, from its name (a token user's
    User.topic_resolver, asked at the exchange's first check): as
    rabbit_oauth2_scope:topic_access/4, the three-part scopes
    (``write:<vhost>/<exchange>/<routing key>``) are matched against the name
    of the exchange being checked, so one declared after the login is checked
    as the others. A topic exchange no such scope names allows no routing key
    (a two-part scope grants no topic access)."""

    def __init__(self, scopes: Iterable[str], claims: Mapping[str, Any] | None = None) -> None:
        self.scopes = list(scopes)
        self.claims = claims or {}
        #: vhost -> (kind, exchange pattern, routing key pattern) of the scopes
        #: whose vhost pattern matches it, variables expanded.
        self._grants: dict[str, list[tuple[str, str, str]]] = {}

    def __call__(self, vhost: str, exchange: str) -> TopicPermission:
        grants = self._grants.get(vhost)
        if grants is None:
            grants = self._grants[vhost] = [
                (kind, name_pattern, key_pattern)
                for kind, vhost_pattern, name_pattern, key_pattern in (
                    g for g in map(_parse, expand(self.scopes, vhost, self.claims)) if g
                )
                if kind in (WRITE, READ)
                and key_pattern is not None
                and _matches(vhost_pattern, vhost)
            ]
        keys: dict[str, list[str]] = {WRITE: [], READ: []}
        for kind, name_pattern, key_pattern in grants:
            if _matches(name_pattern, exchange):
                keys[kind].append(wildcard_regex(key_pattern))
        return TopicPermission(write=_anchored(keys[WRITE]), read=_anchored(keys[READ]))


def topic_permissions_for(
    scopes: Iterable[str],
    topic_exchanges: Mapping[str, Iterable[str]],
    claims: Mapping[str, Any] | None = None,
) -> dict[str, dict[str, TopicPermission]]:
    """TopicScopes for the named exchanges at once: per vhost, per exchange."""
    resolve = TopicScopes(scopes, claims)
    result: dict[str, dict[str, TopicPermission]] = {}
    for vhost, exchanges in topic_exchanges.items():
        table = {exchange: resolve(vhost, exchange) for exchange in exchanges}
        if table:
            result[vhost] = table
    return result


def _anchored(patterns: list[str]) -> str:
    """One search pattern for whole routing keys; none: matches nothing."""
    if not patterns:
        return "(?!)"
    return r"\A(?s:" + "|".join(patterns) + r")\Z"


def token_user(token: Token, vhosts: Iterable[str]) -> User:
    """The user a token logs in as: not in the user store, gone with its
    connection. ``vhosts``: every vhost's name. Its topic permissions are
    worked out per exchange as they are checked (TopicScopes), from an empty
    table per vhost it may open, which makes every publish check them."""
    permissions = permissions_for(token.scopes, vhosts, token.claims)
    user = User(token.username, "", list(token.tags), permissions)
    user.topic_permissions = {vhost: {} for vhost in permissions}
    user.topic_resolver = TopicScopes(token.scopes, token.claims)
    user.expires_ms = token.expires_ms
    user.from_token = True
    return user
