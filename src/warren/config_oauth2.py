"""The ``[oauth2]`` settings with dotted names, RabbitMQ's ``auth_oauth2.*``
ones: scope aliases, resource servers, identity providers, the JWKS URL's TLS
options, signing keys by key id, algorithms. config.py hands every such key
here (is_extra_key) and keeps the result as one field, ``oauth2_extra``;
oauth2_backend.py turns it into core/oauth2.py's settings (docs/security.md).

The INI reader lowercases key names: an alias or a resource server id with
capitals is written the indexed way (``scope_aliases.<n>.alias``,
``resource_servers.<name>.id``), as RabbitMQ allows too; identity provider
names are matched without regard to case.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

#: Keys of [oauth2] handled here besides the dotted ones.
_PLAIN = frozenset(
    {
        "resource_server_type",
        "extra_scopes_source",
        "default_oauth_provider",
        "require_exp",
        "discovery_endpoint_path",
    }
)
_DOTTED = (
    "scope_aliases.", "resource_servers.", "oauth_providers.", "https.", "signing_keys.",
    "algorithms", "discovery_endpoint_params.",
)  # fmt: skip
_PEER_VERIFICATION = {"verify_peer": True, "verify_none": False}
_HOSTNAME_VERIFICATION = {"wildcard": True, "none": False}
#: A resource server's own settings (anything else is the root's).
_SERVER_KEYS = frozenset(
    {
        "id",
        "scope_prefix",
        "verify_aud",
        "additional_scopes_key",
        "extra_scopes_source",
        "preferred_username_claims",
        "resource_server_type",
        "signing_keys",
        "default_key",
        "issuer",
        "oauth_provider_id",
        "require_exp",
    }
)
#: An identity provider's settings (``oauth_providers.<name>.*``).
_PROVIDER_KEYS = frozenset(
    {
        "jwks_uri",
        "jwks_url",
        "issuer",
        "default_key",
        "https.cacertfile",
        "https.peer_verification",
        "https.hostname_verification",
        "discovery_endpoint_path",
    }
)
_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}


@dataclass(frozen=True)
class ResourceServer:
    """``resource_servers.<name>.*``; None: the root's value (RabbitMQ's
    inheritance; the scope prefix defaults to ``<id>.``, or the root's
    explicit scope_prefix)."""

    id: str
    scope_prefix: str | None = None
    verify_aud: bool | None = None
    additional_scopes_key: str | None = None
    preferred_username_claims: tuple[str, ...] | None = None
    resource_server_type: str | None = None
    scope_aliases: dict[str, tuple[str, ...]] | None = None
    #: ``kid:path`` key files; none: the root's keys (and JWKS).
    signing_keys: tuple[str, ...] = ()
    default_key: str | None = None
    issuer: str | None = None
    #: The identity provider whose keys, issuer and default key it uses (None:
    #: the root's, ``default_oauth_provider`` or the [oauth2] settings).
    oauth_provider_id: str | None = None
    require_exp: bool | None = None


@dataclass(frozen=True)
class OAuthProvider:
    """``oauth_providers.<name>.*``: an identity provider's JWKS URL (with its
    TLS options), key files, issuer and default key."""

    id: str
    jwks_url: str | None = None
    issuer: str | None = None
    signing_keys: tuple[str, ...] = ()
    default_key: str | None = None
    https_cacertfile: str | None = None
    https_peer_verification: bool = True
    https_hostname_verification: bool = True
    #: The signature algorithms its tokens may use (None: any its keys allow).
    algorithms: tuple[str, ...] | None = None
    #: OpenID discovery (no jwks_url, an issuer): the configuration document's
    #: path under the issuer (None: /.well-known/openid-configuration) and
    #: query parameters added to its URL.
    discovery_endpoint_path: str | None = None
    discovery_endpoint_params: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class OAuth2Extra:
    """What the dotted [oauth2] keys set."""

    scope_aliases: dict[str, tuple[str, ...]] = field(default_factory=dict)
    resource_server_type: str | None = None
    #: RabbitMQ's advanced.config name for additional_scopes_key.
    extra_scopes_source: str | None = None
    #: ``signing_keys.<kid> = path``: more ``kid:path`` key files.
    signing_keys: tuple[str, ...] = ()
    #: The JWKS URL's TLS: the CA bundle to verify its certificate with (None:
    #: the system's), whether to verify it at all, and its host name.
    https_cacertfile: str | None = None
    https_peer_verification: bool = True
    https_hostname_verification: bool = True
    resource_servers: tuple[ResourceServer, ...] = ()
    oauth_providers: tuple[OAuthProvider, ...] = ()
    #: The provider of the root resource server (and of those naming none).
    default_oauth_provider: str | None = None
    #: ``algorithms`` (or ``algorithms.<n>``): what [oauth2]'s own keys may verify.
    algorithms: tuple[str, ...] | None = None
    #: RabbitMQ 4's require_exp: off, a token without ``exp`` is accepted.
    require_exp: bool = True
    #: [oauth2]'s own OpenID discovery (OAuthProvider's fields of the same names).
    discovery_endpoint_path: str | None = None
    discovery_endpoint_params: tuple[tuple[str, str], ...] = ()

    def provider(self, name: str | None) -> OAuthProvider | None:
        """The provider called ``name`` (any case), None if none is."""
        wanted = (name or "").lower()
        return next((p for p in self.oauth_providers if p.id.lower() == wanted), None)


def is_extra_key(key: str) -> bool:
    """Whether an [oauth2] key is one of this module's."""
    return key in _PLAIN or key.startswith(_DOTTED)


def parse_extra(entries: list[tuple[str, str, str]]) -> OAuth2Extra:
    """The settings of ``(key, raw value, where)`` entries; ValueError names the
    line of the first bad one."""
    top: dict[str, Any] = {}
    aliases = _Aliases()
    servers: dict[str, dict[str, Any]] = {}
    server_aliases: dict[str, _Aliases] = {}
    keys: list[str] = []
    providers: dict[str, dict[str, Any]] = {}
    algorithms: list[str] = []
    params: list[tuple[str, str]] = []
    for key, raw, where in entries:
        value = raw.strip()
        try:
            if key == "require_exp":
                top[key] = _bool(value)
            elif key in _PLAIN:
                top[key] = value or None
            elif key.startswith("discovery_endpoint_params."):
                params.append(_param(key[len("discovery_endpoint_params.") :], value))
            elif key == "algorithms" or key.startswith("algorithms."):
                algorithms.extend(_algorithms(value))
            elif key.startswith("scope_aliases."):
                aliases.add(key[len("scope_aliases.") :], value)
            elif key.startswith("signing_keys."):
                keys.append(_key_entry(key[len("signing_keys.") :], value))
            elif key == "https.cacertfile":
                top[key] = value or None
            elif key == "https.peer_verification":
                top[key] = _choice(value, _PEER_VERIFICATION)
            elif key == "https.hostname_verification":
                top[key] = _choice(value, _HOSTNAME_VERIFICATION)
            elif key.startswith("oauth_providers."):
                name, _, setting = key[len("oauth_providers.") :].partition(".")
                if not name or not setting:
                    raise ValueError("the key must be oauth_providers.<name>.<setting>")
                _provider_setting(providers.setdefault(name, {}), setting, value)
            elif key.startswith("resource_servers."):
                name, _, setting = key[len("resource_servers.") :].partition(".")
                if not name or not setting:
                    raise ValueError("the key must be resource_servers.<name>.<setting>")
                if setting.startswith("scope_aliases."):
                    target = server_aliases.setdefault(name, _Aliases())
                    target.add(setting[len("scope_aliases.") :], value)
                elif setting.startswith("signing_keys."):
                    entry = _key_entry(setting[len("signing_keys.") :], value)
                    servers.setdefault(name, {}).setdefault("keys", []).append(entry)
                else:
                    servers.setdefault(name, {})[setting] = _server_value(setting, value)
            else:
                raise ValueError(f"unknown setting (known: {', '.join(_DOTTED)}...)")
        except ValueError as exc:
            raise ValueError(f"{where}: [oauth2] {key} = {raw!r}: {exc}") from None
    try:
        built = tuple(
            _server(name, servers.get(name, {}), server_aliases.get(name))
            for name in sorted(set(servers) | set(server_aliases))
        )
        extra = OAuth2Extra(
            scope_aliases=aliases.table(),
            resource_server_type=top.get("resource_server_type"),
            extra_scopes_source=top.get("extra_scopes_source"),
            signing_keys=tuple(keys),
            https_cacertfile=top.get("https.cacertfile"),
            https_peer_verification=top.get("https.peer_verification", True),
            https_hostname_verification=top.get("https.hostname_verification", True),
            resource_servers=built,
            oauth_providers=tuple(_provider(n, providers[n]) for n in sorted(providers)),
            default_oauth_provider=top.get("default_oauth_provider"),
            algorithms=tuple(algorithms) or None,
            require_exp=top.get("require_exp", True),
            discovery_endpoint_path=top.get("discovery_endpoint_path"),
            discovery_endpoint_params=tuple(params),
        )
    except ValueError as exc:
        raise ValueError(f"{entries[0][2]}: [oauth2]: {exc}") from None
    problem = check_extra(extra)
    if problem is not None:
        raise ValueError(f"{entries[0][2]}: [oauth2]: {problem}")
    return extra


def check_extra(value: Any) -> str | None:
    """config_checks' check of the field: resource server ids set and distinct."""
    if not isinstance(value, OAuth2Extra):
        return "must be an OAuth2Extra"
    ids = [s.id for s in value.resource_servers]
    if any(not i for i in ids):
        return "a resource server needs an id"
    if len(set(ids)) != len(ids):
        return "two resource servers have the same id"
    named = [value.default_oauth_provider, *(s.oauth_provider_id for s in value.resource_servers)]
    for name in named:
        if name is not None and value.provider(name) is None:
            return f"no oauth_providers.{name.lower()} for the identity provider '{name}'"
    return None


class _Aliases:
    """``<alias> = scopes`` and ``<n>.alias``/``<n>.scope`` pairs."""

    def __init__(self) -> None:
        self.named: dict[str, tuple[str, ...]] = {}
        self.indexed: dict[str, dict[str, str]] = {}

    def add(self, rest: str, value: str) -> None:
        index, dot, part = rest.partition(".")
        if dot and index.isdigit() and part in ("alias", "scope"):
            self.indexed.setdefault(index, {})[part] = value
        elif rest and not dot:
            self.named[rest] = tuple(value.split())
        else:
            raise ValueError(
                "the key must be scope_aliases.<alias> or scope_aliases.<n>.alias|scope"
            )

    def table(self) -> dict[str, tuple[str, ...]]:
        table = dict(self.named)
        for index, pair in sorted(self.indexed.items()):
            if set(pair) != {"alias", "scope"}:
                raise ValueError(f"scope_aliases.{index} needs both alias and scope")
            table[pair["alias"]] = tuple(pair["scope"].split())
        return table


def _key_entry(kid: str, path: str) -> str:
    if not kid or not path:
        raise ValueError("the key must be signing_keys.<kid> = <path>")
    return f"{kid}:{path}"


def _bool(value: str) -> bool:
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise ValueError("not a boolean (true/false)")


def _param(name: str, value: str) -> tuple[str, str]:
    if not name:
        raise ValueError("the key must be discovery_endpoint_params.<name>")
    return name, value


def _choice(value: str, choices: dict[str, bool]) -> bool:
    if value not in choices:
        raise ValueError("must be " + " or ".join(choices))
    return choices[value]


def _server_value(setting: str, value: str) -> Any:
    if setting not in _SERVER_KEYS:
        raise ValueError(
            f"unknown resource server setting (known: {', '.join(sorted(_SERVER_KEYS))})"
        )
    if setting in ("verify_aud", "require_exp"):
        return _bool(value)
    if setting in ("preferred_username_claims", "signing_keys"):
        items = tuple(v.strip() for v in value.split(",") if v.strip())
        if setting == "signing_keys" and any(not re.fullmatch(r"[^:]+:.+", v) for v in items):
            raise ValueError("must be kid:path pairs, comma separated")
        return items
    return value if setting == "scope_prefix" else value or None


def _server(name: str, settings: dict[str, Any], aliases: _Aliases | None) -> ResourceServer:
    extra_scopes = settings.get("additional_scopes_key") or settings.get("extra_scopes_source")
    return ResourceServer(
        id=settings.get("id") or name,
        scope_prefix=settings.get("scope_prefix"),
        verify_aud=settings.get("verify_aud"),
        additional_scopes_key=extra_scopes,
        preferred_username_claims=settings.get("preferred_username_claims"),
        resource_server_type=settings.get("resource_server_type"),
        scope_aliases=aliases.table() if aliases is not None else None,
        signing_keys=tuple(settings.get("signing_keys", ())) + tuple(settings.get("keys", ())),
        default_key=settings.get("default_key"),
        issuer=settings.get("issuer"),
        oauth_provider_id=settings.get("oauth_provider_id"),
        require_exp=settings.get("require_exp"),
    )


def _provider_setting(provider: dict[str, Any], setting: str, value: str) -> None:
    """One ``oauth_providers.<name>.<setting>`` into ``provider``."""
    if setting.startswith("signing_keys."):
        entry = _key_entry(setting[len("signing_keys.") :], value)
        provider.setdefault("signing_keys", []).append(entry)
    elif setting == "algorithms" or setting.startswith("algorithms."):
        provider.setdefault("algorithms", []).extend(_algorithms(value))
    elif setting.startswith("discovery_endpoint_params."):
        name = setting[len("discovery_endpoint_params.") :]
        provider.setdefault("params", []).append(_param(name, value))
    elif setting not in _PROVIDER_KEYS:
        known = ", ".join(sorted(_PROVIDER_KEYS))
        raise ValueError(f"unknown identity provider setting (known: {known})")
    elif setting == "https.peer_verification":
        provider[setting] = _choice(value, _PEER_VERIFICATION)
    elif setting == "https.hostname_verification":
        provider[setting] = _choice(value, _HOSTNAME_VERIFICATION)
    else:
        provider["jwks_url" if setting == "jwks_uri" else setting] = value or None


def _provider(name: str, settings: dict[str, Any]) -> OAuthProvider:
    return OAuthProvider(
        id=name,
        jwks_url=settings.get("jwks_url"),
        issuer=settings.get("issuer"),
        signing_keys=tuple(settings.get("signing_keys", ())),
        default_key=settings.get("default_key"),
        https_cacertfile=settings.get("https.cacertfile"),
        https_peer_verification=settings.get("https.peer_verification", True),
        https_hostname_verification=settings.get("https.hostname_verification", True),
        algorithms=tuple(settings.get("algorithms", ())) or None,
        discovery_endpoint_path=settings.get("discovery_endpoint_path"),
        discovery_endpoint_params=tuple(settings.get("params", ())),
    )


def _algorithms(value: str) -> list[str]:
    """JWS algorithm names (comma separated), the ones core/oauth2.py verifies."""
    from warren.core.oauth2 import ALGORITHMS, HMAC_ALGORITHMS

    names = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [n for n in names if n not in (*ALGORITHMS, *HMAC_ALGORITHMS)]
    if unknown or not names:
        raise ValueError(f"known algorithms: {', '.join((*ALGORITHMS, *HMAC_ALGORITHMS))}")
    return names


# -- LavinMQ's [oauth] ------------------------------------------------------------------------
#: LavinMQ 2.7+'s [oauth] keys with the same meaning in [oauth2].
_LAVINMQ_SAME = ("issuer", "preferred_username_claims", "scope_prefix", "verify_aud")
#: LavinMQ's [oauth] keys: the ones read (those above, and these), the rest warned about.
_LAVINMQ_KEYS = frozenset(
    {
        *_LAVINMQ_SAME,
        "resource_server_id",
        "audience",
        "additional_scopes_keys",
        "client_id",
        "mgmt_scopes",
    }
)
_LAVINMQ_IGNORED = frozenset({"jwks_cache_ttl", "mgmt_base_url"})
_LAVINMQ_BACKENDS = {"oauth": "oauth2", "local": "internal"}


def from_lavinmq(
    parser: Any, lines: dict[tuple[str, str | None], int], name: str
) -> dict[tuple[str, str | None], int]:
    """Rewrite a LavinMQ file's ``[oauth]`` section as the ``[oauth2]`` (and
    ``[mgmt] oauth_*``) settings that do the same, in ``parser`` (a
    ConfigParser) and ``lines`` (line numbers, kept for error messages), and
    LavinMQ's ``oauth``/``local`` in ``[main] auth_backends``. Returns ``lines``.

    LavinMQ checks ``aud`` against ``audience`` (else ``resource_server_id``),
    filters scopes by ``scope_prefix`` (else ``<resource_server_id>.``, else
    none), reads Keycloak's ``resource_access.<resource_server_id>.roles`` as
    scopes and finds its keys by OpenID discovery from ``issuer``: Warren's
    resource server id is the audience, its prefix set explicitly, the roles
    claim one more additional_scopes_key. ``name``: the file, for errors."""
    if parser.has_option("main", "auth_backends"):
        names = [n.strip() for n in parser.get("main", "auth_backends").split(",")]
        mapped = ", ".join(_LAVINMQ_BACKENDS.get(n, n) for n in names if n)
        parser.set("main", "auth_backends", mapped)
    if not parser.has_section("oauth"):
        return lines
    from warren.config import ConfigError  # config.py imports this module

    def where(key: str | None) -> str:
        number = lines.get(("oauth", key)) or lines.get(("oauth", None))
        return f"{name}:{number}" if number else name

    given = {k: parser.get("oauth", k).strip() for k in parser.options("oauth")}
    for key in given:
        if key in _LAVINMQ_IGNORED:
            log.warning(
                "%s: LavinMQ's [oauth] %s is not supported by Warren; ignored", where(key), key
            )
        elif key not in _LAVINMQ_KEYS:
            known = ", ".join(sorted(_LAVINMQ_KEYS | _LAVINMQ_IGNORED))
            raise ConfigError(f"{where(key)}: unknown LavinMQ [oauth] key {key} (known: {known})")
    settings: dict[str, tuple[str, str]] = {}  # [oauth2] key -> value, the [oauth] key
    for key in _LAVINMQ_SAME:
        if given.get(key):
            settings[key] = (given[key], key)
    rs_id = given.get("resource_server_id") or None
    audience = given.get("audience") or rs_id
    if audience is None:
        if _bool(given.get("verify_aud") or "true"):
            raise ConfigError(
                f"{where(None)}: [oauth] needs resource_server_id or audience "
                "(Warren's resource_server_id), or verify_aud = false"
            )
        audience = "lavinmq"  # only a name: no aud is checked
    settings["resource_server_id"] = (
        audience,
        "audience" if "audience" in given else "resource_server_id",
    )
    if "scope_prefix" not in settings:
        settings["scope_prefix"] = (f"{rs_id}." if rs_id else "", "resource_server_id")
    paths = [p.strip() for p in given.get("additional_scopes_keys", "").split(",") if p.strip()]
    if rs_id:
        paths.append(f"resource_access.{rs_id}.roles")
    if paths:
        settings["additional_scopes_key"] = (" ".join(paths), "additional_scopes_keys")
    mgmt: dict[str, tuple[str, str]] = {}
    if given.get("client_id"):
        mgmt["oauth_client_id"] = (given["client_id"], "client_id")
        if given.get("mgmt_base_url") and given.get("issuer"):  # LavinMQ's SSO switch
            mgmt["oauth_enabled"] = ("true", "client_id")
            mgmt["oauth_provider_url"] = (given["issuer"], "issuer")
            mgmt["oauth_disable_basic_auth"] = ("false", "client_id")
    if given.get("mgmt_scopes"):
        mgmt["oauth_scopes"] = (given["mgmt_scopes"], "mgmt_scopes")
    for section, table in (("oauth2", settings), ("mgmt", mgmt)):
        if table and not parser.has_section(section):
            parser.add_section(section)
            lines[(section, None)] = lines.get(("oauth", None), 0)
        for key, (value, source) in table.items():
            if parser.has_option(section, key):
                raise ConfigError(
                    f"{where(source)}: LavinMQ's [oauth] {source} sets [{section}] {key}, "
                    "which the file sets too"
                )
            parser.set(section, key, value)
            lines[(section, key)] = lines.get(("oauth", source)) or lines.get(("oauth", None), 0)
    parser.remove_section("oauth")
    return lines
