r"""Serving a second protocol on a listener's port, told apart by its protocol header.

RabbitMQ 4 takes AMQP 1.0 clients on the AMQP port: the first eight bytes
(``AMQP`` and a protocol id and version) say which protocol the client
speaks. A listener given a :data:`warren.node.HeaderHandoffs` table reads the
first bytes with :func:`choose` and, when they name another protocol, gives the
connection to it with :func:`hand_off`; its own protocol never learns of the
other (neither package imports the other: warren.app wires them).

What RabbitMQ 3.10.8 (Debian's) does, seen on its AMQP port: without the
rabbitmq_amqp1_0 plugin, ``AMQP\x00\x01\x00\x00`` and ``AMQP\x03\x01\x00\x00``
get 0-9-1's header back and the close, as any unknown header (so does Warren
with no handoffs); with it, the first is answered with itself and the server
waits for the client's open, the second with itself and a sasl-mechanisms
frame (ANONYMOUS, PLAIN, AMQPLAIN), and the TLS layer's ``AMQP\x02\x01\x00\x00``
with the SASL header and the close. 0-9-1 clients are served the same either way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final

from warren.node import HeaderHandoffs

__all__ = ["PENDING", "choose", "hand_off"]

#: :func:`choose`'s answer while the bytes so far could still be a registered header.
PENDING: Final = "pending"


def choose(
    handoffs: HeaderHandoffs, head: bytes | bytearray
) -> Callable[[], asyncio.Protocol] | None | str:
    """Whose connection a client that began with ``head`` is: the factory of the
    registered header it starts with (the longest, when one is a prefix of
    another), None when it can start with none (the listener's own protocol), or
    PENDING while more bytes are needed to tell. Decided as early as possible, so a
    client of the listener's own protocol is never held back for bytes it does not
    owe."""
    best: bytes | None = None
    for key in handoffs:
        if len(head) < len(key):
            if key.startswith(head):
                return PENDING  # this one may still match
        elif head.startswith(key) and (best is None or len(key) > len(best)):
            best = key
    return None if best is None else handoffs[best]


def hand_off(
    transport: asyncio.BaseTransport,
    factory: Callable[[], asyncio.Protocol],
    data: bytes,
) -> asyncio.Protocol:
    """Make the transport drive a new protocol of ``factory``: connection_made, then
    ``data`` (what was read so far). The old protocol has already let go of it."""
    protocol = factory()
    transport.set_protocol(protocol)
    protocol.connection_made(transport)
    if data:
        protocol.data_received(data)
    return protocol
