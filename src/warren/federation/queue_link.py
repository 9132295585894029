"""One federated-queue link: a queue here that fetches from its upstream queue
while it has consumers and nothing to give them.

Queue federation moves messages to where the consumers are, as RabbitMQ's
does: the link consumes from the upstream queue of the same name (or the
upstream's ``queue``) only while the local queue has consumers and no ready
messages, and stops consuming as soon as it has a backlog or no consumers. What
it takes is published into the local queue (default exchange) through this
broker's AMQP port, with an ``x-received-from`` entry, and acknowledged
upstream once confirmed here. Its reconnect loop and state are
warren.links.LinkRunner's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import aiormq
from aiormq.abc import DeliveredMessage
from pamqp.commands import Basic

from warren.core.clock import Clock
from warren.core.queue import Queue
from warren.federation.upstream import Upstream, add_hop
from warren.links import LinkRunner, redact

#: Milliseconds of the broker's clock between two looks at the local queue's
#: demand (a consumer comes, its backlog drains): no event announces it.
DEMAND_CHECK_MS = 50


class QueueLink(LinkRunner):
    """One upstream of one federated queue: ``_session`` consumes upstream while
    the local queue has demand and forwards what it receives."""

    FAILED = "error"
    MIN_BACKOFF = 0.1
    log = logging.getLogger("warren.federation")

    def __init__(
        self,
        vhost: str,
        queue: str,
        upstream: Upstream,
        local_uri: str,
        cluster_name: str,
        local_queue: Callable[[], Queue | None],
        on_change: Callable[[], None] | None = None,
        clock: Clock | None = None,
    ) -> None:
        super().__init__(upstream.reconnect_delay, on_change, clock)
        self.vhost = vhost
        self.queue = queue
        self.upstream = upstream
        self.local_uri = local_uri
        self.cluster_name = cluster_name
        self._local_queue = local_queue
        self.received = 0
        self.dropped = 0
        self.consuming = False

    @property
    def label(self) -> str:
        return f"federation link {self.vhost}:queue {self.queue} <- {self.upstream.name}"

    @property
    def upstream_queue(self) -> str:
        return self.upstream.queue or self.queue

    def info(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "type": "queue",
            "vhost": self.vhost,
            "queue": self.queue,
            "upstream_queue": self.upstream_queue,
            "upstream": self.upstream.name,
            "id": f"{self.vhost}:queue:{self.queue}:{self.upstream.name}",
            "status": self.state,
            "uri": redact(self.upstream.uris[0]),
            "timestamp": self.timestamp,
            "consuming": self.consuming,
            "messages_received": self.received,
            "messages_dropped": self.dropped,
        }
        if self.reason is not None:
            out["error"] = self.reason
        return out

    def _demand(self) -> bool:
        queue = self._local_queue()
        return queue is not None and queue.consumer_count > 0 and queue.message_count == 0

    async def _session(self) -> None:
        self.consuming = False  # nothing consumed upstream until there is demand
        up = self.upstream
        # Made before their connects: the finally closes a connection whose connect
        # a cancellation met as it completed (never returned by aiormq).
        uri = up.uris[0]
        remote = aiormq.Connection(uri)
        local: aiormq.Connection | None = None
        try:
            await self._connect(remote, uri)
            upstream_cluster = str(remote.server_properties.get("cluster_name", ""))
            ch = await self._rpc(remote.channel(), uri, "channel.open")
            try:
                await self._rpc(
                    ch.queue_declare(self.upstream_queue, passive=True), uri, "queue.declare"
                )
            except aiormq.exceptions.ChannelNotFoundEntity:
                self._end_if_stopped()  # a stop that met the 404 comes out as it
                ch = await self._rpc(remote.channel(), uri, "channel.open")
                await self._rpc(
                    ch.queue_declare(self.upstream_queue, durable=True), uri, "queue.declare"
                )
            local = aiormq.Connection(self.local_uri)
            await self._connect(local, self.local_uri)
            local_ch = await self._rpc(
                local.channel(publisher_confirms=True), self.local_uri, "channel.open"
            )
            if up.prefetch_count:
                await self._rpc(ch.basic_qos(prefetch_count=up.prefetch_count), uri, "basic.qos")
            failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

            async def on_message(message: DeliveredMessage) -> None:
                try:
                    await self._forward(message, local_ch, up, upstream_cluster)
                    await ch.basic_ack(message.delivery_tag or 0)
                except Exception as exc:
                    if not failed.done():
                        failed.set_exception(exc)

            self._set_running()
            tag: str | None = None
            while not failed.done():
                if remote.is_closed or local.is_closed:
                    raise ConnectionError("a connection of the link closed")
                wanted = self._demand()
                if wanted and tag is None:
                    ok = await self._rpc(
                        ch.basic_consume(self.upstream_queue, on_message), uri, "basic.consume"
                    )
                    tag = ok.consumer_tag
                    self._set_consuming(True)
                elif not wanted and tag is not None:
                    await self._rpc(ch.basic_cancel(tag), uri, "basic.cancel")
                    tag = None
                    self._set_consuming(False)
                await self._next_look(failed)
            failed.result()  # raises what failed it
        finally:
            for conn in (remote, local):
                if conn is not None and not conn.is_closed:
                    with contextlib.suppress(Exception):
                        await conn.close()

    def _set_consuming(self, consuming: bool) -> None:
        self.consuming = consuming
        self._changed()  # the API's "consuming": waiters see it change

    async def _next_look(self, failed: asyncio.Future[None]) -> None:
        """Wait ``DEMAND_CHECK_MS`` of the broker's clock, or until ``failed``."""
        look: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def due() -> None:
            if not look.done():
                look.set_result(None)

        timer = self.clock.call_later(DEMAND_CHECK_MS, due)
        try:
            await asyncio.wait([failed, look], return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()

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
            "queue": self.upstream_queue,
            "redelivered": bool(message.redelivered),
            "cluster-name": upstream_cluster,
        }
        if not add_hop(props, up, self.cluster_name, hop):
            self.dropped += 1
            return
        confirm = await local_ch.basic_publish(
            message.body, exchange="", routing_key=self.queue, properties=props
        )
        if not isinstance(confirm, Basic.Ack):
            raise ConnectionError(f"the local queue refused a message ({confirm})")
        self.received += 1
