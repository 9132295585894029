"""One federation link: an exchange here receiving from its upstream exchange.

The link connects to the upstream broker (aiormq), declares the upstream
exchange (same type) and a durable queue for this link,
``federation: <upstream exchange> to <cluster name>:<vhost>:<exchange>``,
binds that queue with every binding the local exchange has (kept in step as
bindings come and go), and moves what arrives into the local exchange through
this broker's AMQP port, with the routing key it had. Each message gets an
``x-received-from`` entry (uri, exchange, redelivered, cluster-name) as the
federation plugin adds; a message that has already crossed ``max-hops``
links, or that came from this cluster before (a loop), is dropped. Its
reconnect loop and state are warren.links.LinkRunner's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Callable
from typing import Any

import aiormq
from aiormq.abc import DeliveredMessage
from pamqp.commands import Basic

from warren.core.clock import Clock
from warren.federation.upstream import Upstream, add_hop
from warren.links import LinkRunner, redact

BindingKey = tuple[str, tuple[tuple[str, Any], ...]]

# What pamqp (aiormq's codec) accepts in a queue name.
_NOT_NAME = re.compile(r"[^a-zA-Z0-9\-_.:@#,/+ ]")


def binding_key(routing_key: str, arguments: dict[str, Any] | None) -> BindingKey:
    return routing_key, tuple(sorted((arguments or {}).items()))


class ExchangeLink(LinkRunner):
    """One upstream of one federated exchange: ``_session`` keeps the upstream
    queue bound as the local exchange is and forwards what it receives."""

    FAILED = "error"
    MIN_BACKOFF = 0.1
    log = logging.getLogger("warren.federation")

    def __init__(
        self,
        vhost: str,
        exchange: str,
        exchange_type: str,
        durable: bool,
        upstream: Upstream,
        local_uri: str,
        cluster_name: str,
        bindings: set[BindingKey],
        on_change: Callable[[], None] | None = None,
        clock: Clock | None = None,
    ) -> None:
        super().__init__(upstream.reconnect_delay, on_change, clock)
        self.vhost = vhost
        self.exchange = exchange
        self.exchange_type = exchange_type
        self.durable = durable
        self.upstream = upstream
        self.local_uri = local_uri
        self.cluster_name = cluster_name
        self.bindings = set(bindings)
        self.received = 0
        self.dropped = 0
        self._bound: set[BindingKey] = set()
        self._channel: aiormq.abc.AbstractChannel | None = None
        self._uri = upstream.uris[0]  # the peer of the current session
        self._bindings_changed = asyncio.Event()

    @property
    def label(self) -> str:
        return f"federation link {self.vhost}:{self.exchange} <- {self.upstream.name}"

    @property
    def upstream_exchange(self) -> str:
        return self.upstream.exchange or self.exchange

    @property
    def queue_name(self) -> str:
        """The link's queue on the upstream (in the characters AMQP clients accept)."""
        raw = f"federation: {self.upstream_exchange} to {self.cluster_name}:{self.vhost}:{self.exchange}"
        return _NOT_NAME.sub("_", raw)[:255]

    def set_bindings(self, bindings: set[BindingKey]) -> None:
        """The local exchange's bindings now: the upstream queue follows."""
        if bindings != self.bindings:
            self.bindings = set(bindings)
            self._bindings_changed.set()

    def info(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "type": "exchange",
            "vhost": self.vhost,
            "exchange": self.exchange,
            "upstream_exchange": self.upstream_exchange,
            "upstream": self.upstream.name,
            "id": f"{self.vhost}:{self.exchange}:{self.upstream.name}",
            "status": self.state,
            "uri": redact(self.upstream.uris[0]),
            "timestamp": self.timestamp,
            "queue": self.queue_name,
            "messages_received": self.received,
            "messages_dropped": self.dropped,
        }
        if self.reason is not None:
            out["error"] = self.reason
        return out

    # -- running ----------------------------------------------------------------------
    async def _session(self) -> None:
        up = self.upstream
        # Made before their connects: the finally closes a connection whose connect
        # a cancellation met as it completed (never returned by aiormq).
        uri = self._uri = up.uris[0]
        remote = aiormq.Connection(uri)
        local: aiormq.Connection | None = None
        self._bound = set()
        try:
            await self._connect(remote, uri)
            upstream_cluster = str(remote.server_properties.get("cluster_name", ""))
            ch = self._channel = await self._rpc(remote.channel(), uri, "channel.open")
            await self._rpc(
                ch.exchange_declare(
                    self.upstream_exchange, exchange_type=self.exchange_type, durable=self.durable
                ),
                uri,
                "exchange.declare",
            )
            arguments: dict[str, Any] = {"x-internal-purpose": "federation"}
            if up.expires is not None:
                arguments["x-expires"] = up.expires
            if up.message_ttl is not None:
                arguments["x-message-ttl"] = up.message_ttl
            await self._rpc(
                ch.queue_declare(self.queue_name, durable=True, arguments=arguments),
                uri,
                "queue.declare",
            )
            await self._sync_bindings(ch)
            local = aiormq.Connection(self.local_uri)
            await self._connect(local, self.local_uri)
            local_ch = await self._rpc(
                local.channel(publisher_confirms=up.ack_mode == "on-confirm"),
                self.local_uri,
                "channel.open",
            )
            no_ack = up.ack_mode == "no-ack"
            if up.prefetch_count and not no_ack:
                await self._rpc(ch.basic_qos(prefetch_count=up.prefetch_count), uri, "basic.qos")
            failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

            async def on_message(message: DeliveredMessage) -> None:
                try:
                    await self._forward(message, local_ch, up, upstream_cluster)
                    if not no_ack:
                        await ch.basic_ack(message.delivery_tag or 0)
                except Exception as exc:
                    if not failed.done():
                        failed.set_exception(exc)

            await self._rpc(
                ch.basic_consume(self.queue_name, on_message, no_ack=no_ack), uri, "basic.consume"
            )
            self._set_running()
            while True:
                waiters = [
                    asyncio.ensure_future(self._bindings_changed.wait()),
                    asyncio.ensure_future(asyncio.shield(remote.closing)),
                    asyncio.ensure_future(asyncio.shield(local.closing)),
                ]
                try:
                    await asyncio.wait([failed, *waiters], return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for w in waiters:
                        w.cancel()
                if failed.done():
                    failed.result()
                if remote.is_closed or local.is_closed:
                    raise ConnectionError("a connection of the link closed")
                self._bindings_changed.clear()
                await self._sync_bindings(ch)
        finally:
            self._channel = None
            for conn in (remote, local):
                if conn is not None and not conn.is_closed:
                    with contextlib.suppress(Exception):
                        await conn.close()

    async def _sync_bindings(self, ch: aiormq.abc.AbstractChannel) -> None:
        wanted = set(self.bindings)
        uri = self._uri
        for key in wanted - self._bound:
            await self._rpc(
                ch.queue_bind(
                    self.queue_name,
                    self.upstream_exchange,
                    routing_key=key[0],
                    arguments=dict(key[1]),
                ),
                uri,
                "queue.bind",
            )
        for key in self._bound - wanted:
            await self._rpc(
                ch.queue_unbind(
                    self.queue_name,
                    self.upstream_exchange,
                    routing_key=key[0],
                    arguments=dict(key[1]),
                ),
                uri,
                "queue.unbind",
            )
        self._bound = wanted

    async def _forward(
        self,
        message: DeliveredMessage,
        local_ch: aiormq.abc.AbstractChannel,
        up: Upstream,
        upstream_cluster: str,
    ) -> None:
        props = message.header.properties
        hop = {
            "uri": redact(up.uris[0]),
            "exchange": self.upstream_exchange,
            "redelivered": bool(message.redelivered),
            "cluster-name": upstream_cluster,
        }
        if not add_hop(props, up, self.cluster_name, hop):
            self.dropped += 1
            return
        confirm = await local_ch.basic_publish(
            message.body,
            exchange=self.exchange,
            routing_key=message.routing_key or "",
            properties=props,
        )
        if up.ack_mode == "on-confirm" and not isinstance(confirm, Basic.Ack):
            raise ConnectionError(f"the local exchange refused a message ({confirm})")
        self.received += 1


UpstreamsOf = Callable[[str, dict[str, Any]], list[Upstream]]
