"""Testing an aio-pika application against Warren, with pytest-asyncio.

The broker runs on its own loop in a background thread, so the test's event
loop (pytest-asyncio's) only runs the client, exactly as against RabbitMQ.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aio_pika
import notifier
import pytest
import pytest_asyncio


@pytest_asyncio.fixture
async def channel(warren_vhost: Any) -> AsyncIterator[aio_pika.abc.AbstractChannel]:
    async with await aio_pika.connect_robust(warren_vhost.url) as connection:
        yield await connection.channel()


@pytest.mark.asyncio
async def test_events_reach_matching_subscribers(channel: aio_pika.abc.AbstractChannel) -> None:
    orders = await notifier.subscribe(channel, "order.*")
    everything = await notifier.subscribe(channel, "#")
    await notifier.publish_event(channel, "order.created", {"id": 7})
    await notifier.publish_event(channel, "user.deleted", {"id": 8})

    message = await orders.get(timeout=5)
    await message.ack()
    assert json.loads(message.body) == {"id": 7}
    assert await orders.get(fail=False) is None
    keys = []
    for _ in range(2):
        m = await everything.get(timeout=5)
        await m.ack()
        keys.append(m.routing_key)
    assert keys == ["order.created", "user.deleted"]


@pytest.mark.asyncio
async def test_rpc_over_direct_reply_to(channel: aio_pika.abc.AbstractChannel) -> None:
    await notifier.serve_upper(channel)
    assert await notifier.call_upper(channel, "hello warren") == "HELLO WARREN"
