"""The names a config file may use, and where in the file each one is.

Warren refuses to start on a section or key it does not know, as RabbitMQ
does: a typo (``[mian]``, ``prot = 5673``) would otherwise leave the broker
running on defaults. The error names the file, the line and the nearest known
name. Two kinds of LavinMQ names are not typos and are told apart:

* settings of LavinMQ features Warren does not have (``[amqp] unix_path``,
  ``[experimental]`` ...): a warning, and the rest of the file applies, so a LavinMQ
  config file still starts the broker;
* LavinMQ settings Warren has under another name or meaning
  (``default_password_hash``, ``[mqtt] max_inflight_messages`` ...): an error
  that says which Warren setting to use, since ignoring them would change
  what the broker does (a default password, a limit).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

__all__ = [
    "RENAMED",
    "UNSUPPORTED_KEYS",
    "line_numbers",
    "suggestion",
    "unsupported_section",
]

#: LavinMQ keys of features Warren does not implement: warned about, ignored.
UNSUPPORTED_KEYS: frozenset[tuple[str, str]] = frozenset(
    [
        *(
            ("main", key)
            for key in (
                "data_dir_lock",
                "log_file",
                "stats_interval",
                "stats_log_size",
                "set_timestamp",
                "socket_buffer_size",
                "tcp_nodelay",
                "tcp_keepalive",
                "tcp_recv_buffer_size",
                "tcp_send_buffer_size",
                "tls_keylog_file",
                "log_exchange",
                "free_disk_warn",
                "max_deleted_definitions",
                "default_consumer_prefetch",
            )
        ),
        *(
            ("amqp", key)
            for key in (
                "unix_path",
                "unix_proxy_protocol",
                "tcp_proxy_protocol",
                "set_timestamp",
                "default_consumer_prefetch",
            )
        ),
        ("mgmt", "unix_path"),
        ("mqtt", "unix_path"),
        ("mqtt", "permission_check_enabled"),
        ("mqtt", "max_packet_size"),
        ("clustering", "on_leader_elected"),
        ("clustering", "on_leader_lost"),
    ]
)

#: LavinMQ sections of features Warren does not implement (and ``[sni:<host>]``).
_UNSUPPORTED_SECTIONS = frozenset({"experimental"})

#: LavinMQ names whose setting Warren has under another name: an error naming it.
RENAMED: dict[tuple[str, str | None], str] = {
    ("http", None): "Warren's management API section is [mgmt]",
    ("replication", None): "LavinMQ replaced [replication] with [clustering]",
    ("amqp", "tls_cert"): "the certificate is [main] tls_cert",
    ("amqp", "tls_key"): "the key is [main] tls_key",
    ("mgmt", "tls_cert"): "the certificate is [main] tls_cert",
    ("mgmt", "tls_key"): "the key is [main] tls_key",
    ("amqp", "consumer_timeout"): "Warren's is [main] consumer_timeout",
    ("mqtt", "max_inflight_messages"): "Warren's is [mqtt] prefetch",
    ("main", "metrics_http_bind"): "Warren's is [prometheus] bind",
    ("main", "metrics_http_port"): "Warren's is [prometheus] port",
    ("main", "default_password_hash"): (
        "Warren takes the default user's password in plain text: [main] default_password"
    ),
    ("main", "default_user_only_loopback"): "Warren's is [main] loopback_users (user names)",
    ("main", "guest_only_loopback"): "Warren's is [main] loopback_users (user names)",
}


def unsupported_section(section: str) -> bool:
    """A LavinMQ section Warren has no feature for (its keys are not checked)."""
    return section in _UNSUPPORTED_SECTIONS or section.startswith("sni:")


def suggestion(name: str, candidates: Iterable[str]) -> str | None:
    """The known name closest to ``name``, if one is close enough to be a typo of it."""
    matches = difflib.get_close_matches(name, sorted(set(candidates)), n=1, cutoff=0.6)
    return matches[0] if matches else None


_SECTION_RE = re.compile(r"\[(?P<name>.+)\]")
_INLINE_COMMENT = re.compile(r"\s;")
_KEY_RE = re.compile(r"(?P<key>[^=:]+?)\s*[=:]")


def line_numbers(text: str) -> dict[tuple[str, str | None], int]:
    """1-based line of each ``(section, None)`` header and ``(section, key)`` in ``text``.

    Follows configparser's reading closely enough for error messages: keys are
    lower-cased as configparser's optionxform does, indented lines continue a
    value, comments start with ``#`` or ``;``. The first occurrence wins
    (configparser rejects duplicates anyway).
    """
    found: dict[tuple[str, str | None], int] = {}
    section: str | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = _INLINE_COMMENT.split(line.strip(), maxsplit=1)[0]
        if not stripped or stripped[0] in "#;" or line[0].isspace():
            continue
        header = _SECTION_RE.match(stripped)
        if header is not None:
            section = header.group("name")
            found.setdefault((section, None), number)
            continue
        key = _KEY_RE.match(stripped)
        if section is not None and key is not None:
            found.setdefault((section, key.group("key").strip().lower()), number)
    return found
