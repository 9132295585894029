"""rstream scenarios run against Warren and against RabbitMQ 3.10's
rabbitmq_stream plugin (a private node, tests/rabbitmq_proc.py): each test
is written once, and asserts what the client observes on both (publishing
ids and confirms, the offsets a subscription starts at, stored offsets,
deduplication, the answers to a missing stream and to bad arguments).
Where Warren differs on purpose, ``expected`` says so and why.
Needs Debian's rabbitmq-server for the RabbitMQ runs (skipped without).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from rstream import (
    AMQPMessage,
    ConfirmationStatus,
    Consumer,
    ConsumerOffsetSpecification,
    MessageContext,
    OffsetType,
    Producer,
    amqp_decoder,
    exceptions,
    schema,
)
from rstream.client import Client

from warren.pytest_plugin import WarrenBroker, start_broker

pytestmark = [
    pytest.mark.timeout(120),
    # Both brokers are driven over sockets only: nothing here runs Warren in
    # this process differently between the builds.
    pytest.mark.passes("compiled"),
]

HOST = "127.0.0.1"
WARREN, RABBITMQ_310 = "warren", "rabbitmq-3.10"
T = TypeVar("T")
_names = itertools.count()


@dataclass
class StreamPeer:
    name: str
    port: int

    def stream(self, what: str) -> str:
        """A fresh stream name: RabbitMQ's node serves the whole module."""
        return f"cmp-{what}-{next(_names)}"

    def producer(self, **kw: Any) -> Producer:
        return Producer(HOST, self.port, username="guest", password="guest", **kw)

    def consumer(self) -> Consumer:
        return Consumer(HOST, self.port, username="guest", password="guest")

    def expected(self, warren: T, rabbitmq: T) -> T:
        return warren if self.name == WARREN else rabbitmq


@pytest.fixture(scope="module")
def warren_stream() -> Iterator[WarrenBroker]:
    broker = start_broker(http_port=-1, mqtt_port=-1, prometheus_port=-1, stream_port=0)
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="module")
def rabbitmq_stream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """RabbitMQ 3.10 with rabbitmq_stream on a free port, one per module."""
    from rabbitmq_proc import AVAILABLE, RabbitMQ

    if not AVAILABLE:
        pytest.skip("rabbitmq-server is not installed (make rabbitmq installs Debian's)")
    server = RabbitMQ(Path(tmp_path_factory.mktemp("rabbitmq")), plugins=["rabbitmq_stream"])
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=[WARREN, RABBITMQ_310])
def peer(request: pytest.FixtureRequest) -> StreamPeer:
    if request.param == WARREN:
        broker = request.getfixturevalue("warren_stream")
        return StreamPeer(WARREN, broker.broker.listener("stream").port)
    return StreamPeer(RABBITMQ_310, request.getfixturevalue("rabbitmq_stream").stream_port)


def run(coro: Awaitable[T]) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(coro, 60)

    return asyncio.run(bounded())


async def consume(
    peer: StreamPeer, stream: str, n: int, spec: ConsumerOffsetSpecification
) -> list[tuple[int, bytes]]:
    """The first ``n`` (offset, body) a subscription from ``spec`` gets."""
    got: list[tuple[int, bytes]] = []
    done = asyncio.Event()

    async def on_message(msg: AMQPMessage, ctx: MessageContext) -> None:
        got.append((ctx.offset, bytes(msg.body)))
        if len(got) >= n:
            done.set()

    async with peer.consumer() as consumer:
        await consumer.subscribe(
            stream, on_message, decoder=amqp_decoder, offset_specification=spec
        )
        await asyncio.wait_for(done.wait(), 20)
    return got[:n]


def test_publish_with_confirms(peer: StreamPeer) -> None:
    """send_wait returns each publishing id once confirmed; send()'s callback
    gets a confirm for every publishing id."""
    stream = peer.stream("confirm")

    async def scenario() -> tuple[list[int], list[tuple[int, bool, int]]]:
        confirms: list[tuple[int, bool, int]] = []
        all_in = asyncio.Event()

        async def on_confirm(status: ConfirmationStatus) -> None:
            confirms.append((status.message_id, status.is_confirmed, status.response_code))
            if len(confirms) == 5:
                all_in.set()

        async with peer.producer() as p:
            await p.create_stream(stream)
            ids = [await p.send_wait(stream, AMQPMessage(body=f"w{i}".encode())) for i in range(3)]
            for i in range(5):
                await p.send(
                    stream, AMQPMessage(body=f"a{i}".encode()), on_publish_confirm=on_confirm
                )
            await asyncio.wait_for(all_in.wait(), 20)
            await p.delete_stream(stream)
        return ids, sorted(confirms)

    ids, confirms = run(scenario())
    assert ids == [1, 2, 3]
    assert confirms == [(i, True, 0) for i in range(4, 9)]


def test_subscribe_from_first_offset_last_and_next(peer: StreamPeer) -> None:
    stream = peer.stream("offsets")

    async def scenario() -> dict[str, list[tuple[int, bytes]]]:
        seen: dict[str, list[tuple[int, bytes]]] = {}
        async with peer.producer() as p:
            await p.create_stream(stream)
            for i in range(6):  # one Publish (a chunk in RabbitMQ) each
                await p.send_wait(stream, AMQPMessage(body=f"m{i}".encode()))
            spec = ConsumerOffsetSpecification
            seen["first"] = await consume(peer, stream, 6, spec(OffsetType.FIRST))
            seen["offset"] = await consume(peer, stream, 2, spec(OffsetType.OFFSET, 4))
            seen["last"] = await consume(peer, stream, 1, spec(OffsetType.LAST))
            # NEXT: sent until one arrives (no race with the Subscribe)
            task = asyncio.create_task(consume(peer, stream, 1, spec(OffsetType.NEXT)))
            while not task.done():
                await p.send_wait(stream, AMQPMessage(body=b"after"))
                await asyncio.wait({task}, timeout=0.2)
            seen["next"] = await task
            await p.delete_stream(stream)
        return seen

    seen = run(scenario())
    assert seen["first"] == [(i, f"m{i}".encode()) for i in range(6)]
    assert seen["offset"] == [(4, b"m4"), (5, b"m5")]
    assert seen["last"] == [(5, b"m5")]
    [(offset, body)] = seen["next"]
    assert offset >= 6 and body == b"after"


def test_store_and_query_offset(peer: StreamPeer) -> None:
    stream = peer.stream("store")

    async def scenario() -> list[Any]:
        seen: list[Any] = []
        async with peer.producer() as p:
            await p.create_stream(stream)
            client = await p.default_client

            async def query(reference: str) -> Any:
                try:
                    return await client.query_offset(stream, reference)
                except exceptions.ServerError as exc:
                    return type(exc).__name__

            seen.append(await query("app"))
            await client.store_offset(stream, "app", 7)
            seen.append(await query("app"))
            await client.store_offset(stream, "app", 3)  # going back is allowed
            seen.append(await query("app"))
            seen.append(await query("other"))
            await p.delete_stream(stream)
        return seen

    assert run(scenario()) == ["OffsetNotFound", 7, 3, "OffsetNotFound"]


def test_deduplication_by_reference(peer: StreamPeer) -> None:
    """Publishing ids at or below the reference's last stored one are dropped
    (and confirmed); QueryPublisherSequence answers the last one stored."""
    stream = peer.stream("dedup")

    async def scenario() -> tuple[list[int], list[bytes], list[int]]:
        sequences = []
        confirmed: list[int] = []
        async with peer.producer() as p:
            await p.create_stream(stream)
            client = await p.default_client
            sequences.append(await client.query_publisher_sequence(stream, "ref"))
            await client.declare_publisher(stream, "ref", 9)

            async def on_confirm(frame: schema.PublishConfirm) -> None:
                confirmed.extend(frame.publishing_ids)

            client.add_handler(schema.PublishConfirm, on_confirm, name="cmp")

            def batch(ids: range) -> list[schema.Message]:
                return [
                    schema.Message(i, None, bytes(AMQPMessage(body=f"id{i}".encode()))) for i in ids
                ]

            await client.publish(batch(range(1, 4)), 9)
            await client.publish(batch(range(2, 6)), 9)  # 2 and 3 again
            for _ in range(200):
                if len(confirmed) >= 7:
                    break
                await asyncio.sleep(0.05)
            sequences.append(await client.query_publisher_sequence(stream, "ref"))
            await client.delete_publisher(9)
            spec = ConsumerOffsetSpecification(OffsetType.FIRST)
            got = await consume(peer, stream, 5, spec)
            await p.delete_stream(stream)
        return sequences, [body for _, body in got], sorted(confirmed)

    sequences, bodies, confirmed = run(scenario())
    assert sequences == [0, 5]
    assert bodies == [b"id1", b"id2", b"id3", b"id4", b"id5"]
    assert confirmed == [1, 2, 2, 3, 3, 4, 5]


def test_a_missing_stream(peer: StreamPeer) -> None:
    """Metadata names it with STREAM_DOES_NOT_EXIST and no broker; the
    commands on it answer the same code; QueryPublisherSequence answers 0."""

    async def scenario() -> list[Any]:
        client = Client(HOST, peer.port, frame_max=1 << 20, heartbeat=60)
        await client.start()
        try:
            await client.authenticate("/", "guest", "guest")
            meta = await client.sync_request(
                schema.Metadata(client._corr_id_seq.next(), ["cmp-missing"]),
                schema.MetadataResponse,
                raise_exception=False,
            )
            seen: list[Any] = [(meta.brokers, meta.metadata)]
            seen.append(await client.stream_exists("cmp-missing"))

            async def outcome(call: Callable[[], Awaitable[Any]]) -> Any:
                try:
                    return await call()
                except exceptions.ServerError as exc:
                    return type(exc).__name__

            seen.append(await outcome(lambda: client.query_leader_and_replicas("cmp-missing")))
            seen.append(await outcome(lambda: client.delete_stream("cmp-missing")))
            seen.append(await outcome(lambda: client.query_offset("cmp-missing", "r")))
            seen.append(await outcome(lambda: client.query_publisher_sequence("cmp-missing", "r")))
            seen.append(await outcome(lambda: client.declare_publisher("cmp-missing", "r", 1)))
            return seen
        finally:
            await client.close()

    missing = schema.StreamMetadata("cmp-missing", 2, 0xFFFF, [])
    assert run(scenario()) == [
        ([], [missing]),
        False,
        "StreamDoesNotExist",
        "StreamDoesNotExist",
        "StreamDoesNotExist",
        0,
        "StreamDoesNotExist",
    ]


async def create_outcome(peer: StreamPeer, stream: str, arguments: dict[str, Any]) -> str:
    """What one Create on a connection of its own gets: its answer's code
    (as rstream's exception), ``ok``, ``closed`` when the broker closes
    the connection instead of answering, ``no answer`` when nothing comes
    in rstream's request timeout."""
    closed = asyncio.Event()

    async def on_close(_: Any) -> None:
        closed.set()

    client = Client(
        HOST, peer.port, frame_max=1 << 20, heartbeat=60, connection_closed_handler=on_close
    )
    await client.start()
    try:
        await client.authenticate("/", "guest", "guest")
        create = asyncio.create_task(client.create_stream(stream, arguments))
        closing = asyncio.create_task(closed.wait())
        await asyncio.wait({create, closing}, timeout=20, return_when=asyncio.FIRST_COMPLETED)
        if not create.done():
            create.cancel()
            return "closed" if closed.is_set() else "no answer"
        closing.cancel()
        exc = create.exception()
        if isinstance(exc, asyncio.TimeoutError):
            return "no answer"
        return "ok" if exc is None else type(exc).__name__
    finally:
        await client.close()


@pytest.mark.parametrize(
    ("arguments", "warren", "rabbitmq"),
    [
        ({"queue-leader-locator": "nowhere"}, "PreconditionFailed", "PreconditionFailed"),
        ({"max-age": "1D", "unknown-argument": "x"}, "ok", "ok"),
        # RabbitMQ 3.10's stream manager fails to parse the value and the
        # Create is never answered; Warren answers PRECONDITION_FAILED.
        ({"max-length-bytes": "many"}, "PreconditionFailed", "no answer"),
        ({"max-age": "forever"}, "PreconditionFailed", "no answer"),
        # 3.10's stream plugin takes a negative size (0-9-1's x-max-length-bytes
        # refuses it); Warren refuses it over every protocol.
        ({"max-length-bytes": "-1"}, "PreconditionFailed", "ok"),
    ],
)
def test_create_with_bad_arguments(
    peer: StreamPeer, arguments: dict[str, Any], warren: str, rabbitmq: str
) -> None:
    stream = peer.stream("args")

    async def scenario() -> tuple[str, str]:
        outcome = await create_outcome(peer, stream, arguments)
        again = await create_outcome(peer, stream, {})
        async with peer.producer() as p:
            if await p.stream_exists(stream):
                await p.delete_stream(stream)
        return outcome, again

    outcome, again = run(scenario())
    assert outcome == peer.expected(warren, rabbitmq)
    # Created, the stream is there: a Create with other arguments is refused
    # as inequivalent (STREAM_ALREADY_EXISTS is for equivalent ones).
    assert again == ("PreconditionFailed" if outcome == "ok" else "ok")


def test_create_an_existing_stream(peer: StreamPeer) -> None:
    """STREAM_ALREADY_EXISTS for the same arguments (in another order, an
    argument the stream ignores left out), PRECONDITION_FAILED for others."""
    stream = peer.stream("exists")
    arguments = {"max-length-bytes": "1000000", "max-age": "1h"}

    async def scenario() -> list[str]:
        seen = [await create_outcome(peer, stream, arguments)]
        for again in (
            {"max-age": "1h", "max-length-bytes": "1000000"},
            {"max-age": "1h", "max-length-bytes": "1000000", "unknown-argument": "x"},
            {"max-length-bytes": "1000000"},
            {"max-length-bytes": "2000000", "max-age": "1h"},
        ):
            seen.append(await create_outcome(peer, stream, again))
        async with peer.producer() as p:
            await p.delete_stream(stream)
        return seen

    assert run(scenario()) == [
        "ok",
        "StreamAlreadyExists",
        "StreamAlreadyExists",
        "PreconditionFailed",
        "PreconditionFailed",
    ]
