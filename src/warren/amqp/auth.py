"""SASL mechanisms a client may pick in connection.start-ok."""

from __future__ import annotations

import struct

from warren.core.codec_errors import DecodeError
from warren.core.table import decode_table

# In RabbitMQ's order: clients that pick the first mechanism they know pick the same.
MECHANISMS = b"AMQPLAIN PLAIN"
#: Offered on TLS connections whose client presented a verified certificate, as
#: RabbitMQ's rabbitmq_auth_mechanism_ssl (whose should_offer checks for a peer
#: certificate): the certificate names the user, no password.
MECHANISMS_WITH_EXTERNAL = b"EXTERNAL AMQPLAIN PLAIN"


def parse_credentials(mechanism: str, response: bytes) -> tuple[str, str] | None:
    """(username, password) from a start-ok response, or None if it is malformed."""
    if mechanism == "PLAIN":
        # NUL user NUL password: like RabbitMQ, no authorisation identity before the
        # first NUL is accepted.
        parts = response.split(b"\x00")
        if len(parts) != 3 or parts[0]:
            return None
        _authzid, user, password = parts
        return user.decode("utf-8", "replace"), password.decode("utf-8", "replace")
    if mechanism == "AMQPLAIN":
        # A field table without its length prefix.
        try:
            table, _ = decode_table(struct.pack(">I", len(response)) + response, 0)
        except DecodeError:
            return None
        login, secret = table.get("LOGIN"), table.get("PASSWORD")
        if isinstance(login, bytes):
            login = login.decode("utf-8", "replace")
        if isinstance(secret, bytes):
            secret = secret.decode("utf-8", "replace")
        if not isinstance(login, str) or not isinstance(secret, str):
            return None
        return login, secret
    return None
