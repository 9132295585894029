"""The ports of an aiohttp listener, bound before its application exists.

The management and Prometheus listeners bind (and listen on) their HTTP and
HTTPS ports when the broker binds every port, before it reads the data dir
(bound_port.py), and serve them through aiohttp's SockSite once started.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Callable

from aiohttp import web

from warren.bound_port import BoundPort
from warren.proxy_accept import ProxySettings, proxy_factory

__all__ = ["BoundSites", "Wrap"]

#: A protocol factory, and what wraps one (given the port's name, HTTP or HTTPS).
Factory = Callable[[], asyncio.BaseProtocol]
Wrap = Callable[[Factory, str], Factory]


class BoundSites:
    """The bound, not yet served, ports of one aiohttp listener."""

    def __init__(self) -> None:
        self._ports: list[tuple[BoundPort, ssl.SSLContext | None]] = []
        self._proxy: ProxySettings | None = None

    def __bool__(self) -> bool:
        return bool(self._ports)

    def bind(self, what: str, host: str, port: int, tls: ssl.SSLContext | None = None) -> int:
        """Bind and listen on host:port (BindError if taken); the port bound."""
        bound = BoundPort(what, host, port, 128)
        self._ports.append((bound, tls))
        return bound.port

    async def start(
        self,
        runner: web.BaseRunner,
        proxy: ProxySettings | None = None,
        wrap: Wrap | None = None,
    ) -> None:
        """Serve every bound socket through the runner (which closes them at its
        cleanup); with ``proxy``, each connection opens with a PROXY header;
        ``wrap`` wraps the request handlers' factory (after the header and the
        TLS handshake: http/admission.py's connection rate)."""
        self._proxy = proxy
        pending = [
            (sock, tls, bound.backlog) for bound, tls in self._ports for sock in bound.take()
        ]
        self._ports.clear()
        try:
            while pending:
                sock, tls, backlog = pending[0]
                if proxy is None and wrap is None:
                    await web.SockSite(runner, sock, ssl_context=tls, backlog=backlog).start()
                else:
                    await _WrappedSite(runner, sock, tls, backlog, proxy, wrap).start()
                pending.pop(0)
        finally:
            for sock, _, _ in pending:
                sock.close()

    def close(self) -> None:
        """Close what was bound and not served, and the connections still sending
        their PROXY header (aiohttp does not know of them)."""
        if self._proxy is not None:
            self._proxy.abort_waiting()
        for bound, _ in self._ports:
            bound.close()
        self._ports.clear()


class _WrappedSite(web.SockSite):
    """aiohttp's SockSite, its request handlers made once the PROXY header is read
    (and the TLS handshake done; aiohttp has no PROXY protocol of its own)
    and through ``wrap``."""

    __slots__ = ("_proxy", "_wrap")

    def __init__(
        self,
        runner: web.BaseRunner,
        sock: socket.socket,
        tls: ssl.SSLContext | None,
        backlog: int,
        proxy: ProxySettings | None,
        wrap: Wrap | None,
    ) -> None:
        super().__init__(runner, sock, ssl_context=tls, backlog=backlog)
        self._proxy = proxy
        self._wrap = wrap

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site; SockSite's own serves
        server = self._runner.server
        assert server is not None
        what = "HTTPS" if self._ssl_context else "HTTP"
        factory: Factory = server
        if self._wrap is not None:
            factory = self._wrap(factory, what)
        tls = self._ssl_context
        if self._proxy is not None:  # the header first, then TLS
            factory, tls = proxy_factory(factory, tls, self._proxy, what), None
        self._server = await asyncio.get_running_loop().create_server(
            factory, sock=self._sock, ssl=tls, backlog=self._backlog
        )
