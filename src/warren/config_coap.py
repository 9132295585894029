"""The ``[coap]`` settings (warren.coap, docs/coap.md), kept apart from config.py.

Off by default, as a RabbitMQ plugin is until enabled: ``[coap] enabled =
true`` opens UDP ``bind:port`` (5683, CoAP's; 0 picks a free one, as embedded
brokers do). config.py's Config takes these fields as a base class, its INI
table takes COAP_INI_KEYS and config_checks.py takes COAP_CHECKS, so this
module imports neither (they import it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from warren.config_values import int_in, is_bool, parse_bool, parse_int, parse_str

__all__ = ["COAP_CHECKS", "COAP_INI_KEYS", "CoAPSettings", "coap_problem"]


@dataclass
class CoAPSettings:
    """Config's CoAP fields (the other fields are config.py's)."""

    #: Serve CoAP at all (RabbitMQ-style: a plugin is off until enabled).
    coap_enabled: bool = False
    coap_bind: str = "127.0.0.1"
    #: UDP port; 0 picks a free one.
    coap_port: int = 5683
    #: The vhost CoAP requests publish and observe in.
    coap_vhost: str = "/"
    #: The user a request without ``u``/``p`` in its query acts as ("": such
    #: requests are refused with 4.01).
    coap_anonymous_user: str = ""
    #: Requests per source address per second (0: no limit); beyond, 4.29.
    coap_requests_per_second: int = 100
    #: Largest request payload (a block-wise upload: all of it); beyond, 4.13.
    coap_max_payload: int = 1024
    #: Observations (subscriptions) open at once on the node.
    coap_max_observations: int = 10_000
    #: Seconds after its last datagram a client observing nothing is no longer
    #: listed under /api/connections (0: listed until closed or shutdown).
    coap_client_idle_timeout: int = 300
    #: Serve CoAP over DTLS too (``coaps://``; needs DTLSSocket, the PSK file).
    coap_dtls_enabled: bool = False
    #: DTLS's UDP port; 0 picks a free one.
    coap_dtls_port: int = 5684
    #: ``identity:key`` lines: a PSK per user, the identity its name.
    coap_dtls_psk_file: str = ""
    #: DTLS sessions (and handshakes past the cookie) at once.
    coap_dtls_max_sessions: int = 1000
    #: Seconds a handshake may take, then its peer is forgotten.
    coap_dtls_handshake_timeout: int = 30
    #: Seconds a session may go without a datagram to or from its peer.
    coap_dtls_idle_timeout: int = 600


#: (section, key) -> (Config field, parser), as config.py's _INI_KEYS.
COAP_INI_KEYS: dict[tuple[str, str], tuple[str, Callable[[str], Any]]] = {
    ("coap", "enabled"): ("coap_enabled", parse_bool),
    ("coap", "bind"): ("coap_bind", parse_str),
    ("coap", "port"): ("coap_port", parse_int),
    ("coap", "vhost"): ("coap_vhost", parse_str),
    ("coap", "anonymous_user"): ("coap_anonymous_user", parse_str),
    ("coap", "requests_per_second"): ("coap_requests_per_second", parse_int),
    ("coap", "max_payload"): ("coap_max_payload", parse_int),
    ("coap", "max_observations"): ("coap_max_observations", parse_int),
    ("coap", "client_idle_timeout"): ("coap_client_idle_timeout", parse_int),
    ("coap", "dtls_enabled"): ("coap_dtls_enabled", parse_bool),
    ("coap", "dtls_port"): ("coap_dtls_port", parse_int),
    ("coap", "dtls_psk_file"): ("coap_dtls_psk_file", parse_str),
    ("coap", "dtls_max_sessions"): ("coap_dtls_max_sessions", parse_int),
    ("coap", "dtls_handshake_timeout"): ("coap_dtls_handshake_timeout", parse_int),
    ("coap", "dtls_idle_timeout"): ("coap_dtls_idle_timeout", parse_int),
}


def _text(empty_ok: bool) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        if not isinstance(value, str) or (not empty_ok and not value):
            return "must be a string" if empty_ok else "must be a non-empty string"
        return None

    return check


#: Field -> why a value is unacceptable (None: fine), as config_checks.py's.
COAP_CHECKS: dict[str, Callable[[Any], str | None]] = {
    "coap_enabled": is_bool,
    "coap_bind": _text(False),
    "coap_port": int_in(0, 65535),
    "coap_vhost": _text(False),
    "coap_anonymous_user": _text(True),
    "coap_requests_per_second": int_in(0, 1_000_000),
    # Block-wise uploads go beyond a datagram; each of at most 64 at once
    # (coap/blockwise.py) holds up to this much.
    "coap_max_payload": int_in(1, 1 << 20),
    "coap_max_observations": int_in(0, 1_000_000),
    "coap_client_idle_timeout": int_in(0, 86_400),
    "coap_dtls_enabled": is_bool,
    "coap_dtls_port": int_in(0, 65535),
    "coap_dtls_psk_file": _text(True),
    "coap_dtls_max_sessions": int_in(1, 1_000_000),
    "coap_dtls_handshake_timeout": int_in(1, 3600),
    "coap_dtls_idle_timeout": int_in(1, 86_400),
}


def coap_problem(config: CoAPSettings) -> tuple[str, str] | None:
    """(field, message) for settings that do not go together (Config.validate)."""
    if config.coap_dtls_enabled and not config.coap_dtls_psk_file:
        return ("coap_dtls_enabled", "[coap] dtls_enabled needs dtls_psk_file (identity:key lines)")
    return None
