"""Publish and Deliver in memory (publishing.py, delivering.py): confirms after
the sync, PublishError codes, deduplication by publisher reference across a
reconnect and a restart, chunks from every offset spec, credit in chunks,
filters, single active consumer hand-over, resource alarms, and the same
stream read over AMQP 0-9-1. Messages are encoded with
rstream's AMQP 1.0 encoder (its bundled pyamqp) and chunks checked with
chunk.py's decoder against rstream's frame decoder."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest
from harness import harness_fixture
from harness.broker import Harness
from harness.held_syncs import HeldSyncs
from harness.stream import MemoryStream, split_frames
from rstream import encoding, schema
from rstream.amqp import AMQPMessage, amqp_decoder

from warren.stream_protocol import commands as c
from warren.stream_protocol.chunk import decode_delivered_chunk, read_records, sub_batch_entry
from warren.stream_protocol.constants import Compression, OffsetType, ResponseCode
from warren.stream_protocol.frames import decode_frame
from warren.stream_protocol.publish import Deliver, Publish, PublishedMessage
from warren.stream_protocol.wire import OffsetSpec

broker = harness_fixture(manual_clock=True)

OK = ResponseCode.OK


def spec(kind: int, value: int | None = None) -> schema.OffsetSpecification:
    """rstream's offset spec: first 1, last 2, next 3 (no value), offset 4, timestamp 5."""
    return schema.OffsetSpecification(offset_type=kind, offset=value)  # type: ignore[arg-type]


FIRST = spec(1)
LAST = spec(2)
NEXT = spec(3)


def opened(broker: Harness, stream: str | None = "s") -> MemoryStream:
    client = MemoryStream(broker)
    assert client.open().response_code == OK
    if stream is not None:
        client.request(schema.Create(client.next_id(), stream, []))
    return client


def message(body: bytes, **props: Any) -> bytes:
    return bytes(AMQPMessage(body=body, **props))


def declare(client: MemoryStream, pid: int = 1, ref: str = "", stream: str = "s") -> None:
    answer = client.request(schema.DeclarePublisher(client.next_id(), pid, ref, stream))
    assert answer.response_code == OK


def publish(
    client: MemoryStream, ids: list[int], bodies: list[bytes], pid: int = 1, **kw: Any
) -> list[Any]:
    msgs = [
        PublishedMessage.simple(i, b, kw.get("filters", {}).get(i))
        for i, b in zip(ids, bodies, strict=True)
    ]
    return [decode_frame(f) for f in client.raw(Publish.of(pid, msgs).encode())]


def encode(frame: Any) -> bytes:
    return bytes(encoding.encode_frame(frame))


def confirmed(answers: list[Any]) -> list[int]:
    out: list[int] = []
    for a in answers:
        assert isinstance(a, c.PublishConfirm), answers
        out += a.publishing_ids
    return out


def deliveries(frames: list[bytes]) -> list[tuple[int, int, list[bytes]]]:
    """(subscription, first offset, records) of each Deliver frame."""
    out = []
    for f in frames:
        d = decode_frame(f)
        if not isinstance(d, Deliver):
            continue
        header, data, entries = decode_delivered_chunk(d.chunk)
        records = [r for e in entries for r in read_records(data, e)]
        out.append((d.subscription_id, header.first_offset, records))
    return out


def bodies(frames: list[bytes]) -> list[bytes]:
    return [amqp_decoder(r).body for _, _, rs in deliveries(frames) for r in rs]


def test_publish_is_confirmed_once_in_one_frame(broker: Harness) -> None:
    client = opened(broker)
    declare(client)
    answers = publish(client, [1, 2, 3], [message(b"a"), message(b"b"), message(b"c")])
    assert len(answers) == 1
    assert confirmed(answers) == [1, 2, 3]


def test_publish_errors(broker: Harness) -> None:
    client = opened(broker)
    unknown = publish(client, [7], [message(b"x")], pid=9)
    assert isinstance(unknown[0], c.PublishError)
    assert unknown[0].errors[0].code == ResponseCode.PUBLISHER_DOES_NOT_EXIST
    missing = client.request(schema.DeclarePublisher(client.next_id(), 1, "", "nope"))
    assert missing.response_code == ResponseCode.STREAM_DOES_NOT_EXIST


def test_deduplication_by_reference_and_query_publisher_sequence(broker: Harness) -> None:
    client = opened(broker)
    declare(client, ref="app")
    assert confirmed(publish(client, [1, 2], [message(b"1"), message(b"2")])) == [1, 2]
    # A duplicate is confirmed, and not stored again.
    assert confirmed(publish(client, [2, 3], [message(b"2"), message(b"3")])) == [3, 2]
    seq = client.request(schema.QueryPublisherSequence(client.next_id(), "app", "s"))
    assert seq.sequence == 3
    again = opened(broker, stream=None)  # a reconnect
    declare(again, ref="app")
    assert confirmed(publish(again, [1, 3, 4], [message(b"1"), message(b"3"), message(b"4")])) == [
        4,
        1,
        3,
    ]
    sub = opened(broker, stream=None)
    frames = sub.raw(encode(schema.Subscribe(sub.next_id(), 1, "s", FIRST, 10, [])))
    assert bodies(frames) == [b"1", b"2", b"3", b"4"]


def test_deduplication_survives_a_restart(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with Harness(data) as first:
        client = opened(first)
        declare(client, ref="app")
        assert confirmed(publish(client, [1, 2], [message(b"1"), message(b"2")])) == [1, 2]
    with Harness(data) as second:
        client = opened(second, stream=None)
        seq = client.request(schema.QueryPublisherSequence(client.next_id(), "app", "s"))
        assert seq.sequence == 2
        declare(client, ref="app")
        assert confirmed(publish(client, [2, 3], [message(b"2"), message(b"3")])) == [3, 2]
        frames = client.raw(encode(schema.Subscribe(client.next_id(), 1, "s", FIRST, 10, [])))
        assert bodies(frames) == [b"1", b"2", b"3"]


def test_offset_specs(broker: Harness) -> None:
    client = opened(broker)
    declare(client)
    publish(client, [1, 2, 3], [message(b"a"), message(b"b"), message(b"c")])
    sub = opened(broker, stream=None)
    # The Publish is one chunk, sent whole as RabbitMQ does: LAST and offset 1
    # start inside it, and the client skips what it did not ask for.
    cases = {1: (FIRST, [b"a", b"b", b"c"]), 2: (LAST, [b"a", b"b", b"c"]), 3: (NEXT, [])}
    cases[4] = (spec(4, 1), [b"a", b"b", b"c"])
    cases[5] = (spec(5, 0), [b"a", b"b", b"c"])  # timestamp 0: from the start
    for sid, (offset, expected) in cases.items():
        frames = sub.raw(encode(schema.Subscribe(sub.next_id(), sid, "s", offset, 10, [])))
        got = [amqp_decoder(r).body for s, _, rs in deliveries(frames) if s == sid for r in rs]
        assert got == expected, sid
    # Offsets in the chunks are the stream's.
    firsts = {s: f for s, f, _ in deliveries(sub.raw(b""))}
    assert firsts == {}
    publish(client, [4], [message(b"d")])
    frames = sub.raw(b"")
    assert sorted((s, f) for s, f, _ in deliveries(frames)) == [(i, 3) for i in range(1, 6)]


def test_credit_counts_chunks(broker: Harness) -> None:
    client = opened(broker)
    declare(client)
    sub = opened(broker, stream=None)
    assert sub.request(schema.Subscribe(sub.next_id(), 1, "s", NEXT, 1, [])).response_code == OK
    publish(client, [1, 2], [message(b"a"), message(b"b")])
    first = deliveries(sub.raw(b""))
    assert [len(rs) for _, _, rs in first] == [2]  # one chunk, one credit
    publish(client, [3], [message(b"c")])
    assert deliveries(sub.raw(b"")) == []  # no credit left
    later = deliveries(sub.raw(encode(schema.Credit(1, 1))))
    assert [(f, len(rs)) for _, f, rs in later] == [(2, 1)]


def test_filters(broker: Harness) -> None:
    client = opened(broker)
    declare(client)
    filters = {1: "red", 2: "blue"}
    answers = publish(
        client, [1, 2, 3], [message(b"r"), message(b"b"), message(b"n")], filters=filters
    )
    assert confirmed(answers) == [1, 2, 3]
    sub = opened(broker, stream=None)
    red = [schema.Property("filter.0", "red")]
    frames = sub.raw(encode(schema.Subscribe(sub.next_id(), 1, "s", FIRST, 10, red)))
    assert bodies(frames) == [b"r"]
    both = [*red, schema.Property("match-unfiltered", "true")]
    frames = sub.raw(encode(schema.Subscribe(sub.next_id(), 2, "s", FIRST, 10, both)))
    got = deliveries(frames)
    assert [(f, [amqp_decoder(r).body for r in rs]) for _, f, rs in got] == [
        (0, [b"r"]),
        (2, [b"n"]),
    ]


def test_stream_protocol_and_amqp_091_read_the_same_stream(broker: Harness) -> None:
    client = opened(broker)
    declare(client)
    props = {"application_properties": {b"k": b"v"}}
    publish(client, [1], [message(b"from-stream", **props)])
    conn = broker.amqp_connection()
    ch = conn.channel()
    ch.basic_qos(prefetch_count=10)
    ch.basic_consume("s", arguments={"x-stream-offset": "first"})
    got = ch.next_delivery()
    assert got.body == b"from-stream"
    assert got.properties.headers["k"] == "v"
    assert got.properties.headers["x-stream-offset"] == 0
    ch.basic_publish("", "s", b"from-091")
    sub = opened(broker, stream=None)
    frames = sub.raw(encode(schema.Subscribe(sub.next_id(), 1, "s", FIRST, 10, [])))
    assert bodies(frames) == [b"from-stream", b"from-091"]


def test_raw_bytes_come_back_as_they_were(broker: Harness) -> None:
    client = opened(broker)
    declare(client)
    assert confirmed(publish(client, [1], [b"not amqp"])) == [1]
    sub = opened(broker, stream=None)
    frames = sub.raw(encode(schema.Subscribe(sub.next_id(), 1, "s", FIRST, 10, [])))
    assert [r for _, _, rs in deliveries(frames) for r in rs] == [b"not amqp"]


def test_a_stream_deleted_under_a_subscription(broker: Harness) -> None:
    client = opened(broker)
    sub = opened(broker, stream=None)
    assert sub.request(schema.Subscribe(sub.next_id(), 1, "s", FIRST, 10, [])).response_code == OK
    broker.call(lambda: broker.broker.vhosts["/"].delete_queue("s"))
    frames = [decode_frame(f) for f in sub.raw(b"")]
    assert frames == [c.MetadataUpdate(ResponseCode.STREAM_NOT_AVAILABLE, "s")]
    assert sub.conn.control.subscriptions == {}
    assert sub.conn.control.delivering.consumers == {}
    # The deleting connection's own subscription: the answer, then the update.
    client.request(schema.Create(client.next_id(), "t", []))
    client.raw(encode(schema.Subscribe(client.next_id(), 1, "t", FIRST, 10, [])))
    answers = [decode_frame(f) for f in client.raw(encode(schema.Delete(client.next_id(), "t")))]
    assert [type(a) for a in answers] == [c.DeleteResponse, c.MetadataUpdate]


def test_unsubscribe_stops_deliveries(broker: Harness) -> None:
    client = opened(broker)
    declare(client)
    sub = opened(broker, stream=None)
    frames = sub.raw(encode(schema.Subscribe(sub.next_id(), 1, "s", NEXT, 10, [])))
    assert sub.request(schema.Unsubscribe(sub.next_id(), 1)).response_code == OK
    publish(client, [1], [message(b"a")])
    assert deliveries(sub.raw(b"")) == []
    assert frames


def test_a_gzip_sub_entry_batch_is_one_publishing_id(broker: Harness) -> None:
    client = opened(broker)
    declare(client)
    entry = sub_batch_entry([message(b"x"), message(b"y")], Compression.GZIP)
    frame = Publish.of(1, [PublishedMessage(5, entry)]).encode()
    assert confirmed([decode_frame(f) for f in client.raw(frame)]) == [5]
    sub = opened(broker, stream=None)
    frames = sub.raw(encode(schema.Subscribe(sub.next_id(), 1, "s", FIRST, 10, [])))
    assert bodies(frames) == [b"x", b"y"]


def test_a_resource_alarm_stops_reading_a_publishing_connection(broker: Harness) -> None:
    client = opened(broker)
    reading: list[bool] = []
    client.conn.reading_control = reading.append
    broker.call(lambda: client.conn.set_blocked(True))
    assert reading == []  # no publisher: reading goes on
    refused = client.request(schema.DeclarePublisher(client.next_id(), 1, "", "s"))
    assert refused.response_code == ResponseCode.PRECONDITION_FAILED
    broker.call(lambda: client.conn.set_blocked(False))
    declare(client)
    broker.call(lambda: client.conn.set_blocked(True))
    assert reading == [True, False]
    broker.call(lambda: client.conn.set_blocked(False))
    assert reading == [True, False, True]


def test_single_active_consumer_hand_over(broker: Harness) -> None:
    client = opened(broker)
    declare(client)
    publish(client, [1, 2], [message(b"a"), message(b"b")])
    sac = [schema.Property("single-active-consumer", "true"), schema.Property("name", "g")]
    one, two = opened(broker, stream=None), opened(broker, stream=None)
    frames = [
        decode_frame(f) for f in one.raw(encode(schema.Subscribe(50, 1, "s", FIRST, 10, sac)))
    ]
    assert [type(f) for f in frames] == [c.SubscribeResponse, c.ConsumerUpdate]
    update = frames[1]
    assert (update.subscription_id, update.active) == (1, True)
    frames = [decode_frame(f) for f in two.raw(encode(schema.Subscribe(60, 7, "s", NEXT, 10, sac)))]
    assert [type(f) for f in frames] == [c.SubscribeResponse]  # waits, unannounced
    # The active one starts where its answer says: offset 1, inside the chunk
    # of the Publish, which comes whole (the client skips offset 0).
    answer = c.ConsumerUpdateResponse(update.correlation_id, OK, OffsetSpec(OffsetType.OFFSET, 1))
    assert bodies(one.raw(answer.encode())) == [b"a", b"b"]
    publish(client, [3], [message(b"c")])
    assert bodies(one.raw(b"")) == [b"c"]
    assert deliveries(two.raw(b"")) == []
    # The active one goes: the other is told, and starts as it subscribed (next).
    assert one.request(schema.Unsubscribe(51, 1)).response_code == OK
    frames = [decode_frame(f) for f in two.raw(b"")]
    assert [(type(f), f.subscription_id, f.active) for f in frames] == [(c.ConsumerUpdate, 7, True)]
    answer = c.ConsumerUpdateResponse(frames[0].correlation_id, OK, OffsetSpec(OffsetType.NONE))
    assert deliveries(two.raw(answer.encode())) == []
    publish(client, [4], [message(b"d")])
    assert bodies(two.raw(b"")) == [b"d"]


def test_a_closed_connection_hands_single_active_over(broker: Harness) -> None:
    sac = [schema.Property("single-active-consumer", "true"), schema.Property("name", "g")]
    opened(broker)
    one, two = opened(broker, stream=None), opened(broker, stream=None)
    one.raw(encode(schema.Subscribe(50, 1, "s", FIRST, 10, sac)))
    assert [
        type(decode_frame(f)) for f in two.raw(encode(schema.Subscribe(60, 2, "s", FIRST, 10, sac)))
    ] == [c.SubscribeResponse]
    broker.call(one.conn.connection_lost)
    frames = [decode_frame(f) for f in two.raw(b"")]
    assert [(type(f), f.subscription_id, f.active) for f in frames] == [(c.ConsumerUpdate, 2, True)]


def test_a_timestamp_offset_spec_starts_at_the_first_record_stored_then(broker: Harness) -> None:
    client = opened(broker)
    declare(client)
    publish(client, [1], [message(b"early")])
    broker.advance(60_000)
    then = broker.broker.clock.now_ms()
    publish(client, [2], [message(b"late")])
    sub = opened(broker, stream=None)
    frames = sub.raw(encode(schema.Subscribe(sub.next_id(), 1, "s", spec(5, then), 10, [])))
    got = deliveries(frames)
    assert [(f, [amqp_decoder(r).body for r in rs]) for _, f, rs in got] == [(1, [b"late"])]
    # The chunk's timestamp is the record's.
    chunk = decode_frame(frames[1])
    assert isinstance(chunk, Deliver)
    header, _, _ = decode_delivered_chunk(chunk.chunk)
    assert header.timestamp == then


def test_offset_commands_cannot_reach_a_publishers_sequence(broker: Harness) -> None:
    client = opened(broker)
    declare(client, ref="app")
    publish(client, [5], [message(b"a")])
    hidden = "\x00pub\x00app"
    assert client.send(schema.StoreOffset("s", hidden, 0)) == []
    seq = client.request(schema.QueryPublisherSequence(client.next_id(), "app", "s"))
    assert seq.sequence == 5
    query = client.request(schema.QueryOffset(client.next_id(), hidden, "s"))
    assert query.response_code == ResponseCode.NO_OFFSET


def test_publish_confirm_waits_for_its_sync_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the group commit's file syncs held, the broker does all it can and
    no PublishConfirm is written; once they are let go it comes."""
    syncs = HeldSyncs(monkeypatch)
    with Harness(tmp_path / "data") as harness:
        client = opened(harness)
        declare(client)
        frame = Publish.of(1, [PublishedMessage.simple(1, message(b"a"))]).encode()
        conn = client.conn
        syncs.hold()
        try:
            harness.call(lambda: conn.feed(frame))
            assert syncs.waiting.wait(30), "no sync round started"
            harness.run_ready()
            assert client.take() == b""
        finally:
            syncs.release()
        harness.settle()
        answers = [decode_frame(f) for f in split_frames(client.take())]
        assert confirmed(answers) == [1]


def test_a_snappy_sub_entry_batch_is_stored_closed(broker: Harness) -> None:
    """Kept as it came, one offset per record (test_stream_sub_entry_batches.py)."""
    client = opened(broker)
    declare(client)
    body = b"\x00" * 8  # never looked into: the broker has no snappy codec
    entry = struct.pack(">BHII", 0x80 | (Compression.SNAPPY << 4), 3, 100, len(body)) + body
    frame = Publish.of(1, [PublishedMessage(9, entry)]).encode()
    assert confirmed([decode_frame(f) for f in client.raw(frame)]) == [9]
    assert broker.broker.vhosts["/"].queues["s"].stream.next_offset == 3
