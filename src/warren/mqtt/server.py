"""The asyncio layer for MQTT: sockets (TCP, TLS, WebSocket) to the sans-IO connection.

`MQTTListener` is the broker's Listener for MQTT: one `MQTTState` shared by a
TCP server (``mqtt_port``, -1 for none), a TLS server (``mqtt_tls_port``) and
whatever other transport asks `new_protocol` for a protocol (the HTTP
listener's WebSocket endpoint ``/mqtt``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, cast

from warren.batched_protocol import (
    YIELD_AFTER_BYTES,
    BatchedProtocol,
    ConnectionTimer,
    OpenClients,
    end_connection,
    socket_addresses,
)
from warren.bound_port import ListenerPorts
from warren.mqtt.connection import MQTTConnection
from warren.mqtt.state import MQTTState
from warren.proxy_accept import listener_proxy
from warren.tls import cert_login

if TYPE_CHECKING:
    from warren.node import Node

log = logging.getLogger("warren.mqtt")

#: ms of the broker's clock a client has to send CONNECT.
CONNECT_TIMEOUT_MS = 10_000


class MQTTProtocol(BatchedProtocol):
    """One client. Output gathered during a loop turn is written once."""

    conn: MQTTConnection | None

    def __init__(self, listener: MQTTListener, transport_name: str = "MQTT") -> None:
        super().__init__()
        self.listener = listener
        self.conn = None
        #: The broker's clock: message times, the CONNECT timeout, keep alive.
        self.clock = listener.state.clock
        self._timer = ConnectionTimer(self.clock)
        self.transport_name = transport_name

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        peer, local = socket_addresses(transport)
        name = self.transport_name
        ssl_object = transport.get_extra_info("ssl_object")
        if name == "MQTT" and ssl_object is not None:
            name = "MQTT/TLS"
        self.conn = MQTTConnection(
            self.listener.state,
            peer,
            local,
            self.request_flush,
            self.request_close,
            name,
        )
        self.conn.reading_control = self.set_reading
        self.conn.request_drain = self.yield_reading
        if ssl_object is not None:
            self.conn.cert_login = cert_login(
                ssl_object.getpeercert(), self.listener.state.config.tls_cert_login_from
            )
        self.listener.protocols.add(self)
        self.rate_publishes(self.listener.state.node.rate_limits)
        self._timer.set(self.clock.now_ms() + CONNECT_TIMEOUT_MS, self._connect_timeout)

    def data_received(self, data: bytes) -> None:
        conn = self.conn
        if conn is None:
            return
        now = self.clock.now_ms()
        conn.now_ms = now
        self.count_read(data)
        was_connected = conn.vhost is not None
        conn.feed(data)
        self.count_publishes(conn.stats.publish)
        if conn.vhost is not None:
            if not was_connected:
                self._timer.cancel()  # the CONNECT timeout's
                if conn.keepalive:
                    self._arm(now + conn.keepalive * 1500)
            # An unfinished packet must be complete by its deadline, keep alive or not.
            deadline = conn.unfinished_deadline()
            if deadline is not None and (not self._timer.pending or deadline < self._timer.due):
                self._arm(deadline)
        if conn.backlog or len(data) >= YIELD_AFTER_BYTES:
            self.yield_reading()

    def drain_backlog(self) -> bool:
        """Input left by the connection's budget: the next part of it, this turn."""
        conn = self.conn
        if conn is not None and conn.backlog:
            conn.feed(b"")
            self.count_publishes(conn.stats.publish)
            return conn.backlog
        return False

    def _arm(self, due_ms: int) -> None:
        """The connection's next check (keep alive, unfinished packet) at ``due_ms``."""
        self._timer.set(due_ms, self._check)

    def _check(self) -> None:
        self._timer.fired()
        conn = self.conn
        if conn is None:
            return
        now = self.clock.now_ms()
        due = conn.tick(now)
        if due:
            self._arm(now + due + 1)

    def _connect_timeout(self) -> None:
        self._timer.fired()
        conn = self.conn
        if conn is not None and conn.vhost is None:
            log.warning(
                "%s: no CONNECT within %.0f s, closing", conn.name, CONNECT_TIMEOUT_MS / 1000
            )
            if self.transport is not None:
                self.transport.abort()

    def close(self) -> None:
        """Broker shutdown: MQTT 5 clients hear 0x8B Server shutting down."""
        if self.conn is not None:
            self.conn.disconnect(0x8B, "server shutting down")
        self.close_now()

    def connection_lost(self, exc: Exception | None) -> None:
        self._timer.cancel()
        end_connection(self.conn, log, "cleaning up the MQTT session failed")
        self.transport = None
        self.listener.protocols.discard(self)


class MQTTListener:
    """MQTT 3.1.1/5 on TCP and TLS, and the protocol factory for WebSocket."""

    name = "mqtt"

    def __init__(self, bind: str, port: int, tls_port: int = -1) -> None:
        self.bind = bind
        self.requested_port = port
        self.requested_tls_port = tls_port
        self.protocols: OpenClients[MQTTProtocol] = OpenClients()
        self._state: MQTTState | None = None
        #: Bound and listening before the data dir is read; served by start().
        self._ports = ListenerPorts("MQTT", bind)

    @property
    def state(self) -> MQTTState:
        assert self._state is not None, "the MQTT listener is not started"
        return self._state

    @property
    def port(self) -> int:
        return self._ports.port

    @property
    def tls_port(self) -> int:
        return self._ports.tls_port

    def new_protocol(self) -> MQTTProtocol:
        """A protocol for a client arriving over another transport (WebSocket)."""
        return MQTTProtocol(self, "MQTT/WebSocket")

    def bind_ports(self, node: Node) -> None:
        """Bind and listen on the MQTT (and MQTT/TLS) port, accepting nothing yet:
        BindError when a port is taken (broker_lifecycle.py binds before it reads
        the data dir)."""
        self._ports.bind(
            self.requested_port,
            self.requested_tls_port,
            lambda: node.tls.context("the MQTT TLS port"),
        )

    async def start(self, node: Node) -> None:
        """Read the MQTT state of the data dir, then accept on the ports
        bind_ports() bound (binding them first if not)."""
        self.bind_ports(node)
        self._state = MQTTState(node)
        try:
            self._state.start()
        except BaseException:
            self._state.close()  # the files it opened before the damaged one
            self._ports.close_bound()
            raise
        node.vhost_deleted.append(self._state.forget_vhost)
        try:
            await self._ports.serve(
                lambda tls: MQTTProtocol(self, "MQTT/TLS") if tls else MQTTProtocol(self),
                log,
                listener_proxy(node.config, node.clock, "mqtt"),
            )
        except OSError:
            await self.stop()
            raise

    async def stop(self) -> None:
        await self._ports.stop(self.protocols.close_all)
        if self._state is not None:
            self._state.close()
            with contextlib.suppress(ValueError):  # a listener stopped before it started
                self._state.node.vhost_deleted.remove(self._state.forget_vhost)
