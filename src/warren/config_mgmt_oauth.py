"""``[mgmt] oauth_*``: the web UI's login through an OpenID Connect provider,
RabbitMQ's ``management.oauth_*`` settings (docs/security.md, "Web UI login
through an OpenID Connect provider").

Its own module so config.py stays one file of manageable size: Config inherits
the fields, its INI table takes ``INI_KEYS``, config_checks takes ``CHECKS``
and Config.validate asks ``problem`` about the fields together.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from warren.config_values import any_str, is_bool, parse_bool, parse_optional, parse_str

#: RabbitMQ's default scopes for the management UI's login.
DEFAULT_SCOPES = "openid profile"


@dataclass
class MgmtOAuthSettings:
    """The fields Config gets from ``[mgmt] oauth_*``."""

    #: The UI logs in through the provider (the access token is the API's Bearer).
    mgmt_oauth_enabled: bool = False
    #: The UI's client id at the provider.
    mgmt_oauth_client_id: str = ""
    #: Only for a confidential client: added by Warren to the code exchange it
    #: relays (/api/auth/token), never sent to the browser.
    mgmt_oauth_client_secret: str | None = None
    #: The provider's issuer URL; its discovery document is
    #: ``<url>/.well-known/openid-configuration`` unless metadata_url says otherwise.
    mgmt_oauth_provider_url: str = ""
    mgmt_oauth_metadata_url: str | None = None
    #: Space-separated scopes the UI asks for.
    mgmt_oauth_scopes: str = DEFAULT_SCOPES
    #: The login page offers the provider only (False: the password form too).
    mgmt_oauth_disable_basic_auth: bool = True

    @property
    def mgmt_oauth_discovery_url(self) -> str:
        """Where the provider's OpenID configuration is read."""
        if self.mgmt_oauth_metadata_url:
            return self.mgmt_oauth_metadata_url
        return self.mgmt_oauth_provider_url.rstrip("/") + "/.well-known/openid-configuration"


INI_KEYS: dict[tuple[str, str], tuple[str, Callable[[str], Any]]] = {
    ("mgmt", "oauth_enabled"): ("mgmt_oauth_enabled", parse_bool),
    ("mgmt", "oauth_client_id"): ("mgmt_oauth_client_id", parse_str),
    ("mgmt", "oauth_client_secret"): ("mgmt_oauth_client_secret", parse_optional),
    ("mgmt", "oauth_provider_url"): ("mgmt_oauth_provider_url", parse_str),
    ("mgmt", "oauth_metadata_url"): ("mgmt_oauth_metadata_url", parse_optional),
    ("mgmt", "oauth_scopes"): ("mgmt_oauth_scopes", parse_str),
    ("mgmt", "oauth_disable_basic_auth"): ("mgmt_oauth_disable_basic_auth", parse_bool),
}


def _check_url(value: Any) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        return "must be a URL"
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return "must be an http:// or https:// URL"
    return None


def _check_secret(value: Any) -> str | None:
    return None if value is None or (isinstance(value, str) and value) else "must be non-empty"


CHECKS: dict[str, Callable[[Any], str | None]] = {
    "mgmt_oauth_enabled": is_bool,
    "mgmt_oauth_client_id": any_str,
    "mgmt_oauth_client_secret": _check_secret,
    "mgmt_oauth_provider_url": _check_url,
    "mgmt_oauth_metadata_url": _check_url,
    "mgmt_oauth_scopes": any_str,
    "mgmt_oauth_disable_basic_auth": is_bool,
}


def problem(config: Any) -> tuple[str, str] | None:
    """(field, message) when oauth_enabled lacks what the login needs: a UI
    that would offer a login no token of which the API takes is refused at
    the start rather than found out at the first login."""
    if not config.mgmt_oauth_enabled:
        return None
    if not config.mgmt_oauth_client_id:
        return "mgmt_oauth_enabled", "[mgmt] oauth_enabled needs oauth_client_id"
    if not config.mgmt_oauth_provider_url:
        return "mgmt_oauth_enabled", "[mgmt] oauth_enabled needs oauth_provider_url"
    if not config.oauth2_resource_server_id or "oauth2" not in config.auth_backends:
        return (
            "mgmt_oauth_enabled",
            "[mgmt] oauth_enabled needs [oauth2] resource_server_id (and oauth2 in "
            "[main] auth_backends): the API must take the tokens the UI gets",
        )
    return None
