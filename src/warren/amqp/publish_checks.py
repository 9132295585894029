"""RabbitMQ's checks of a publish's property list, for the message-by-message
path (`Publishing._publish_message`). A run of publishes skips them: the property
lists a run takes (publish_run.simple_delivery_mode) pass every one."""

from __future__ import annotations

from warren.core.codec_errors import DecodeError, UnsafeValue
from warren.core.dead_letter import check_routing_headers
from warren.core.erlang_format import string_p
from warren.core.errors import FrameError, PreconditionFailed
from warren.core.message import Message
from warren.core.properties import (
    edit_properties,
    peek_delivery_mode,
    peek_expiration,
    validate_properties,
)
from warren.core.users import User
from warren.core.vhost_routing import REPLY_TO, REPLY_TO_PREFIX

__all__ = ["MAX_EXPIRY", "check_message", "expiration_error", "validate_publish_properties"]

# The user_id property's bit in the second byte of the property flags word.
_USER_ID_FLAG = 0x10
# delivery-mode and expiration bits in the first byte: properties RabbitMQ validates.
_CHECKED_FLAGS = 0x11
# The headers bit in the first byte.
_HEADERS_FLAG = 0x20
#: Per-message TTLs above ten years are refused, as RabbitMQ does.
MAX_EXPIRY = 315_360_000_000


def validate_publish_properties(props: bytes) -> None:
    """Refuse, before anything is routed or confirmed, a property list that a
    later path or a consumer could not decode (core/properties.py). RabbitMQ
    crashes the connection with 541 on the malformed ones; Warren says why."""
    try:
        validate_properties(props)
    except DecodeError as exc:
        raise FrameError(f"cannot decode the message's properties: {exc}") from None
    except UnsafeValue as exc:
        raise PreconditionFailed(f"invalid message: {exc}") from None


def check_message(msg: Message, user: User | None, reply_token: str | None) -> Message:
    """RabbitMQ's checks of a publish's properties (user-id, expiration,
    delivery-mode, CC/BCC types) and the direct reply-to rewrite (with the
    channel's ``reply_token``), for a message with more properties than
    delivery-mode."""
    props = msg.properties
    if props[1] & _USER_ID_FLAG:
        _check_user_id(msg, user)
    if props[0] & _CHECKED_FLAGS:
        _check_properties(props)
    if props[0] & _HEADERS_FLAG and b"CC" in props:  # CC or BCC, maybe
        check_routing_headers(msg.headers)
    if b"amq.rabbitmq.reply-to" in props:
        msg = _rewrite_reply_to(msg, reply_token)
    return msg


def _check_user_id(msg: Message, user: User | None) -> None:
    """RabbitMQ's validated user-id: it must name the authenticated user."""
    claimed = msg.decoded_properties().user_id
    assert user is not None
    if claimed != user.name and "impersonator" not in user.tags:
        raise PreconditionFailed(
            f"user_id property set to '{claimed}' but authenticated user was '{user.name}'"
        )


def _check_properties(props: bytes) -> None:
    """RabbitMQ refuses a publish whose expiration or delivery-mode it cannot use."""
    expiration = peek_expiration(props)
    mode = peek_delivery_mode(props)
    if expiration is not None:
        error = expiration_error(expiration)
        if error is not None:
            raise PreconditionFailed(f"invalid expiration '{expiration}': {error}")
    if mode is not None and mode not in (1, 2):
        raise PreconditionFailed(f"invalid message: {{delivery_mode_unknown,{mode}}}")


def _rewrite_reply_to(msg: Message, reply_token: str | None) -> Message:
    if msg.decoded_properties().reply_to != REPLY_TO:
        return msg
    if reply_token is None:
        raise PreconditionFailed("fast reply consumer does not exist")
    raw = edit_properties(
        msg.properties, set_properties={"reply_to": REPLY_TO_PREFIX + reply_token}
    )
    return Message(msg.exchange, msg.routing_key, raw, msg.body, msg.timestamp)


def expiration_error(expiration: str) -> str | None:
    """Why RabbitMQ cannot take ``expiration`` as a TTL (its Erlang term), or None.

    Like Erlang's string:to_integer: an optional sign and digits, nothing else.
    """
    digits = expiration[1:] if expiration[:1] in ("+", "-") else expiration
    count = 0
    while count < len(digits) and "0" <= digits[count] <= "9":
        count += 1
    if count == 0:
        return "no_integer"
    rest = digits[count:]
    if rest:
        return f"{{leftover_string,{string_p(rest)}}}"
    value = int(expiration)
    if value < 0:
        return f"{{value_negative,{value}}}"
    if value > MAX_EXPIRY:
        return f"{{value_too_large,{value}}}"
    return None
