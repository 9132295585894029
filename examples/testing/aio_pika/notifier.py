"""A tiny aio-pika application: events fan out through a topic exchange, and an
RPC-style request/reply over a direct reply-to queue."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import aio_pika

EXCHANGE = "events"


async def subscribe(
    channel: aio_pika.abc.AbstractChannel, pattern: str
) -> aio_pika.abc.AbstractQueue:
    """A private queue bound to ``events`` with ``pattern``."""
    exchange = await channel.declare_exchange(EXCHANGE, aio_pika.ExchangeType.TOPIC, durable=True)
    queue = await channel.declare_queue(exclusive=True)
    await queue.bind(exchange, pattern)
    return queue


async def publish_event(
    channel: aio_pika.abc.AbstractChannel, key: str, payload: dict[str, Any]
) -> None:
    exchange = await channel.declare_exchange(EXCHANGE, aio_pika.ExchangeType.TOPIC, durable=True)
    await exchange.publish(aio_pika.Message(json.dumps(payload).encode()), routing_key=key)


async def serve_upper(channel: aio_pika.abc.AbstractChannel, queue_name: str = "upper") -> None:
    """An RPC server: replies to each request with its body upper-cased."""
    queue = await channel.declare_queue(queue_name)

    async def on_request(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        async with message.process():
            await channel.default_exchange.publish(
                aio_pika.Message(message.body.upper(), correlation_id=message.correlation_id),
                routing_key=message.reply_to or "",
            )

    await queue.consume(on_request)


async def call_upper(
    channel: aio_pika.abc.AbstractChannel, text: str, queue_name: str = "upper"
) -> str:
    """The RPC client, using RabbitMQ's direct reply-to pseudo-queue."""
    loop = asyncio.get_running_loop()
    reply: asyncio.Future[bytes] = loop.create_future()
    correlation_id = str(uuid.uuid4())

    async def on_reply(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        if message.correlation_id == correlation_id and not reply.done():
            reply.set_result(message.body)

    replies = await channel.get_queue("amq.rabbitmq.reply-to", ensure=False)
    tag = await replies.consume(on_reply, no_ack=True)
    try:
        await channel.default_exchange.publish(
            aio_pika.Message(
                text.encode(), correlation_id=correlation_id, reply_to="amq.rabbitmq.reply-to"
            ),
            routing_key=queue_name,
        )
        return (await asyncio.wait_for(reply, 10)).decode()
    finally:
        await replies.cancel(tag)
