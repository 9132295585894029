"""[mgmt] oauth_*: the web UI's OpenID Connect login settings (config_mgmt_oauth.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from warren.config import Config, ConfigError

OAUTH2 = "[oauth2]\nresource_server_id = rabbitmq\njwks_url = https://idp.example/jwks\n"


def load(tmp_path: Path, text: str) -> Config:
    path = tmp_path / "warren.ini"
    path.write_text(text, encoding="utf-8")
    return Config.from_ini(path)


def test_defaults_leave_the_password_form() -> None:
    c = Config()
    assert c.mgmt_oauth_enabled is False
    assert c.mgmt_oauth_scopes == "openid profile"
    assert c.mgmt_oauth_disable_basic_auth is True
    c.validate()


def test_ini_keys(tmp_path: Path) -> None:
    c = load(
        tmp_path,
        OAUTH2 + "[mgmt]\noauth_enabled = true\noauth_client_id = warren-ui\n"
        "oauth_client_secret = s3cret\noauth_provider_url = https://idp.example/realms/x/\n"
        "oauth_scopes = openid rabbitmq.tag:administrator\noauth_disable_basic_auth = false\n",
    )
    assert c.mgmt_oauth_enabled and c.mgmt_oauth_client_id == "warren-ui"
    assert c.mgmt_oauth_client_secret == "s3cret"
    assert c.mgmt_oauth_scopes == "openid rabbitmq.tag:administrator"
    assert c.mgmt_oauth_disable_basic_auth is False
    assert c.mgmt_oauth_discovery_url == (
        "https://idp.example/realms/x/.well-known/openid-configuration"
    )
    c.mgmt_oauth_metadata_url = "https://idp.example/meta"
    assert c.mgmt_oauth_discovery_url == "https://idp.example/meta"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[mgmt]\noauth_enabled = maybe\n", r"\[mgmt\] oauth_enabled = 'maybe': not a boolean"),
        ("[mgmt]\noauth_provider_url = idp.example\n", r"must be an http:// or https:// URL"),
        ("[mgmt]\noauth_enabeld = true\n", r"did you mean oauth_enabled\?"),
        (
            OAUTH2 + "[mgmt]\noauth_enabled = true\noauth_provider_url = https://idp.example\n",
            r"warren.ini:\d+: \[mgmt\] oauth_enabled: \[mgmt\] oauth_enabled needs oauth_client_id",
        ),
        (
            OAUTH2 + "[mgmt]\noauth_enabled = true\noauth_client_id = ui\n",
            r"needs oauth_provider_url",
        ),
        (
            "[mgmt]\noauth_enabled = true\noauth_client_id = ui\n"
            "oauth_provider_url = https://idp.example\n",
            r"needs \[oauth2\] resource_server_id",
        ),
        (
            OAUTH2 + "[main]\nauth_backends = internal\n[mgmt]\noauth_enabled = true\n"
            "oauth_client_id = ui\noauth_provider_url = https://idp.example\n",
            r"oauth2 in \[main\] auth_backends",
        ),
    ],
)
def test_refused(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load(tmp_path, text)
