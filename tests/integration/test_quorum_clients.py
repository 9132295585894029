"""kombu (py-amqp) and aio-pika declaring and using quorum queues, as their users
do against RabbitMQ 4: declaration with the client's own API, publish with
confirms, consume, nack with requeue and the x-delivery-count that comes back,
and the 406 for a non-durable declaration."""

from __future__ import annotations

import asyncio
from typing import Any

import aio_pika
import amqp.exceptions
import pytest
from aio_pika.exceptions import ChannelPreconditionFailed
from conftest import BrokerThread
from kombu import Connection, Exchange, Producer, Queue
from pikahelp import uniq

QUORUM = {"x-queue-type": "quorum"}


def test_kombu_declares_and_uses_a_quorum_queue(broker: BrokerThread) -> None:
    name = uniq("kombu")
    exchange = Exchange(uniq("kx"), type="topic")
    queue = Queue(
        name,
        exchange,
        routing_key="jobs.#",
        queue_arguments={**QUORUM, "x-delivery-limit": 2},
    )
    with Connection(broker.url, transport_options={"confirm_publish": True}) as conn:
        channel = conn.channel()
        bound = queue(channel)
        bound.declare()
        bound.declare()  # redeclared as it is: fine
        producer = Producer(channel, exchange)
        for i in range(3):
            producer.publish({"n": i}, routing_key="jobs.new", serializer="json")
        assert bound.queue_declare(passive=True).message_count == 3
        first = bound.get()
        assert first is not None and first.payload == {"n": 0}
        assert "x-delivery-count" not in first.headers
        first.requeue()
        again = bound.get()
        assert again is not None and again.payload == {"n": 0}
        assert again.headers["x-delivery-count"] == 1
        assert again.delivery_info["redelivered"] is True
        again.ack()
        got: list[Any] = []
        with conn.Consumer(bound, callbacks=[lambda body, m: (got.append(body), m.ack())]):
            while len(got) < 2:
                conn.drain_events(timeout=5)
        assert got == [{"n": 1}, {"n": 2}]
        info = broker.broker.vhosts["/"].queues[name]
        assert info.queue_type == "quorum"
        # A classic redeclaration of it is refused as RabbitMQ refuses it.
        with pytest.raises(amqp.exceptions.PreconditionFailed, match="x-queue-type"):
            Queue(name, exchange, routing_key="jobs.#")(conn.channel()).declare()


def test_aio_pika_declares_and_uses_a_quorum_queue(broker: BrokerThread) -> None:
    name = uniq("aiopika")

    async def scenario() -> None:
        conn = await aio_pika.connect_robust(broker.url)
        async with conn:
            channel = await conn.channel(publisher_confirms=True)
            await channel.set_qos(prefetch_count=5)  # per consumer: fine on quorum
            queue = await channel.declare_queue(
                name, durable=True, arguments={**QUORUM, "x-delivery-limit": 1}
            )
            for i in range(2):
                await channel.default_exchange.publish(
                    aio_pika.Message(b"m%d" % i, priority=9 if i else None), routing_key=name
                )
            seen: list[tuple[bytes, Any]] = []
            async with queue.iterator() as it:
                async for message in it:
                    seen.append((message.body, message.headers.get("x-delivery-count")))
                    if message.body == b"m0" and len(seen) < 3:
                        await message.nack(requeue=True)
                    else:
                        await message.ack()
                    if len(seen) == 3:
                        break
            # The high-priority m1 first; m0 back once with its count.
            assert seen == [(b"m1", None), (b"m0", None), (b"m0", 1)]
            refused = await conn.channel()
            with pytest.raises(ChannelPreconditionFailed, match="non-durable"):
                await refused.declare_queue(uniq("nd"), durable=False, arguments=QUORUM)

    asyncio.run(asyncio.wait_for(scenario(), 30))
