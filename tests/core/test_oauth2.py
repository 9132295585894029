"""OAuth 2 access tokens as passwords (core/oauth2.py, ClientSession.login):
scopes to permissions and tags, the claims' checks on the broker's clock,
expiry closing the connection, connection.update-secret; in memory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import ChannelClosed, ConnectionClosed, Harness, channel_error
from oauth2help import FULL, SigningKey
from pamqp import commands

from warren.core.clock import ManualClock
from warren.core.oauth2 import (
    KeySet,
    OAuth2Settings,
    TokenRefused,
    TokenVerifier,
    expand,
    looks_like_jwt,
    permissions_for,
    topic_permissions_for,
)

KEY = SigningKey("key-1")
OTHER = SigningKey("key-2", "ec")


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Harness]:
    with Harness(
        tmp_path / "data",
        clock=ManualClock(),
        oauth2_resource_server_id="rabbitmq",
        oauth2_signing_keys=(KEY.write_pem(tmp_path), OTHER.write_pem(tmp_path)),
    ) as harness:
        yield harness


def now_s(h: Harness) -> int:
    return h.broker.clock.now_ms() // 1000


# -- scopes -----------------------------------------------------------------------------------
def test_scopes_map_to_permissions_per_vhost_with_rabbitmqs_wildcards() -> None:
    perms = permissions_for(
        ["configure:*/tmp-*", "write:prod/x", "read:prod/*", "read:%2F/a*b", "tag:monitoring"],
        ["/", "prod", "dev"],
    )
    assert set(perms) == {"/", "prod", "dev"}  # configure:*/... reaches every vhost
    prod = perms["prod"]
    assert prod.allows("configure", "tmp-1") and not prod.allows("configure", "q")
    assert prod.allows("write", "x") and not prod.allows("write", "xy")
    assert prod.allows("read", "anything")
    # %2F is "/" (URL-decoded, as RabbitMQ's wildcard parts are); a*b as a glob.
    assert perms["/"].allows("read", "a-b") and not perms["/"].allows("read", "ab-")
    assert not perms["dev"].allows("write", "x")  # no write scope for dev: nothing
    assert permissions_for(["read:prod/*"], ["/", "prod"]).keys() == {"prod"}
    assert permissions_for(["bogus", "read:novhost", "read:a/b/c/d"], ["/"]) == {}


def test_topic_scopes_allow_routing_keys_per_topic_exchange() -> None:
    scopes = ["write:*/amq.topic/sensors.*", "read:prod/amq.*/#", "write:*/*", "read:*/*"]
    topics = topic_permissions_for(scopes, {"/": ["amq.topic", "t2"], "prod": ["amq.topic"]})
    slash = topics["/"]["amq.topic"]
    assert slash.allows("write", "sensors.temp") and not slash.allows("write", "x.sensors.temp")
    assert not slash.allows("read", "anything")  # no read scope for "/": no key at all
    # A topic exchange no three-part scope names: no routing key (two-part scopes
    # grant no topic access, as rabbit_oauth2_scope:topic_access/4).
    assert not topics["/"]["t2"].allows("write", "sensors.temp")
    assert topics["prod"]["amq.topic"].allows("read", "#")
    assert not topics["prod"]["amq.topic"].allows("read", "a")


def test_scope_variables_vhost_and_claims() -> None:
    scopes = ["read:{vhost}/q-{sub}", "write:*/{client_id}", "write:*/{missing}"]
    claims = {"sub": "alice", "client_id": "app", "exp": 5}
    perms = permissions_for(scopes, ["/", "prod"], claims)
    assert perms["prod"].allows("read", "q-alice") and not perms["prod"].allows("read", "q-bob")
    assert perms["prod"].allows("write", "app") and perms["prod"].allows("write", "missing")
    assert expand(["read:*/{exp}"], "/", claims) == ["read:*/exp"]  # not a string: the name
    topics = topic_permissions_for(
        ["write:{vhost}/amq.topic/{sub}.*"], {"v": ["amq.topic"]}, claims
    )
    assert topics["v"]["amq.topic"].allows("write", "alice.x")


def test_regex_metacharacters_in_scopes_are_literal() -> None:
    perm = permissions_for(["read:*/a.b"], ["/"])["/"]
    assert perm.allows("read", "a.b") and not perm.allows("read", "axb")


def test_looks_like_jwt() -> None:
    assert looks_like_jwt(KEY.token(0))
    assert not looks_like_jwt("guest") and not looks_like_jwt("a.b") and not looks_like_jwt(None)


def verifier(now_ms: int, **settings: object) -> TokenVerifier:
    keys = KeySet(static={"key-1": KEY.private.public_key()})
    return TokenVerifier(OAuth2Settings("rabbitmq", **settings), keys, lambda: now_ms)  # type: ignore[arg-type]


def test_username_tags_and_additional_scopes() -> None:
    v = verifier(1_000_000, preferred_username_claims=("user_name",), additional_scopes_key="roles")
    token = v.verify(
        KEY.token(
            1000,
            ["tag:administrator", "read:*/*", "other.read:*/*"],
            user_name="bob",
            roles={"rabbitmq": ["write:*/q"]},
        )
    )
    assert token.username == "bob"
    assert token.tags == ["administrator"]
    # Another resource server's scopes are not ours; the map entry gets the prefix.
    assert token.scopes == ["read:*/*", "tag:administrator", "write:*/q"]
    assert token.expires_ms == (1000 + 3600) * 1000
    assert v.verify(KEY.token(1000, "rabbitmq.read:*/* rabbitmq.tag:x")).tags == ["x"]
    # sub, then client_id, when the preferred claims are missing.
    assert v.verify(KEY.token(1000, FULL, sub="svc")).username == "svc"


@pytest.mark.parametrize(
    ("token", "why"),
    [
        (lambda: KEY.token(1000, FULL, lifetime=-1), "expired"),
        (lambda: KEY.token(1000, FULL, nbf=1100), "not valid before"),
        (lambda: KEY.token(1000, FULL, aud="other"), "invalid_aud"),
        (lambda: KEY.token(1000, FULL, aud=None), "invalid_aud"),
        (lambda: KEY.token(1000, FULL, exp=None), "no exp"),
        (lambda: KEY.token(1000, FULL, kid="nope"), "unknown signing key"),
        (lambda: OTHER.token(1000, FULL, kid="key-1"), "invalid"),
        (lambda: KEY.token(1000, FULL)[:-4] + "AAAA", "signature_invalid"),
    ],
)
def test_refused_tokens(token: object, why: str) -> None:
    with pytest.raises(TokenRefused, match=why):
        verifier(1_000_000).verify(token())  # type: ignore[operator]


def test_issuer_and_verify_aud_settings() -> None:
    v = verifier(1_000_000, issuer="https://idp", verify_aud=False)
    assert v.verify(KEY.token(1000, FULL, aud="x", iss="https://idp")).username == "alice"
    with pytest.raises(TokenRefused, match="issuer"):
        v.verify(KEY.token(1000, FULL, iss="https://evil"))


# -- logins over AMQP 0-9-1, in memory --------------------------------------------------------
def test_token_logs_in_with_its_scopes_as_permissions(broker: Harness) -> None:
    token = KEY.token(now_s(broker), ["configure:*/q-*", "write:*/*", "read:*/q-*"])
    conn = broker.amqp_connection("ignored", token)
    ch = conn.channel()
    ch.queue_declare("q-1")
    assert "refused for user 'alice'" in _refused(lambda: conn.channel().queue_declare("other"))
    assert broker.broker.users.users.keys() == {"guest"}  # never stored
    conn.close()


def _refused(fn: object) -> str:
    with pytest.raises(ChannelClosed) as info:
        fn()  # type: ignore[operator]
    assert info.value.reply_code == 403
    return info.value.reply_text


def test_topic_exchanges_need_routing_key_scopes(broker: Harness) -> None:
    t = now_s(broker)
    conn = broker.amqp_connection("", KEY.token(t, [*FULL, "write:*/amq.topic/ok.*"]))
    ch = conn.channel()
    ch.confirm_delivery()  # a refused publish raises
    ch.basic_publish("amq.topic", "ok.1", b"x")
    ch.basic_publish("amq.direct", "any", b"x")  # not a topic exchange: no topic check
    text = channel_error(403, ch.basic_publish, "amq.topic", "no.1", b"x")
    assert text.startswith("ACCESS_REFUSED - access to topic 'no.1' in exchange 'amq.topic'")


def test_token_without_access_to_the_vhost_is_refused(broker: Harness) -> None:
    token = KEY.token(now_s(broker), ["read:prod/*"])
    with pytest.raises(ConnectionClosed) as info:
        broker.amqp_connection("", token)
    assert info.value.reply_code == 530


@pytest.mark.parametrize("kind", ["expired", "not yet valid", "wrong aud", "bad signature"])
def test_bad_tokens_are_refused_like_bad_passwords(broker: Harness, kind: str) -> None:
    t = now_s(broker)
    token = {
        "expired": lambda: KEY.token(t - 7200, FULL),
        "not yet valid": lambda: KEY.token(t, FULL, nbf=t + 60),
        "wrong aud": lambda: KEY.token(t, FULL, aud="other"),
        "bad signature": lambda: OTHER.token(t, FULL, kid="key-1"),
    }[kind]()
    with pytest.raises(ConnectionClosed) as info:
        broker.amqp_connection("alice", token)
    assert info.value.reply_code == 403


def test_internal_users_still_log_in_after_oauth2(broker: Harness) -> None:
    broker.amqp_connection("guest", "guest").close()


def test_connection_closes_when_its_token_expires(broker: Harness) -> None:
    conn = broker.amqp_connection("", KEY.token(now_s(broker), FULL, lifetime=60))
    conn.channel()
    broker.advance(59_000)
    assert conn.closed is None
    broker.advance(1_000)
    closed = conn.frames.expect_method(commands.Connection.Close)
    assert closed.reply_code == 320
    assert closed.reply_text == "CONNECTION_FORCED - credential expired"


def test_update_secret_replaces_the_token(broker: Harness) -> None:
    t = now_s(broker)
    conn = broker.amqp_connection("", KEY.token(t, ["read:*/*"], lifetime=60))
    frames = conn.frames
    new = KEY.token(t, FULL, lifetime=600)
    frames.send_method(0, commands.Connection.UpdateSecret(new_secret=new, reason="refresh"))
    frames.expect_method(commands.Connection.UpdateSecretOk)
    conn.channel().queue_declare("now-allowed")  # the new token's configure scope
    broker.advance(120_000)  # past the first token's expiry: still open
    conn.channel()
    broker.advance(480_000)
    assert frames.expect_method(commands.Connection.Close).reply_code == 320


def test_update_secret_refuses_another_user(broker: Harness) -> None:
    t = now_s(broker)
    conn = broker.amqp_connection("", KEY.token(t, FULL))
    other = KEY.token(t, FULL, sub="mallory")
    conn.frames.send_method(0, commands.Connection.UpdateSecret(new_secret=other, reason="x"))
    closed = conn.frames.expect_method(commands.Connection.Close)
    assert (closed.reply_code, closed.reply_text) == (
        530,
        "NOT_ALLOWED - New secret was refused by one of the backends",
    )


# -- the management API: Authorization: Bearer ----------------------------------------------
def bearer(h: Harness, path: str, token: str, method: str = "GET") -> object:
    return h.http().request(method, path, headers={"Authorization": f"Bearer {token}"})


def test_http_bearer_token_tags_decide_as_for_internal_users(broker: Harness) -> None:
    t = now_s(broker)
    admin = KEY.token(t, [*FULL, "tag:administrator"], sub="root")
    reply = bearer(broker, "/api/whoami", admin)
    assert reply.status == 200, reply  # type: ignore[attr-defined]
    assert reply.json() == {"name": "root", "tags": ["administrator"]}  # type: ignore[attr-defined]
    assert bearer(broker, "/api/users", admin).status == 200  # type: ignore[attr-defined]
    # management may look at its own vhosts, not at users.
    mgmt = KEY.token(t, [*FULL, "tag:management"])
    assert bearer(broker, "/api/queues", mgmt).status == 200  # type: ignore[attr-defined]
    refused = bearer(broker, "/api/users", mgmt)
    assert refused.status == 401  # type: ignore[attr-defined]
    assert refused.json()["reason"] == "Not administrator user"  # type: ignore[attr-defined]
    # No tag: no management API at all, as for an internal user without tags.
    assert bearer(broker, "/api/overview", KEY.token(t, FULL)).status == 401  # type: ignore[attr-defined]


def test_http_bearer_bad_tokens_are_401(broker: Harness) -> None:
    t = now_s(broker)
    for token in (
        KEY.token(t - 7200, ["tag:administrator"]),
        KEY.token(t, ["tag:administrator"], aud="x"),
        "not-a-token",
    ):
        assert bearer(broker, "/api/overview", token).status == 401  # type: ignore[attr-defined]


# -- the stream protocol: SaslAuthenticate, re-authentication, expiry -----------------------
def test_stream_token_login_reauthentication_and_expiry(broker: Harness) -> None:
    from harness.stream import MemoryStream, split_frames
    from rstream import encoding, schema

    t = now_s(broker)
    client = MemoryStream(broker)
    opened = client.open("any", KEY.token(t, FULL, lifetime=60), heartbeat=0)  # no heartbeats
    assert opened.response_code == 1
    assert client.conn.user is not None and client.conn.user.name == "alice"

    def reauth(token: str) -> int:
        auth = b"\0any\0" + token.encode()
        return client.request(
            schema.SaslAuthenticate(client.next_id(), "PLAIN", auth)
        ).response_code

    assert reauth(KEY.token(t, FULL, lifetime=600)) == 1  # a new token: taken
    broker.advance(120_000)  # past the first token's expiry, within the second's
    client.take()
    assert not client.close_asked
    broker.advance(480_000)  # the broker closes it, as an operator's close
    closes = [encoding.decode_frame(f) for f in split_frames(client.take())]
    assert [type(f) for f in closes] == [schema.Close], closes
    assert closes[0].reason == "credential expired"
    # A token of another user is refused, and the refusal ends the connection.
    client = MemoryStream(broker)
    assert client.open("any", KEY.token(t, FULL), heartbeat=0).response_code == 1
    assert reauth(KEY.token(t, FULL, sub="mallory")) == 8
    assert client.close_asked


# -- the chain and the INI section -----------------------------------------------------------
@pytest.mark.parametrize("backends", [("internal",), ("oauth2",)])
def test_auth_backends_chooses_who_may_log_in(tmp_path: Path, backends: tuple[str, ...]) -> None:
    with Harness(
        tmp_path / "data",
        auth_backends=backends,
        oauth2_resource_server_id="rabbitmq",
        oauth2_signing_keys=(KEY.write_pem(tmp_path),),
    ) as h:
        token = KEY.token(now_s(h), FULL)
        for user, password, allowed in (("", token, "oauth2"), ("guest", "guest", "internal")):
            if allowed in backends:
                h.amqp_connection(user, password).close()
            else:
                with pytest.raises(ConnectionClosed):
                    h.amqp_connection(user, password)


def test_the_oauth2_ini_section(tmp_path: Path) -> None:
    from warren.config import Config, ConfigError

    ini = tmp_path / "w.ini"
    ini.write_text(
        "[main]\nauth_backends = oauth2, internal\n"
        "[oauth2]\nresource_server_id = rabbitmq\n"
        "signing_keys = k1:/etc/k1.pem, k2:/etc/k2.pem\n"
        "preferred_username_claims = user_name, email\nverify_aud = false\n"
    )
    config = Config.from_ini(ini)
    assert config.oauth2_signing_keys == ("k1:/etc/k1.pem", "k2:/etc/k2.pem")
    assert config.oauth2_preferred_username_claims == ("user_name", "email")
    assert config.oauth2_verify_aud is False
    ini.write_text("[main]\nauth_backends = ldap\n")
    with pytest.raises(ConfigError, match="auth_backends"):
        Config.from_ini(ini)


# -- AMQP 1.0: RabbitMQ 4's PUT /auth/tokens on the /management node -------------------------
def test_amqp1_auth_tokens_replaces_the_token(broker: Harness) -> None:
    from harness.management_node import NodePair

    from warren.amqp1.errors import ConnectionError_
    from warren.amqp1.management_node import ManagementError

    t = now_s(broker)
    pair = NodePair(broker, "", KEY.token(t, ["read:*/*"], lifetime=60))
    with pytest.raises(ManagementError, match="configure access"):
        pair.status("PUT", "/queues/q", {})
    pair = NodePair(broker, "", KEY.token(t, ["read:*/*"], lifetime=60))
    assert pair.status("PUT", "/auth/tokens", KEY.token(t, FULL).encode())[0] == "204"
    assert pair.status("PUT", "/queues/q", {})[0] == "201"  # the new token's configure scope
    with pytest.raises(ConnectionError_, match="credential update failed"):
        pair.status("PUT", "/auth/tokens", KEY.token(t, FULL, sub="mallory").encode())
    assert pair.status("PUT", "/auth/tokens", "text")[0] == "400"
