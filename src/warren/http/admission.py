"""The management listener's connection rate per source address.

As the AMQP, MQTT and stream listeners, the management ports (HTTP, HTTPS)
count each new connection against ``connection_rate_limit`` per source
address (core/rate_limits.py; ``[mgmt] connection_rate_limit``, else
``[main]``'s), the PROXY header's client when that is on: the check sits
where the connection is handed to aiohttp, after the header and the TLS
handshake. A connection over the rate never reaches aiohttp: it is answered
``429 Too Many Requests`` (``Retry-After: 1``, ``Connection: close``) and
closed once its request head is read (so the client reads the answer rather
than a reset), or after a deadline on the node's clock.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from warren.core.clock import Clock, TimerHandle

__all__ = ["Admit", "admitting"]

log = logging.getLogger("warren.http")

#: Whether a connection from the address (None: not a network one) may go on.
Admit = Callable[[str | None], bool]

#: ms a refused connection has to send its request head before it is closed.
REFUSED_DEADLINE_MS = 5000

_BODY = b'{"error":"too_many","reason":"connection_rate_limit reached, retry later"}'
_TOO_MANY = (
    b"HTTP/1.1 429 Too Many Requests\r\n"
    b"Content-Type: application/json\r\n"
    b"Retry-After: 1\r\n"
    b"Connection: close\r\n"
    b"Content-Length: %d\r\n"
    b"\r\n%s" % (len(_BODY), _BODY)
)


def admitting(
    factory: Callable[[], asyncio.BaseProtocol], admit: Admit, clock: Clock, what: str
) -> Callable[[], asyncio.BaseProtocol]:
    """A protocol factory that gives a connection ``factory``'s protocol when
    ``admit`` lets its peer in, else answers it 429 and closes it."""
    return lambda: _Admission(factory, admit, clock, what)


class _Admission(asyncio.Protocol):
    """A connection until it is admitted or refused: then the chosen protocol's."""

    def __init__(
        self, factory: Callable[[], asyncio.BaseProtocol], admit: Admit, clock: Clock, what: str
    ) -> None:
        self._factory = factory
        self._admit = admit
        self._clock = clock
        self._what = what
        self._chosen: asyncio.Protocol | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        host = str(peer[0]) if isinstance(peer, tuple) else None
        chosen: asyncio.BaseProtocol
        if self._admit(host):
            chosen = self._factory()
        else:
            port = peer[1] if isinstance(peer, tuple) else ""
            log.warning(
                "%s:%s: %s connection refused: connection_rate_limit reached",
                host,
                port,
                self._what,
            )
            chosen = _Refused(self._clock)
        # Python's transports switch their reading to the new protocol's kind.
        self._chosen = cast(asyncio.Protocol, chosen)
        transport.set_protocol(chosen)
        chosen.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        # What a TLS layer read before the hand-over (proxy_accept.py) comes here.
        if self._chosen is not None:
            self._chosen.data_received(data)

    def eof_received(self) -> bool | None:
        return self._chosen.eof_received() if self._chosen is not None else None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._chosen is not None:
            self._chosen.connection_lost(exc)


class _Refused(asyncio.Protocol):
    """A connection over the rate: answered 429 at once, closed after its request head."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._transport: asyncio.BaseTransport | None = None
        self._timer: TimerHandle | None = None
        self._tail = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        cast(asyncio.Transport, transport).write(_TOO_MANY)
        self._timer = self._clock.call_later(REFUSED_DEADLINE_MS, transport.close)

    def data_received(self, data: bytes) -> None:
        seen = self._tail + data
        if b"\r\n\r\n" in seen and self._transport is not None:
            self._transport.close()
        self._tail = seen[-3:]

    def eof_received(self) -> bool:
        return False  # the transport closes

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
