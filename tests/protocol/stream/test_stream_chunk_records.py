"""The stream protocol's fast path (issue 31): a Publish of simple entries to a
stream that reads no message is stored as one chunk record
(publishing.py's _publish_chunk, StreamStore.append_chunk); AMQP 0-9-1 and
1.0 consumers read its messages one by one with their x-stream-offset, the
publisher sequence comes back from the records when the tracking file's last
write is lost, and a stream that deduplicates by header keeps one record per
message. Clients: rstream's frames, the harness's 0-9-1 client, Qpid Proton."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from harness import harness_fixture
from harness.amqp1 import ProtonClient
from harness.broker import Harness
from rstream import schema
from test_stream_publish_deliver import (
    FIRST,
    LAST,
    bodies,
    confirmed,
    declare,
    deliveries,
    encode,
    message,
    opened,
    publish,
    spec,
)

from warren.core.stream_queue import StreamQueue
from warren.stream_protocol.frames import decode_frame
from warren.stream_protocol.publish import Deliver, Publish, PublishedMessage
from warren.stream_protocol.wire import StreamProtocolError

broker = harness_fixture(manual_clock=True)


def stream_of(harness: Harness, name: str = "s") -> StreamQueue:
    q = harness.broker.vhosts["/"].queues[name]
    assert isinstance(q, StreamQueue)
    return q


def records_of(harness: Harness, name: str = "s") -> set[tuple[int, int]]:
    """The (segment, position) of the record holding each offset."""
    stream = stream_of(harness, name).stream
    return {
        stream.position_of(o)[:2]  # type: ignore[attr-defined]
        for o in range(stream.first_offset, stream.next_offset)
    }


def test_a_publish_is_one_chunk_record(broker: Harness) -> None:
    client = opened(broker)
    declare(client)
    texts = [f"m{i}".encode() for i in range(5)]
    assert confirmed(publish(client, list(range(1, 6)), [message(t) for t in texts])) == [
        1,
        2,
        3,
        4,
        5,
    ]
    assert len(records_of(broker)) == 1
    assert confirmed(publish(client, [6, 7], [message(b"m5"), message(b"m6")])) == [6, 7]
    assert len(records_of(broker)) == 2
    assert stream_of(broker).stream.next_offset == 7
    sub = opened(broker, stream=None)
    frames = sub.raw(encode(schema.Subscribe(sub.next_id(), 1, "s", FIRST, 10, [])))
    assert bodies(frames) == [*texts, b"m5", b"m6"]


def test_amqp_091_reads_every_message_of_a_chunk_with_its_offset(broker: Harness) -> None:
    client = opened(broker)
    declare(client)
    props = {"application_properties": {b"k": b"v"}}
    publish(client, [1, 2, 3], [message(b"a", **props), message(b"b"), b"not amqp"])
    conn = broker.amqp_connection()
    ch = conn.channel()
    ch.basic_qos(prefetch_count=10)
    ch.basic_consume("s", arguments={"x-stream-offset": 1})
    got = [ch.next_delivery() for _ in range(2)]
    assert [d.body for d in got] == [b"b", b"not amqp"]
    assert [d.properties.headers["x-stream-offset"] for d in got] == [1, 2]
    assert all(d.method.routing_key == "s" for d in got)
    ch2 = conn.channel()
    ch2.basic_qos(prefetch_count=10)
    ch2.basic_consume("s", arguments={"x-stream-offset": "first"})
    first = ch2.next_delivery()
    assert first.body == b"a"
    assert first.properties.headers["k"] == "v"
    assert first.properties.headers["x-stream-offset"] == 0
    assert isinstance(first.properties.headers["x-stream-timestamp"], int)


def test_amqp_10_reads_every_message_of_a_chunk(broker: Harness) -> None:
    proton = pytest.importorskip("proton")
    client = opened(broker)
    declare(client)
    publish(
        client,
        [1, 2, 3],
        [message(b"x"), message(b"y", application_properties={b"k": b"v"}), message(b"z")],
    )
    c = ProtonClient(broker).open()

    def configure(receiver: Any) -> None:
        receiver.source.filter.put_dict(
            {
                proton.symbol("o"): proton.Described(
                    proton.symbol("rabbitmq:stream-offset-spec"), "first"
                )
            }
        )

    receiver = c.receiver("/queues/s", credit=10, configure=configure)
    got = c.receive(receiver)
    assert [bytes(m.body) if not isinstance(m.body, str) else m.body for _, m in got] == [
        b"x",
        b"y",
        b"z",
    ]
    assert bytes(got[1][1].properties["k"]) == b"v"
    offsets = [m.annotations["x-stream-offset"] for _, m in got]
    assert offsets == [0, 1, 2]


def test_duplicates_are_dropped_from_the_chunk(broker: Harness) -> None:
    client = opened(broker)
    declare(client, ref="app")
    assert confirmed(publish(client, [1, 2], [message(b"1"), message(b"2")])) == [1, 2]
    answers = publish(
        client, [2, 3, 1, 4], [message(b"2"), message(b"3"), message(b"1"), message(b"4")]
    )
    assert sorted(confirmed(answers)) == [1, 2, 3, 4]
    seq = client.request(schema.QueryPublisherSequence(client.next_id(), "app", "s"))
    assert seq.sequence == 4
    sub = opened(broker, stream=None)
    frames = sub.raw(encode(schema.Subscribe(sub.next_id(), 1, "s", FIRST, 10, [])))
    assert bodies(frames) == [b"1", b"2", b"3", b"4"]


def test_a_deduplicating_stream_keeps_a_record_per_message(broker: Harness) -> None:
    ch = broker.amqp_connection().channel()
    args = {"x-queue-type": "stream", "x-message-deduplication": True}
    ch.queue_declare("d", durable=True, arguments=args)
    assert not stream_of(broker, "d").takes_chunks()
    client = opened(broker, stream=None)
    declare(client, stream="d")
    answers = publish(client, [1, 2, 3], [message(b"1"), message(b"2"), message(b"3")])
    assert confirmed(answers) == [1, 2, 3]
    assert len(records_of(broker, "d")) == 3


def test_the_trailer_restores_a_sequence_the_tracking_file_lost(tmp_path: Path) -> None:
    """A crash after the records' sync and before the tracking file's write:
    played by putting back the tracking file as it was before the last publish."""
    data = tmp_path / "data"
    with Harness(data) as first:
        client = opened(first)
        declare(client, ref="app")
        assert confirmed(publish(client, [1, 2], [message(b"1"), message(b"2")])) == [1, 2]
        directory = stream_of(first).stream.directory
        first.call(lambda: stream_of(first).stream.sync())
        kept = tmp_path / "offsets-before"
        shutil.copy(directory / "offsets", kept)
        assert confirmed(publish(client, [3, 4], [message(b"3"), message(b"4")])) == [3, 4]
    shutil.copy(kept, directory / "offsets")
    with Harness(data) as second:
        client = opened(second, stream=None)
        seq = client.request(schema.QueryPublisherSequence(client.next_id(), "app", "s"))
        assert seq.sequence == 4
        declare(client, ref="app")
        answers = publish(client, [3, 4, 5], [message(b"3"), message(b"4"), message(b"5")])
        assert sorted(confirmed(answers)) == [3, 4, 5]
        frames = client.raw(encode(schema.Subscribe(client.next_id(), 1, "s", FIRST, 10, [])))
        assert bodies(frames) == [b"1", b"2", b"3", b"4", b"5"]


def test_a_chunk_record_goes_out_as_it_is_stored(broker: Harness) -> None:
    client = opened(broker)
    declare(client)
    publish(client, [1, 2, 3], [message(b"a"), message(b"b"), message(b"c")])
    ch = broker.amqp_connection().channel()
    ch.basic_publish("", "s", b"from-091")
    publish(client, [4, 5], [message(b"d"), message(b"e")])
    sub = opened(broker, stream=None)
    # From offset 1, inside the first chunk: it comes whole, from offset 0.
    frames = sub.raw(encode(schema.Subscribe(sub.next_id(), 1, "s", spec(4, 1), 10, [])))
    got = deliveries(frames)
    assert [(first, len(records)) for _s, first, records in got] == [(0, 3), (3, 1), (4, 2)]
    assert bodies(frames) == [b"a", b"b", b"c", b"from-091", b"d", b"e"]
    # The stored chunk, byte for byte: the Deliver carries the record's body.
    stream = stream_of(broker).stream
    sid, pos, _ = stream.position_of(4)  # type: ignore[attr-defined]
    path = stream.directory / f"msgs.{sid:010d}"
    stored = path.read_bytes()[pos + 26 : pos + 26 + 48 + 2 * (4 + len(message(b"d")))]
    chunks = [decode_frame(f).chunk for f in frames if isinstance(decode_frame(f), Deliver)]
    assert bytes(chunks[2]) == stored


def test_credit_counts_a_chunk_record_as_one(broker: Harness) -> None:
    client = opened(broker)
    declare(client)
    for i in range(3):
        publish(client, [2 * i + 1, 2 * i + 2], [message(b"x"), message(b"y")])
    sub = opened(broker, stream=None)
    frames = sub.raw(encode(schema.Subscribe(sub.next_id(), 1, "s", FIRST, 2, [])))
    assert [first for _s, first, _r in deliveries(frames)] == [0, 2]
    frames = sub.raw(encode(schema.Credit(1, 1)))
    assert [first for _s, first, _r in deliveries(frames)] == [4]


def test_a_publish_of_like_entries_scans_as_one_of_unlike_ones() -> None:
    """The uniform scan (one size: strided checks, one struct) and the loop agree."""
    like = Publish.of(1, [PublishedMessage.simple(10 + i, b"x" * 16) for i in range(300)])
    unlike = Publish.of(1, [PublishedMessage.simple(10 + i, b"x" * (i % 3)) for i in range(300)])
    for command in (like, unlike):
        decoded = decode_frame(command.encode()[4:])
        assert isinstance(decoded, Publish)
        entries = decoded.scan()
        assert entries.publishing_ids == list(range(10, 310))
        assert entries.batches == 0 and entries.records == 300
        buf = decoded.messages
        bodies = [bytes(buf[s + 4 : e]) for s, e in zip(entries.starts, entries.ends, strict=True)]
        assert bodies == [b"x" * 16 if command is like else b"x" * (i % 3) for i in range(300)]
    # One size field off by a byte: the loop finds the frame broken.
    data = bytearray(like.encode()[4:])
    at = len(data) - 20  # the last entry's size field
    data[at + 3] ^= 1
    broken = decode_frame(bytes(data))
    assert isinstance(broken, Publish)
    with pytest.raises(StreamProtocolError):
        broken.scan()


def test_a_publish_of_more_entries_than_a_chunk_header_counts_is_cut_into_chunk_records(
    broker: Harness,
) -> None:
    """One more entry than a chunk header's u16 count: cut into chunk records
    of CHUNK_ENTRIES, as any long Publish (it took the per-message path once)."""
    from warren.stream_protocol.publishing import CHUNK_ENTRIES

    client = opened(broker)
    declare(client)
    n = 0x10000
    answers = publish(client, list(range(1, n + 1)), [b"x"] * n)
    assert len(confirmed(answers)) == n
    assert stream_of(broker).stream.next_offset == n
    assert len(records_of(broker)) == -(-n // CHUNK_ENTRIES)


def test_a_publish_of_more_than_chunk_entries_is_several_chunk_records(broker: Harness) -> None:
    """A chunk record holds at most CHUNK_ENTRIES entries, so LAST of one big
    Publish is its last piece, not all of it (rstream's suite checks it against
    RabbitMQ, whose writer cuts chunks small); the confirms are the whole
    Publish's."""
    from warren.stream_protocol.publishing import CHUNK_ENTRIES

    client = opened(broker)
    declare(client)
    n = 2 * CHUNK_ENTRIES + 100
    ids = list(range(1, n + 1))
    payloads = [message(b"%d" % i) for i in ids]
    assert confirmed(publish(client, ids, payloads)) == ids
    assert len(records_of(broker)) == 3
    sub = opened(broker, stream=None)
    frames = sub.raw(encode(schema.Subscribe(sub.next_id(), 1, "s", LAST, 10, [])))
    assert [(first, len(records)) for _s, first, records in deliveries(frames)] == [
        (2 * CHUNK_ENTRIES, 100)
    ]
    assert stream_of(broker).stream.next_offset == n
