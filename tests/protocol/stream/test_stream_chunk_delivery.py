"""An AMQP 0-9-1 consumer of chunk records through the delivery pass (issue 31):
in the compiled build a chunk record's messages go out in spans framed in C
(warren._fastpath's deliver_entries), a message C does not frame (no AMQP
1.0 message) and the rest of its record one by one; in the pure build all
one by one. Either way the consumer sees the same deliveries, and a multiple
ack settles them all. Messages encoded by rstream (the oracle), read by the
harness's 0-9-1 client (pamqp)."""

from __future__ import annotations

from harness import harness_fixture
from harness.broker import Harness
from rstream._pyamqp.message import Properties  # type: ignore[import-untyped]
from test_stream_chunk_records import stream_of
from test_stream_publish_deliver import confirmed, declare, message, opened, publish

import warren

broker = harness_fixture(manual_clock=True)


def test_091_reads_chunk_records_in_spans_and_one_by_one_alike(broker: Harness) -> None:
    client = opened(broker)
    declare(client)
    first = [message(f"a{i}".encode()) for i in range(10)]
    second = [
        message(b"b0"),
        message(b"b1", application_properties={b"k": b"v"}),
        b"not amqp",
        message(b"b3"),
    ]
    third = [
        message(
            f"c{i}".encode(),
            properties=Properties(message_id="id", content_type="text/plain"),
        )
        for i in range(5)
    ]
    ids = 1
    for chunk in (first, second, third):
        assert confirmed(publish(client, list(range(ids, ids + len(chunk))), chunk))
        ids += len(chunk)
    conn = broker.amqp_connection()
    ch = conn.channel()
    ch.basic_qos(prefetch_count=100)
    ch.basic_consume("s", arguments={"x-stream-offset": "first"})
    got = [ch.next_delivery() for _ in range(19)]
    assert [d.body for d in got] == [
        *(f"a{i}".encode() for i in range(10)),
        b"b0",
        b"b1",
        b"not amqp",
        b"b3",
        *(f"c{i}".encode() for i in range(5)),
    ]
    assert [d.properties.headers["x-stream-offset"] for d in got] == list(range(19))
    assert [d.method.delivery_tag for d in got] == list(range(1, 20))
    assert all(d.method.routing_key == "s" and not d.method.redelivered for d in got)
    stamps = {d.properties.headers["x-stream-timestamp"] for d in got}
    assert len(stamps) <= 3 and all(isinstance(t, int) for t in stamps)
    assert got[11].properties.headers["k"] == "v"
    assert [(d.properties.message_id, d.properties.content_type) for d in got[14:]] == [
        ("id", "text/plain")
    ] * 5
    q = stream_of(broker)
    native = warren.native_module("_fastpath")
    if native is not None and hasattr(native, "deliver_entries"):
        # The first record in one span; the second's first two (C stops at
        # its third) and the third record's in spans.
        assert sorted((s.first, s.left) for s in q.reading.spans.values()) == [
            (0, 10),
            (10, 2),
            (14, 5),
        ]
    assert q.unacked == 19
    ch.basic_ack(got[-1].method.delivery_tag, multiple=True)
    broker.settle()
    assert q.unacked == 0
    assert not q.reading.spans and not q.reading.deliveries
