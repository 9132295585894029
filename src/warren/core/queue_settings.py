"""What a queue's arguments and a message's properties ask of the queue.

A queue's own x-arguments become the same settings keys that policies use
(``message-ttl``, ``max-length``, ``overflow``...), so one code path applies
either; a message's ``expiration`` property is its own TTL.
"""

from __future__ import annotations

import struct
from typing import Any

from warren.core.message import Message
from warren.core.properties import edit_properties, peek_expiration

DROP_HEAD, REJECT_PUBLISH, REJECT_PUBLISH_DLX = "drop-head", "reject-publish", "reject-publish-dlx"

_I64 = struct.Struct(">q")

# The expiration property's bit in the first byte of the property flags.
_EXPIRATION_FLAG = 0x01


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return value if isinstance(value, str) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def argument_settings(arguments: dict[str, Any]) -> dict[str, Any]:
    """A queue's own x-arguments under the policy keys they correspond to."""
    settings: dict[str, Any] = {}
    for key in (
        "message-ttl",
        "expires",
        "max-length",
        "max-length-bytes",
        "delivery-limit",
    ):
        value = _int(arguments.get("x-" + key))
        if value is not None:
            settings[key] = value
    for key in ("overflow", "dead-letter-exchange", "dead-letter-routing-key", "dead-letter-strategy"):
        text = _text(arguments.get("x-" + key))
        if text is not None:
            settings[key] = text
    return settings


def message_ttl(msg: Message) -> int | None:
    """The message's own TTL (the expiration property) in ms, or None."""
    return properties_ttl(msg.properties)


def properties_ttl(props: bytes) -> int | None:
    """The TTL in raw basic properties (their expiration) in ms, or None."""
    if not (props and props[0] & _EXPIRATION_FLAG):
        return None
    try:
        value = peek_expiration(props)
        return None if value is None else max(0, int(value))
    except ValueError:  # validated on publish; a damaged record is left alone
        return None


def with_delivery_count(msg: Message, count: int) -> Message:
    """The message as redelivered by a queue with a delivery limit: its headers
    carry x-delivery-count (a long, as RabbitMQ writes it), the number of
    earlier delivery attempts."""
    raw = edit_properties(msg.properties, set_headers={"x-delivery-count": b"l" + _I64.pack(count)})
    copy = Message(msg.exchange, msg.routing_key, raw, msg.body, msg.timestamp, msg.native)
    copy._ex_rk = msg._ex_rk
    return copy
