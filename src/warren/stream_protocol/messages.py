"""What the stream protocol needs to turn its messages into the core's and back.

A stream protocol message is an AMQP 1.0-encoded message that RabbitMQ
stores as it came. A protocol package never imports another, so the AMQP 1.0
codec is not imported here: the composition root (warren.app) builds a
`StreamMessageCodec` from amqp1's decoder and mapping and hands it to the
stream listener.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from warren.core.message import Message

__all__ = ["RawMessages", "StreamMessageCodec"]


class StreamMessageCodec(Protocol):
    """The conversions between a stream protocol record and a core message."""

    def to_core(self, data: bytes) -> tuple[bytes, bytes, bytes | None]:
        """A published record as the core's (properties, body, native): native
        always keeps the record's bare message, so a stream consumer gets the
        bytes back as they were published; a record that is no AMQP 1.0
        message is a body of its own, kept as native too."""
        ...

    def to_wire(self, msg: Message) -> bytes:
        """The record a stream consumer gets for ``msg``: its native bytes
        when it has them, else its AMQP 1.0 encoding (RabbitMQ 4's conversion
        of a 0-9-1 message)."""
        ...


class RawMessages:
    """The codec of a listener built without one (tests of the codec alone):
    records are bodies as they are, without properties."""

    def to_core(self, data: bytes) -> tuple[bytes, bytes, bytes | None]:
        return b"\x00\x00", data, data

    def to_wire(self, msg: Message) -> bytes:
        return msg.native if msg.native is not None else msg.body
