"""The INI file: LavinMQ's section and key names, each value parsed and
range-checked where it is read, so that an error names the file, line,
section and key.

config.py's Config.apply_ini calls :func:`read_ini`; the table of keys is
here with the value parsers and the error texts (an unknown section or key
names the nearest known one, config_names.py). The sections kept in their own
modules (config_coap.py, config_edges.py, config_mgmt_oauth.py,
config_oauth2.py's dotted [oauth2] keys) are entered into the table here.
"""

from __future__ import annotations

import configparser
import logging
import os
from collections.abc import Callable
from typing import Any

from warren import config_mgmt_oauth
from warren.config_checks import check_field, normalize_log_level
from warren.config_coap import COAP_INI_KEYS
from warren.config_edges import EDGE_INI_KEYS
from warren.config_names import (
    RENAMED,
    UNSUPPORTED_KEYS,
    line_numbers,
    suggestion,
    unsupported_section,
)
from warren.config_oauth2 import from_lavinmq, is_extra_key, parse_extra
from warren.config_values import (
    parse_bool,
    parse_float,
    parse_int,
    parse_optional,
    parse_str,
    parse_user_list,
)

__all__ = ["ConfigError", "ini_sections", "read_ini"]

log = logging.getLogger("warren.config")


class ConfigError(ValueError):
    """Invalid configuration; the message is meant to be shown to the operator as is."""


def read_ini(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """The settings of one INI file as (Config field -> value, field -> where it
    was set), every value parsed and checked; ConfigError for the first problem."""
    name = os.fspath(path)
    parser = configparser.ConfigParser(
        # A literal [DEFAULT] section would otherwise leak its keys into
        # every section; treat it as just another unknown section.
        default_section="\x00warren-no-default\x00",
        # Passwords and paths may contain '%'.
        interpolation=None,
        # "port = 5672   ; a comment", as the docs write them; a ';' not
        # preceded by whitespace stays part of the value.
        inline_comment_prefixes=(";",),
    )
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        parser.read_string(text, source=name)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ConfigError(f"cannot read config file {name}: {reason}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{name}: malformed config file: not UTF-8 text ({exc})") from exc
    except configparser.Error as exc:
        raise ConfigError(_malformed(name, text, exc)) from exc
    lines = from_lavinmq(parser, line_numbers(text), name)  # LavinMQ's [oauth]

    def where(section: str, key: str | None = None) -> str:
        number = lines.get((section, key)) or lines.get((section, None))
        return f"{name}:{number}" if number else name

    updates: dict[str, Any] = {}
    origin: dict[str, str] = {}
    retention: dict[str, list[tuple[int, int]]] = {}
    retention_origin: dict[str, str] = {}
    oauth2_extra: list[tuple[str, str, str]] = []
    for section in parser.sections():
        if unsupported_section(section):
            log.warning(
                "%s: LavinMQ's [%s] is not supported by Warren; its settings are ignored",
                where(section),
                section,
            )
            continue
        if section not in _INI_SECTIONS:
            raise ConfigError(f"{where(section)}: {_unknown_section(section)}")
        for key in parser.options(section):
            raw = parser.get(section, key)
            if section == "mgmt" and key.startswith(_RETENTION_PREFIX):
                try:
                    policy, pair = _parse_retention(key, raw)
                except ValueError as exc:
                    raise ConfigError(
                        _ini_error(where(section, key), section, key, raw, str(exc))
                    ) from None
                retention.setdefault(policy, []).append(pair)
                retention_origin.setdefault(policy, where(section, key))
                continue
            if section == "oauth2" and is_extra_key(key):
                oauth2_extra.append((key, raw, where(section, key)))
                continue
            spec = _INI_KEYS.get((section, key))
            if spec is None:
                if (section, key) in UNSUPPORTED_KEYS:
                    log.warning(
                        "%s: LavinMQ's [%s] %s is not supported by Warren; ignored",
                        where(section, key),
                        section,
                        key,
                    )
                    continue
                raise ConfigError(f"{where(section, key)}: {_unknown_key(section, key)}")
            field, convert = spec
            try:
                value = convert(raw)
            except ValueError as exc:
                raise ConfigError(
                    _ini_error(where(section, key), section, key, raw, str(exc))
                ) from None
            problem = check_field(field, value)
            if problem is not None:
                raise ConfigError(_ini_error(where(section, key), section, key, raw, problem))
            updates[field] = value
            origin[field] = f"{where(section, key)}: [{section}] {key}"
    for policy, pairs in retention.items():
        # The policies set replace their defaults; the others keep theirs.
        field = f"sample_retention_{policy}"
        value = tuple(sorted(pairs))
        problem = check_field(field, value)
        if problem is not None:
            raise ConfigError(
                f"{retention_origin[policy]}: [mgmt] {_RETENTION_PREFIX}{policy}: {problem}"
            )
        updates[field] = value
        origin[field] = f"{retention_origin[policy]}: [mgmt] {_RETENTION_PREFIX}{policy}"
    if oauth2_extra:
        try:
            updates["oauth2_extra"] = parse_extra(oauth2_extra)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    return updates, origin


# --- value parsing -----------------------------------------------------------


def _parse_log_level(raw: str) -> str:
    return normalize_log_level(raw)


_INI_KEYS: dict[tuple[str, str], tuple[str, Callable[[str], Any]]] = {
    ("main", "data_dir"): ("data_dir", parse_str),
    ("main", "log_level"): ("log_level", _parse_log_level),
    ("main", "rabbitmq_version"): ("rabbitmq_version", parse_str),
    # RabbitMQ-like extras, not LavinMQ keys.
    ("main", "default_user"): ("default_user", parse_str),
    ("main", "default_password"): ("default_password", parse_str),
    ("main", "loopback_users"): ("loopback_users", parse_user_list),
    ("main", "segment_size"): ("segment_size", parse_int),
    ("main", "free_disk_min"): ("free_disk_min", parse_int),
    ("main", "memory_high_watermark"): ("memory_high_watermark", parse_float),
    ("main", "memory_high_watermark_absolute"): ("memory_high_watermark_absolute", parse_int),
    ("main", "consumer_timeout"): ("consumer_timeout", parse_int),
    ("main", "collect_statistics_interval"): ("collect_statistics_interval", parse_int),
    ("main", "sync"): ("sync", parse_bool),
    ("main", "damaged_metadata"): ("damaged_metadata", parse_str),
    ("main", "load_definitions"): ("load_definitions", parse_optional),
    ("main", "webhooks_file"): ("webhooks_file", parse_optional),
    ("main", "auth_failure_delay"): ("auth_failure_delay", parse_int),
    ("main", "auth_failures_per_minute"): ("auth_failures_per_minute", parse_int),
    ("main", "auth_backends"): ("auth_backends", parse_user_list),
    ("oauth2", "resource_server_id"): ("oauth2_resource_server_id", parse_str),
    ("oauth2", "jwks_url"): ("oauth2_jwks_url", parse_optional),
    ("oauth2", "signing_keys"): ("oauth2_signing_keys", parse_user_list),
    ("oauth2", "default_key"): ("oauth2_default_key", parse_optional),
    ("oauth2", "issuer"): ("oauth2_issuer", parse_optional),
    ("oauth2", "verify_aud"): ("oauth2_verify_aud", parse_bool),
    ("oauth2", "scope_prefix"): ("oauth2_scope_prefix", parse_str),
    ("oauth2", "preferred_username_claims"): ("oauth2_preferred_username_claims", parse_user_list),
    ("oauth2", "additional_scopes_key"): ("oauth2_additional_scopes_key", parse_optional),
    ("oauth2", "jwks_min_refetch_interval"): ("oauth2_jwks_min_refetch_interval", parse_int),
    ("main", "max_connections"): ("max_connections", parse_int),
    ("main", "proxy_protocol"): ("proxy_protocol", parse_bool),
    ("main", "proxy_protocol_timeout"): ("proxy_protocol_timeout", parse_int),
    ("amqp", "proxy_protocol"): ("amqp_proxy_protocol", parse_bool),
    ("mqtt", "proxy_protocol"): ("mqtt_proxy_protocol", parse_bool),
    ("stream", "proxy_protocol"): ("stream_proxy_protocol", parse_bool),
    ("mgmt", "proxy_protocol"): ("http_proxy_protocol", parse_bool),
    ("main", "connection_rate_limit"): ("connection_rate_limit", parse_int),
    ("main", "publish_rate_limit"): ("publish_rate_limit", parse_int),
    ("main", "max_subscriptions_per_client"): ("max_subscriptions_per_client", parse_int),
    ("amqp", "bind"): ("bind", parse_str),
    ("amqp", "port"): ("amqp_port", parse_int),
    ("amqp", "heartbeat"): ("heartbeat", parse_int),
    ("amqp", "frame_max"): ("frame_max", parse_int),
    ("amqp", "channel_max"): ("channel_max", parse_int),
    ("amqp", "max_consumers_per_channel"): ("max_consumers_per_channel", parse_int),
    ("amqp", "max_message_size"): ("max_message_size", parse_int),
    ("main", "tls_cert"): ("tls_cert", parse_optional),
    ("main", "tls_key"): ("tls_key", parse_optional),
    ("main", "tls_min_version"): ("tls_min_version", parse_str),
    ("main", "tls_ciphers"): ("tls_ciphers", parse_str),
    ("main", "tls_ca_cert"): ("tls_ca_cert", parse_optional),
    ("main", "tls_verify_peer"): ("tls_verify_peer", parse_bool),
    ("main", "tls_fail_if_no_peer_cert"): ("tls_fail_if_no_peer_cert", parse_bool),
    ("main", "tls_cert_login_from"): ("tls_cert_login_from", parse_str),
    ("main", "tls_sni_certs"): ("tls_sni_certs", parse_optional),
    ("amqp", "tls_port"): ("amqp_tls_port", parse_int),
    ("mgmt", "tls_port"): ("http_tls_port", parse_int),
    ("mgmt", "max_body_size"): ("http_max_body_size", parse_int),
    ("mgmt", "max_definitions_size"): ("http_max_definitions_size", parse_int),
    ("mgmt", "body_budget"): ("http_body_budget", parse_int),
    ("mgmt", "bridge_max_body_size"): ("http_bridge_max_body_size", parse_int),
    ("mqtt", "bind"): ("mqtt_bind", parse_str),
    ("mqtt", "port"): ("mqtt_port", parse_int),
    ("mqtt", "tls_port"): ("mqtt_tls_port", parse_int),
    ("mqtt", "exchange"): ("mqtt_exchange", parse_str),
    ("mqtt", "default_vhost"): ("mqtt_vhost", parse_str),
    ("mqtt", "allow_anonymous"): ("mqtt_allow_anonymous", parse_bool),
    ("amqp1", "allow_anonymous"): ("amqp1_allow_anonymous", parse_bool),
    ("amqp1", "announce_rabbitmq"): ("amqp1_announce_rabbitmq", parse_bool),
    ("stream", "bind"): ("stream_bind", parse_str),
    ("stream", "port"): ("stream_port", parse_int),
    ("stream", "tls_port"): ("stream_tls_port", parse_int),
    ("stream", "allow_anonymous"): ("stream_allow_anonymous", parse_bool),
    ("stream", "advertised_host"): ("stream_advertised_host", parse_str),
    ("stream", "advertised_port"): ("stream_advertised_port", parse_int),
    ("stream", "frame_max"): ("stream_frame_max", parse_int),
    ("stream", "heartbeat"): ("stream_heartbeat", parse_int),
    ("mqtt", "prefetch"): ("mqtt_prefetch", parse_int),
    ("mqtt", "max_session_expiry_interval"): ("mqtt_max_session_expiry", parse_int),
    ("mqtt", "max_keepalive"): ("mqtt_max_keepalive", parse_int),
    ("mqtt", "topic_alias_maximum"): ("mqtt_topic_alias_maximum", parse_int),
    ("mqtt", "packet_timeout"): ("mqtt_packet_timeout", parse_float),
    ("mqtt", "partial_packet_memory"): ("mqtt_partial_packet_memory", parse_int),
    ("clustering", "enabled"): ("clustering", parse_bool),
    ("clustering", "etcd_endpoints"): ("clustering_etcd_endpoints", parse_user_list),
    ("clustering", "etcd_prefix"): ("clustering_etcd_prefix", parse_str),
    ("clustering", "node_name"): ("clustering_node_name", parse_str),
    ("clustering", "bind"): ("clustering_bind", parse_str),
    ("clustering", "port"): ("clustering_port", parse_int),
    ("clustering", "advertised_uri"): ("clustering_advertised_uri", parse_str),
    ("clustering", "max_unsynced_actions"): ("clustering_max_unsynced_actions", parse_int),
    ("clustering", "lease_ttl"): ("clustering_lease_ttl", parse_int),
    ("clustering", "stream_read_port"): ("clustering_stream_read_port", parse_int),
    ("clustering", "stream_protocol_read_port"): (
        "clustering_stream_protocol_read_port",
        parse_int,
    ),
    ("clustering", "tls"): ("clustering_tls", parse_bool),
    ("clustering", "etcd_ca_cert"): ("clustering_etcd_ca_cert", parse_optional),
    ("clustering", "etcd_cert"): ("clustering_etcd_cert", parse_optional),
    ("clustering", "etcd_key"): ("clustering_etcd_key", parse_optional),
    ("clustering", "target_cluster_size_hint"): (
        "clustering_target_cluster_size_hint",
        parse_int,
    ),
    # LavinMQ's section for its management HTTP server.
    ("mgmt", "bind"): ("http_bind", parse_str),
    ("mgmt", "port"): ("http_port", parse_int),
    ("prometheus", "bind"): ("prometheus_bind", parse_str),
    ("prometheus", "port"): ("prometheus_port", parse_int),
    ("prometheus", "tls_port"): ("prometheus_tls_port", parse_int),
    ("prometheus", "return_per_object_metrics"): (
        "prometheus_return_per_object_metrics",
        parse_bool,
    ),
    # RabbitMQ's deprecated_features.permit.<feature> keys.
    ("deprecated_features", "permit.global_qos"): ("permit_global_qos", parse_bool),
    **config_mgmt_oauth.INI_KEYS,
    **COAP_INI_KEYS,
}
for _key, (_field, _kind) in EDGE_INI_KEYS.items():  # config_edges.py's
    _INI_KEYS[_key] = (_field, parse_bool if _kind is bool else parse_int)
_INI_SECTIONS = frozenset(section for section, _ in _INI_KEYS)


def ini_sections() -> list[str]:
    """The INI file's sections, in the order the key table introduces them (for --help)."""
    return list(dict.fromkeys(section for section, _ in _INI_KEYS))


#: [mgmt] sample_retention_policies.<global|basic|detailed>.<max age> = <interval>,
#: as RabbitMQ's keys (the age in seconds, or minute, hour, day).
_RETENTION_PREFIX = "sample_retention_policies."
_RETENTION_AGES = {"minute": 60, "hour": 3600, "day": 86400}


def _parse_retention(key: str, raw: str) -> tuple[str, tuple[int, int]]:
    """(policy, (max age, interval)) of one retention key."""
    parts = key[len(_RETENTION_PREFIX) :].split(".")
    if len(parts) != 2 or parts[0] not in ("global", "basic", "detailed"):
        raise ValueError("the key must be sample_retention_policies.<global|basic|detailed>.<age>")
    age_text = parts[1].strip()
    age = _RETENTION_AGES.get(age_text)
    if age is None:
        try:
            age = parse_int(age_text)
        except ValueError:
            raise ValueError("the age must be seconds, minute, hour or day") from None
    return parts[0], (age, parse_int(raw))


def _ini_error(where: str, section: str, key: str, raw: str, why: str) -> str:
    return f"{where}: [{section}] {key} = {raw!r}: {why}"


def _unknown_section(section: str) -> str:
    hint = RENAMED.get((section, None))
    if hint is None:
        near = suggestion(section, _INI_SECTIONS)
        hint = (
            f"did you mean [{near}]?"
            if near
            else "known sections: " + ", ".join(f"[{s}]" for s in sorted(_INI_SECTIONS))
        )
    return f"unknown section [{section}] ({hint})"


def _unknown_key(section: str, key: str) -> str:
    hint = RENAMED.get((section, key))
    if hint is None:
        here = [k for s, k in _INI_KEYS if s == section]
        if section == "mgmt":
            here.append(_RETENTION_PREFIX + "<policy>.<age>")
        near = suggestion(key, here)
        elsewhere = sorted(s for s, k in _INI_KEYS if k == key)
        if near is not None:
            hint = f"did you mean {near}?"
        elif elsewhere:
            hint = f"did you mean [{elsewhere[0]}] {key}?"
        else:
            hint = f"known keys in [{section}]: " + ", ".join(sorted(here))
    return f"unknown setting [{section}] {key} ({hint})"


def _malformed(name: str, text: str, exc: configparser.Error) -> str:
    """configparser's errors as ``file:line: malformed config file: what``."""
    if isinstance(exc, configparser.MissingSectionHeaderError):
        line = exc.line.strip()
        return f"{name}:{exc.lineno}: malformed config file: {line!r} is before any [section]"
    if isinstance(exc, configparser.DuplicateOptionError):
        return (
            f"{name}:{exc.lineno}: malformed config file: [{exc.section}] {exc.option} is set twice"
        )
    if isinstance(exc, configparser.DuplicateSectionError):
        return f"{name}:{exc.lineno}: malformed config file: [{exc.section}] appears twice"
    if isinstance(exc, configparser.ParsingError) and exc.errors:
        lineno = exc.errors[0][0]
        line = text.splitlines()[lineno - 1].strip()
        return f"{name}:{lineno}: malformed config file: not a [section] or key = value: {line!r}"
    return f"{name}: malformed config file: {exc}"
