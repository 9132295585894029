"""rbfly (the Cython stream client) against Warren's stream listener over a
socket: the shapes its documentation shows. Streams created twice and deleted,
a publisher's send (each message confirmed) and its two batch publishers,
subscriptions from every offset specification (a stored reference among
them), filters, message properties both ways (rbfly's own and those of an
AMQP 0-9-1 publisher), and deduplication by publisher name.

rbfly's sdist has no tests that need a broker (its suite is unit tests
with mocks), so there is no suite of its own to run here.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pika
import pytest

from warren.pytest_plugin import WarrenBroker, start_broker

rbs = pytest.importorskip("rbfly.streams")
from rbfly.amqp import MessageCtx  # noqa: E402
from rbfly.streams import Offset, StreamsClient  # noqa: E402
from rbfly.streams.error import ProtocolError  # noqa: E402
from rbfly.types import Symbol  # noqa: E402

pytestmark = [
    pytest.mark.timeout(60),
    # Warren is driven over sockets only: nothing here runs the broker in
    # this process differently between the builds.
    pytest.mark.passes("compiled"),
]

HOST = "127.0.0.1"


@pytest.fixture(scope="module")
def warren() -> Iterator[WarrenBroker]:
    broker = start_broker(http_port=-1, mqtt_port=-1, prometheus_port=-1, stream_port=0)
    try:
        yield broker
    finally:
        broker.stop()


def client(warren: WarrenBroker) -> StreamsClient:
    port = warren.broker.listener("stream").port
    return rbs.streams_client(f"rabbitmq-stream://guest:guest@{HOST}:{port}/")


async def take(messages: AsyncIterator[Any], n: int) -> list[tuple[int, Any, MessageCtx]]:
    """The first ``n`` messages of a subscription: (offset, body, context)."""
    got: list[tuple[int, Any, MessageCtx]] = []
    async for body in messages:
        ctx = rbs.get_message_ctx()
        got.append((ctx.stream_offset, body, ctx))
        if len(got) == n:
            break
    return got


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_create_twice_publish_subscribe_and_delete(warren: WarrenBroker) -> None:
    async def scenario() -> list[tuple[int, Any, MessageCtx]]:
        c = client(warren)
        try:
            await c.create_stream("rb-basic")
            await c.create_stream("rb-basic")  # rbfly ignores STREAM_ALREADY_EXISTS
            async with c.publisher("rb-basic", name="basic") as pub:
                await pub.send(b"bytes")
                await pub.send("text")
                await pub.send({"map": [1, 2.5, None, True]})
                assert pub.message_id == 4  # the next publishing id
            got = await take(c.subscribe("rb-basic", offset=Offset.FIRST, timeout=10), 3)
            await c.delete_stream("rb-basic")
            # rbfly ignores STREAM_NOT_AVAILABLE here, not the STREAM_DOES_NOT_EXIST
            # that RabbitMQ (and Warren) answer
            with pytest.raises(ProtocolError) as refused:
                await c.delete_stream("rb-basic")
            assert refused.value.code == 0x02
            return got
        finally:
            await c.disconnect()

    got = run(scenario())
    assert [(offset, body) for offset, body, _ in got] == [
        (0, b"bytes"),
        (1, "text"),
        (2, {"map": [1, 2.5, None, True]}),
    ]
    assert all(ctx.stream_publish_id == 0 for _, _, ctx in got)  # not carried to consumers
    assert "rb-basic" not in warren.broker.vhosts["/"].queues


def test_batch_publishers(warren: WarrenBroker) -> None:
    """PublisherBatchFast (batch, then flush) and PublisherBatchLimit, whose
    batch() waits while ``max_len`` messages are not flushed: a flusher task
    beside it, as rbfly's documentation shows."""

    async def scenario() -> list[tuple[int, Any, MessageCtx]]:
        c = client(warren)
        try:
            await c.create_stream("rb-batch")
            async with c.publisher("rb-batch", name="fast", cls=rbs.PublisherBatchFast) as fast:
                for i in range(100):
                    fast.batch(f"fast-{i}")
                await fast.flush()
            async with c.publisher("rb-batch", name="limit", cls=rbs.PublisherBatchLimit) as lim:

                async def flusher() -> None:
                    while True:
                        await lim.flush()
                        await asyncio.sleep(0.01)

                task = asyncio.create_task(flusher())
                for i in range(50):
                    await lim.batch(f"limit-{i}", max_len=8)
                task.cancel()
                await lim.flush()
            return await take(c.subscribe("rb-batch", offset=Offset.FIRST, timeout=10), 150)
        finally:
            await c.disconnect()

    got = run(scenario())
    assert [offset for offset, _, _ in got] == list(range(150))
    assert [body for _, body, _ in got] == [f"fast-{i}" for i in range(100)] + [
        f"limit-{i}" for i in range(50)
    ]


def test_subscribe_from_each_offset_specification(warren: WarrenBroker) -> None:
    async def scenario() -> dict[str, list[Any]]:
        c = client(warren)
        try:
            await c.create_stream("rb-offsets")
            async with c.publisher("rb-offsets", name="offsets") as pub:
                for i in range(10):
                    await pub.send(f"m{i}")
            seen: dict[str, list[Any]] = {}

            async def offsets(name: str, offset: Offset, n: int) -> None:
                got = await take(c.subscribe("rb-offsets", offset=offset, timeout=10), n)
                seen[name] = [o for o, _, _ in got]

            await offsets("first", Offset.FIRST, 10)
            await offsets("offset", Offset.offset(7), 3)
            await offsets("last", Offset.LAST, 1)
            # the stored reference is the last offset processed: reading goes on after it
            await c.write_offset("rb-offsets", "app", 4)
            await offsets("reference", Offset.reference("app"), 5)
            # a reference never stored starts at the stream's first message
            await offsets("new reference", Offset.reference("unknown"), 2)
            # a timestamp before the first message: all of them
            await offsets("timestamp", Offset.timestamp(0.0), 10)

            # NEXT: nothing of what was there, the first message published
            # after the subscription (sent until one arrives: no race with
            # the Subscribe)
            async def next_only() -> None:
                got = await take(c.subscribe("rb-offsets", offset=Offset.NEXT, timeout=20), 1)
                seen["next"] = [o for o, _, _ in got]
                seen["next body"] = [body for _, body, _ in got]

            task = asyncio.create_task(next_only())
            async with c.publisher("rb-offsets", name="offsets") as pub:
                while not task.done():
                    await pub.send("after")
                    await asyncio.wait({task}, timeout=0.2)
            await task
            return seen
        finally:
            await c.disconnect()

    seen = run(scenario())
    assert seen["first"] == list(range(10))
    assert seen["offset"] == [7, 8, 9]
    assert seen["last"] == [9]  # a chunk is one message in Warren's stream: the last one
    assert seen["reference"] == [5, 6, 7, 8, 9]
    assert seen["new reference"] == [0, 1]
    assert seen["timestamp"] == list(range(10))
    assert seen["next"][0] >= 10 and seen["next body"] == ["after"]


def test_write_offset_of_the_last_message_read(warren: WarrenBroker) -> None:
    """write_offset without a value stores the offset of the message in the
    current context, and the broker answers it to QueryOffset."""

    async def scenario() -> list[int]:
        c = client(warren)
        try:
            await c.create_stream("rb-ctx-offset")
            async with c.publisher("rb-ctx-offset", name="p") as pub:
                for i in range(6):
                    await pub.send(i)
            async for body in c.subscribe("rb-ctx-offset", offset=Offset.FIRST, timeout=10):
                if body == 3:
                    await c.write_offset("rb-ctx-offset", "ctx")
                    break
            got = await take(
                c.subscribe("rb-ctx-offset", offset=Offset.reference("ctx"), timeout=10), 2
            )
            return [o for o, _, _ in got]
        finally:
            await c.disconnect()

    assert run(scenario()) == [4, 5]


def test_filters(warren: WarrenBroker) -> None:
    """A publisher with ``filter_extract`` sends Publish v2 with each message's
    filter value; a subscription with a MessageFilter gets those values only
    (Warren's filter is exact; rbfly drops a Bloom filter's false positives
    itself)."""

    def region(msg: MessageCtx) -> str:
        return str(msg.app_properties["region"])

    async def scenario() -> list[tuple[int, Any, MessageCtx]]:
        c = client(warren)
        try:
            await c.create_stream("rb-filter")
            async with c.publisher("rb-filter", name="f", filter_extract=region) as pub:
                for i in range(12):
                    where = ("emea", "apac", "amer")[i % 3]
                    await pub.send(
                        rbs.stream_message_ctx(f"m{i}", app_properties={"region": where})
                    )
            wanted = rbs.MessageFilter(region, {"emea", "amer"})
            return await take(
                c.subscribe("rb-filter", offset=Offset.FIRST, filter=wanted, timeout=10), 8
            )
        finally:
            await c.disconnect()

    got = run(scenario())
    assert [(o, body) for o, body, _ in got] == [(i, f"m{i}") for i in range(12) if i % 3 != 1]
    assert {ctx.app_properties["region"] for _, _, ctx in got} == {"emea", "amer"}


def test_message_properties_round_trip(warren: WarrenBroker) -> None:
    """Application properties rbfly publishes come back to rbfly as they were
    (rbfly 0.10 encodes no other section); an AMQP 0-9-1 message's
    properties reach rbfly in their AMQP 1.0 form."""
    app_properties = {"s": "text", "i": -7, "f": 2.5, "b": True, "bin": b"\x00\x01"}

    async def publish() -> None:
        c = client(warren)
        try:
            await c.create_stream("rb-props")
            async with c.publisher("rb-props", name="props") as pub:
                msg = rbs.stream_message_ctx(b"with-props", app_properties=app_properties)
                await pub.send(msg)
        finally:
            await c.disconnect()

    run(publish())

    conn = pika.BlockingConnection(
        pika.ConnectionParameters(
            HOST, warren.amqp_port, credentials=pika.PlainCredentials("guest", "guest")
        )
    )
    try:
        conn.channel().basic_publish(
            "",
            "rb-props",
            b"from-0-9-1",
            pika.BasicProperties(
                content_type="text/plain",
                message_id="m-1",
                correlation_id="c-1",
                headers={"h": "v", "n": 5},
                delivery_mode=2,
            ),
        )
    finally:
        conn.close()

    async def read() -> list[tuple[int, Any, MessageCtx]]:
        c = client(warren)
        try:
            return await take(c.subscribe("rb-props", offset=Offset.FIRST, timeout=10), 2)
        finally:
            await c.disconnect()

    (_, body, mine), (_, body2, theirs) = run(read())
    assert body == b"with-props"
    assert mine.app_properties == app_properties
    assert body2 == b"from-0-9-1"
    assert theirs.app_properties == {"h": "v", "n": 5}
    props = theirs.properties
    assert (props.message_id, props.correlation_id, props.content_type) == (
        "m-1",
        "c-1",
        Symbol("text/plain"),
    )
    assert theirs.header.durable


def test_deduplication_by_publisher_name(warren: WarrenBroker) -> None:
    """A publisher's name is its reference: a new publisher of the same name
    starts after the last publishing id stored, and a message sent again
    with an id already stored is dropped (and still confirmed). A message
    with a publishing id of its own moves the publisher's ids on from it."""

    async def scenario() -> tuple[list[int], list[Any]]:
        c = client(warren)
        try:
            await c.create_stream("rb-dedup")
            ids = []
            async with c.publisher("rb-dedup", name="dedup") as pub:
                ids.append(pub.message_id)
                for i in range(3):
                    await pub.send(f"first-{i}")
            async with c.publisher("rb-dedup", name="dedup") as pub:
                ids.append(pub.message_id)
                # publishing ids 2 and 3 again: dropped
                await pub.send(rbs.stream_message_ctx("again-2", publish_id=2))
                await pub.send(rbs.stream_message_ctx("again-3", publish_id=3))
                await pub.send(rbs.stream_message_ctx("new-4", publish_id=4))
            async with c.publisher("rb-dedup", name="dedup", cls=rbs.PublisherBatchFast) as fast:
                ids.append(fast.message_id)
                fast.batch(rbs.stream_message_ctx("jump-10", publish_id=10))
                fast.batch("then-11")
                await fast.flush()
            async with c.publisher("rb-dedup", name="dedup") as pub:
                ids.append(pub.message_id)
            got = await take(c.subscribe("rb-dedup", offset=Offset.FIRST, timeout=10), 6)
            return ids, [body for _, body, _ in got]
        finally:
            await c.disconnect()

    ids, bodies = run(scenario())
    assert ids == [1, 4, 5, 12]
    assert bodies == ["first-0", "first-1", "first-2", "new-4", "jump-10", "then-11"]
