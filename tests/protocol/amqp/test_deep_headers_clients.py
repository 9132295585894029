"""Headers nested to the depth limit reach every Python client: pika, aio-pika
(pamqp) and py-amqp each decode the message after the headers exchange, CC
routing and dead-lettering.

What the broker does with such headers is tested in memory
(test_hostile_headers.py); this one needs the client libraries themselves,
which connect over a socket.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aio_pika
import amqp
import pika
from conftest import BrokerThread
from pikahelp import connect, ready_count, uniq, wait_until

from warren.core.table import MAX_DEPTH


def nested(levels: int) -> dict[str, Any]:
    """Headers whose tables nest ``levels`` deep, the headers table being level 1."""
    value: dict[str, Any] = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


def depth(value: Any) -> int:
    """How deep tables nest in ``value`` (a dict is one level), iteratively."""
    levels = 0
    while isinstance(value, dict):
        levels += 1
        value = value.get("a")
    return levels


def dlx_queue(ch: Any, **arguments: Any) -> tuple[str, str]:
    """A queue dead-lettering (through the default exchange) into a second queue."""
    src, dlq = uniq("src"), uniq("dlq")
    ch.queue_declare(dlq, durable=True)
    args = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq, **arguments}
    ch.queue_declare(src, durable=True, arguments=args)
    return src, dlq


def wait_for_count(conn: Any, ch: Any, queue: str, count: int, timeout: float = 5.0) -> None:
    wait_until(conn, lambda: ready_count(ch, queue) == count, timeout)


def test_headers_at_the_depth_limit_survive_routing_dead_lettering_and_every_client(
    broker: BrokerThread,
) -> None:
    """Nesting at the limit goes through the headers exchange and CC routing, is
    rejected into a dead-letter queue, and pika, aio-pika and py-amqp read it back."""
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    src, dlq = dlx_queue(ch)
    other = uniq("cc")
    ch.queue_declare(other, durable=True)
    hx = uniq("hx")
    ch.exchange_declare(hx, "headers")
    ch.queue_bind(src, hx, arguments={"x-match": "all", "route": "yes"})
    ch.exchange_declare(dx := uniq("dx"), "direct")
    ch.queue_bind(src, dx, "to-src")
    ch.queue_bind(other, dx, "to-other")
    headers = {"route": "yes", "deep": nested(MAX_DEPTH - 1)}
    props = pika.BasicProperties(headers=headers, delivery_mode=2, message_id="m1")
    ch.basic_publish(hx, "", b"by-headers", props)  # confirmed, or this raises
    cc_props = pika.BasicProperties(headers={**headers, "CC": ["to-other"]}, delivery_mode=2)
    ch.basic_publish(dx, "to-src", b"by-cc", cc_props)
    assert ready_count(ch, src) == 2 and ready_count(ch, other) == 1

    for _ in range(2):
        method, _, _ = ch.basic_get(src)
        assert method is not None
        ch.basic_reject(method.delivery_tag, requeue=False)
    wait_for_count(conn, ch, dlq, 2)

    method, got, body = ch.basic_get(dlq, auto_ack=True)  # pika
    assert body == b"by-headers"
    assert depth(got.headers["deep"]) == MAX_DEPTH - 1
    assert got.headers["x-death"][0]["reason"] == "rejected"
    assert got.headers["x-first-death-queue"] == src

    async def aio_get() -> Any:  # aio-pika (pamqp)
        c = await aio_pika.connect(broker.url)
        try:
            channel = await c.channel()
            queue = await channel.get_queue(dlq, ensure=False)
            return await queue.get(no_ack=True)
        finally:
            await c.close()

    message = asyncio.run(aio_get())
    assert message.body == b"by-cc"
    assert depth(message.headers["deep"]) == MAX_DEPTH - 1
    # A dead-letter routing key replaces the CC header; x-death keeps the keys.
    assert "CC" not in message.headers
    assert message.headers["x-death"][0]["routing-keys"] == ["to-src", "to-other"]

    with amqp.Connection(f"127.0.0.1:{broker.port}") as pyamqp:  # py-amqp
        pych = pyamqp.channel()
        msg = pych.basic_get(other, no_ack=True)
        assert msg is not None and msg.body == b"by-cc"
        assert depth(msg.headers["deep"]) == MAX_DEPTH - 1
    conn.close()
