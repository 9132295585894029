"""Sub-entry batches kept closed (issue 31), in memory: a Publish's batches,
whatever their compression, are stored as they came in a chunk record, one
offset per record and one publishing id per batch (osiris's rules); stream
protocol consumers (the leader's and a follower's read service) get the
chunk byte for byte, from any offset spec; a filtering subscription gets it
when it matches unfiltered; AMQP 0-9-1 and 1.0 readers get the messages of
plain and gzip batches at their offsets and skip snappy, lz4 and zstd ones,
said once per stream; StreamStats and a restart on the same data directory
count records. Batches are built with rstream's codecs; snappy, lz4 and zstd
bytes are never looked into by the broker, so arbitrary bytes stand in."""

from __future__ import annotations

import logging
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest
from harness import harness_fixture
from harness.amqp1 import ProtonClient
from harness.broker import Harness
from rstream import encoding, schema
from rstream.amqp import amqp_decoder
from rstream.compression import GzipCompressionCodec, NoneCompressionCodec
from test_stream_publish_deliver import (
    FIRST,
    LAST,
    confirmed,
    declare,
    encode,
    message,
    opened,
    spec,
)
from test_stream_replica import replica

from warren.stream_protocol import commands as c
from warren.stream_protocol.chunk import decode_delivered_chunk
from warren.stream_protocol.constants import ResponseCode
from warren.stream_protocol.frames import decode_frame
from warren.stream_protocol.publish import Deliver, Publish, PublishedMessage

broker = harness_fixture(manual_clock=True)

OK = ResponseCode.OK


def rstream_batch(codec: Any, *bodies: bytes) -> bytes:
    """A sub-entry batch entry as rstream's producer writes it (producer.py's
    PublishSubBatching fields), of AMQP 1.0 messages with these bodies."""
    codec.compress([message(b) for b in bodies])
    return struct.pack(
        ">BHII",
        0x80 | codec.compression_type() << 4,
        codec.messages_count(),
        codec.uncompressed_size(),
        codec.compressed_size(),
    ) + bytes(codec.data())


def closed_batch(compression: int, count: int) -> bytes:
    """A batch the broker cannot open (snappy 2, lz4 3, zstd 4): bytes it keeps."""
    body = bytes(range(count * 7 % 250 + 5))
    return struct.pack(">BHII", 0x80 | compression << 4, count, 1000, len(body)) + body


def simple(body: bytes) -> bytes:
    data = message(body)
    return struct.pack(">I", len(data)) + data


#: Publishing ids 1-6: simple, gzip (3), snappy (2), lz4 (1), zstd (2), none (2).
ENTRIES = [
    simple(b"a"),
    rstream_batch(GzipCompressionCodec(), b"b", b"c", b"d"),
    closed_batch(2, 2),
    closed_batch(3, 1),
    closed_batch(4, 2),
    rstream_batch(NoneCompressionCodec(), b"j", b"k"),
]
#: What an AMQP reader gets: offsets 4-8 are snappy's, lz4's and zstd's.
READABLE = [(0, b"a"), (1, b"b"), (2, b"c"), (3, b"d"), (9, b"j"), (10, b"k")]


def publish_entries(client: Any, ids: list[int], entries: list[bytes]) -> list[Any]:
    frame = Publish.of(1, [PublishedMessage(i, e) for i, e in zip(ids, entries, strict=True)])
    return [decode_frame(f) for f in client.raw(frame.encode())]


def chunks(frames: list[bytes]) -> list[tuple[int, int, int, bytes]]:
    """(first offset, entries, records, data) of each Deliver's chunk (CRC checked)."""
    out = []
    for f in frames:
        d = decode_frame(f)
        if isinstance(d, Deliver):
            header, data, _entries = decode_delivered_chunk(d.chunk)
            out.append((header.first_offset, header.num_entries, header.num_records, bytes(data)))
    return out


def stored(broker: Harness) -> Any:
    client = opened(broker)
    declare(client)
    assert confirmed(publish_entries(client, [1, 2, 3, 4, 5, 6], ENTRIES)) == [1, 2, 3, 4, 5, 6]
    return client


def amqp_read(broker: Harness, start: Any, n: int) -> list[tuple[int, bytes]]:
    ch = broker.amqp_connection().channel()
    ch.basic_qos(prefetch_count=50)
    ch.basic_consume("s", arguments={"x-stream-offset": start})
    got = [ch.next_delivery() for _ in range(n)]
    return [(d.properties.headers["x-stream-offset"], d.body) for d in got]


def test_batches_are_stored_closed_and_delivered_as_published(broker: Harness) -> None:
    stored(broker)
    q = broker.broker.vhosts["/"].queues["s"]
    assert q.stream.next_offset == 11  # offsets count records, as RabbitMQ's do
    sub = opened(broker, stream=None)
    frames = sub.raw(encode(schema.Subscribe(sub.next_id(), 1, "s", FIRST, 10, [])))
    assert chunks(frames) == [(0, 6, 11, b"".join(ENTRIES))]
    # rstream's own decoder opens the chunk's gzip and plain batches; it has
    # no snappy, lz4 or zstd codec: the raw entries are what a client gets.
    deliver = [encoding.decode_frame(f) for f in frames][-1]
    assert isinstance(deliver, schema.Deliver)
    assert (deliver.num_entries, deliver.num_records) == (6, 11)


@pytest.mark.parametrize("offset", [1, 5, 10])
def test_an_offset_inside_a_batch_gets_the_chunk_from_its_start(
    broker: Harness, offset: int
) -> None:
    stored(broker)
    sub = opened(broker, stream=None)
    frames = sub.raw(encode(schema.Subscribe(sub.next_id(), 1, "s", spec(4, offset), 10, [])))
    assert [(f, e, r) for f, e, r, _d in chunks(frames)] == [(0, 6, 11)]
    frames = sub.raw(encode(schema.Subscribe(sub.next_id(), 2, "s", LAST, 10, [])))
    assert [(f, e, r) for f, e, r, _d in chunks(frames)] == [(0, 6, 11)]


def test_amqp_091_opens_plain_and_gzip_batches_and_skips_the_others(
    broker: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    client = stored(broker)
    publish_entries(client, [7], [simple(b"after")])
    with caplog.at_level(logging.WARNING, "warren.store"):
        assert amqp_read(broker, "first", 7) == [*READABLE, (11, b"after")]
        assert amqp_read(broker, 2, 4) == [(2, b"c"), (3, b"d"), (9, b"j"), (10, b"k")]
        assert amqp_read(broker, 5, 3) == [(9, b"j"), (10, b"k"), (11, b"after")]
        assert amqp_read(broker, 10, 2) == [(10, b"k"), (11, b"after")]
    said = [r.getMessage() for r in caplog.records if "sub-entry batch" in r.getMessage()]
    assert len(said) == 1 and "snappy" in said[0]


def test_amqp_10_reads_the_open_batches_at_their_offsets(broker: Harness) -> None:
    proton = pytest.importorskip("proton")
    stored(broker)
    client = ProtonClient(broker).open()

    def configure(receiver: Any) -> None:
        receiver.source.filter.put_dict(
            {
                proton.symbol("o"): proton.Described(
                    proton.symbol("rabbitmq:stream-offset-spec"), "first"
                )
            }
        )

    receiver = client.receiver("/queues/s", credit=20, configure=configure)
    got = client.receive(receiver)
    assert [(m.annotations["x-stream-offset"], bytes(m.body)) for _, m in got] == READABLE


def test_one_publishing_id_per_batch_and_duplicates_dropped(broker: Harness) -> None:
    client = opened(broker)
    declare(client, ref="app")
    assert confirmed(publish_entries(client, [1, 2], ENTRIES[:2])) == [1, 2]
    answers = publish_entries(client, [2, 3], [ENTRIES[1], ENTRIES[2]])
    assert sorted(confirmed(answers)) == [2, 3]
    seq = client.request(schema.QueryPublisherSequence(client.next_id(), "app", "s"))
    assert seq.sequence == 3
    q = broker.broker.vhosts["/"].queues["s"]
    assert q.stream.next_offset == 1 + 3 + 2
    assert amqp_read(broker, "first", 4) == READABLE[:4]


def test_a_filtering_subscription_gets_the_chunk_when_it_matches_unfiltered(
    broker: Harness,
) -> None:
    client = stored(broker)
    red = PublishedMessage.simple(7, message(b"r"), "red")
    [confirm] = [decode_frame(f) for f in client.raw(Publish.of(1, [red]).encode())]
    assert isinstance(confirm, c.PublishConfirm)
    sub = opened(broker, stream=None)
    only_red = [schema.Property("filter.0", "red")]
    frames = sub.raw(encode(schema.Subscribe(sub.next_id(), 1, "s", FIRST, 10, only_red)))
    got = chunks(frames)
    assert [(f, r) for f, _e, r, _d in got] == [(11, 1)]
    unfiltered = [*only_red, schema.Property("match-unfiltered", "true")]
    frames = sub.raw(encode(schema.Subscribe(sub.next_id(), 2, "s", FIRST, 10, unfiltered)))
    got = chunks(frames)
    assert [(f, r) for f, _e, r, _d in got] == [(0, 11), (11, 1)]
    assert got[0][3] == b"".join(ENTRIES)


def test_a_follower_read_service_delivers_the_chunk_as_stored(broker: Harness) -> None:
    stored(broker)
    wire = replica(broker)
    sub = schema.Subscribe(wire.next_id(), 3, "s", spec(4, 6), 5, [])
    frames = wire.raw(encoding.encode_frame(sub))
    assert chunks(frames) == [(0, 6, 11, b"".join(ENTRIES))]
    [frame] = wire.raw(c.StreamStats(wire.next_id(), "s").encode())
    answer = decode_frame(frame)
    assert isinstance(answer, c.StreamStatsResponse)
    assert answer.stats == {"first_chunk_id": 0, "committed_chunk_id": 10}


def test_stream_stats_count_records(broker: Harness) -> None:
    client = stored(broker)
    [frame] = client.raw(c.StreamStats(client.next_id(), "s").encode())
    answer = decode_frame(frame)
    assert isinstance(answer, c.StreamStatsResponse) and answer.code == OK
    assert answer.stats == {"first_chunk_id": 0, "committed_chunk_id": 10}


def test_batches_keep_their_offsets_over_a_restart(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with Harness(data) as first:
        stored(first)
    with Harness(data) as second:
        client = opened(second, stream=None)
        declare(client)
        assert confirmed(publish_entries(client, [7], [simple(b"after")])) == [7]
        assert amqp_read(second, "first", 7) == [*READABLE, (11, b"after")]
        frames = client.raw(encode(schema.Subscribe(client.next_id(), 1, "s", FIRST, 10, [])))
        assert [(f, r) for f, _e, r, _d in chunks(frames)] == [(0, 11), (11, 1)]


def test_a_deduplicating_stream_opens_gzip_and_refuses_snappy(broker: Harness) -> None:
    """Deduplication by header reads every message (StreamQueue.takes_chunks):
    a batch is opened there, and one that cannot be is refused."""
    ch = broker.amqp_connection().channel()
    args = {"x-queue-type": "stream", "x-message-deduplication": True}
    ch.queue_declare("s", durable=True, arguments=args)
    client = opened(broker, stream=None)
    declare(client)
    answers = publish_entries(client, [1, 2], [ENTRIES[1], ENTRIES[2]])
    assert confirmed([a for a in answers if isinstance(a, c.PublishConfirm)]) == [1]
    errors = [a for a in answers if isinstance(a, c.PublishError)]
    assert [(e.publishing_id, e.code) for e in errors[0].errors] == [
        (2, ResponseCode.PRECONDITION_FAILED)
    ]
    assert amqp_read(broker, "first", 3) == [(0, b"b"), (1, b"c"), (2, b"d")]


def test_an_empty_batch_is_confirmed_and_holds_no_offset(broker: Harness) -> None:
    """A batch of no record takes the per-message path (a chunk record's
    entries hold one offset or more): confirmed, nothing stored."""
    client = opened(broker)
    declare(client)
    empty = struct.pack(">BHII", 0x80, 0, 0, 0)
    answers = publish_entries(client, [1, 2], [empty, ENTRIES[0]])
    assert confirmed(answers) == [1, 2]
    assert broker.broker.vhosts["/"].queues["s"].stream.next_offset == 1
    assert amqp_read(broker, "first", 1) == [(0, b"a")]


def test_rstream_decodes_the_delivered_gzip_batch(broker: Harness) -> None:
    """rstream's Deliver decoder (schema.Deliver.get_messages) opens what it has a
    codec for: a chunk of a simple entry, a gzip and a plain batch."""
    client = opened(broker)
    declare(client)
    entries = [ENTRIES[0], ENTRIES[1], ENTRIES[5]]
    assert confirmed(publish_entries(client, [1, 2, 3], entries)) == [1, 2, 3]
    sub = opened(broker, stream=None)
    frames = sub.raw(encode(schema.Subscribe(sub.next_id(), 1, "s", FIRST, 10, [])))
    deliver = encoding.decode_frame(frames[-1])
    assert isinstance(deliver, schema.Deliver)
    bodies = [amqp_decoder(m).body for m in deliver.get_messages()]
    assert bodies == [b"a", b"b", b"c", b"d", b"j", b"k"]
    assert zlib.crc32(b"".join(entries)) == deliver.chunk_crc


def test_last_over_amqp_is_the_last_message_it_can_read(broker: Harness) -> None:
    client = stored(broker)
    publish_entries(client, [7], [closed_batch(4, 3)])  # offsets 11-13: zstd
    assert amqp_read(broker, "last", 1) == [(10, b"k")]
    sub = opened(broker, stream=None)  # the stream protocol's LAST: the last chunk
    frames = sub.raw(encode(schema.Subscribe(sub.next_id(), 1, "s", LAST, 10, [])))
    assert [(f, r) for f, _e, r, _d in chunks(frames)] == [(11, 3)]


def test_a_follower_read_service_filters_chunk_records_as_the_leader(broker: Harness) -> None:
    client = stored(broker)
    red = PublishedMessage.simple(7, message(b"r"), "red")
    client.raw(Publish.of(1, [red]).encode())
    wire = replica(broker)
    only_red = [schema.Property("filter.0", "red")]
    frames = wire.raw(
        encoding.encode_frame(schema.Subscribe(wire.next_id(), 1, "s", FIRST, 9, only_red))
    )
    assert [(f, r) for f, _e, r, _d in chunks(frames)] == [(11, 1)]
    unfiltered = [*only_red, schema.Property("match-unfiltered", "true")]
    sub = schema.Subscribe(wire.next_id(), 2, "s", FIRST, 9, unfiltered)
    got = chunks(wire.raw(encoding.encode_frame(sub)))
    assert [(f, r) for f, _e, r, _d in got] == [(0, 11), (11, 1)]
    assert got[0][3] == b"".join(ENTRIES)


def test_a_publish_of_more_entries_than_a_chunk_header_counts_keeps_its_batches(
    broker: Harness,
) -> None:
    """A Publish of over 65,535 entries (a chunk header counts entries in 16
    bits) is cut into chunk records like any long Publish, its sub-entry batches
    kept closed: a zstd batch in it is stored, not refused as the per-message
    path (which opens what it stores) must. Entries of one byte, which no
    reader here opens, keep the frame under the 1 MiB frame_max."""
    client = opened(broker)
    declare(client)
    n = 70_000
    entries = [struct.pack(">IB", 1, i & 0xFF) for i in range(n)] + [closed_batch(4, 2)]
    ids = list(range(1, n + 2))
    assert confirmed(publish_entries(client, ids, entries)) == ids
    assert broker.broker.vhosts["/"].queues["s"].stream.next_offset == n + 2
    sub = opened(broker, stream=None)
    frames = sub.raw(encode(schema.Subscribe(sub.next_id(), 1, "s", FIRST, 100, [])))
    got = chunks(frames)
    # 70,001 entries: 17 chunk records of 4,096, then 369 with the batch's 2 records.
    assert [(e, r) for _f, e, r, _d in got] == [(4096, 4096)] * 17 + [(369, 370)]
    assert b"".join(d for *_, d in got) == b"".join(entries)
