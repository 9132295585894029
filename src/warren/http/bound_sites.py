"""The ports of an aiohttp listener, bound before its application exists.

The management and Prometheus listeners bind (and listen on) their HTTP and
HTTPS ports when the broker binds every port, before it reads the data dir
(bound_port.py), and serve them through aiohttp's SockSite once started.
"""

from __future__ import annotations

import ssl

from aiohttp import web

from warren.bound_port import BoundPort

__all__ = ["BoundSites"]


class BoundSites:
    """The bound, not yet served, ports of one aiohttp listener."""

    def __init__(self) -> None:
        self._ports: list[tuple[BoundPort, ssl.SSLContext | None]] = []

    def __bool__(self) -> bool:
        return bool(self._ports)

    def bind(self, what: str, host: str, port: int, tls: ssl.SSLContext | None = None) -> int:
        """Bind and listen on host:port (BindError if taken); the port bound."""
        bound = BoundPort(what, host, port, 128)
        self._ports.append((bound, tls))
        return bound.port

    async def start(self, runner: web.BaseRunner) -> None:
        """Serve every bound socket through the runner (which closes them at its cleanup)."""
        pending = [(sock, tls, bound.backlog) for bound, tls in self._ports for sock in bound.take()]
        self._ports.clear()
        try:
            while pending:
                sock, tls, backlog = pending[0]
                await web.SockSite(runner, sock, ssl_context=tls, backlog=backlog).start()
                pending.pop(0)
        finally:
            for sock, _, _ in pending:
                sock.close()

    def close(self) -> None:
        """Close what was bound and not served."""
        for bound, _ in self._ports:
            bound.close()
        self._ports.clear()
