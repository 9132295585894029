"""A listener's port, bound and listening before the broker reads its data dir.

A start refused because a port is taken must leave the data directory as it
was, so the broker binds every listener's sockets first (broker_lifecycle.py)
and serves them only once it is started. Bound here means listening too: on
Linux a socket bound with SO_REUSEADDR but not listening does not keep another
such socket off the port, and its own listen() would then fail after the data
dir was read. Until :meth:`BoundPort.serve`, nothing accepts: a client that
connects waits in the kernel's backlog and is answered by the started broker.
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import ssl
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["BindError", "BoundPort", "ListenerPorts"]


class BindError(OSError):
    """A listener's port cannot be bound; names the listener and the address."""

    def __init__(self, cause: OSError, what: str, host: str, port: int) -> None:
        code = cause.errno if cause.errno is not None else errno.EINVAL
        reason = cause.strerror or str(cause)
        super().__init__(code, f"cannot listen on {what} {host}:{port} ({reason})")
        #: The listener's port as the operator knows it: ``AMQP``, ``MQTT/TLS``, ...
        self.what = what
        self.host = host
        self.port = port


class BoundPort:
    """The listening sockets of one host:port (one per address the host names),
    not yet accepting."""

    def __init__(self, what: str, host: str, port: int, backlog: int) -> None:
        self.what = what
        self.host = host
        self.backlog = backlog
        self.sockets: list[socket.socket] = []
        try:
            for family, kind, proto, address in _addresses(host, port):
                sock = socket.socket(family, kind, proto)
                self.sockets.append(sock)
                if os.name == "posix" and sys.platform != "cygwin":
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:  # as asyncio: IPv4 has its own socket
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind(address)
                sock.listen(backlog)
                sock.setblocking(False)
        except OSError as exc:
            self.close()
            raise BindError(exc, what, host, port) from exc
        #: The port bound (the one asked, or the one the OS chose for 0).
        self.port: int = self.sockets[0].getsockname()[1]

    async def serve(
        self, factory: Callable[[], asyncio.BaseProtocol], tls: ssl.SSLContext | None = None
    ) -> list[asyncio.AbstractServer]:
        """Start accepting on every socket; the servers own the sockets from then on."""
        loop = asyncio.get_running_loop()
        servers: list[asyncio.AbstractServer] = []
        sockets, self.sockets = self.sockets, []
        try:
            for sock in sockets:
                servers.append(
                    await loop.create_server(factory, sock=sock, backlog=self.backlog, ssl=tls)
                )
        except BaseException:
            for server in servers:
                server.close()
            for sock in sockets[len(servers) :]:
                sock.close()
            raise
        return servers

    def take(self) -> list[socket.socket]:
        """The sockets, for a server that makes its own (aiohttp's SockSite)."""
        sockets, self.sockets = self.sockets, []
        return sockets

    def close(self) -> None:
        """Close what was bound and not yet served."""
        for sock in self.sockets:
            sock.close()
        self.sockets = []


def _addresses(host: str, port: int) -> list[tuple[int, int, int, tuple[Any, ...]]]:
    """The passive addresses of host (every interface for ""), without repeats."""
    infos = socket.getaddrinfo(
        host or None, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE
    )
    seen: set[tuple[int, tuple[Any, ...]]] = set()
    out: list[tuple[int, int, int, tuple[Any, ...]]] = []
    for family, kind, proto, _, address in infos:
        if (family, address) not in seen:
            seen.add((family, address))
            out.append((family, kind, proto, address))
    if not out:
        raise OSError(errno.EADDRNOTAVAIL, f"no address for {host!r}")
    return out


class ListenerPorts:
    """A listener's plain and TLS ports (AMQP's, MQTT's, the stream protocol's):
    bound before the broker reads its data dir (:meth:`bind`), served once it has
    started (:meth:`serve`), and at the stop closed before the listener's
    clients are told, which the servers then wait for (:meth:`stop`)."""

    def __init__(self, what: str, bind: str, backlog: int = 4096) -> None:
        #: The plain port's name in logs and BindError (``MQTT``); the TLS port's
        #: is ``<what>/TLS``.
        self.what = what
        self.bind_host = bind
        self.backlog = backlog
        self.port = 0
        self.tls_port = 0
        self.tls: ssl.SSLContext | None = None
        self._bound: list[BoundPort] = []
        self._servers: list[asyncio.AbstractServer] = []

    def bind(self, port: int, tls_port: int, tls: Callable[[], ssl.SSLContext]) -> None:
        """Bind and listen on ``port`` and ``tls_port`` (-1: none), accepting nothing
        yet; ``tls`` gives the TLS port's context. Once is enough: a second call
        (start() after the broker bound every listener) does nothing."""
        if self._bound or self._servers:
            return
        try:
            if port >= 0:
                bound = BoundPort(self.what, self.bind_host, port, self.backlog)
                self._bound.append(bound)
                self.port = bound.port
            if tls_port >= 0:
                self.tls = tls()
                bound = BoundPort(f"{self.what}/TLS", self.bind_host, tls_port, self.backlog)
                self._bound.append(bound)
                self.tls_port = bound.port
        except BaseException:
            self.close_bound()
            raise

    async def serve(self, factory: Callable[[bool], asyncio.BaseProtocol], log: Any) -> None:
        """Accept on the bound ports; ``factory(tls)`` makes each client's protocol."""
        for bound in self._bound:
            tls = bound.what.endswith("/TLS")
            servers = await bound.serve(
                (lambda: factory(True)) if tls else (lambda: factory(False)),
                self.tls if tls else None,
            )
            self._servers.extend(servers)
            log.info("listening on %s %s:%s", bound.what, self.bind_host, bound.port)
        self._bound.clear()

    def close_bound(self) -> None:
        for bound in self._bound:
            bound.close()
        self._bound.clear()

    async def stop(self, close_clients: Callable[[], Any]) -> None:
        """Accept no more, tell the clients (``close_clients``, awaited), then wait
        for the servers."""
        self.close_bound()
        for server in self._servers:
            server.close()
        await close_clients()
        for server in self._servers:
            await server.wait_closed()
        self._servers.clear()
