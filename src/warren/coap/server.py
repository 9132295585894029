"""The asyncio layer of CoAP: a UDP socket on ``[coap] bind:port`` (5683).

`CoAPListener` is the broker's Listener for CoAP, off unless ``[coap]
enabled``; a datagram goes to the message layer (endpoint.py), requests
from there to the ``/ps`` resources (pubsub.py). No DTLS: see docs/coap.md.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import TYPE_CHECKING, Any

from warren.bound_port import BindError
from warren.coap.dtls import DTLSLayer, load_psk_file
from warren.coap.endpoint import Endpoint
from warren.coap.pubsub import PubSub, RetainedTopics
from warren.core.rate_limits import RateLimits

if TYPE_CHECKING:
    from warren.node import Node

__all__ = ["CoAPListener", "CoAPSListener"]

log = logging.getLogger("warren.coap")


class _Datagrams(asyncio.DatagramProtocol):
    def __init__(self, listener: CoAPListener) -> None:
        self.listener = listener

    def datagram_received(self, data: bytes, addr: tuple[Any, ...]) -> None:
        self.listener.count(addr, len(data), True)
        self.listener.received(data, addr)

    def error_received(self, exc: Exception) -> None:
        # An ICMP error for something we sent (a client that went away): its
        # notifications time out on their own.
        log.debug("CoAP: %s", exc)


class CoAPListener:
    """CoAP over UDP: publish to and observe the MQTT topic space."""

    name = "coap"
    #: How the log names the transport.
    label = "UDP"

    def __init__(self, bind: str, port: int, retained: RetainedTopics | None = None) -> None:
        self.bind = bind
        self.requested_port = port
        self.retained = retained
        self.endpoint: Endpoint | None = None
        self.pubsub: PubSub | None = None
        self._sock: socket.socket | None = None
        self._transport: asyncio.DatagramTransport | None = None
        self._port = 0

    @property
    def port(self) -> int:
        return self._port

    def bind_ports(self, node: Node) -> None:
        """Bind the UDP socket (BindError when the port is taken)."""
        if self._sock is not None:
            return
        try:
            family, kind, proto, _, address = socket.getaddrinfo(
                self.bind, self.requested_port, type=socket.SOCK_DGRAM
            )[0]
            sock = socket.socket(family, kind, proto)
        except OSError as exc:
            raise BindError(exc, "CoAP", self.bind, self.requested_port) from None
        try:
            sock.bind(address)
            sock.setblocking(False)
        except OSError as exc:
            sock.close()
            raise BindError(exc, "CoAP", self.bind, self.requested_port) from None
        self._sock = sock
        self._port = sock.getsockname()[1]

    async def start(self, node: Node) -> None:
        self.bind_ports(node)
        loop = asyncio.get_running_loop()
        # A request is CoAP's connection: refusals count with the node's
        # (warren_rate_limit_connections_refused_total).
        limits = RateLimits(
            node.clock,
            connections_per_second=node.config.coap_requests_per_second,
            counts=node.rate_limits.counts,
        )
        endpoint = self.endpoint = Endpoint(
            self._send, node.clock, self._request, node.config.coap_max_payload
        )
        self.pubsub = PubSub(
            node, endpoint, limits, self.retained, (self.bind, self._port), self.peer_user
        )
        transport, _ = await loop.create_datagram_endpoint(
            lambda: _Datagrams(self), sock=self._sock
        )
        self._transport = transport
        log.info("CoAP listening on %s:%d (%s)", self.bind, self._port, self.label)

    def received(self, data: bytes, addr: tuple[Any, ...]) -> None:
        if self.endpoint is not None:
            self.endpoint.datagram(data, addr)

    def peer_user(self, addr: tuple[Any, ...]) -> str | None:
        """The user a peer authenticated as below CoAP (None: by the request's query)."""
        return None

    def _send(self, data: bytes, addr: tuple[Any, ...]) -> None:
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.sendto(data, addr)
            self.count(addr, len(data), False)

    def count(self, addr: tuple[Any, ...], octets: int, incoming: bool) -> None:
        """A datagram, counted for the client it is from or to (clients.py)."""
        if self.pubsub is not None:
            self.pubsub.clients.count(addr, octets, incoming)

    def _request(self, req: Any, addr: tuple[Any, ...]) -> None:
        if self.pubsub is not None:
            self.pubsub.request(req, addr)

    async def stop(self) -> None:
        """Every observation ends (its queue deleted); the socket closes."""
        if self.pubsub is not None:
            self.pubsub.close()
        if self.endpoint is not None:
            self.endpoint.close()
        self._closing()
        if self._transport is not None:
            self._transport.close()
            self._transport = None
        elif self._sock is not None:
            self._sock.close()
        self._sock = None

    def _closing(self) -> None:
        """Before the socket closes (DTLS: the sessions' close_notify)."""


class CoAPSListener(CoAPListener):
    """CoAP over DTLS 1.2 with pre-shared keys: ``coaps://``, port 5684."""

    name = "coaps"
    label = "DTLS"

    def __init__(
        self,
        bind: str,
        port: int,
        retained: RetainedTopics | None,
        psk_file: str,
    ) -> None:
        super().__init__(bind, port, retained)
        self.psk_file = psk_file
        self.dtls: DTLSLayer | None = None

    async def start(self, node: Node) -> None:
        config = node.config
        if not self.psk_file:
            raise ValueError("[coap] dtls_enabled needs [coap] dtls_psk_file")
        keys = load_psk_file(self.psk_file)  # read at start: a bad file stops it
        self.dtls = DTLSLayer(
            super()._send,
            node.clock,
            keys.get,
            max_sessions=config.coap_dtls_max_sessions,
            handshake_timeout_ms=config.coap_dtls_handshake_timeout * 1000,
            idle_timeout_ms=config.coap_dtls_idle_timeout * 1000,
        )
        await super().start(node)
        assert self.endpoint is not None
        self.dtls.deliver = self.endpoint.datagram

    def received(self, data: bytes, addr: tuple[Any, ...]) -> None:
        if self.dtls is not None:
            self.dtls.datagram(data, addr)

    def peer_user(self, addr: tuple[Any, ...]) -> str | None:
        return self.dtls.identity(addr) if self.dtls is not None else None

    def _send(self, data: bytes, addr: tuple[Any, ...]) -> None:
        if self.dtls is not None:
            self.dtls.write(data, addr)

    def _closing(self) -> None:
        if self.dtls is not None:
            self.dtls.close()
