"""AMQP 1.0 error conditions (part 2, 2.8.15-2.8.18) and the exceptions that carry them.

Each exception says at what scope the peer is answered: a whole connection
(close), a session (end) or a link (detach). The connection's frame loop
catches them at that scope, so a bad link never ends its session and a bad
session never its connection.
"""

from __future__ import annotations

from typing import Any, Final

from warren.amqp1.performatives import Error
from warren.amqp1.types import Symbol

__all__ = [
    "ConnectionError_",
    "LinkError",
    "ProtocolError",
    "SessionError",
]

INTERNAL_ERROR: Final = "amqp:internal-error"
NOT_FOUND: Final = "amqp:not-found"
UNAUTHORIZED_ACCESS: Final = "amqp:unauthorized-access"
DECODE_ERROR: Final = "amqp:decode-error"
RESOURCE_LIMIT_EXCEEDED: Final = "amqp:resource-limit-exceeded"
NOT_ALLOWED: Final = "amqp:not-allowed"
INVALID_FIELD: Final = "amqp:invalid-field"
NOT_IMPLEMENTED: Final = "amqp:not-implemented"
RESOURCE_LOCKED: Final = "amqp:resource-locked"
PRECONDITION_FAILED: Final = "amqp:precondition-failed"
RESOURCE_DELETED: Final = "amqp:resource-deleted"
ILLEGAL_STATE: Final = "amqp:illegal-state"
FRAME_SIZE_TOO_SMALL: Final = "amqp:frame-size-too-small"
CONNECTION_FORCED: Final = "amqp:connection:forced"
FRAMING_ERROR: Final = "amqp:connection:framing-error"
WINDOW_VIOLATION: Final = "amqp:session:window-violation"
UNATTACHED_HANDLE: Final = "amqp:session:unattached-handle"
HANDLE_IN_USE: Final = "amqp:session:handle-in-use"
DETACH_FORCED: Final = "amqp:link:detach-forced"
MESSAGE_SIZE_EXCEEDED: Final = "amqp:link:message-size-exceeded"
TRANSFER_LIMIT_EXCEEDED: Final = "amqp:link:transfer-limit-exceeded"


def error(condition: str, description: str | None = None, info: Any = None) -> Error:
    """An error performative field."""
    return Error(Symbol(condition), description, info)


class ProtocolError(Exception):
    """Something the peer did that ends a scope, with the condition to say why."""

    def __init__(self, condition: str, description: str) -> None:
        super().__init__(description)
        self.condition = condition
        self.description = description

    def as_error(self) -> Error:
        return error(self.condition, self.description)


class ConnectionError_(ProtocolError):  # noqa: N801  (the builtin's name is taken)
    """Ends the connection: close with this error."""


class SessionError(ProtocolError):
    """Ends the session: end with this error."""


class LinkError(ProtocolError):
    """Ends the link: detach (closed) with this error."""
