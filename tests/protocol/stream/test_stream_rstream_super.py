"""rstream's SuperStreamProducer and SuperStreamConsumer against a broker over a
socket: a super stream they create, hash routing (rstream's murmur3 over
Partitions, recomputed here with mmh3 as the oracle of where each message
belongs) and key routing (Route), a consumer reading every partition, and a
super stream declared over AMQP 0-9-1 (pika, as RabbitMQ's Java client
declares one) that rstream routes to."""

from __future__ import annotations

import asyncio
from typing import Any

import mmh3
import pika
import pytest
from rstream import (
    AMQPMessage,
    ConsumerOffsetSpecification,
    MessageContext,
    OffsetType,
    RouteType,
    SuperStreamConsumer,
    SuperStreamCreationOption,
    SuperStreamProducer,
    amqp_decoder,
)
from streamhelp import HOST, port, stream_broker_fixture

from warren.pytest_plugin import WarrenBroker

pytestmark = [pytest.mark.timeout(120)]

warren = stream_broker_fixture()


async def body_key(message: AMQPMessage) -> str:
    return bytes(message.body).decode()


def hashed_partition(key: str, partitions: list[str]) -> str:
    """Where rstream's HashRoutingMurmurStrategy sends ``key`` (as the Java client)."""
    digest = mmh3.hash_bytes(key.encode("UTF-16"), 104729)
    return partitions[int.from_bytes(digest, "little") % len(partitions)]


def producer(warren: WarrenBroker, name: str, **kw: Any) -> SuperStreamProducer:
    return SuperStreamProducer(
        HOST,
        port(warren),
        username="guest",
        password="guest",
        super_stream=name,
        routing_extractor=body_key,
        **kw,
    )


async def send_confirmed(p: SuperStreamProducer, bodies: list[str]) -> None:
    confirmed: list[Any] = []
    done = asyncio.Event()

    async def on_confirm(status: Any) -> None:
        confirmed.append(status)
        if len(confirmed) == len(bodies):
            done.set()

    for body in bodies:
        await p.send(AMQPMessage(body=body.encode()), on_publish_confirm=on_confirm)
    await asyncio.wait_for(done.wait(), 30)
    assert all(s.is_confirmed for s in confirmed)


async def consume_all(warren: WarrenBroker, name: str, n: int) -> dict[str, list[str]]:
    """The first ``n`` messages a SuperStreamConsumer gets, by partition."""
    got: dict[str, list[str]] = {}
    done = asyncio.Event()

    async def on_message(msg: AMQPMessage, ctx: MessageContext) -> None:
        got.setdefault(ctx.stream, []).append(bytes(msg.body).decode())
        if sum(len(v) for v in got.values()) >= n:
            done.set()

    consumer = SuperStreamConsumer(
        HOST, port(warren), username="guest", password="guest", super_stream=name
    )
    async with consumer:
        await consumer.subscribe(
            on_message,
            decoder=amqp_decoder,
            offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST),
        )
        await asyncio.wait_for(done.wait(), 30)
    return got


def test_hash_routing_and_a_consumer_of_every_partition(warren: WarrenBroker) -> None:
    partitions = ["rs-hash-0", "rs-hash-1", "rs-hash-2"]
    bodies = [f"key-{i}" for i in range(30)]

    async def run() -> None:
        option = SuperStreamCreationOption(n_partitions=3)
        async with producer(warren, "rs-hash", super_stream_creation_option=option) as p:
            await send_confirmed(p, bodies)
        got = await consume_all(warren, "rs-hash", len(bodies))
        expected: dict[str, list[str]] = {}
        for body in bodies:
            expected.setdefault(hashed_partition(body, partitions), []).append(body)
        assert got == expected
        assert len(expected) == 3  # the keys spread over every partition

    asyncio.run(run())
    assert sorted(warren.broker.vhosts["/"].queues) >= partitions


def test_key_routing_with_binding_keys(warren: WarrenBroker) -> None:
    async def run() -> None:
        option = SuperStreamCreationOption(n_partitions=0, binding_keys=["amer", "emea"])
        keyed = producer(
            warren, "rs-key", super_stream_creation_option=option, routing=RouteType.Key
        )
        async with keyed as p:
            await send_confirmed(p, ["emea", "emea"])
        # rstream keeps the first Route's answer: one producer per key.
        async with producer(warren, "rs-key", routing=RouteType.Key) as p:
            await send_confirmed(p, ["amer"])
        got = await consume_all(warren, "rs-key", 3)
        assert got == {"rs-key-emea": ["emea", "emea"], "rs-key-amer": ["amer"]}
        async with producer(warren, "rs-key") as p:
            await p.delete_super_stream("rs-key")

    asyncio.run(run())
    vhost = warren.broker.vhosts["/"]
    assert "rs-key" not in vhost.exchanges
    assert not [q for q in vhost.queues if q.startswith("rs-key")]


def test_a_super_stream_declared_over_amqp_091_is_routed_to_by_rstream(
    warren: WarrenBroker,
) -> None:
    params = pika.ConnectionParameters(HOST, warren.amqp_port)
    conn = pika.BlockingConnection(params)
    try:
        ch = conn.channel()
        ch.exchange_declare("rs-091", "direct", durable=True, arguments={"x-super-stream": True})
        for i in range(2):
            ch.queue_declare(f"rs-091-{i}", durable=True, arguments={"x-queue-type": "stream"})
            ch.queue_bind(
                f"rs-091-{i}", "rs-091", str(i), arguments={"x-stream-partition-order": i}
            )
        ch.basic_publish("rs-091", "1", b"from-091")
    finally:
        conn.close()
    partitions = ["rs-091-0", "rs-091-1"]
    bodies = [f"k{i}" for i in range(10)]

    async def run() -> None:
        async with producer(warren, "rs-091") as p:
            await send_confirmed(p, bodies)
        got = await consume_all(warren, "rs-091", len(bodies) + 1)
        expected: dict[str, list[str]] = {"rs-091-1": ["from-091"]}
        for body in bodies:
            expected.setdefault(hashed_partition(body, partitions), []).append(body)
        assert got == expected

    asyncio.run(run())
