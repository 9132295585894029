"""rstream publishing and consuming over a socket (publishing.py, delivering.py),
and the same stream read and written over AMQP 0-9-1 (pika) and AMQP 1.0
(Qpid Proton): same offsets, bodies and properties both ways; publisher
deduplication across a reconnect."""

from __future__ import annotations

import asyncio
from typing import Any

import pika
import pytest
from rstream import (
    AMQPMessage,
    Consumer,
    ConsumerOffsetSpecification,
    FilterConfiguration,
    MessageContext,
    OffsetSpecification,
    OffsetType,
    Producer,
    amqp_decoder,
)
from rstream._pyamqp.message import Properties  # type: ignore[import-untyped]
from streamhelp import HOST, first_messages, port, producer, stream_broker_fixture

from warren.pytest_plugin import WarrenBroker

proton = pytest.importorskip("proton")
from proton import Described, Message, symbol  # noqa: E402
from proton.reactor import Filter  # noqa: E402
from proton.utils import BlockingConnection  # noqa: E402

pytestmark = [pytest.mark.timeout(60)]

warren = stream_broker_fixture()


async def consume(
    warren: WarrenBroker,
    stream: str,
    n: int,
    offset: ConsumerOffsetSpecification,
    **kw: Any,
) -> list[tuple[int, AMQPMessage]]:
    """The first ``n`` messages (offset, message) a subscription gets."""
    return await first_messages(port(warren), stream, n, offset, **kw)


def consumers(warren: WarrenBroker, stream: str) -> int:
    """How many subscriptions the stream has (from the broker's loop)."""
    return warren.call(lambda: len(warren.broker.vhosts["/"].queues[stream].consumers))


def test_publish_with_confirms_and_consume_from_every_offset_spec(warren: WarrenBroker) -> None:
    async def run() -> None:
        async with producer(warren) as p:
            await p.create_stream("rs-pub")
            for i in range(3):
                await p.send_wait("rs-pub", AMQPMessage(body=f"m{i}".encode()))
            ids = await p.send_batch("rs-pub", [AMQPMessage(body=b"m3"), AMQPMessage(body=b"m4")])
            assert len(ids) == 2
        first = await consume(warren, "rs-pub", 5, ConsumerOffsetSpecification(OffsetType.FIRST))
        assert [(o, m.body) for o, m in first] == [(i, f"m{i}".encode()) for i in range(5)]
        at = await consume(warren, "rs-pub", 2, ConsumerOffsetSpecification(OffsetType.OFFSET, 3))
        assert [o for o, _ in at] == [3, 4]
        last = await consume(warren, "rs-pub", 1, ConsumerOffsetSpecification(OffsetType.LAST))
        # The last chunk, as RabbitMQ: send_batch's one Publish is one chunk.
        assert [o for o, _ in last] == [3, 4]
        stamp = await consume(
            warren, "rs-pub", 5, ConsumerOffsetSpecification(OffsetType.TIMESTAMP, 0)
        )
        assert [o for o, _ in stamp] == [0, 1, 2, 3, 4]

    asyncio.run(run())


def test_next_gets_only_what_comes_after(warren: WarrenBroker) -> None:
    async def run() -> None:
        async with producer(warren) as p:
            await p.create_stream("rs-next")
            await p.send_wait("rs-next", AMQPMessage(body=b"old"))
            task = asyncio.create_task(
                consume(warren, "rs-next", 1, ConsumerOffsetSpecification(OffsetType.NEXT))
            )
            # "next" is the end when the subscription arrives: publish once it has.
            while not await asyncio.to_thread(consumers, warren, "rs-next"):
                await asyncio.sleep(0.01)
            await p.send_wait("rs-next", AMQPMessage(body=b"new"))
            got = await task
            assert [(o, m.body) for o, m in got] == [(1, b"new")]

    asyncio.run(run())


def test_deduplication_across_a_reconnect(warren: WarrenBroker) -> None:
    async def run() -> None:
        async with producer(warren) as p:
            await p.create_stream("rs-dedup")
            for i in range(3):
                await p.send_wait("rs-dedup", AMQPMessage(body=f"d{i}".encode()), "app")
        async with producer(warren) as p:
            client = await p.default_client
            assert await client.query_publisher_sequence("rs-dedup", "app") == 3
            # rstream resumes after the stored sequence: the next id is 4.
            await p.send_wait("rs-dedup", AMQPMessage(body=b"d3"), "app")
            assert await client.query_publisher_sequence("rs-dedup", "app") == 4
        got = await consume(warren, "rs-dedup", 4, ConsumerOffsetSpecification(OffsetType.FIRST))
        assert [m.body for _, m in got] == [b"d0", b"d1", b"d2", b"d3"]

    asyncio.run(run())


def amqp1(warren: WarrenBroker) -> BlockingConnection:
    return BlockingConnection(
        f"amqp://{HOST}:{warren.amqp_port}",
        user="guest",
        password="guest",
        allowed_mechs="PLAIN",
        allow_insecure_mechs=True,
        virtual_host="vhost:/",
        timeout=10,
    )


def test_rstream_messages_read_over_amqp_091_and_10(warren: WarrenBroker) -> None:
    async def publish() -> None:
        async with producer(warren) as p:
            await p.create_stream("rs-cross")
            msg = AMQPMessage(
                body=b"hello",
                properties=Properties(message_id="id-1", content_type="text/plain"),
                application_properties={"color": "red"},
            )
            await p.send_wait("rs-cross", msg)

    asyncio.run(publish())
    conn = pika.BlockingConnection(pika.URLParameters(warren.url))
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=10)
        gen = ch.consume("rs-cross", arguments={"x-stream-offset": "first"}, inactivity_timeout=10)
        method, props, body = next(gen)
        assert body == b"hello"
        assert props.message_id == "id-1"
        assert props.content_type == "text/plain"
        assert props.headers["color"] == "red"
        assert props.headers["x-stream-offset"] == 0
        ch.cancel()
    finally:
        conn.close()
    c1 = amqp1(warren)
    try:
        first = {symbol("offset"): Described(symbol("rabbitmq:stream-offset-spec"), "first")}
        receiver = c1.create_receiver("/queues/rs-cross", options=Filter(first))
        got = receiver.receive(timeout=10)
        receiver.accept()
        assert got.body == b"hello"
        assert got.id == "id-1"
        assert got.properties == {"color": "red"}
        assert got.annotations[symbol("x-stream-offset")] == 0
    finally:
        c1.close()


def test_amqp_091_and_10_messages_read_by_rstream(warren: WarrenBroker) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(warren.url))
    try:
        ch = conn.channel()
        ch.queue_declare("rs-back", durable=True, arguments={"x-queue-type": "stream"})
        ch.confirm_delivery()
        props = pika.BasicProperties(message_id="p1", headers={"k": "v"})
        ch.basic_publish("", "rs-back", b"from-091", props)
    finally:
        conn.close()
    c1 = amqp1(warren)
    try:
        sender = c1.create_sender("/queues/rs-back")
        sender.send(Message(body=b"from-10", id="a1", properties={"k": "w"}))
    finally:
        c1.close()

    async def run() -> None:
        got = await consume(warren, "rs-back", 2, ConsumerOffsetSpecification(OffsetType.FIRST))
        (o1, m1), (o2, m2) = got
        assert (o1, m1.body, m1.properties.message_id) == (0, b"from-091", b"p1")
        assert m1.application_properties == {b"k": b"v"}
        # Proton sends bytes as an amqp-value section: it comes back as one.
        assert (o2, m2.value, m2.properties.message_id) == (1, b"from-10", b"a1")
        assert m2.application_properties == {b"k": b"w"}

    asyncio.run(run())


def test_rstream_filtering(warren: WarrenBroker) -> None:
    """Publish v2 filter values (rstream's filter_value_extractor) and a
    subscription's filter.N: only the matching records come (no post-filter)."""

    async def color(msg: AMQPMessage) -> str:
        return str(msg.application_properties["color"])

    async def run() -> None:
        async with Producer(
            HOST, port(warren), username="guest", password="guest", filter_value_extractor=color
        ) as p:
            await p.create_stream("rs-filter")
            for i, c in enumerate(["red", "blue", "red", "green", "red"]):
                msg = AMQPMessage(body=b"f%d" % i, application_properties={"color": c})
                await p.send_wait("rs-filter", msg)
        got = await consume(
            warren,
            "rs-filter",
            3,
            ConsumerOffsetSpecification(OffsetType.FIRST),
            filter_input=FilterConfiguration(values_to_filter=["red"]),
        )
        assert [(o, m.body) for o, m in got] == [(0, b"f0"), (2, b"f2"), (4, b"f4")]

    asyncio.run(run())


def test_rstream_single_active_consumer(warren: WarrenBroker) -> None:
    """Two rstream consumers in one group: the first gets the messages; when
    it closes, the other takes over from where its listener says."""

    async def run() -> None:
        async with producer(warren) as p:
            await p.create_stream("rs-sac")
            await p.send_wait("rs-sac", AMQPMessage(body=b"s0"))
            first: list[bytes] = []
            second: list[bytes] = []
            came = asyncio.Event()

            async def on_first(msg: AMQPMessage, ctx: MessageContext) -> None:
                first.append(msg.body)

            async def on_second(msg: AMQPMessage, ctx: MessageContext) -> None:
                second.append(msg.body)
                came.set()

            async def from_first(active: bool, ctx: Any) -> OffsetSpecification:
                return OffsetSpecification(OffsetType.FIRST, 0)

            props = {"single-active-consumer": "true", "name": "group"}
            one = Consumer(HOST, port(warren), username="guest", password="guest")
            two = Consumer(HOST, port(warren), username="guest", password="guest")
            await one.start()
            await two.start()
            await one.subscribe(
                "rs-sac",
                on_first,
                decoder=amqp_decoder,
                properties=dict(props),
                consumer_update_listener=from_first,
            )
            await two.subscribe(
                "rs-sac",
                on_second,
                decoder=amqp_decoder,
                properties=dict(props),
                consumer_update_listener=from_first,
            )
            for _ in range(100):
                if first:
                    break
                await asyncio.sleep(0.05)
            assert first == [b"s0"] and second == []
            await one.close()
            await asyncio.wait_for(came.wait(), 20)
            assert second == [b"s0"]
            await two.close()

    asyncio.run(run())
