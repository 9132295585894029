"""rstream's sub-entry batches over a socket (issue 31): ``send_sub_entry``
with gzip, with none, and with a codec the broker has not got (a gzip codec
registered in rstream as zstd, so the client can open what the broker must
keep closed); rstream's consumer gets every message at its offset from the
chunks as stored, and pika (AMQP 0-9-1) and the Spark reader's read task
(warren.spark.stream.read_range, no Spark needed) the plain and gzip ones,
the "zstd" batch's offsets skipped."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pika
import pytest
from rstream import AMQPMessage, ConsumerOffsetSpecification, OffsetType
from rstream.compression import (
    CompressionType,
    GzipCompressionCodec,
    StreamCompressionCodecs,
)
from streamhelp import first_messages, port, producer, stream_broker_fixture

from warren.pytest_plugin import WarrenBroker

warren = stream_broker_fixture()


class GzipAsZstd(GzipCompressionCodec):
    """gzip bytes under zstd's number: opaque to the broker, not to this client."""

    def compression_type(self) -> int:
        return CompressionType.Zstd.value


@pytest.fixture
def zstd_codec() -> Iterator[None]:
    codecs = StreamCompressionCodecs.available_compress_codecs
    before = codecs.get(CompressionType.Zstd)
    codecs[CompressionType.Zstd] = GzipAsZstd()
    try:
        yield
    finally:
        if before is None:
            del codecs[CompressionType.Zstd]
        else:
            codecs[CompressionType.Zstd] = before


def test_sub_entry_batches_of_rstream(warren: WarrenBroker, zstd_codec: None) -> None:
    batches = [
        (CompressionType.Gzip, [b"g0", b"g1", b"g2"]),
        (CompressionType.No, [b"n0", b"n1"]),
        (CompressionType.Zstd, [b"z0", b"z1"]),
    ]

    async def publish() -> None:
        async with producer(warren) as p:
            await p.create_stream("rs-batches")
            for codec, bodies in [*batches, (CompressionType.No, [b"last"])]:
                done = asyncio.Event()
                status: list[Any] = []

                def confirmed(
                    s: Any, status: list[Any] = status, done: asyncio.Event = done
                ) -> None:
                    status.append(s)
                    done.set()

                msgs = [AMQPMessage(body=b) for b in bodies]
                await p.send_sub_entry(
                    "rs-batches", msgs, compression_type=codec, on_publish_confirm=confirmed
                )
                await asyncio.wait_for(done.wait(), 20)
                assert status[0].is_confirmed

    asyncio.run(publish())
    everything = [b for _c, bodies in batches for b in bodies] + [b"last"]
    got = asyncio.run(
        first_messages(port(warren), "rs-batches", 8, ConsumerOffsetSpecification(OffsetType.FIRST))
    )
    assert [(o, m.body) for o, m in got] == list(enumerate(everything))
    conn = pika.BlockingConnection(pika.URLParameters(warren.url))
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=10)
        gen = ch.consume(
            "rs-batches", arguments={"x-stream-offset": "first"}, inactivity_timeout=10
        )
        read = []
        for _ in range(6):
            _method, props, body = next(gen)
            read.append((props.headers["x-stream-offset"], body))
        ch.cancel()
    finally:
        conn.close()
    assert read == [(0, b"g0"), (1, b"g1"), (2, b"g2"), (3, b"n0"), (4, b"n1"), (7, b"last")]

    pytest.importorskip("pyarrow")
    from warren.spark.columns import to_batch
    from warren.spark.stream import Planner, read_range

    rows = read_range(
        warren.url,
        "rs-batches",
        1,
        8,
        prefetch=10,
        poll_timeout_ms=20_000,
        fail_on_data_loss=True,
    )
    table = [r for batch in rows for r in to_batch(batch, "rs-batches").to_pylist()]
    assert [(r["offset"], r["body"]) for r in table] == read[1:]

    # A stream ending in a batch AMQP readers skip: the planner's bounds end
    # after the last message they can read.
    async def closed_at_the_end() -> None:
        async with producer(warren) as p:
            done = asyncio.Event()
            msgs = [AMQPMessage(body=b"z2"), AMQPMessage(body=b"z3")]
            await p.send_sub_entry(
                "rs-batches",
                msgs,
                compression_type=CompressionType.Zstd,
                on_publish_confirm=lambda _s: done.set(),
            )
            await asyncio.wait_for(done.wait(), 20)

    asyncio.run(closed_at_the_end())
    with Planner(warren.url, 20_000) as planner:
        bounds = planner.bounds("rs-batches")
    assert (bounds.first, bounds.end) == (0, 8)
    assert warren.broker.vhosts["/"].queues["rs-batches"].stream.next_offset == 10
