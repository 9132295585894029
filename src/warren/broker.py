"""The broker: owns the core (vhosts, users) and the listeners, starts and stops them."""

from __future__ import annotations

import asyncio
import logging
import socket
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from warren import __version__
from warren.config import Config
from warren.core.users import UserStore
from warren.core.vhost import VHost

if TYPE_CHECKING:
    from warren.amqp.connection import AMQPConnection
    from warren.amqp.server import AMQPProtocol

log = logging.getLogger("warren")


class Broker:
    """An embeddable broker.

    ``async with Broker(Config(amqp_port=0)) as broker:`` serves until the block
    exits; ``broker.amqp_port`` is the port actually bound.
    """

    def __init__(self, config: Config | None = None, **overrides: Any) -> None:
        self.config = config if config is not None else Config()
        for key, value in overrides.items():
            setattr(self.config, key, value)
        self.config.validate()
        self.users = UserStore()
        self.vhosts: dict[str, VHost] = {}
        self.connections: set[AMQPConnection] = set()
        self.protocols: set[AMQPProtocol] = set()
        self.cluster_name = f"warren@{socket.gethostname()}"
        self.amqp_port = 0
        self._server: asyncio.base_events.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def data_dir(self) -> Path:
        return Path(self.config.data_dir).resolve()

    def add_vhost(self, name: str) -> VHost:
        assert self._loop is not None, "the broker must be started first"
        vhost = self.vhosts.get(name)
        if vhost is None:
            vhost = self.vhosts[name] = VHost(name, self._loop.call_soon)
        return vhost

    async def start(self) -> None:
        from warren.amqp.server import AMQPProtocol

        self._loop = loop = asyncio.get_running_loop()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.add_vhost(self.config.default_vhost)
        if not self.users.users:
            self.users.add_user(
                self.config.default_user, self.config.default_password, ["administrator"]
            )
            self.users.set_permissions(self.config.default_user, self.config.default_vhost)
        self._server = await loop.create_server(
            lambda: AMQPProtocol(self),
            host=self.config.bind,
            port=self.config.amqp_port,
            reuse_address=True,
            backlog=1024,
        )
        self.amqp_port = self._server.sockets[0].getsockname()[1]
        log.info(
            "Warren %s listening on AMQP %s:%s, data dir %s",
            __version__,
            self.config.bind,
            self.amqp_port,
            self.data_dir,
        )

    async def stop(self) -> None:
        """Stop accepting, close every client with 320 CONNECTION_FORCED, then wait."""
        if self._server is None:
            return
        self._server.close()
        protocols = list(self.protocols)
        for proto in protocols:
            proto.close()
        if protocols:
            await asyncio.wait([p.closed for p in protocols], timeout=5)
        await self._server.wait_closed()
        self._server = None
        for vhost in self.vhosts.values():
            vhost.close()
        log.info("Warren stopped")

    async def __aenter__(self) -> Broker:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def connection_opened(self, conn: AMQPConnection) -> None:
        self.connections.add(conn)

    def connection_closed(self, conn: AMQPConnection) -> None:
        self.connections.discard(conn)
