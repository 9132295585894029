"""The management API's publish answers as a publisher confirm would, as
RabbitMQ's does (it publishes in confirm mode and waits): ``{"routed": true}``
for a persistent message in a durable queue only once the group sync has made
it durable, and a nack's error when a queue refused it (core/commit.py).
tests/store/test_disk_full_commit.py has the full disk; tests/store/powercut the power cut.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pika
import pytest
import pytest_asyncio
from conftest import BrokerThread

pytestmark = [pytest.mark.timeout(60), pytest.mark.asyncio]

AUTH = {"Authorization": aiohttp.encode_basic_auth("guest", "guest")}


@pytest_asyncio.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(headers=AUTH) as s:
        yield s


async def publish(
    session: aiohttp.ClientSession, b: BrokerThread, queue: str, payload: str, mode: int
) -> tuple[int, Any]:
    body = {
        "routing_key": queue,
        "payload": payload,
        "payload_encoding": "string",
        "properties": {"delivery_mode": mode},
    }
    url = f"http://127.0.0.1:{b.http_port}/api/exchanges/%2F/amq.default/publish"
    async with session.post(url, json=body) as reply:
        return reply.status, await reply.json()


def declare(b: BrokerThread, queue: str, **arguments: Any) -> None:
    with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", b.port)) as conn:
        conn.channel().queue_declare(queue, durable=True, arguments=arguments or None)


def sync_state(b: BrokerThread, queue: str) -> tuple[int, bool, bool]:
    """The sync rounds started so far, whether one is still running, and whether
    ``queue``'s store holds anything no round has synced (read on the loop)."""

    def read() -> tuple[int, bool, bool]:
        syncer = b.broker.syncer
        store = b.broker.vhosts["/"].queues[queue].store
        return syncer.rounds, syncer._running, store.dirty

    return b.call(read)


async def test_routed_comes_after_the_sync_of_a_persistent_message(
    broker: BrokerThread, session: aiohttp.ClientSession
) -> None:
    declare(broker, "durable")
    rounds, running, dirty = sync_state(broker, "durable")
    assert not running and not dirty
    assert await publish(session, broker, "durable", "p", 2) == (200, {"routed": True})
    # One round covered it and had finished when the answer was sent: the reply
    # is sent by that round's callback, which runs when the round is done.
    assert sync_state(broker, "durable") == (rounds + 1, False, False)
    # A transient message waits for no sync (as its confirm does not).
    assert await publish(session, broker, "durable", "t", 1) == (200, {"routed": True})
    assert sync_state(broker, "durable")[0] == rounds + 1
    with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port)) as conn:
        assert conn.channel().queue_declare("durable", passive=True).method.message_count == 2


async def test_a_message_a_queue_refuses_is_an_error_as_in_rabbitmq(
    broker: BrokerThread, session: aiohttp.ClientSession
) -> None:
    # RabbitMQ's answer to the nack its publish gets (rabbit_mgmt_wm_exchange_publish).
    declare(broker, "full", **{"x-max-length": 1, "x-overflow": "reject-publish"})
    assert await publish(session, broker, "full", "1", 2) == (200, {"routed": True})
    status, answer = await publish(session, broker, "full", "2", 2)
    assert (status, answer) == (
        400,
        {
            "error": "bad_request",
            "reason": "rejected Unable to publish message. Check queue limits.",
        },
    )
