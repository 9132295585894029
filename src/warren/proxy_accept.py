"""Accepting a connection that opens with a PROXY protocol header.

Every listener (AMQP's, MQTT's, the stream protocol's, the HTTP ones, a
follower's read ports) serves its sockets through :func:`proxy_factory` when
its ``proxy_protocol`` is on (bound_port.ListenerPorts, http/bound_sites.py,
replica_reads.py): a :class:`ProxyHeaderProtocol`
reads the header (proxy_header.py) exactly, byte count by byte count, so
nothing after it is consumed; then the TLS handshake starts if the port is a
TLS one (the header comes before it), and the listener's own protocol is made
and given a transport whose ``peername`` and ``sockname`` are the header's.
That one ``get_extra_info`` is how every listing, log line, loopback check and
rate limit sees the proxied client without knowing of the proxy. A client that
sends no valid header within the deadline (the node's clock) is cut, with a
log line.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from asyncio import constants
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from warren.config import Config
from warren.proxy_header import ProxyHeader, ProxyHeaderError, parse

if TYPE_CHECKING:
    # Annotations only: warren-ctl imports bound_port, and with it this
    # module, without the core (tests/integration/test_ctl.py).
    from warren.core.clock import Clock, TimerHandle

__all__ = [
    "ProxiedTransport",
    "ProxyHeaderProtocol",
    "ProxySettings",
    "listener_proxy",
    "proxy_factory",
]

log = logging.getLogger("warren.proxy")

#: ms of the node's clock a client has to send its PROXY header (the default of
#: [main] proxy_protocol_timeout).
DEFAULT_TIMEOUT_MS = 5000


#: The TLS handshakes under way after a header.
_handshakes: set[asyncio.Task[None]] = set()


@dataclass(frozen=True, slots=True)
class ProxySettings:
    """A listener's PROXY protocol: on when a listener is given one."""

    clock: Clock
    timeout_ms: int = DEFAULT_TIMEOUT_MS
    #: Connections still before their listener's protocol (header, TLS
    #: handshake): no listener knows them, so its stop aborts them here.
    waiting: set[asyncio.Transport] = field(default_factory=set, compare=False)

    def abort_waiting(self) -> None:
        for transport in list(self.waiting):
            transport.abort()
        self.waiting.clear()


def listener_proxy(config: Config, clock: Clock, section: str) -> ProxySettings | None:
    """The PROXY protocol settings of the listener of ``section`` (amqp, mqtt,
    stream, mgmt, prometheus, clustering: a follower's read ports); None when
    it is off."""
    if not config.proxy_protocol_for(section):
        return None
    return ProxySettings(clock, config.proxy_protocol_timeout)


def proxy_factory(
    factory: Callable[[], asyncio.BaseProtocol],
    tls: ssl.SSLContext | None,
    settings: ProxySettings,
    what: str,
) -> Callable[[], asyncio.BaseProtocol]:
    """A protocol factory for a socket served without TLS (``tls`` is started
    after the header) that reads the header, then hands over to ``factory``'s."""
    return lambda: ProxyHeaderProtocol(factory, tls, settings, what)


class ProxiedTransport(asyncio.Transport):
    """A transport as it is, but for the addresses the PROXY header gave."""

    # asyncio's loop.sendfile would reach for the socket behind the header: fall
    # back to writes (aiohttp's file responses).
    _sendfile_compatible = constants._SendfileMode.FALLBACK

    def __init__(
        self, transport: asyncio.Transport, peer: tuple[str, int], local: tuple[str, int] | None
    ) -> None:
        super().__init__()
        self._inner = transport
        self._peer = peer
        self._local = local

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "peername":
            return self._peer
        if name == "sockname" and self._local is not None:
            return self._local
        return self._inner.get_extra_info(name, default)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._inner.write(data)

    def writelines(self, list_of_data: Any) -> None:
        self._inner.writelines(list_of_data)

    def is_closing(self) -> bool:
        return self._inner.is_closing()

    def close(self) -> None:
        self._inner.close()

    def abort(self) -> None:
        self._inner.abort()

    def pause_reading(self) -> None:
        self._inner.pause_reading()

    def resume_reading(self) -> None:
        self._inner.resume_reading()

    def is_reading(self) -> bool:
        return self._inner.is_reading()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._inner.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._inner.get_protocol()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._inner.set_write_buffer_limits(high, low)

    def get_write_buffer_size(self) -> int:
        return self._inner.get_write_buffer_size()

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._inner.get_write_buffer_limits()

    def can_write_eof(self) -> bool:
        return self._inner.can_write_eof()

    def write_eof(self) -> None:
        self._inner.write_eof()


class ProxyHeaderProtocol(asyncio.BufferedProtocol):
    """A connection until its PROXY header is read: then the listener's protocol's."""

    def __init__(
        self,
        factory: Callable[[], asyncio.BaseProtocol],
        tls: ssl.SSLContext | None,
        settings: ProxySettings,
        what: str,
    ) -> None:
        self._factory = factory
        self._tls = tls
        self._settings = settings
        self._what = what
        self._transport: asyncio.Transport | None = None
        self._timer: TimerHandle | None = None
        self._head = bytearray()
        #: The next read's size: never past the header's end.
        self._chunk = bytearray(1)
        self._want = 1
        self._done = False

    def _client(self) -> str:
        peer = self._transport.get_extra_info("peername") if self._transport else None
        return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "local"

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its API.
        self._transport = cast(asyncio.Transport, transport)
        self._settings.waiting.add(self._transport)
        first = parse(b"")
        assert isinstance(first, int)
        self._want = first
        self._timer = self._settings.clock.call_later(self._settings.timeout_ms, self._timeout)

    def get_buffer(self, sizehint: int) -> bytearray:
        if len(self._chunk) != self._want:
            self._chunk = bytearray(self._want)
        return self._chunk

    def buffer_updated(self, nbytes: int) -> None:
        if self._done:
            return
        self._head += self._chunk[:nbytes]
        try:
            result = parse(self._head)
        except ProxyHeaderError as exc:
            self._refuse(f"invalid PROXY protocol header ({exc})")
            return
        if isinstance(result, int):
            self._want = result
            return
        self._accepted(result)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        if self._transport is not None:
            self._settings.waiting.discard(self._transport)
        self._transport = None

    def _timeout(self) -> None:
        self._timer = None
        if not self._done:
            self._refuse("no PROXY protocol header in time")

    def _refuse(self, why: str) -> None:
        self._done = True
        self._cancel_timer()
        log.warning("%s: %s connection closed: %s", self._client(), self._what, why)
        if self._transport is not None:
            self._transport.abort()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _accepted(self, header: ProxyHeader) -> None:
        self._done = True
        self._cancel_timer()
        transport = self._transport
        assert transport is not None
        if self._tls is None:
            self._settings.waiting.discard(transport)
            self._hand_over(transport, header)
            return
        # Nothing more is read until start_tls has put TLS in between (it resumes
        # reading): a ClientHello read now would go to this protocol, and be lost.
        transport.pause_reading()
        task = asyncio.get_running_loop().create_task(self._start_tls(transport, header))
        _handshakes.add(task)  # the loop keeps only a weak reference
        task.add_done_callback(_handshakes.discard)

    async def _start_tls(self, transport: asyncio.Transport, header: ProxyHeader) -> None:
        assert self._tls is not None
        loop = asyncio.get_running_loop()
        waiting = _Waiting()
        try:
            tls_transport = await loop.start_tls(transport, waiting, self._tls, server_side=True)
        except (TimeoutError, OSError, ssl.SSLError, ConnectionError) as exc:
            log.warning("%s: %s TLS handshake failed: %s", self._client(), self._what, exc)
            transport.abort()
            return
        finally:
            self._settings.waiting.discard(transport)  # handed over below, or gone
        if tls_transport is None or tls_transport.is_closing() or waiting.lost:
            return
        self._hand_over(tls_transport, header, bytes(waiting.data))

    def _hand_over(
        self, transport: asyncio.Transport, header: ProxyHeader, data: bytes = b""
    ) -> None:
        """The listener's protocol takes the transport, seeing the header's addresses;
        ``data``: what the TLS layer read before."""
        protocol = self._factory()
        shown: asyncio.Transport = transport
        if header.source is not None:
            shown = ProxiedTransport(transport, header.source, header.dest)
        transport.set_protocol(protocol)
        protocol.connection_made(shown)
        if data and isinstance(protocol, asyncio.Protocol) and not transport.is_closing():
            protocol.data_received(data)


class _Waiting(asyncio.Protocol):
    """The TLS transport's protocol from the handshake to the hand-over (a loop
    turn later, once start_tls returned): keeps what it reads for the next."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.lost = False

    def data_received(self, data: bytes) -> None:
        self.data += data

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
