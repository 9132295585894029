"""What each setting of :class:`~warren.config.Config` accepts.

One check per field, by field name: it returns why a value is unacceptable, or
None. Config runs them on every value an INI file gives (so the error can name
the file, section and key) and on the merged config (``Config.validate``); the
command line runs them on its flags (``check_field``). The checks that relate
several fields stay in ``Config.validate``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

from warren.config_coap import COAP_CHECKS
from warren.config_mgmt_oauth import CHECKS as MGMT_OAUTH_CHECKS
from warren.config_oauth2 import check_extra
from warren.config_values import any_str, int_in, is_bool, non_empty_str

__all__ = ["LOG_LEVELS", "check_field", "normalize_log_level"]

#: Accepted ``log_level`` values mapped to :mod:`logging` levels.
LOG_LEVELS: dict[str, int] = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
_LOG_LEVEL_ALIASES = {"warn": "warning"}

MAX_MESSAGE_SIZE_LIMIT = 512 * 1024 * 1024
FRAME_MIN_SIZE = 4096  # AMQP 0-9-1 frame-min-size: peers may not propose less.
FRAME_MAX_LIMIT = 2**31 - 1


def normalize_log_level(value: str) -> str:
    """Return the canonical spelling of a log level ('WARN' -> 'warning').

    LavinMQ configs say ``warn``; Python's logging says ``warning``. Unknown
    values are returned lower-cased so validation can report them.
    """
    level = value.strip().lower()
    return _LOG_LEVEL_ALIASES.get(level, level)


def _endpoint_list(value: Any) -> str | None:
    if (
        not isinstance(value, tuple)
        or not value
        or not all(isinstance(v, str) and v for v in value)
    ):
        return "must be one or more host:port, http:// or https:// URLs"
    return None


def _optional(check: Callable[[Any], str | None]) -> Callable[[Any], str | None]:
    """``check``, or None (a default worked out from other settings)."""
    return lambda value: None if value is None else check(value)


def _fraction(value: Any) -> str | None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return "must be a number"
    if not 0 <= value <= 1:
        return "must be between 0 and 1"
    return None


def _zero_or_in(low: int, high: int) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        if not isinstance(value, int) or isinstance(value, bool):
            return "must be an integer"
        if value and not low <= value <= high:
            return f"must be 0 or between {low} and {high}"
        return None

    return check


def _seconds(value: Any) -> str | None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return "must be a number"
    if not 0 <= value <= 86400 * 365:
        return "must be between 0 and 31536000 (seconds)"
    return None


def _node_name(value: Any) -> str | None:
    """Empty, or a name that fits etcd's comma-separated in-sync replica list."""
    if isinstance(value, str) and re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]{0,63})?", value):
        return None
    return "must be letters, digits, '.', '_' or '-' (at most 64, starting with a letter or digit)"


def _log_level(value: Any) -> str | None:
    if isinstance(value, str) and normalize_log_level(value) in LOG_LEVELS:
        return None
    return "must be one of debug, info, warning (or warn), error"


def _user_tuple(value: Any) -> str | None:
    if not isinstance(value, tuple) or not all(isinstance(u, str) and u for u in value):
        return "must be a tuple of non-empty user names"
    return None


def _tls_version(value: Any) -> str | None:
    return None if value in ("1.2", "1.3") else "must be 1.2 or 1.3"


def _cert_login_from(value: Any) -> str | None:
    if value in ("common_name", "distinguished_name", "subject_alternative_name"):
        return None
    return "must be common_name, distinguished_name or subject_alternative_name"


def _damage_policy(value: Any) -> str | None:
    if value in ("refuse", "set-aside"):
        return None
    return "must be refuse or set-aside"


def _optional_path(value: Any) -> str | None:
    if value is None:
        return None
    return non_empty_str(value)


def _retention(value: Any) -> str | None:
    if (
        not isinstance(value, tuple)
        or not value
        or not all(
            isinstance(p, tuple)
            and len(p) == 2
            and all(isinstance(x, int) and not isinstance(x, bool) for x in p)
            for p in value
        )
    ):
        return "must be one or more (max age, interval) pairs of seconds"
    if len(value) > 8:
        return "must have at most 8 (max age, interval) pairs"
    for age, interval in value:
        if not 0 < interval <= age <= 10 * 365 * 86400:
            return f"{age}: {interval}: the interval must be positive and at most the age"
    if [age for age, _ in value] != sorted({age for age, _ in value}):
        return "the max ages must be different, in ascending order"
    return None


_VERSION_RE = re.compile(r"[0-9]+(\.[0-9]+){1,3}([-+][0-9A-Za-z.-]+)?")


def _rabbitmq_version(value: Any) -> str | None:
    """Clients compare it numerically (kombu: >= 3.3), so it must read as a version."""
    if not isinstance(value, str) or not _VERSION_RE.fullmatch(value):
        return "must be a version number such as 3.10.8"
    return None


def _auth_backends(value: Any) -> str | None:
    if (
        not isinstance(value, tuple)
        or not value
        or any(b not in ("oauth2", "internal") for b in value)
        or len(set(value)) != len(value)
    ):
        return "must list oauth2 and/or internal, each once"
    return None


def _signing_keys(value: Any) -> str | None:
    if not isinstance(value, tuple) or any(
        not isinstance(v, str) or not v.partition(":")[0] or not v.partition(":")[2] for v in value
    ):
        return "must be kid:path pairs, comma separated"
    return None


_CHECKS: dict[str, Callable[[Any], str | None]] = {
    "data_dir": non_empty_str,
    "log_level": _log_level,
    "rabbitmq_version": _rabbitmq_version,
    "bind": non_empty_str,
    "amqp_port": int_in(0, 65535),
    "http_bind": non_empty_str,
    "http_port": int_in(-1, 65535),
    "prometheus_bind": non_empty_str,
    "prometheus_port": int_in(-1, 65535),
    "prometheus_tls_port": int_in(-1, 65535),
    "prometheus_return_per_object_metrics": is_bool,
    "heartbeat": int_in(0, 65535),
    "frame_max": int_in(FRAME_MIN_SIZE, FRAME_MAX_LIMIT),
    "channel_max": int_in(0, 65535),
    "max_connections": int_in(0, 2**31 - 1),
    "proxy_protocol": is_bool,
    "amqp_proxy_protocol": _optional(is_bool),
    "mqtt_proxy_protocol": _optional(is_bool),
    "stream_proxy_protocol": _optional(is_bool),
    "http_proxy_protocol": _optional(is_bool),
    "proxy_protocol_timeout": int_in(1, 3_600_000),
    "connection_rate_limit": int_in(0, 2**31 - 1),
    "publish_rate_limit": int_in(0, 2**31 - 1),
    "max_subscriptions_per_client": int_in(0, 2**31 - 1),
    "max_consumers_per_channel": int_in(0, 2**31 - 1),
    "max_message_size": int_in(1, MAX_MESSAGE_SIZE_LIMIT),
    "default_user": non_empty_str,
    "default_password": any_str,
    "loopback_users": _user_tuple,
    "default_vhost": non_empty_str,
    "segment_size": int_in(64 * 1024, 2**31 - 1),
    "sync": is_bool,
    "free_disk_min": int_in(0, 2**63 - 1),
    "memory_high_watermark": _fraction,
    "memory_high_watermark_absolute": int_in(0, 2**63 - 1),
    "consumer_timeout": int_in(0, 2**63 - 1),
    "collect_statistics_interval": int_in(0, 86_400_000),
    "load_definitions": _optional_path,
    "webhooks_file": _optional_path,
    "damaged_metadata": _damage_policy,
    "permit_global_qos": is_bool,
    "auth_failure_delay": int_in(0, 60_000),
    "auth_failures_per_minute": int_in(0, 1_000_000),
    "auth_backends": _auth_backends,
    "oauth2_resource_server_id": any_str,
    "oauth2_jwks_url": _optional_path,
    "oauth2_signing_keys": _signing_keys,
    "oauth2_default_key": _optional_path,
    "oauth2_issuer": _optional_path,
    "oauth2_verify_aud": is_bool,
    "oauth2_scope_prefix": _optional(any_str),
    "oauth2_preferred_username_claims": _user_tuple,
    "oauth2_additional_scopes_key": _optional_path,
    "oauth2_jwks_min_refetch_interval": int_in(0, 86_400),
    "oauth2_extra": check_extra,
    "mqtt_bind": non_empty_str,
    "mqtt_port": int_in(-1, 65535),
    "mqtt_tls_port": int_in(-1, 65535),
    "tls_cert": _optional_path,
    "tls_key": _optional_path,
    "tls_min_version": _tls_version,
    "tls_ciphers": any_str,
    "tls_ca_cert": _optional_path,
    "tls_verify_peer": is_bool,
    "tls_fail_if_no_peer_cert": is_bool,
    "tls_cert_login_from": _cert_login_from,
    "tls_sni_certs": _optional_path,
    "amqp_tls_port": int_in(-1, 65535),
    "http_tls_port": int_in(-1, 65535),
    "http_max_body_size": int_in(1, 2**31 - 1),
    "http_bridge_max_body_size": int_in(1, 2**31 - 1),
    "http_bridge_max_wait": int_in(0, 3600),
    "http_bridge_visibility_timeout": int_in(1, 86_400),
    "http_bridge_max_visibility_timeout": int_in(1, 86_400),
    "http_bridge_max_consumers_per_user": int_in(0, 1_000_000),
    "http_connection_rate_limit": _optional(int_in(0, 2**31 - 1)),
    "prometheus_proxy_protocol": _optional(is_bool),
    "clustering_proxy_protocol": _optional(is_bool),
    "http_max_definitions_size": int_in(1, 2**31 - 1),
    "http_body_budget": int_in(1, 2**63 - 1),
    "sample_retention_global": _retention,
    "sample_retention_basic": _retention,
    "sample_retention_detailed": _retention,
    "mqtt_exchange": non_empty_str,
    "mqtt_vhost": non_empty_str,
    "mqtt_allow_anonymous": is_bool,
    "amqp1_allow_anonymous": is_bool,
    "amqp1_announce_rabbitmq": is_bool,
    "stream_bind": non_empty_str,
    "stream_port": int_in(-1, 65535),
    "stream_tls_port": _optional(int_in(-1, 65535)),
    "stream_allow_anonymous": is_bool,
    "stream_advertised_host": any_str,
    "stream_advertised_port": int_in(0, 65535),
    "stream_frame_max": int_in(0, 0xFFFFFFFF),
    "stream_heartbeat": int_in(0, 65535),
    "mqtt_prefetch": int_in(1, 65535),
    "mqtt_max_session_expiry": int_in(0, 0xFFFFFFFF),
    "mqtt_max_keepalive": int_in(0, 65535),
    "mqtt_topic_alias_maximum": int_in(0, 65535),
    "mqtt_packet_timeout": _seconds,
    "mqtt_partial_packet_memory": _zero_or_in(65536, 1 << 40),
    "clustering": is_bool,
    "clustering_etcd_endpoints": _endpoint_list,
    "clustering_etcd_prefix": non_empty_str,
    "clustering_bind": non_empty_str,
    "clustering_port": int_in(0, 65535),
    "clustering_advertised_uri": any_str,
    "clustering_max_unsynced_actions": int_in(1, 2**31 - 1),
    "clustering_lease_ttl": int_in(2, 3600),
    "clustering_stream_read_port": int_in(-1, 65535),
    "clustering_stream_protocol_read_port": int_in(-1, 65535),
    "clustering_tls": is_bool,
    "clustering_etcd_ca_cert": _optional_path,
    "clustering_etcd_cert": _optional_path,
    "clustering_etcd_key": _optional_path,
    "clustering_target_cluster_size_hint": int_in(1, 1000),
    "clustering_node_name": _node_name,
    **MGMT_OAUTH_CHECKS,
    **COAP_CHECKS,
}


def check_field(name: str, value: Any) -> str | None:
    """Why ``value`` is unacceptable for field ``name``, or None if it is fine.

    Public so callers that merge other sources (CLI flags) can name that
    source in their error message instead of the field name.
    """
    return _CHECKS[name](value)
