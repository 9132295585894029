"""aio-pika (plain and robust connections) against a real Warren broker.

Every scenario runs on its own event loop through ``asyncio.run``; the broker
lives on another loop in a background thread, so everything goes over TCP.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aio_pika
import aiormq
import pytest
from aio_pika import DeliveryMode, ExchangeType, Message
from aio_pika.abc import AbstractConnection, AbstractIncomingMessage, AbstractQueue
from aio_pika.exceptions import (
    ChannelNotFoundEntity,
    ChannelPreconditionFailed,
    DeliveryError,
    PublishError,
    QueueEmpty,
)
from aio_pika.patterns import RPC
from aiormq.exceptions import ChannelLockedResource

CONNECTORS = {"plain": aio_pika.connect, "robust": aio_pika.connect_robust}

Scenario = Callable[[str, Callable[..., Awaitable[AbstractConnection]]], Awaitable[None]]


def run(url: str, scenario: Scenario, kind: str = "robust", timeout: float | None = 30) -> None:
    asyncio.run(asyncio.wait_for(scenario(url, CONNECTORS[kind]), timeout))


async def take(it: Any, n: int, timeout: float = 5) -> list[AbstractIncomingMessage]:
    """The next ``n`` messages from a queue iterator, failing if they do not come."""
    out = []
    for _ in range(n):
        out.append(await asyncio.wait_for(it.__anext__(), timeout))
    return out


async def ready_count(channel: aio_pika.abc.AbstractChannel, name: str) -> int:
    """Ready messages per a fresh passive queue.declare (robust channels cache
    passive declarations, so this goes to the aiormq channel underneath)."""
    underlay = await channel.get_underlay_channel()
    ok = await underlay.queue_declare(name, passive=True)
    assert ok.message_count is not None
    return ok.message_count


class Collector:
    """A consume callback feeding an asyncio.Queue, for checks that something does
    *not* arrive (a queue iterator closes itself when a wait on it is cancelled)."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[AbstractIncomingMessage] = asyncio.Queue()

    async def __call__(self, message: AbstractIncomingMessage) -> None:
        await self.queue.put(message)

    async def take(self, n: int, timeout: float = 5) -> list[AbstractIncomingMessage]:
        return [await asyncio.wait_for(self.queue.get(), timeout) for _ in range(n)]

    async def nothing_more(self, wait: float = 0.3) -> bool:
        try:
            await asyncio.wait_for(self.queue.get(), wait)
        except TimeoutError:
            return True
        return False


async def ignore(message: AbstractIncomingMessage) -> None:
    pass


async def drain_get(queue: AbstractQueue) -> list[bytes]:
    bodies = []
    while (msg := await queue.get(no_ack=True, fail=False)) is not None:
        bodies.append(msg.body)
    return bodies


# -- exchanges of every type --------------------------------------------------------


@pytest.mark.parametrize("kind", ["plain", "robust"])
def test_exchange_types_route_as_rabbitmq(broker: Any, kind: str) -> None:
    async def scenario(url: str, connect: Any) -> None:
        async with await connect(url) as conn:
            ch = await conn.channel()
            direct = await ch.declare_exchange("t.direct", ExchangeType.DIRECT)
            fanout = await ch.declare_exchange("t.fanout", ExchangeType.FANOUT)
            topic = await ch.declare_exchange("t.topic", ExchangeType.TOPIC)
            headers = await ch.declare_exchange("t.headers", ExchangeType.HEADERS)

            qd = await ch.declare_queue("q.direct", auto_delete=True)
            qf1 = await ch.declare_queue("q.fanout1", auto_delete=True)
            qf2 = await ch.declare_queue("q.fanout2", auto_delete=True)
            qt_star = await ch.declare_queue("q.topic.star", auto_delete=True)
            qt_hash = await ch.declare_queue("q.topic.hash", auto_delete=True)
            qh_all = await ch.declare_queue("q.headers.all", auto_delete=True)
            qh_any = await ch.declare_queue("q.headers.any", auto_delete=True)

            await qd.bind(direct, "red")
            await qf1.bind(fanout)
            await qf2.bind(fanout, "ignored")
            await qt_star.bind(topic, "stock.*.nyse")
            await qt_hash.bind(topic, "stock.#")
            await qh_all.bind(headers, arguments={"x-match": "all", "a": 1, "b": "x"})
            await qh_any.bind(headers, arguments={"x-match": "any", "a": 1, "b": "x"})

            await direct.publish(Message(b"d-red"), "red")
            await direct.publish(Message(b"d-blue"), "blue")
            await fanout.publish(Message(b"f"), "whatever")
            await topic.publish(Message(b"t1"), "stock.ibm.nyse")
            await topic.publish(Message(b"t2"), "stock.ibm.nasdaq")
            await topic.publish(Message(b"t3"), "stock")
            await topic.publish(Message(b"t4"), "stock.a.b.nyse")
            await headers.publish(Message(b"h-both", headers={"a": 1, "b": "x"}), "")
            await headers.publish(Message(b"h-a", headers={"a": 1}), "")
            await headers.publish(Message(b"h-none", headers={"c": 1}), "")

            assert await drain_get(qd) == [b"d-red"]
            assert await drain_get(qf1) == [b"f"]
            assert await drain_get(qf2) == [b"f"]
            assert await drain_get(qt_star) == [b"t1"]
            assert await drain_get(qt_hash) == [b"t1", b"t2", b"t3", b"t4"]
            assert await drain_get(qh_all) == [b"h-both"]
            assert await drain_get(qh_any) == [b"h-both", b"h-a"]

            # Redeclaring with another type is a channel error, as in RabbitMQ.
            with pytest.raises(ChannelPreconditionFailed, match="inequivalent arg 'type'"):
                await ch.declare_exchange("t.direct", ExchangeType.FANOUT)

    run(broker.url, scenario, kind)


# -- consuming with iterators, acks, nacks --------------------------------------------


@pytest.mark.parametrize("kind", ["plain", "robust"])
def test_iterator_process_acks(broker: Any, kind: str) -> None:
    async def scenario(url: str, connect: Any) -> None:
        async with await connect(url) as conn:
            ch = await conn.channel()
            queue = await ch.declare_queue("work")
            for i in range(10):
                await ch.default_exchange.publish(
                    Message(f"m{i}".encode(), delivery_mode=DeliveryMode.PERSISTENT), "work"
                )
            assert await ready_count(ch, "work") == 10

            got = []
            async with queue.iterator() as it:
                async for message in it:
                    async with message.process():
                        got.append(message.body.decode())
                        assert message.redelivered is False
                        assert message.routing_key == "work"
                        assert message.delivery_mode == DeliveryMode.PERSISTENT
                    if len(got) == 10:
                        break
            assert got == [f"m{i}" for i in range(10)]
            assert message.processed

            # The acks reached the broker: nothing is left, nothing comes back on close.
            assert await ready_count(ch, "work") == 0
        async with await connect(url) as conn:
            ch = await conn.channel()
            assert await ready_count(ch, "work") == 0

    run(broker.url, scenario, kind)


def test_process_requeues_on_exception(broker: Any) -> None:
    async def scenario(url: str, connect: Any) -> None:
        async with await connect(url) as conn:
            ch = await conn.channel()
            queue = await ch.declare_queue("", exclusive=True)
            await ch.default_exchange.publish(Message(b"boom"), queue.name)
            async with queue.iterator() as it:
                (first,) = await take(it, 1)
                with pytest.raises(RuntimeError):
                    async with first.process(requeue=True):
                        raise RuntimeError("handler failed")
                (again,) = await take(it, 1)
                assert again.body == b"boom"
                assert again.redelivered is True
                await again.ack()

    run(broker.url, scenario)


@pytest.mark.parametrize("kind", ["plain", "robust"])
def test_nack_and_reject_requeue_keep_original_order(broker: Any, kind: str) -> None:
    async def scenario(url: str, connect: Any) -> None:
        async with await connect(url) as conn:
            ch = await conn.channel()
            await ch.set_qos(prefetch_count=10)
            queue = await ch.declare_queue("order", auto_delete=False)
            for i in range(6):
                await ch.default_exchange.publish(Message(str(i).encode()), "order")

            async with queue.iterator() as it:
                first = await take(it, 6)
                assert [m.body for m in first] == [b"0", b"1", b"2", b"3", b"4", b"5"]
                assert not any(m.redelivered for m in first)
                await first[5].reject(requeue=False)  # dropped for good
                await first[4].nack(multiple=True, requeue=True)  # 0..4 go back at once

                second = await take(it, 5)
                assert [m.body for m in second] == [b"0", b"1", b"2", b"3", b"4"]
                assert all(m.redelivered for m in second)
                await second[-1].ack(multiple=True)

            assert await ready_count(ch, "order") == 0

            # Requeued one by one in reverse, with no consumer attached, they still
            # return to their original positions.
            for i in range(5):
                await ch.default_exchange.publish(Message(str(i).encode()), "order")
            pulled = [await queue.get() for _ in range(5)]
            for m in reversed(pulled):
                if int(m.body) % 2:
                    await m.reject(requeue=True)
                else:
                    await m.nack(requeue=True)
            again = [await queue.get(no_ack=True) for _ in range(5)]
            assert [(m.body, m.redelivered) for m in again] == [
                (str(i).encode(), True) for i in range(5)
            ]
            assert await queue.get(fail=False) is None

    run(broker.url, scenario, kind)


def test_nack_multiple_requeue(broker: Any) -> None:
    async def scenario(url: str, connect: Any) -> None:
        async with await connect(url) as conn:
            ch = await conn.channel()
            queue = await ch.declare_queue("", exclusive=True)
            for i in range(4):
                await ch.default_exchange.publish(Message(str(i).encode()), queue.name)
            async with queue.iterator() as it:
                batch = await take(it, 4)
                await batch[2].nack(multiple=True, requeue=True)  # 0, 1, 2 go back
                redone = await take(it, 3)
                assert [(m.body, m.redelivered) for m in redone] == [
                    (b"0", True),
                    (b"1", True),
                    (b"2", True),
                ]
                for m in redone + [batch[3]]:
                    await m.ack()
            assert await ready_count(ch, queue.name) == 0

    run(broker.url, scenario)


# -- prefetch ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["plain", "robust"])
def test_prefetch_limits_unacked_deliveries(broker: Any, kind: str) -> None:
    async def scenario(url: str, connect: Any) -> None:
        async with await connect(url) as conn:
            ch = await conn.channel()
            await ch.set_qos(prefetch_count=3)
            queue = await ch.declare_queue("", exclusive=True)
            for i in range(10):
                await ch.default_exchange.publish(Message(str(i).encode()), queue.name)

            got = Collector()
            await queue.consume(got)
            held = await got.take(3)
            assert [m.body for m in held] == [b"0", b"1", b"2"]
            # A fourth delivery would exceed the prefetch window.
            assert await got.nothing_more()
            assert await ready_count(ch, queue.name) == 7

            await held[0].ack()
            (nxt,) = await got.take(1)
            assert nxt.body == b"3"
            assert await got.nothing_more()

            # Acking everything outstanding lets the rest flow, three at a time.
            await nxt.ack(multiple=True)
            rest: list[bytes] = []
            while len(rest) < 6:
                window = await got.take(min(3, 6 - len(rest)))
                rest += [m.body for m in window]
                await window[-1].ack(multiple=True)
            assert rest == [str(i).encode() for i in range(4, 10)]

    run(broker.url, scenario, kind)


def test_global_prefetch_shared_by_consumers(broker: Any) -> None:
    async def scenario(url: str, connect: Any) -> None:
        async with await connect(url) as conn:
            ch = await conn.channel()
            await ch.set_qos(prefetch_count=2, global_=True)
            q1 = await ch.declare_queue("", exclusive=True)
            q2 = await ch.declare_queue("", exclusive=True)
            for i in range(3):
                await ch.default_exchange.publish(Message(b"a%d" % i), q1.name)
                await ch.default_exchange.publish(Message(b"b%d" % i), q2.name)
            got = Collector()
            await q1.consume(got)
            await q2.consume(got)
            # Both consumers share one window of two unacked deliveries.
            window = await got.take(2)
            assert await got.nothing_more()
            await window[0].ack()
            (third,) = await got.take(1)
            assert await got.nothing_more()
            for m in (window[1], third):
                await m.ack()
            rest = await got.take(2)
            await rest[0].ack()
            await rest[1].ack()
            bodies = sorted(m.body for m in window + [third] + rest)
            assert len(bodies) == 5

    run(broker.url, scenario)


# -- publisher confirms, mandatory and returns ----------------------------------------


@pytest.mark.parametrize("kind", ["plain", "robust"])
def test_publisher_confirms_ack(broker: Any, kind: str) -> None:
    async def scenario(url: str, connect: Any) -> None:
        async with await connect(url) as conn:
            ch = await conn.channel()  # publisher_confirms=True by default
            queue = await ch.declare_queue("", exclusive=True)
            result = await ch.default_exchange.publish(Message(b"x"), queue.name)
            assert isinstance(result, aiormq.spec.Basic.Ack)
            # Unroutable but not mandatory: confirmed all the same.
            result = await ch.default_exchange.publish(
                Message(b"y"), "no-such-queue", mandatory=False
            )
            assert isinstance(result, aiormq.spec.Basic.Ack)
            # Confirms of concurrent publishes all arrive (the broker may coalesce them).
            results = await asyncio.gather(
                *(ch.default_exchange.publish(Message(b"%d" % i), queue.name) for i in range(50))
            )
            assert all(isinstance(r, aiormq.spec.Basic.Ack) for r in results)
            assert await ready_count(ch, queue.name) == 51

    run(broker.url, scenario, kind)


@pytest.mark.parametrize("kind", ["plain", "robust"])
def test_mandatory_unroutable_raises_delivery_error(broker: Any, kind: str) -> None:
    async def scenario(url: str, connect: Any) -> None:
        async with await connect(url) as conn:
            ch = await conn.channel(on_return_raises=True)
            ex = await ch.declare_exchange("mand", ExchangeType.DIRECT, auto_delete=True)
            with pytest.raises(DeliveryError) as info:
                await ex.publish(Message(b"lost", message_id="m-1"), "nowhere")
            assert isinstance(info.value, PublishError)
            returned = info.value.message
            assert returned.body == b"lost"
            assert isinstance(returned.delivery, aiormq.spec.Basic.Return)
            assert returned.delivery.reply_code == 312
            assert returned.delivery.reply_text == "NO_ROUTE"
            assert returned.delivery.exchange == "mand"
            assert returned.delivery.routing_key == "nowhere"

            # The channel is still usable and routable publishes are acked.
            queue = await ch.declare_queue("", exclusive=True)
            await queue.bind(ex, "here")
            assert isinstance(await ex.publish(Message(b"kept"), "here"), aiormq.spec.Basic.Ack)
            assert await drain_get(queue) == [b"kept"]

    run(broker.url, scenario, kind)


def test_mandatory_unroutable_goes_to_return_callbacks(broker: Any) -> None:
    async def scenario(url: str, connect: Any) -> None:
        async with await connect(url) as conn:
            ch = await conn.channel()  # on_return_raises=False
            loop = asyncio.get_running_loop()
            returned: asyncio.Future[Any] = loop.create_future()
            ch.return_callbacks.add(lambda _ch, msg: returned.done() or returned.set_result(msg))
            result = await ch.default_exchange.publish(
                Message(b"bounce", headers={"k": "v"}), "missing-queue"
            )
            msg = await asyncio.wait_for(returned, 5)
            assert msg.body == b"bounce"
            assert msg.headers == {"k": "v"}
            assert msg.routing_key == "missing-queue"
            # publish() hands back the returned message instead of an ack frame.
            assert not isinstance(result, aiormq.spec.Basic.Ack)
            assert result.body == b"bounce"

    run(broker.url, scenario, "plain")


# -- transactions -----------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["plain", "robust"])
def test_transactions_commit_and_rollback(broker: Any, kind: str) -> None:
    async def scenario(url: str, connect: Any) -> None:
        async with await connect(url) as conn:
            observer = await conn.channel()
            queue = await observer.declare_queue("txq")
            ch = await conn.channel(publisher_confirms=False)

            async with ch.transaction():
                await ch.default_exchange.publish(Message(b"c1"), "txq")
                await ch.default_exchange.publish(Message(b"c2"), "txq")
                # Not visible before the commit.
                assert await ready_count(observer, "txq") == 0
            assert await ready_count(observer, "txq") == 2

            tx = ch.transaction()
            await tx.select()
            await ch.default_exchange.publish(Message(b"r1"), "txq")
            await tx.rollback()
            await tx.commit()  # an empty commit on the still-transactional channel
            assert await ready_count(observer, "txq") == 2

            # Acks are transactional too: a rolled-back ack leaves the message unacked.
            txq = await ch.get_queue("txq")
            m1 = await txq.get()
            assert m1.body == b"c1"
            await m1.ack()
            await tx.rollback()
            await ch.close()  # closing requeues the still-unacked c1
            assert await ready_count(observer, "txq") == 2

            again = await queue.get()
            assert (again.body, again.redelivered) == (b"c1", True)
            await again.ack()
            assert await drain_get(queue) == [b"c2"]

    run(broker.url, scenario, kind)


def test_transaction_commit_applies_acks(broker: Any) -> None:
    async def scenario(url: str, connect: Any) -> None:
        async with await connect(url) as conn:
            ch = await conn.channel(publisher_confirms=False)
            queue = await ch.declare_queue("txack")
            await ch.default_exchange.publish(Message(b"a"), "txack")
            async with ch.transaction():
                msg = await queue.get()
                await msg.ack()
            await ch.close()
            ch2 = await conn.channel()
            assert await ready_count(ch2, "txack") == 0

    run(broker.url, scenario, "plain")


# -- exchange-to-exchange bindings ------------------------------------------------------


@pytest.mark.parametrize("kind", ["plain", "robust"])
def test_exchange_to_exchange_bindings(broker: Any, kind: str) -> None:
    async def scenario(url: str, connect: Any) -> None:
        async with await connect(url) as conn:
            ch = await conn.channel()
            upstream = await ch.declare_exchange("e2e.up", ExchangeType.TOPIC)
            middle = await ch.declare_exchange("e2e.mid", ExchangeType.FANOUT)
            downstream = await ch.declare_exchange("e2e.down", ExchangeType.DIRECT)
            await middle.bind(upstream, "logs.#")
            await downstream.bind(middle)
            q_mid = await ch.declare_queue("", exclusive=True)
            q_down = await ch.declare_queue("", exclusive=True)
            await q_mid.bind(middle)
            await q_down.bind(downstream, "logs.error")

            await upstream.publish(Message(b"e"), "logs.error")
            await upstream.publish(Message(b"i"), "logs.info")
            await upstream.publish(Message(b"x"), "metrics.cpu")
            assert await drain_get(q_mid) == [b"e", b"i"]
            assert await drain_get(q_down) == [b"e"]

            # A cycle does not deliver twice.
            await upstream.bind(downstream, "logs.error")
            await upstream.publish(Message(b"cycle"), "logs.error")
            assert await drain_get(q_mid) == [b"cycle"]
            assert await drain_get(q_down) == [b"cycle"]
            await upstream.unbind(downstream, "logs.error")

            # Once unbound, nothing routes: a mandatory publish comes back.
            await middle.unbind(upstream, "logs.#")
            ch_r = await conn.channel(on_return_raises=True)
            up_r = await ch_r.get_exchange("e2e.up")
            with pytest.raises(PublishError):
                await up_r.publish(Message(b"gone"), "logs.error")
            assert await drain_get(q_mid) == []
            assert await drain_get(q_down) == []

    run(broker.url, scenario, kind)


# -- exclusive and auto-delete queues ---------------------------------------------------


@pytest.mark.parametrize("kind", ["plain", "robust"])
def test_exclusive_queue_is_private_and_dies_with_connection(broker: Any, kind: str) -> None:
    async def scenario(url: str, connect: Any) -> None:
        async with await connect(url) as other:
            other_ch = await other.channel()
            async with await connect(url) as owner:
                ch = await owner.channel()
                queue = await ch.declare_queue("mine", exclusive=True)
                assert queue.exclusive
                await ch.default_exchange.publish(Message(b"hi"), "mine")

                with pytest.raises(ChannelLockedResource, match="locked queue 'mine'"):
                    await other_ch.declare_queue("mine", exclusive=True)
                other_ch = await other.channel()
                with pytest.raises(ChannelLockedResource):
                    await other_ch.declare_queue("mine", passive=True)
                other_ch = await other.channel()
                # Publishing into it from elsewhere is allowed.
                await other_ch.default_exchange.publish(Message(b"there"), "mine")
                assert await drain_get(queue) == [b"hi", b"there"]

            with pytest.raises(ChannelNotFoundEntity, match="no queue 'mine'"):
                await other_ch.declare_queue("mine", passive=True)

    run(broker.url, scenario, kind)


def test_auto_delete_queue_goes_with_last_consumer(broker: Any) -> None:
    async def scenario(url: str, connect: Any) -> None:
        async with await connect(url) as conn:
            ch = await conn.channel()
            queue = await ch.declare_queue("ephemeral", auto_delete=True)
            # Without ever having had a consumer it stays.
            assert await ready_count(ch, "ephemeral") == 0
            tag1 = await queue.consume(ignore)
            tag2 = await queue.consume(ignore)
            await queue.cancel(tag1)
            assert await ready_count(ch, "ephemeral") == 0  # one consumer left
            await queue.cancel(tag2)
            with pytest.raises(ChannelNotFoundEntity):
                await ch.declare_queue("ephemeral", passive=True)

    run(broker.url, scenario, "plain")


# -- queue.delete preconditions ---------------------------------------------------------


@pytest.mark.parametrize("kind", ["plain", "robust"])
def test_queue_delete_if_unused_if_empty(broker: Any, kind: str) -> None:
    async def scenario(url: str, connect: Any) -> None:
        async with await connect(url) as conn:
            ch = await conn.channel()
            queue = await ch.declare_queue("busy")
            await ch.default_exchange.publish(Message(b"1"), "busy")
            await ch.default_exchange.publish(Message(b"2"), "busy")

            with pytest.raises(ChannelPreconditionFailed, match="not empty"):
                await queue.delete(if_unused=False, if_empty=True)
            ch = await conn.channel()
            queue = await ch.get_queue("busy")
            assert await ready_count(ch, "busy") == 2

            consumer_ch = await conn.channel()
            cq = await consumer_ch.get_queue("busy")
            await consumer_ch.set_qos(prefetch_count=1)
            tag = await cq.consume(ignore)
            with pytest.raises(ChannelPreconditionFailed, match="in use"):
                await queue.delete(if_unused=True, if_empty=False)
            ch = await conn.channel()
            queue = await ch.get_queue("busy")

            await cq.cancel(tag)
            await consumer_ch.close()  # the unacked message returns to the queue
            result = await queue.delete(if_unused=True, if_empty=False)
            assert result.message_count == 2
            with pytest.raises(ChannelNotFoundEntity):
                await ch.declare_queue("busy", passive=True)

            ch = await conn.channel()
            empty = await ch.declare_queue("empty")
            assert (await empty.delete(if_empty=True, if_unused=True)).message_count == 0
            # Deleting a queue that does not exist succeeds, as in RabbitMQ.
            assert (await ch.queue_delete("never-existed")).message_count == 0

    run(broker.url, scenario, kind)


# -- basic.get --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["plain", "robust"])
def test_queue_get(broker: Any, kind: str) -> None:
    async def scenario(url: str, connect: Any) -> None:
        async with await connect(url) as conn:
            ch = await conn.channel()
            queue = await ch.declare_queue("getq")
            assert await queue.get(fail=False) is None
            with pytest.raises(QueueEmpty):
                await queue.get()

            for i in range(3):
                await ch.default_exchange.publish(
                    Message(b"g%d" % i, content_type="text/plain", correlation_id=str(i)),
                    "getq",
                )
            m0 = await queue.get()
            assert m0.body == b"g0"
            assert m0.content_type == "text/plain"
            assert m0.correlation_id == "0"
            assert m0.message_count == 2  # messages left after this one
            await m0.reject(requeue=True)

            again = await queue.get(no_ack=True)
            assert (again.body, again.redelivered) == (b"g0", True)
            m1 = await queue.get()
            await m1.ack()
            assert m1.body == b"g1"
            assert (await queue.get(no_ack=True)).body == b"g2"
            assert await queue.get(fail=False) is None

    run(broker.url, scenario, kind)


# -- RPC ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["plain", "robust"])
def test_rpc_pattern(broker: Any, kind: str) -> None:
    async def scenario(url: str, connect: Any) -> None:
        async with await connect(url) as server_conn, await connect(url) as client_conn:
            server = await RPC.create(await server_conn.channel())

            async def multiply(*, x: int, y: int) -> int:
                return x * y

            async def fail(*, why: str) -> None:
                raise ValueError(why)

            await server.register("multiply", multiply, auto_delete=True)
            await server.register("fail", fail, auto_delete=True)

            client = await RPC.create(await client_conn.channel())
            assert await client.proxy.multiply(x=6, y=7) == 42
            results = await asyncio.gather(
                *(client.call("multiply", {"x": i, "y": i}) for i in range(20))
            )
            assert results == [i * i for i in range(20)]
            with pytest.raises(ValueError, match="nope"):
                await client.call("fail", {"why": "nope"})

            # close() cancels the reply consumer (auto-deleting the reply queue), then
            # unbinds and deletes that queue: both must succeed on a missing queue.
            reply_queue = client.result_queue.name
            await client.close()
            await server.close()
            check = await client_conn.channel()
            with pytest.raises(ChannelNotFoundEntity):
                await check.declare_queue(reply_queue, passive=True)

    run(broker.url, scenario, kind)


@pytest.mark.parametrize("kind", ["plain", "robust"])
def test_direct_reply_to_rpc(broker: Any, kind: str) -> None:
    async def scenario(url: str, connect: Any) -> None:
        async with await connect(url) as server_conn, await connect(url) as client_conn:
            srv_ch = await server_conn.channel()
            requests = await srv_ch.declare_queue("rpc.requests", auto_delete=True)

            async def serve(message: AbstractIncomingMessage) -> None:
                async with message.process():
                    assert message.reply_to is not None
                    n = int(message.body)
                    await srv_ch.default_exchange.publish(
                        Message(str(n * 2).encode(), correlation_id=message.correlation_id),
                        routing_key=message.reply_to,
                    )

            await requests.consume(serve)

            ch = await client_conn.channel()
            reply_queue = await ch.get_queue("amq.rabbitmq.reply-to")  # passive declare works
            loop = asyncio.get_running_loop()
            pending: dict[str, asyncio.Future[bytes]] = {}

            async def on_reply(message: AbstractIncomingMessage) -> None:
                assert message.redelivered is False
                pending.pop(message.correlation_id or "").set_result(message.body)

            await reply_queue.consume(on_reply, no_ack=True)

            async def call(n: int) -> int:
                fut: asyncio.Future[bytes] = loop.create_future()
                pending[str(n)] = fut
                await ch.default_exchange.publish(
                    Message(
                        str(n).encode(),
                        correlation_id=str(n),
                        reply_to="amq.rabbitmq.reply-to",
                    ),
                    "rpc.requests",
                )
                return int(await asyncio.wait_for(fut, 5))

            assert await call(21) == 42
            assert await asyncio.gather(*(call(i) for i in range(50))) == [2 * i for i in range(50)]
            assert not pending

            # The server sees a per-channel pseudo-queue name, not the magic name.
            probe = await srv_ch.declare_queue("", exclusive=True)
            await ch.default_exchange.publish(
                Message(b"p", reply_to="amq.rabbitmq.reply-to"), probe.name
            )
            got = await probe.get()
            assert (got.reply_to or "").startswith("amq.rabbitmq.reply-to.")
            await got.ack()

            # Publishing with reply-to from a channel without the reply consumer fails.
            bare = await client_conn.channel()
            with pytest.raises(
                ChannelPreconditionFailed, match="fast reply consumer does not exist"
            ):
                await bare.default_exchange.publish(
                    Message(b"x", reply_to="amq.rabbitmq.reply-to"), "rpc.requests"
                )

            # A reply consumer must be no-ack.
            other = await client_conn.channel()
            rq = await other.get_queue("amq.rabbitmq.reply-to")
            with pytest.raises(
                ChannelPreconditionFailed, match="reply consumer cannot acknowledge"
            ):
                await rq.consume(on_reply, no_ack=False)

    run(broker.url, scenario, kind)


# -- consumer cancelled by the server ---------------------------------------------------


@pytest.mark.parametrize("kind", ["plain", "robust"])
def test_consumer_cancelled_when_queue_deleted(broker: Any, kind: str) -> None:
    async def scenario(url: str, connect: Any) -> None:
        async with await connect(url) as conn:
            ch = await conn.channel()
            queue = await ch.declare_queue("doomed")
            tag = await queue.consume(ignore, no_ack=True)

            underlay = await ch.get_underlay_channel()
            assert tag in underlay.consumers
            cancelled: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

            def on_cancel(frame: Any) -> None:
                if not cancelled.done():
                    cancelled.set_result(frame)

            underlay.on_consumer_cancel_callbacks.add(on_cancel)

            admin = await conn.channel()
            await admin.queue_delete("doomed")
            frame = await asyncio.wait_for(cancelled, 5)
            assert isinstance(frame, aiormq.spec.Basic.Cancel)
            assert frame.consumer_tag == tag
            assert tag not in underlay.consumers
            # The consumer's channel stays open and usable.
            assert not ch.is_closed
            q2 = await ch.declare_queue("", exclusive=True)
            await ch.default_exchange.publish(Message(b"still"), q2.name)
            assert await drain_get(q2) == [b"still"]

    run(broker.url, scenario, kind)


def test_iterator_consumer_cancelled_then_closed(broker: Any) -> None:
    async def scenario(url: str, connect: Any) -> None:
        async with await connect(url) as conn:
            ch = await conn.channel()
            queue = await ch.declare_queue("doomed-it")
            await ch.default_exchange.publish(Message(b"one"), "doomed-it")
            underlay = await ch.get_underlay_channel()
            cancelled = asyncio.Event()
            underlay.on_consumer_cancel_callbacks.add(lambda frame: cancelled.set())
            async with queue.iterator(no_ack=True) as it:
                (msg,) = await take(it, 1)
                assert msg.body == b"one"
                admin = await conn.channel()
                await admin.queue_delete("doomed-it")
                await asyncio.wait_for(cancelled.wait(), 5)
                assert it.consumer_tag not in underlay.consumers

    run(broker.url, scenario)


# -- volume -------------------------------------------------------------------------------


# 20,000 messages cost about 4 s of CPU here (aio-pika's client 3.5, the broker the
# rest) and no wait on a timer. On a busy machine (a load of 20 on 2 cores) the
# client's thread gets a few percent of a core and spends 60-70 s runnable but not
# running: the 50 s this test once had for the whole run measured the machine's
# load. It bounds what does not depend on the load instead: the CPU the run takes
# (a broker or client gone slow) and the wait for each step (one batch of 1000
# confirms, one delivery: a stall); pytest-timeout only catches a hang past those.
TWENTY_THOUSAND_CPU_SECONDS = 20.0
STEP_SECONDS = 30.0


@pytest.mark.timeout(600)
def test_twenty_thousand_messages_in_order(broker: Any) -> None:
    total = 20_000

    async def scenario(url: str, connect: Any) -> None:
        async with await connect(url) as conn:
            pub = await conn.channel()
            queue = await pub.declare_queue("bulk", durable=False)
            batch = 1000
            for start in range(0, total, batch):
                results = await asyncio.wait_for(
                    asyncio.gather(
                        *(
                            pub.default_exchange.publish(Message(b"%d" % i), "bulk")
                            for i in range(start, start + batch)
                        )
                    ),
                    STEP_SECONDS,
                )
                assert all(isinstance(r, aiormq.spec.Basic.Ack) for r in results)
            assert await ready_count(pub, "bulk") == total

            async with await connect(url) as conn2:
                sub = await conn2.channel()
                await sub.set_qos(prefetch_count=500)
                squeue = await sub.get_queue("bulk")
                expected = 0
                async with squeue.iterator() as it:
                    while expected < total:
                        message = await asyncio.wait_for(it.__anext__(), STEP_SECONDS)
                        assert int(message.body) == expected
                        expected += 1
                        if expected % 250 == 0 or expected == total:
                            await message.ack(multiple=True)
                assert await ready_count(sub, "bulk") == 0
                assert (await queue.delete()).message_count == 0

    cpu = time.process_time()  # every thread's: the broker's too
    run(broker.url, scenario, "plain", timeout=None)
    used = time.process_time() - cpu
    assert used < TWENTY_THOUSAND_CPU_SECONDS, f"{used:.1f} s of CPU for {total} messages"
