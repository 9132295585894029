"""One running shovel: consume from the source, publish to the destination, ack.

Ack modes, as RabbitMQ's: ``on-confirm`` acks a message at the source once the
destination has confirmed it (nothing is lost if either side dies),
``on-publish`` once it is handed to the destination, ``no-ack`` consumes
without acks. When a connection fails the shovel reports ``terminated`` with
the reason, waits (``reconnect-delay``, doubling up to a minute while it keeps
failing) and starts again (that loop is warren.links.LinkRunner's); unacked
messages go back to the source queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import aiormq
from aiormq.abc import DeliveredMessage
from pamqp.commands import Basic

from warren.core import clock as clocks
from warren.core.clock import Clock
from warren.links import Finished, LinkRunner, redact
from warren.shovel.spec import ShovelSpec

#: The reason a shovel that moved what src-delete-after allowed reports.
DELETE_AFTER_REACHED = "src-delete-after reached"

#: ms before an HTTP destination's second attempt at a message, doubled for
#: each next one up to the cap (dest-max-attempts), on the broker's clock.
HTTP_RETRY_MS = 1000
HTTP_RETRY_MAX_MS = 60000


def http_retry_delay(attempt: int) -> int:
    """ms to wait after failed attempt number ``attempt`` (1 for the first)."""
    return min(HTTP_RETRY_MS * 2 ** (attempt - 1), HTTP_RETRY_MAX_MS)


class Shovel(LinkRunner):
    """One shovel: ``_session`` moves messages until a connection fails or
    src-delete-after is reached; LinkRunner starts it again."""

    FAILED = "terminated"
    ZERO_DELAY_STOPS = True  # as RabbitMQ: a reconnect-delay of 0 means no restart
    log = logging.getLogger("warren.shovel")

    def __init__(
        self,
        vhost: str,
        name: str,
        spec: ShovelSpec,
        resolve: Callable[[str, str], str],
        node: str,
        on_finished: Callable[[Shovel], None],
        on_change: Callable[[], None] | None = None,
        clock: Clock | None = None,
    ) -> None:
        super().__init__(spec.reconnect_delay, on_change, clock)
        self.vhost = vhost
        self.name = name
        self.spec = spec
        self._resolve = resolve  # (uri, vhost) -> a connectable URI ("amqp://" is local)
        self.node = node
        self._on_finished = on_finished
        self.transferred = 0
        #: HTTP destination: messages that failed every attempt and were
        #: dead-lettered, and messages waiting for their next attempt now.
        self.dead_lettered = 0
        self.retrying = 0
        limit = spec.delete_after  # what is left to move, across sessions
        self._remaining: int | None = limit if isinstance(limit, int) else None

    @property
    def label(self) -> str:
        return f"shovel '{self.name}' in vhost '{self.vhost}'"

    def _finished(self) -> None:
        self._on_finished(self)

    def info(self) -> dict[str, Any]:
        spec = self.spec
        out: dict[str, Any] = {
            "name": self.name,
            "vhost": self.vhost,
            "type": "dynamic",
            "node": self.node,
            "state": self.state,
            "timestamp": self.timestamp,
            "src_protocol": "amqp091",
            "dest_protocol": "amqp091",
            "src_uri": redact(spec.src_uris[0]),
            "dest_uri": redact(spec.dest_uris[0]),
            "messages_transferred": self.transferred,
        }
        if spec.dead_letter_exchange is not None:
            out["messages_dead_lettered"] = self.dead_lettered
        if spec.src_queue is not None:
            out["src_queue"] = spec.src_queue
        else:
            out["src_exchange"] = spec.src_exchange
            out["src_exchange_key"] = spec.src_exchange_key
        if spec.dest_queue is not None:
            out["dest_queue"] = spec.dest_queue
        elif spec.dest_exchange is not None:
            out["dest_exchange"] = spec.dest_exchange
            if spec.dest_exchange_key is not None:
                out["dest_exchange_key"] = spec.dest_exchange_key
        if self.reason is not None:
            out["reason"] = self.reason
        return out

    # -- running ----------------------------------------------------------------------
    async def _session(self) -> None:
        spec = self.spec
        # Each connection is made before its connect, so that the finally closes it
        # even when a cancellation meets the connect as it completes (aiormq then
        # raises CancelledError and the connection it opened is never returned).
        src_uri = self._resolve(spec.src_uris[0], self.vhost)
        src = aiormq.Connection(src_uri)
        dest_conn: aiormq.Connection | None = None
        http: aiohttp.ClientSession | None = None
        try:
            await self._connect(src, src_uri)
            src_ch = await self._rpc(src.channel(), src_uri, "channel.open")
            if spec.http_destination:
                http = aiohttp.ClientSession()
                dead_letter: aiormq.abc.AbstractChannel | None = None
                if spec.dead_letter_exchange is not None:
                    dead_letter = await self._rpc(
                        src.channel(publisher_confirms=True), src_uri, "channel.open"
                    )
                publish = self._http_publisher(http, dead_letter)
            else:
                dest_uri = self._resolve(spec.dest_uris[0], self.vhost)
                dest_conn = aiormq.Connection(dest_uri)
                await self._connect(dest_conn, dest_uri)
                dest_ch = await self._rpc(
                    dest_conn.channel(publisher_confirms=spec.ack_mode == "on-confirm"),
                    dest_uri,
                    "channel.open",
                )
                if spec.dest_queue is not None:
                    dest_ch = await self._ensure_queue(
                        dest_conn, dest_ch, spec.dest_queue, dest_uri
                    )
                publish = self._amqp_publisher(dest_ch)
            queue, src_ch = await self._source_queue(src, src_ch, src_uri)
            if spec.delete_after == "queue-length":
                ok = await self._rpc(
                    src_ch.queue_declare(queue, passive=True), src_uri, "queue.declare"
                )
                self._remaining = ok.message_count or 0
            if self._remaining == 0:
                raise Finished(DELETE_AFTER_REACHED)
            no_ack = spec.ack_mode == "no-ack"
            if not no_ack and spec.prefetch_count:
                await self._rpc(
                    src_ch.basic_qos(prefetch_count=spec.prefetch_count), src_uri, "basic.qos"
                )
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

            inflight = 0

            async def on_message(message: DeliveredMessage) -> None:
                nonlocal inflight
                if self._remaining is not None:
                    if self._remaining <= 0:
                        return  # over the limit: left unacked, back to the queue
                    self._remaining -= 1
                inflight += 1
                try:
                    await publish(message)
                    if not no_ack:
                        await src_ch.basic_ack(message.delivery_tag or 0)
                    self.transferred += 1
                except Exception as exc:  # fails the session; it restarts
                    if not done.done():
                        done.set_exception(exc)
                finally:
                    inflight -= 1
                # Done once the last allowed message and every one before it is acked.
                if self._remaining == 0 and not inflight and not done.done():
                    done.set_exception(Finished(DELETE_AFTER_REACHED))

            await self._rpc(
                src_ch.basic_consume(queue, on_message, no_ack=no_ack), src_uri, "basic.consume"
            )
            self._set_running()
            closing = [asyncio.ensure_future(asyncio.shield(src.closing))]
            if dest_conn is not None:
                closing.append(asyncio.ensure_future(asyncio.shield(dest_conn.closing)))
            try:
                await asyncio.wait([done, *closing], return_when=asyncio.FIRST_COMPLETED)
            finally:
                for fut in closing:
                    fut.cancel()
            if done.done():
                done.result()  # raises Finished or the failure
            raise ConnectionError("a connection of the shovel closed")
        finally:
            if http is not None:
                await http.close()
            for conn in (src, dest_conn):
                if conn is not None and not conn.is_closed:
                    with contextlib.suppress(Exception):
                        await conn.close()

    async def _ensure_queue(
        self,
        conn: aiormq.abc.AbstractConnection,
        ch: aiormq.abc.AbstractChannel,
        queue: str,
        uri: str,
    ) -> aiormq.abc.AbstractChannel:
        """Use ``queue`` as it is, or declare it durable when it does not exist."""
        try:
            await self._rpc(ch.queue_declare(queue, passive=True), uri, "queue.declare")
            return ch
        except aiormq.exceptions.ChannelNotFoundEntity:
            self._end_if_stopped()  # a stop that met the 404 comes out as it
            confirms = bool(getattr(ch, "publisher_confirms", False))
            ch = await self._rpc(conn.channel(publisher_confirms=confirms), uri, "channel.open")
            await self._rpc(ch.queue_declare(queue, durable=True), uri, "queue.declare")
            return ch

    async def _source_queue(
        self, conn: aiormq.abc.AbstractConnection, ch: aiormq.abc.AbstractChannel, uri: str
    ) -> tuple[str, aiormq.abc.AbstractChannel]:
        """The queue to consume and the channel to use (a failed passive declare
        closed the first one)."""
        spec = self.spec
        if spec.src_queue is not None:
            return spec.src_queue, await self._ensure_queue(conn, ch, spec.src_queue, uri)
        ok = await self._rpc(ch.queue_declare("", exclusive=True), uri, "queue.declare")
        assert ok.queue is not None
        await self._rpc(
            ch.queue_bind(ok.queue, spec.src_exchange or "", routing_key=spec.src_exchange_key),
            uri,
            "queue.bind",
        )
        return ok.queue, ch

    def _properties(self, message: DeliveredMessage) -> Basic.Properties:
        spec = self.spec
        props = message.header.properties
        headers = dict(props.headers or {})
        if spec.add_forward_headers:
            record: dict[str, Any] = {
                "shovelled-by": self.node,
                "shovel-type": "dynamic",
                "shovel-name": self.name,
                "shovel-vhost": self.vhost,
                "src-uri": redact(spec.src_uris[0]),
                "dest-uri": redact(spec.dest_uris[0]),
            }
            if spec.src_queue is not None:
                record["src-queue"] = spec.src_queue
            else:
                record["src-exchange"] = spec.src_exchange
                record["src-exchange-key"] = spec.src_exchange_key
            if spec.dest_queue is not None:
                record["dest-queue"] = spec.dest_queue
            elif spec.dest_exchange is not None:
                record["dest-exchange"] = spec.dest_exchange
            previous = headers.get("x-shovelled")
            headers["x-shovelled"] = [*(previous if isinstance(previous, list) else []), record]
        if spec.add_timestamp_header:
            headers["x-shovelled-timestamp"] = self.clock.now_ms() // 1000
        props.headers = headers or None
        for key, value in spec.publish_properties.items():
            setattr(props, key.replace("-", "_"), value)
        return props

    def _amqp_publisher(self, ch: aiormq.abc.AbstractChannel) -> Callable[[DeliveredMessage], Any]:
        spec = self.spec

        async def publish(message: DeliveredMessage) -> None:
            exchange: str
            key: str
            if spec.dest_queue is not None:
                exchange, key = "", spec.dest_queue
            elif spec.dest_exchange is not None:
                exchange = spec.dest_exchange
                key = spec.dest_exchange_key or message.routing_key or ""
            else:
                exchange, key = message.exchange or "", message.routing_key or ""
            confirm = await ch.basic_publish(
                message.body, exchange=exchange, routing_key=key or "",
                properties=self._properties(message),
            )  # fmt: skip
            if spec.ack_mode == "on-confirm" and not isinstance(confirm, Basic.Ack):
                raise ConnectionError(f"the destination refused a message ({confirm})")

        return publish

    def _http_publisher(
        self, http: aiohttp.ClientSession, dead_letter: aiormq.abc.AbstractChannel | None
    ) -> Callable[[DeliveredMessage], Any]:
        """POST each message; one that fails dest-max-attempts times (retried
        after a doubling backoff) is published to dest-dead-letter-exchange
        when there is one, else it fails the session (it goes back to the queue)."""
        spec = self.spec
        uri = spec.dest_uris[0]

        async def publish(message: DeliveredMessage) -> None:
            props = message.header.properties
            headers = {"User-Agent": "Warren", "X-Shovel": self.name}
            if props.content_type:
                headers["Content-Type"] = props.content_type
            if props.message_id:
                headers["X-Message-Id"] = props.message_id
            for key, value in (props.headers or {}).items():
                headers[f"X-{key}"] = str(value)
            target = uri
            if not urlsplit(uri).path.strip("/") and props.headers and "uri_path" in props.headers:
                target = uri.rstrip("/") + "/" + str(props.headers["uri_path"]).lstrip("/")
            attempt = 0
            while True:
                attempt += 1
                try:
                    async with http.post(target, data=message.body, headers=headers) as resp:
                        if resp.status < 300:
                            return
                        failure: Exception = ConnectionError(
                            f"HTTP destination answered {resp.status}"
                        )
                except aiohttp.ClientError as exc:
                    failure = exc
                if attempt >= spec.max_attempts:
                    if dead_letter is None:
                        raise failure
                    await self._dead_letter(dead_letter, message, failure, attempt)
                    return
                self.retrying += 1
                try:
                    await clocks.sleep(self.clock, http_retry_delay(attempt))
                finally:
                    self.retrying -= 1

        return publish

    async def _dead_letter(
        self,
        ch: aiormq.abc.AbstractChannel,
        message: DeliveredMessage,
        failure: Exception,
        attempts: int,
    ) -> None:
        """Publish a message the HTTP destination kept refusing to the dead-letter
        exchange (confirmed before the source is acked), saying why."""
        spec = self.spec
        props = message.header.properties
        props.headers = {
            **(props.headers or {}),
            "x-shovel-name": self.name,
            "x-shovel-dest-uri": redact(spec.dest_uris[0]),
            "x-shovel-error": str(failure) or type(failure).__name__,
            "x-shovel-attempts": attempts,
        }
        key = spec.dead_letter_routing_key
        confirm = await ch.basic_publish(
            message.body,
            exchange=spec.dead_letter_exchange or "",
            routing_key=key if key is not None else message.routing_key or "",
            properties=props,
        )
        if not isinstance(confirm, Basic.Ack):
            raise ConnectionError(f"the dead-letter exchange refused a message ({confirm})")
        self.dead_lettered += 1
