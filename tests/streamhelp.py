"""rstream against a broker's stream listener over a socket: the broker and the
client pieces the rstream tests (tests/protocol/stream, tests/integration's perf
stream test) share, so that each says only what it tests."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from rstream import (
    AMQPMessage,
    Consumer,
    ConsumerOffsetSpecification,
    MessageContext,
    OffsetType,
    Producer,
    amqp_decoder,
)

from warren.pytest_plugin import WarrenBroker, start_broker

HOST = "127.0.0.1"


def stream_broker_fixture() -> Callable[..., Any]:
    """A module-scoped fixture: a broker with its AMQP and stream listeners only
    (ephemeral ports), shared by the module's tests as starting one is slow. Its
    name is the module attribute it is bound to."""

    @pytest.fixture(scope="module")
    def fixture() -> Iterator[WarrenBroker]:
        broker = start_broker(http_port=-1, mqtt_port=-1, prometheus_port=-1, stream_port=0)
        try:
            yield broker
        finally:
            broker.stop()

    return fixture


def port(broker: WarrenBroker) -> int:
    """The broker's stream protocol port."""
    return broker.stream_port


def producer(broker: WarrenBroker, password: str = "guest", **kw: Any) -> Producer:
    """An rstream Producer logged in as guest (``password``: to be refused)."""
    return Producer(HOST, port(broker), username="guest", password=password, **kw)


async def first_messages(
    stream_port: int,
    stream: str,
    n: int,
    offset: ConsumerOffsetSpecification | None = None,
    ssl_context: ssl.SSLContext | None = None,
    **kw: Any,
) -> list[tuple[int, AMQPMessage]]:
    """The first ``n`` messages (offset, message) a subscription from ``offset``
    (default: the first) gets within 20 s; ``kw`` go to the subscribe."""
    got: list[tuple[int, AMQPMessage]] = []
    done = asyncio.Event()

    async def on_message(msg: AMQPMessage, ctx: MessageContext) -> None:
        got.append((ctx.offset, msg))
        if len(got) >= n:
            done.set()

    consumer = Consumer(
        HOST, stream_port, ssl_context=ssl_context, username="guest", password="guest"
    )
    async with consumer:
        await consumer.subscribe(
            stream,
            on_message,
            decoder=amqp_decoder,
            offset_specification=offset or ConsumerOffsetSpecification(OffsetType.FIRST),
            **kw,
        )
        await asyncio.wait_for(done.wait(), 20)
    return got
