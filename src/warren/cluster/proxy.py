"""A follower's client ports: every connection is passed through to the leader.

Clients may connect to any node of a cluster: on a follower the AMQP, MQTT,
stream protocol and HTTP ports accept the connection and copy bytes both ways to the same port of
the leader named in etcd, so a client's reconnect after a failover needs no
list of nodes. With no leader known the ports are closed. When the leader
changes, the connections passed through to the old one are closed too: a
leader cut off by a partition sends no reset, and its clients would otherwise
wait for their heartbeat timeout before they reconnect.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from warren.config import Config

log = logging.getLogger("warren.cluster")


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(256 * 1024):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            if writer.can_write_eof():
                writer.write_eof()


#: How long a relay waits to reach the leader (one cut off never answers).
CONNECT_TIMEOUT = 5.0


@dataclass(frozen=True)
class RelayedPort:
    """One port a follower relays (named as the broker's listeners are)."""

    name: str
    bind: str
    port: int


class ClientProxy:
    def __init__(self, config: Config) -> None:
        self.config = config
        self._servers: list[asyncio.Server] = []
        #: The ports it relays now (for the ready line).
        self.listeners: list[RelayedPort] = []
        #: The leader the ports relay to (its addresses from etcd).
        self._target: dict[str, Any] | None = None
        #: Both ends of every open relay, to close when the leader changes.
        self._relays: set[asyncio.StreamWriter] = set()

    async def start(self, leader: dict[str, Any]) -> None:
        """Relay to ``leader``; a no-op when already relaying to it."""
        if self._servers and leader == self._target:
            return
        await self.stop()
        self._target = leader
        cfg = self.config
        ports = [
            ("amqp", cfg.bind, cfg.amqp_port),
            ("mqtt", cfg.mqtt_bind, cfg.mqtt_port),
            ("stream", cfg.stream_bind, cfg.stream_port),
            ("http", cfg.http_bind, cfg.http_port),
        ]
        for name, bind, port in ports:
            target = leader.get(name)
            if port < 0 or not target:
                continue
            host, _, target_port = str(target).rpartition(":")
            try:
                server = await asyncio.start_server(
                    self._relay_to(host, int(target_port), name), bind, port
                )
            except OSError as exc:
                log.warning("cannot proxy %s on %s:%d to the leader: %s", name, bind, port, exc)
                continue
            self._servers.append(server)
            port = server.sockets[0].getsockname()[1] if port == 0 else port
            self.listeners.append(RelayedPort(name, bind, port))
            log.info("proxying %s clients on %s:%d to the leader at %s", name, bind, port, target)

    def _relay_to(
        self, host: str, port: int, name: str
    ) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
        async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._relay(reader, writer, host, port, name)

        return relay

    async def _relay(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        host: str,
        port: int,
        name: str,
    ) -> None:
        self._relays.add(writer)
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(host, port), CONNECT_TIMEOUT
            )
        except (OSError, TimeoutError) as exc:
            self._relays.discard(writer)
            log.warning(
                "%s client %s: the leader at %s:%d is unreachable: %s",
                name,
                writer.get_extra_info("peername"),
                host,
                port,
                exc or "timed out",
            )
            writer.close()
            return
        self._relays.add(up_writer)
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            self._relays.discard(writer)
            self._relays.discard(up_writer)
            up_writer.close()
            writer.close()

    async def stop(self) -> None:
        """Close the ports and every connection relayed to the leader."""
        servers, self._servers = self._servers, []
        self._target = None
        self.listeners = []
        for server in servers:
            server.close()
        relays, self._relays = self._relays, set()
        if relays:
            log.info("closing the client connections relayed to the leader")
        for writer in relays:
            writer.close()
        for server in servers:
            with contextlib.suppress(Exception):
                await server.wait_closed()
