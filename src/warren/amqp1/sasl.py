"""The SASL layer of an AMQP 1.0 connection (part 5, 5.3): which mechanisms, and a login.

RabbitMQ 4 requires SASL. It offers PLAIN, ANONYMOUS where anonymous logins are
allowed (Warren: ``[amqp1] allow_anonymous``, as MQTT's ``allow_anonymous``: the
default user logs in, which ``loopback_users`` keeps to this machine), and
EXTERNAL when a verified TLS client certificate names a user (as the AMQP
0-9-1 side offers it: warren.tls.cert_login). The checks themselves are the
client session's (core/session.py), for every protocol alike.
"""

from __future__ import annotations

from typing import Final

from warren.amqp1.types import Symbol

__all__ = ["PLAIN", "ANONYMOUS", "EXTERNAL", "mechanisms", "credentials"]

PLAIN: Final = "PLAIN"
ANONYMOUS: Final = "ANONYMOUS"
EXTERNAL: Final = "EXTERNAL"


def mechanisms(cert_login: str | None, allow_anonymous: bool) -> tuple[Symbol, ...]:
    """The mechanisms offered, the strongest first (clients pick the first they know)."""
    offered: list[str] = []
    if cert_login is not None:
        offered.append(EXTERNAL)
    offered.append(PLAIN)
    if allow_anonymous:
        offered.append(ANONYMOUS)
    return tuple(Symbol(m) for m in offered)


def credentials(response: bytes | None) -> tuple[str, str] | None:
    """PLAIN's (user, password) from ``authzid NUL authcid NUL passwd`` (RFC 4616);
    None when malformed. An authorization identity other than empty or the user
    itself is refused, as impersonation is not offered."""
    if response is None:
        return None
    parts = response.split(b"\x00")
    if len(parts) != 3:
        return None
    authzid, user, password = parts
    if authzid and authzid != user:
        return None
    try:
        return user.decode("utf-8"), password.decode("utf-8")
    except UnicodeDecodeError:
        return None
