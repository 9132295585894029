"""LavinMQ's ``[oauth]`` section (config_oauth2.from_lavinmq): a LavinMQ 2.7+
config file, written as LavinMQ's docs show it, sets the [oauth2] settings that
do the same; its broker logs in the tokens LavinMQ would, with the keys found
by OpenID discovery from its issuer (a local provider, tests/oauth2help.py)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from oauth2help import SigningKey, jwks, serve_idp

from warren.config import Config, ConfigError
from warren.core.clock import ManualClock
from warren.core.oauth2 import TokenRefused
from warren.oauth2_backend import oauth2_backend

#: LavinMQ's documented [oauth] example (the issuer is the local provider's).
LAVINMQ_INI = """\
[main]
auth_backends = local,oauth

[oauth]
issuer = {issuer}
resource_server_id = lavinmq
preferred_username_claims = sub,client_id
verify_aud = true
audience = lavinmq
jwks_cache_ttl = 3600
"""


def load(tmp_path: Path, text: str) -> Config:
    ini = tmp_path / "lavinmq.ini"
    ini.write_text(text)
    return Config.from_ini(ini)


def test_lavinmqs_documented_file_maps_to_oauth2(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        config = load(tmp_path, LAVINMQ_INI.format(issuer="https://auth.example.com"))
    assert config.auth_backends == ("internal", "oauth2")
    assert config.oauth2_resource_server_id == "lavinmq"
    assert config.oauth2_issuer == "https://auth.example.com"
    assert config.oauth2_jwks_url is None  # discovered from the issuer
    assert config.oauth2_preferred_username_claims == ("sub", "client_id")
    assert config.oauth2_verify_aud is True
    assert config.oauth2_scope_prefix == "lavinmq."
    assert config.oauth2_additional_scopes_key == "resource_access.lavinmq.roles"
    assert "[oauth] jwks_cache_ttl is not supported" in caplog.text
    assert "lavinmq.ini:10" in caplog.text  # its line


def test_a_lavinmq_broker_takes_the_tokens_lavinmq_would(tmp_path: Path) -> None:
    key = SigningKey("kc-1")

    async def scenario() -> None:
        idp = await serve_idp(jwks(key))
        ini = LAVINMQ_INI.format(issuer=idp.base) + "additional_scopes_keys = permissions\n"
        ini = ini.replace("audience = lavinmq", "audience = account")
        config = load(tmp_path, ini)
        clock = ManualClock()
        clock.attach(asyncio.get_running_loop())
        backend = oauth2_backend(config, clock)
        assert backend is not None
        try:
            await backend.start()
            assert idp.requests == ["/.well-known/openid-configuration"]
            now = clock.now_ms() // 1000
            token = key.token(
                now,
                "lavinmq.read:*/* other.write:*/*",
                aud="account",  # the audience, not the resource server id
                iss=idp.base,
                resource_access={"lavinmq": {"roles": ["lavinmq.tag:management"]}},
                permissions=["lavinmq.configure:prod/q-*"],
            )
            verified = backend.verifier.verify(token)
            assert verified.scopes == ["configure:prod/q-*", "read:*/*", "tag:management"]
            assert verified.tags == ["management"]
            with pytest.raises(TokenRefused, match="aud"):
                backend.verifier.verify(
                    key.token(now, "lavinmq.read:*/*", aud="lavinmq", iss=idp.base)
                )
            with pytest.raises(TokenRefused, match="issuer"):
                backend.verifier.verify(key.token(now, "lavinmq.read:*/*", aud="account"))
        finally:
            await backend.stop()
            await idp.runner.cleanup()

    asyncio.run(scenario())


def test_without_resource_server_id_no_prefix(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        "[oauth]\nissuer = https://idp\naudience = api://broker\n"
        "additional_scopes_keys = permissions, roles\n",
    )
    assert config.oauth2_resource_server_id == "api://broker"
    assert config.oauth2_scope_prefix == ""
    assert config.oauth2_additional_scopes_key == "permissions roles"
    config = load(tmp_path, "[oauth]\nissuer = https://idp\nverify_aud = false\n")
    assert (config.oauth2_verify_aud, config.oauth2_scope_prefix) == (False, "")


def test_management_sso_settings(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        "[oauth]\nissuer = https://idp\nresource_server_id = lavinmq\nclient_id = ui\n"
        "mgmt_base_url = https://broker.example\nmgmt_scopes = openid email\n",
    )
    assert config.mgmt_oauth_enabled and config.mgmt_oauth_client_id == "ui"
    assert config.mgmt_oauth_provider_url == "https://idp"
    assert config.mgmt_oauth_scopes == "openid email"
    assert config.mgmt_oauth_disable_basic_auth is False  # LavinMQ keeps the password login
    config = load(
        tmp_path, "[oauth]\nissuer = https://idp\nresource_server_id = x\nclient_id = ui\n"
    )
    assert not config.mgmt_oauth_enabled  # SSO needs mgmt_base_url, as in LavinMQ


@pytest.mark.parametrize(
    ("text", "why"),
    [
        # LavinMQ's quick start refuses every token (no audience to check aud against).
        ("[main]\nauth_backends = oauth\n[oauth]\nissuer = https://idp\n", "needs resource_server_id"),
        ("[oauth]\nissuer = https://idp\naudience = a\nscope = x\n", r"lavinmq.ini:4: unknown LavinMQ \[oauth\] key scope"),
        ("[oauth]\naudience = a\n[oauth2]\nresource_server_id = b\n", "sets \\[oauth2\\] resource_server_id"),
        ("[oauth]\naudience = a\nverify_aud = maybe\n", "lavinmq.ini:3: \\[oauth2\\] verify_aud"),
    ],
)  # fmt: skip
def test_lavinmq_oauth_refused(tmp_path: Path, text: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        load(tmp_path, text)
