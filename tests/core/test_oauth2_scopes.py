"""OAuth 2 beyond one resource server's plain scopes (issue 33), as RabbitMQ's
rabbitmq_auth_backend_oauth2: scope aliases, extra scope claims, the scope
prefix, rich authorization requests, HMAC keys, several resource servers, the
dotted [oauth2] settings; tokens signed by PyJWT, logins in memory."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jwt
import pytest
from harness import ChannelClosed, ConnectionClosed, Harness
from oauth2help import FULL, SigningKey

from warren.config import Config, ConfigError
from warren.config_oauth2 import OAuth2Extra, ResourceServer
from warren.core.clock import ManualClock
from warren.core.oauth2 import KeySet, OAuth2Settings, TokenRefused, TokenVerifier, load_key
from warren.core.oauth2_rar import rar_scopes

KEY = SigningKey("key-1")
OTHER = SigningKey("key-2", "ec")
NOW = 1_000_000


def verifier(*others: OAuth2Settings, **settings: Any) -> TokenVerifier:
    keys = KeySet(static={"key-1": KEY.private.public_key()})
    root = OAuth2Settings(settings.pop("resource_server_id", "rabbitmq"), **settings)
    return TokenVerifier(root, keys, lambda: NOW * 1000, others)


def now_s(h: Harness) -> int:
    return h.broker.clock.now_ms() // 1000


# -- scope aliases, extra scopes, prefix ------------------------------------------------------
def test_scope_aliases_stand_for_their_scopes() -> None:
    aliases = {
        "admin": ("rabbitmq.tag:administrator", "rabbitmq.configure:*/*", "rabbitmq.read:*/*"),
        "producer": ("rabbitmq.write:*/*",),
        "elsewhere": ("other.read:*/*",),  # another resource server's: dropped by the prefix
    }
    v = verifier(scope_aliases=aliases, additional_scopes_key="realm_access.roles")
    token = v.verify(KEY.token(NOW, "admin elsewhere", realm_access={"roles": ["producer"]}))
    assert token.scopes == ["configure:*/*", "read:*/*", "tag:administrator", "write:*/*"]
    assert token.tags == ["administrator"]
    # An alias is matched as the token writes its scope: "rabbitmq.admin" is not "admin".
    assert v.verify(KEY.token(NOW, "rabbitmq.admin")).tags == []


def test_extra_scopes_requesting_party_token_and_prefix() -> None:
    # Keycloak's requesting party token keeps scopes in authorization.permissions[].scopes:
    # read whatever additional_scopes_key says, as RabbitMQ does.
    rpt = {"permissions": [{"scopes": ["rabbitmq.read:*/q"]}, {"scopes": "rabbitmq.write:*/q"}]}
    assert verifier().verify(KEY.token(NOW, "", authorization=rpt)).scopes == [
        "read:*/q",
        "write:*/q",
    ]
    # An explicit prefix replaces "<id>.": scopes without it are not ours.
    v = verifier(scope_prefix="rmq/", additional_scopes_key="groups")
    token = v.verify(KEY.token(NOW, "rmq/read:*/* rabbitmq.write:*/*", groups="rmq/tag:x"))
    assert token.scopes == ["read:*/*", "tag:x"]


def test_ini_extra_scopes_source_aliases_and_dotted_signing_keys(tmp_path: Path) -> None:
    ini = tmp_path / "w.ini"
    ini.write_text(
        "[oauth2]\nresource_server_id = rabbitmq\n"
        "extra_scopes_source = roles\n"
        "resource_server_type = rabbitmq-type\n"
        "scope_aliases.admin = rabbitmq.tag:administrator rabbitmq.read:*/*\n"
        "scope_aliases.1.alias = Role-With-Caps\n"
        "scope_aliases.1.scope = rabbitmq.write:*/*\n"
        "signing_keys.k3 = /etc/k3.pem\n"
        "https.cacertfile = /etc/ca.pem\n"
        "https.peer_verification = verify_peer\n"
        "https.hostname_verification = none\n"
    )
    extra = Config.from_ini(ini).oauth2_extra
    assert extra.extra_scopes_source == "roles"
    assert extra.resource_server_type == "rabbitmq-type"
    assert extra.scope_aliases == {
        "admin": ("rabbitmq.tag:administrator", "rabbitmq.read:*/*"),
        "Role-With-Caps": ("rabbitmq.write:*/*",),  # the indexed form keeps the case
    }
    assert extra.signing_keys == ("k3:/etc/k3.pem",)
    assert extra.https_cacertfile == "/etc/ca.pem"
    assert extra.https_peer_verification and not extra.https_hostname_verification


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("https.peer_verification = yes", "verify_peer or verify_none"),
        ("scope_aliases.1.alias = a", "needs both alias and scope"),
        ("resource_servers.x.colour = red", "unknown resource server setting"),
        ("resource_servers.x = y", "resource_servers.<name>.<setting>"),
        ("resource_servers.x.verify_aud = maybe", "not a boolean"),
        ("https.bogus = 1", "unknown setting"),
    ],
)
def test_ini_dotted_oauth2_errors_name_the_line(tmp_path: Path, line: str, why: str) -> None:
    ini = tmp_path / "w.ini"
    ini.write_text(f"[oauth2]\nresource_server_id = rabbitmq\n{line}\n")
    with pytest.raises(ConfigError, match=why) as info:
        Config.from_ini(ini)
    assert str(info.value).startswith(f"{ini}:3: [oauth2]")


# -- rich authorization requests --------------------------------------------------------------
DETAILS = [
    {
        "type": "rabbitmq-type",
        "locations": ["cluster:rabbit*/vhost:prod/queue:q-*", "cluster:rabbitmq/vhost:dev"],
        "actions": ["read", "configure", "administrator", "fly"],
    },
    {
        "type": "rabbitmq-type",
        "locations": "cluster:rabbitmq/exchange:x/routing-key:a.*",
        "actions": "write",
    },
    # Not for us: another type, another cluster, queue and exchange that differ.
    {"type": "other", "locations": ["cluster:rabbitmq"], "actions": ["write"]},
    {"type": "rabbitmq-type", "locations": ["cluster:elsewhere"], "actions": ["write"]},
    {
        "type": "rabbitmq-type",
        "locations": ["cluster:rabbitmq/queue:a/exchange:b"],
        "actions": ["write"],
    },
    {"type": "rabbitmq-type", "actions": ["write"]},  # no locations
]


def test_rar_details_as_rabbitmq_maps_them() -> None:
    scopes = rar_scopes({"authorization_details": DETAILS}, "rabbitmq", "rabbitmq-type")
    assert sorted(scopes) == [
        "rabbitmq.configure:dev/*/*",
        "rabbitmq.configure:prod/q-*/*",
        "rabbitmq.read:dev/*/*",
        "rabbitmq.read:prod/q-*/*",
        "rabbitmq.tag:administrator",
        "rabbitmq.write:*/x/a.*",
    ]
    # Without a resource_server_type, the claim is not read.
    assert rar_scopes({"authorization_details": DETAILS}, "rabbitmq", None) == []


@pytest.mark.parametrize(
    ("location", "scope"),
    [
        ("cluster:rabbitmq/queue:inv/vhost:fin/routing-key:r-*", "read:fin/inv/r-*"),  # any order
        ("cluster:rabbitmq//routing-key:r-*", "read:*/*/r-*"),  # empty parts skipped
        ("cluster:rabbitmq/queue:/vhost:/routing-key:r-*", "read:*/*/r-*"),  # empty values: *
        ("prefix/cluster:rabbitmq/colour:red/exchange:x", "read:*/x/*"),  # not key:value, unknown
        ("cluster:rabbitmq/queue:*/exchange:*", "read:*/*/*"),  # both, the same value
        ("cluster:rabbitmq/vhost:^fin-*", "read:^fin-*/*/*"),  # taken as written
        ("cluster:^rabbitmq$", None),  # the cluster is a wildcard pattern, not a regex
        ("cluster:rabbitmq-*", None),
        ("vhost:a", None),  # no cluster: not ours
    ],
)
def test_rar_locations(location: str, scope: str | None) -> None:
    details = [{"type": "t", "locations": [location], "actions": ["read", ""]}]
    got = rar_scopes({"authorization_details": details}, "rabbitmq", "t")
    assert got == ([f"rabbitmq.{scope}"] if scope else [])


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Harness]:
    with Harness(
        tmp_path / "data",
        clock=ManualClock(),
        oauth2_resource_server_id="rabbitmq",
        oauth2_signing_keys=(KEY.write_pem(tmp_path),),
        oauth2_extra=OAuth2Extra(resource_server_type="rabbitmq-type"),
    ) as harness:
        yield harness


def test_rar_token_logs_in_with_its_permissions(broker: Harness) -> None:
    details = [
        {
            "type": "rabbitmq-type",
            "locations": ["cluster:rabbitmq/vhost:%2F/queue:q-*"],
            "actions": ["configure", "read", "management"],
        },
        {"type": "rabbitmq-type", "locations": ["cluster:rabbitmq"], "actions": ["write"]},
    ]
    token = KEY.token(now_s(broker), "", authorization_details=details)
    conn = broker.amqp_connection("", token)
    conn.channel().queue_declare("q-1")
    with pytest.raises(ChannelClosed) as info:
        conn.channel().queue_declare("other")
    assert info.value.reply_code == 403
    reply = broker.http().request(
        "GET", "/api/whoami", headers={"Authorization": f"Bearer {token}"}
    )
    assert reply.status == 200 and reply.json()["tags"] == ["management"]
    conn.close()


# -- HMAC keys --------------------------------------------------------------------------------
SECRET = b"a secret shared with the identity provider, at least 64 bytes long: HS512 too"


def hmac_token(kid: str, now: int, scopes: str, alg: str = "HS256", **claims: Any) -> str:
    payload = {"sub": "svc", "aud": "rabbitmq", "exp": now + 3600, "scope": scopes, **claims}
    return jwt.encode(payload, SECRET, algorithm=alg, headers={"kid": kid})


def write_jwk(path: Path, jwk: dict[str, Any]) -> str:
    path.write_text(json.dumps(jwk))
    return str(path)


def test_hmac_keys_from_jwk_files(tmp_path: Path) -> None:
    k = base64.urlsafe_b64encode(SECRET).rstrip(b"=").decode()
    oct_file = write_jwk(tmp_path / "oct.json", {"kty": "oct", "k": k, "alg": "HS256"})
    # UAA's form: the secret as text, its algorithm name.
    mac_file = write_jwk(
        tmp_path / "mac.json", {"kty": "MAC", "value": SECRET.decode(), "alg": "HMACSHA256"}
    )
    rsa_pem = KEY.write_pem(tmp_path)
    with Harness(
        tmp_path / "data",
        clock=ManualClock(),
        oauth2_resource_server_id="rabbitmq",
        oauth2_signing_keys=(f"hmac-1:{oct_file}", rsa_pem),
        oauth2_extra=OAuth2Extra(signing_keys=(f"uaa-key:{mac_file}",)),
    ) as h:
        t = now_s(h)
        full = "rabbitmq.configure:*/* rabbitmq.write:*/* rabbitmq.read:*/*"
        for kid in ("hmac-1", "uaa-key"):
            conn = h.amqp_connection("", hmac_token(kid, t, full))
            conn.channel().queue_declare("q")
            conn.close()
        verify = h.broker.oauth2.verifier.verify  # type: ignore[union-attr]
        # An HMAC key checks its own algorithm only...
        with pytest.raises(TokenRefused, match="invalid"):
            verify(hmac_token("hmac-1", t, full, alg="HS512"))
        # ...and a public key is never an HMAC secret (algorithm confusion).
        with pytest.raises(TokenRefused):
            verify(_forged(t, full))
        with pytest.raises(ConnectionClosed):
            h.amqp_connection("", hmac_token("hmac-1", t, full).replace(".", ".x", 1))


def _forged(now: int, scope: str) -> str:
    """HS256 with the RSA public key's PEM as the secret (PyJWT refuses to
    sign so, so the signature is made by hand)."""
    import hashlib
    import hmac

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    header = b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": "key-1"}).encode())
    body = b64(
        json.dumps({"sub": "x", "aud": "rabbitmq", "exp": now + 60, "scope": scope}).encode()
    )
    mac = hmac.new(KEY.pem(), f"{header}.{body}".encode(), hashlib.sha256).digest()
    return f"{header}.{body}.{b64(mac)}"


def test_a_jwks_never_brings_an_hmac_secret() -> None:
    keys = KeySet()
    k = base64.urlsafe_b64encode(SECRET).rstrip(b"=").decode()
    count = keys.load_jwks({"keys": [{"kty": "oct", "k": k, "kid": "s"}, KEY.jwk()]})
    assert count == 1 and set(keys.fetched) == {"key-1"}


def test_bad_key_files_are_refused() -> None:
    with pytest.raises(ValueError, match="JWK"):
        load_key(b"{not json")
    with pytest.raises(ValueError, match="MAC key needs a value"):
        load_key(b'{"kty": "MAC"}')


# -- several resource servers -----------------------------------------------------------------
def test_the_tokens_aud_picks_the_resource_server(tmp_path: Path) -> None:
    ini = tmp_path / "w.ini"
    ini.write_text(
        "[oauth2]\nresource_server_id = rabbitmq\n"
        f"signing_keys = {KEY.write_pem(tmp_path)}\n"
        "resource_servers.billing.id = Billing-API\n"
        "resource_servers.billing.scope_prefix = bill:\n"
        f"resource_servers.billing.signing_keys = {OTHER.write_pem(tmp_path)}\n"
        "resource_servers.billing.preferred_username_claims = user_name\n"
        "resource_servers.audit.verify_aud = false\n"
        "resource_servers.audit.scope_aliases.ro = audit.read:*/*\n"
    )
    config = Config.from_ini(ini)
    assert config.oauth2_extra.resource_servers[1] == ResourceServer(
        id="Billing-API",
        scope_prefix="bill:",
        signing_keys=(f"key-2:{tmp_path / 'key-2.pem'}",),
        preferred_username_claims=("user_name",),
    )
    from warren.oauth2_backend import OAuth2Backend

    clock = ManualClock()
    verify = OAuth2Backend(config, clock).verifier.verify
    t = clock.now_ms() // 1000
    # The root: its keys, its prefix.
    assert verify(KEY.token(t, "rabbitmq.read:*/* bill:write:*/*")).scopes == ["read:*/*"]
    # Billing-API: its own key and prefix; the root's key is not one of its own.
    billing = verify(
        OTHER.token(t, "bill:write:*/* rabbitmq.read:*/*", aud="Billing-API", user_name="b")
    )
    assert (billing.username, billing.scopes) == ("b", ["write:*/*"])
    with pytest.raises(TokenRefused, match="unknown signing key id 'key-1'"):
        verify(KEY.token(t, FULL, aud="Billing-API"))
    # A token for two of them is refused; one for none goes to the only one
    # that does not verify aud (audit: the root's keys, its "audit." prefix).
    with pytest.raises(TokenRefused, match="aud_matched_many"):
        verify(KEY.token(t, FULL, aud=["rabbitmq", "Billing-API"]))
    assert verify(KEY.token(t, "ro", aud="elsewhere")).scopes == ["read:*/*"]
    assert verify(KEY.token(t, "ro", aud=None)).scopes == ["read:*/*"]
    # A space-separated aud string names several, as RabbitMQ reads it.
    assert verify(KEY.token(t, "rabbitmq.read:*/*", aud="x rabbitmq")).scopes == ["read:*/*"]


def test_aud_resolution_errors() -> None:
    lax1 = OAuth2Settings("a", verify_aud=False)
    lax2 = OAuth2Settings("b", verify_aud=False)
    with pytest.raises(TokenRefused, match="too_many_resources_with_verify_aud_false"):
        verifier(lax1, lax2).verify(KEY.token(NOW, FULL, aud="x"))
    with pytest.raises(TokenRefused, match="no_matching_aud_found"):
        verifier().verify(KEY.token(NOW, FULL, aud="x"))


def test_resource_servers_only_no_root_id(tmp_path: Path) -> None:
    with Harness(
        tmp_path / "data",
        clock=ManualClock(),
        oauth2_extra=OAuth2Extra(
            resource_servers=(ResourceServer(id="mq", signing_keys=(KEY.write_pem(tmp_path),)),)
        ),
    ) as h:
        token = KEY.token(now_s(h), "mq.configure:*/* mq.read:*/* mq.write:*/*", aud="mq")
        h.amqp_connection("", token).channel().queue_declare("q")
        with pytest.raises(ConnectionClosed):
            h.amqp_connection("", KEY.token(now_s(h), FULL))  # aud rabbitmq: nobody's


# -- algorithms -------------------------------------------------------------------------------
def test_algorithms_restrict_what_keys_verify(tmp_path: Path) -> None:
    payload = {"sub": "a", "aud": "rabbitmq", "exp": NOW + 60, "scope": "rabbitmq.read:*/*"}
    pss = jwt.encode(payload, KEY.private, algorithm="PS256", headers={"kid": "key-1"})
    assert verifier().verify(pss).scopes == ["read:*/*"]  # any the RSA key allows
    with pytest.raises(TokenRefused, match="alg value is not allowed"):
        verifier(algorithms=("RS256",)).verify(pss)
    assert verifier(algorithms=("RS256",)).verify(KEY.token(NOW, "rabbitmq.read:*/*")).username
    with pytest.raises(TokenRefused, match="none of the allowed algorithms"):
        verifier(algorithms=("HS256",)).verify(pss)
    ini = tmp_path / "w.ini"
    ini.write_text(
        "[oauth2]\nresource_server_id = rabbitmq\nalgorithms.1 = RS256\nalgorithms.2 = ES256\n"
        "oauth_providers.p.algorithms = HS256, HS512\n"
    )
    extra = Config.from_ini(ini).oauth2_extra
    assert extra.algorithms == ("RS256", "ES256")
    assert extra.oauth_providers[0].algorithms == ("HS256", "HS512")
    ini.write_text("[oauth2]\nresource_server_id = rabbitmq\nalgorithms = none\n")
    with pytest.raises(ConfigError, match="known algorithms"):
        Config.from_ini(ini)


def test_a_resource_server_may_not_repeat_the_root_id(tmp_path: Path) -> None:
    from warren.oauth2_backend import OAuth2Backend

    config = Config(
        oauth2_resource_server_id="rabbitmq",
        oauth2_signing_keys=(KEY.write_pem(tmp_path),),
        oauth2_extra=OAuth2Extra(resource_servers=(ResourceServer(id="rabbitmq"),)),
    )
    with pytest.raises(ConfigError, match="the id of resource_server_id"):
        OAuth2Backend(config, ManualClock())
