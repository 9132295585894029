"""Errors raised by the AMQP codec.

Everything that can go wrong while decoding peer bytes is a DecodeError, so
the connection layer needs a single except clause to turn garbage into a
FRAME_ERROR / SYNTAX_ERROR close instead of a crashed task.
"""

from __future__ import annotations

__all__ = ["DecodeError", "UnknownMethod", "UnsafeValue"]


class DecodeError(ValueError):
    """Peer sent bytes that are not valid AMQP 0-9-1 for the expected structure."""


class UnknownMethod(DecodeError):
    """Method frame with a class/method id pair that is not in the spec table.

    Kept distinct so the broker can answer with NOT_IMPLEMENTED / COMMAND_INVALID
    rather than a generic syntax error.
    """

    def __init__(self, class_id: int, method_id: int) -> None:
        super().__init__(f"unknown AMQP method {class_id}/{method_id}")
        self.class_id = class_id
        self.method_id = method_id

    def __reduce__(self) -> tuple[type[UnknownMethod], tuple[int, int]]:
        return (type(self), (self.class_id, self.method_id))


class UnsafeValue(ValueError):
    """Well-formed AMQP that Warren refuses to pass on: the client libraries its
    consumers use could not decode it (see core/table.py's validate_table)."""
