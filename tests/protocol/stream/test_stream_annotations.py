"""A stream protocol message's annotations across protocols, in memory.

RabbitMQ keeps a stream message's message annotations whole. Warren's core
properties carry only ``x-`` ones (headers); the others are kept with the
bare message (Message.native, amqp1/mapping.py's unmapped_annotations) on
the per-message path, which a sub-entry batch, a Publish v2 filter value
and a deduplicating stream take, so they come back as on the whole-chunk
path: to stream protocol consumers (rstream decodes the records) and AMQP
1.0 consumers (Qpid Proton); AMQP 0-9-1 consumers (pika) get the ``x-``
ones as headers and not the others, as from RabbitMQ."""

from __future__ import annotations

from typing import Any

import pytest
from harness import harness_fixture
from harness.amqp1 import ProtonClient
from harness.broker import Harness
from rstream import schema
from rstream.amqp import AMQPMessage, amqp_decoder
from test_stream_publish_deliver import FIRST, declare, deliveries, encode, opened

from warren.stream_protocol.chunk import sub_batch_entry
from warren.stream_protocol.constants import Compression
from warren.stream_protocol.publish import Publish, PublishedMessage

broker = harness_fixture(manual_clock=True)

ANNOTATIONS = {b"foo": "bar", b"x-opt-kept": 7}
PATHS = ["whole chunk", "sub-entry batch", "filter value", "deduplicating stream"]


def record(body: bytes) -> bytes:
    return bytes(AMQPMessage(body=body, message_annotations=dict(ANNOTATIONS)))


def publish_by(broker: Harness, path: str) -> str:
    """Publish two records by ``path``; the stream's name."""
    stream = "d" if path == "deduplicating stream" else "s"
    if path == "deduplicating stream":
        args = {"x-queue-type": "stream", "x-message-deduplication": True}
        broker.amqp_connection().channel().queue_declare("d", durable=True, arguments=args)
    client = opened(broker, stream=None if stream == "d" else "s")
    declare(client, stream=stream)
    records = [record(b"one"), record(b"two")]
    if path == "sub-entry batch":
        msgs = [PublishedMessage(1, sub_batch_entry(records, Compression.GZIP))]
    elif path == "filter value":
        msgs = [PublishedMessage.simple(i, r, "red") for i, r in enumerate(records, 1)]
    else:
        msgs = [PublishedMessage.simple(i, r) for i, r in enumerate(records, 1)]
    client.raw(Publish.of(1, msgs).encode())
    return stream


@pytest.mark.parametrize("path", PATHS)
def test_a_stream_consumer_gets_every_annotation_back(broker: Harness, path: str) -> None:
    stream = publish_by(broker, path)
    sub = opened(broker, stream=None)
    frames = sub.raw(encode(schema.Subscribe(sub.next_id(), 1, stream, FIRST, 10, [])))
    got = [amqp_decoder(r) for _, _, rs in deliveries(frames) for r in rs]
    assert [m.body for m in got] == [b"one", b"two"]
    for msg in got:
        annotations = {bytes(k): v for k, v in (msg.message_annotations or {}).items()}
        assert annotations.get(b"foo") in ("bar", b"bar")
        assert annotations.get(b"x-opt-kept") == 7


@pytest.mark.parametrize("path", PATHS)
def test_an_amqp_10_consumer_gets_them_too(broker: Harness, path: str) -> None:
    proton = pytest.importorskip("proton")
    stream = publish_by(broker, path)
    c = ProtonClient(broker).open()

    def configure(receiver: Any) -> None:
        receiver.source.filter.put_dict(
            {
                proton.symbol("o"): proton.Described(
                    proton.symbol("rabbitmq:stream-offset-spec"), "first"
                )
            }
        )

    receiver = c.receiver(f"/queues/{stream}", credit=10, configure=configure)
    got = [m for _, m in c.receive(receiver)]
    assert [bytes(m.body) for m in got] == [b"one", b"two"]
    for msg in got:
        assert msg.annotations["foo"] == "bar"
        assert msg.annotations["x-opt-kept"] == 7


@pytest.mark.parametrize("path", PATHS)
def test_an_amqp_091_consumer_gets_the_x_ones_as_headers(broker: Harness, path: str) -> None:
    stream = publish_by(broker, path)
    ch = broker.amqp_connection().channel()
    ch.basic_qos(prefetch_count=10)
    ch.basic_consume(stream, arguments={"x-stream-offset": "first"})
    got = [ch.next_delivery() for _ in range(2)]
    assert [d.body for d in got] == [b"one", b"two"]
    for d in got:
        headers = d.properties.headers
        assert headers["x-opt-kept"] == 7
        assert "foo" not in headers
