"""A follower's client ports: every connection is passed through to the leader.

Clients may connect to any node of a cluster: on a follower the AMQP, MQTT and
HTTP ports accept the connection and copy bytes both ways to the same port of
the leader named in etcd, so a client's reconnect after a failover needs no
list of nodes. With no leader known the connection is closed at once, and
the log says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
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


class ClientProxy:
    def __init__(self, config: Config) -> None:
        self.config = config
        self._servers: list[asyncio.Server] = []

    async def start(self, leader: dict[str, Any]) -> None:
        await self.stop()
        cfg = self.config
        ports = [
            ("amqp", cfg.bind, cfg.amqp_port),
            ("mqtt", cfg.mqtt_bind, cfg.mqtt_port),
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
        try:
            up_reader, up_writer = await asyncio.open_connection(host, port)
        except OSError as exc:
            log.warning(
                "%s client %s: the leader at %s:%d is unreachable: %s",
                name,
                writer.get_extra_info("peername"),
                host,
                port,
                exc,
            )
            writer.close()
            return
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            up_writer.close()
            writer.close()

    async def stop(self) -> None:
        servers, self._servers = self._servers, []
        for server in servers:
            server.close()
        for server in servers:
            with contextlib.suppress(Exception):
                await server.wait_closed()
