"""rstream (the Python stream client) against a broker's stream listener over
a socket: its handshake, streams created and deleted, metadata, offsets,
publishers, and the refusals it maps to its exceptions. Publishing and
consuming messages: test_stream_rstream_messages.py."""

from __future__ import annotations

import asyncio

import pytest
from rstream import exceptions
from streamhelp import HOST, producer, stream_broker_fixture

from warren.pytest_plugin import WarrenBroker

warren = stream_broker_fixture()


def test_create_query_and_delete_a_stream(warren: WarrenBroker) -> None:
    async def run() -> None:
        async with producer(warren) as p:
            await p.create_stream("rs-events", arguments={"max-length-bytes": 10_000_000})
            assert await p.stream_exists("rs-events")
            with pytest.raises(exceptions.StreamAlreadyExists):
                await p.create_stream("rs-events", arguments={"max-length-bytes": 10_000_000})
            with pytest.raises(exceptions.PreconditionFailed):  # other arguments
                await p.create_stream("rs-events")
            client = await p.default_client
            leader, replicas = await client.query_leader_and_replicas("rs-events")
            assert (leader.host, leader.port, replicas) == (HOST, warren.stream_port, [])
            await p.delete_stream("rs-events")
            assert not await p.stream_exists("rs-events")
            with pytest.raises(exceptions.StreamDoesNotExist):
                await p.delete_stream("rs-events")

    asyncio.run(run())
    assert "rs-events" not in warren.broker.vhosts["/"].queues


def test_offsets_and_publishers(warren: WarrenBroker) -> None:
    async def run() -> None:
        async with producer(warren) as p:
            await p.create_stream("rs-offsets")
            client = await p.default_client
            with pytest.raises(exceptions.OffsetNotFound):
                await client.query_offset("rs-offsets", "app")
            await client.store_offset("rs-offsets", "app", 7)
            assert await client.query_offset("rs-offsets", "app") == 7
            await client.declare_publisher("rs-offsets", "ref", 1)
            assert await client.query_publisher_sequence("rs-offsets", "ref") == 0
            await client.delete_publisher(1)
            await p.delete_stream("rs-offsets")

    asyncio.run(run())


def test_bad_credentials_are_refused(warren: WarrenBroker) -> None:
    async def run() -> None:
        with pytest.raises(exceptions.AuthenticationFailure):
            await producer(warren, password="wrong").start()

    asyncio.run(run())
