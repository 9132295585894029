"""``require_exp = false`` (RabbitMQ 4): a token without ``exp`` logs in and
lasts as long as its connection, yet stays a token's user, so a refresh
(update-secret) must bring a token again, and one with ``exp`` arms the
expiry; in memory, on AMQP 0-9-1 and the management API."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import Harness
from oauth2help import FULL, SigningKey
from pamqp import commands

from warren.config import Config, ConfigError
from warren.config_oauth2 import OAuth2Extra
from warren.core.clock import ManualClock
from warren.core.oauth2 import KeySet, OAuth2Settings, TokenRefused, TokenVerifier

KEY = SigningKey("key-1")


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Harness]:
    with Harness(
        tmp_path / "data",
        clock=ManualClock(),
        oauth2_resource_server_id="rabbitmq",
        oauth2_signing_keys=(KEY.write_pem(tmp_path),),
        oauth2_extra=OAuth2Extra(require_exp=False),
    ) as harness:
        yield harness


def now_s(h: Harness) -> int:
    return h.broker.clock.now_ms() // 1000


def test_the_verifier_takes_a_token_without_exp_only_when_told() -> None:
    keys = KeySet(static={"key-1": KEY.private.public_key()})
    token = KEY.token(1000, FULL, exp=None)
    strict = TokenVerifier(OAuth2Settings("rabbitmq"), keys, lambda: 1_000_000)
    with pytest.raises(TokenRefused, match="no exp claim"):
        strict.verify(token)
    lax = TokenVerifier(OAuth2Settings("rabbitmq", require_exp=False), keys, lambda: 1_000_000)
    assert lax.verify(token).expires_ms is None
    # An exp that is there is still checked.
    with pytest.raises(TokenRefused, match="expired"):
        lax.verify(KEY.token(0, FULL, lifetime=10))
    with pytest.raises(TokenRefused, match="not a number"):
        lax.verify(KEY.token(1000, FULL, exp="soon"))


def test_a_token_without_exp_keeps_its_connection_open(broker: Harness) -> None:
    conn = broker.amqp_connection("", KEY.token(now_s(broker), FULL, exp=None))
    conn.channel().queue_declare("q")
    broker.advance(10 * 86_400_000)
    assert conn.closed is None
    conn.channel()


def test_update_secret_on_a_token_without_exp_still_checks_the_new_token(
    broker: Harness,
) -> None:
    t = now_s(broker)
    conn = broker.amqp_connection("", KEY.token(t, ["read:*/*"], exp=None))
    frames = conn.frames
    # Not a token: refused (an internal user's update-secret would be accepted).
    frames.send_method(0, commands.Connection.UpdateSecret(new_secret="guest", reason="x"))
    closed = frames.expect_method(commands.Connection.Close)
    assert (closed.reply_code, closed.reply_text) == (
        530,
        "NOT_ALLOWED - New secret was refused by one of the backends",
    )
    # Another user's token: refused too.
    conn = broker.amqp_connection("", KEY.token(t, ["read:*/*"], exp=None))
    other = KEY.token(t, FULL, sub="mallory", exp=None)
    conn.frames.send_method(0, commands.Connection.UpdateSecret(new_secret=other, reason="x"))
    assert conn.frames.expect_method(commands.Connection.Close).reply_code == 530


def test_update_secret_with_an_exp_arms_the_expiry(broker: Harness) -> None:
    t = now_s(broker)
    conn = broker.amqp_connection("", KEY.token(t, ["read:*/*"], exp=None))
    frames = conn.frames
    frames.send_method(
        0, commands.Connection.UpdateSecret(new_secret=KEY.token(t, FULL, lifetime=60), reason="")
    )
    frames.expect_method(commands.Connection.UpdateSecretOk)
    conn.channel().queue_declare("now-allowed")  # the new token's scopes
    broker.advance(59_000)
    assert conn.closed is None
    broker.advance(1_000)
    closed = frames.expect_method(commands.Connection.Close)
    assert (closed.reply_code, closed.reply_text) == (320, "CONNECTION_FORCED - credential expired")


def test_update_secret_without_exp_disarms_the_expiry(broker: Harness) -> None:
    t = now_s(broker)
    conn = broker.amqp_connection("", KEY.token(t, FULL, lifetime=60))
    frames = conn.frames
    new = KEY.token(t, FULL, exp=None)
    frames.send_method(0, commands.Connection.UpdateSecret(new_secret=new, reason=""))
    frames.expect_method(commands.Connection.UpdateSecretOk)
    broker.advance(3_600_000)
    assert conn.closed is None
    conn.channel()


def test_internal_users_update_secret_as_before(broker: Harness) -> None:
    conn = broker.amqp_connection("guest", "guest")
    conn.frames.send_method(0, commands.Connection.UpdateSecret(new_secret="x", reason=""))
    conn.frames.expect_method(commands.Connection.UpdateSecretOk)


def test_http_bearer_token_without_exp(broker: Harness, tmp_path: Path) -> None:
    token = KEY.token(now_s(broker), [*FULL, "tag:administrator"], sub="root", exp=None)
    reply = broker.http().request(
        "GET", "/api/whoami", headers={"Authorization": f"Bearer {token}"}
    )
    assert reply.status == 200, reply
    assert reply.json() == {"name": "root", "tags": ["administrator"]}


def test_http_refuses_it_with_require_exp_on(tmp_path: Path) -> None:
    with Harness(
        tmp_path / "data",
        clock=ManualClock(),
        oauth2_resource_server_id="rabbitmq",
        oauth2_signing_keys=(KEY.write_pem(tmp_path),),
    ) as broker:
        token = KEY.token(now_s(broker), [*FULL, "tag:administrator"], exp=None)
        reply = broker.http().request(
            "GET", "/api/whoami", headers={"Authorization": f"Bearer {token}"}
        )
        assert reply.status == 401


def test_require_exp_settings(tmp_path: Path) -> None:
    ini = tmp_path / "warren.ini"
    ini.write_text(
        "[oauth2]\nresource_server_id = rabbitmq\nrequire_exp = false\n"
        "resource_servers.billing.require_exp = true\n"
    )
    config = Config()
    config.apply_ini(str(ini))
    extra = config.oauth2_extra
    assert extra.require_exp is False
    assert extra.resource_servers[0].require_exp is True
    ini.write_text("[oauth2]\nresource_server_id = rabbitmq\nrequire_exp = maybe\n")
    with pytest.raises(ConfigError, match="require_exp"):
        Config().apply_ini(str(ini))


def test_a_resource_server_inherits_require_exp_or_sets_its_own(tmp_path: Path) -> None:
    from warren.oauth2_backend import OAuth2Backend

    ini = tmp_path / "warren.ini"
    ini.write_text(
        f"[oauth2]\nresource_server_id = rabbitmq\nrequire_exp = false\n"
        f"signing_keys = {KEY.write_pem(tmp_path)}\n"
        "resource_servers.billing.require_exp = true\nresource_servers.other.scope_prefix = o.\n"
    )
    backend = OAuth2Backend(Config.from_ini(str(ini)), ManualClock())
    by_id = {s.resource_server_id: s.require_exp for s in backend.verifier.servers}
    assert by_id == {"rabbitmq": False, "billing": True, "other": False}
