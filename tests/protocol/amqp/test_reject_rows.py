"""Rows of single basic.reject and basic.nack (multiple=false) frames in one
read, with consecutive tags and one requeue flag, settled together as
single acks are (amqp/ack_scan.py, Settlement.reject_range, issue 27): what a
client sees is what the frames one by one gave it. Dead-letter copies leave in
tag order, requeued messages come back in their old order, redelivered; an
unknown tag in a row closes the channel there (the tags before it settled);
a stream's delivery in a row is refused with 540 there (the connection
closes; the tags before it settled).

Moved from tests/ to the in-memory harness (tests/harness): one send is one
read of AMQPConnection there, so a row always arrives whole, as meant."""

from __future__ import annotations

import struct

from amqp_runs import _consume, _declare, _fill, _queue_state, _round_trip
from harness import Harness, MemoryAMQP, harness_fixture
from pamqp import commands

REJECT, NACK = 90, 120


def settle_frame(method: int, tag: int, bits: int, channel: int = 1) -> bytes:
    """basic.reject (bits: requeue) or basic.nack (bits: multiple | requeue << 1)."""
    return struct.pack(">BHIHHQB", 1, channel, 13, 60, method, tag, bits) + b"\xce"


def row(method: int, tags: range | list[int], requeue: bool) -> bytes:
    bits = (1 if method == REJECT else 2) if requeue else 0
    return b"".join(settle_frame(method, t, bits) for t in tags)


def receive(c: MemoryAMQP, n: int, channel: int = 1) -> list[tuple[int, bool, bytes]]:
    out = []
    for _ in range(n):
        deliver = c.expect_method(commands.Basic.Deliver, channel=channel)
        _, body = c.expect_content()
        out.append((deliver.delivery_tag, deliver.redelivered, body))
    return out


broker = harness_fixture(segment_size=64 * 1024)


def test_rows_of_rejects_and_nacks_settle_as_the_frames_would(broker: Harness) -> None:
    c = broker.amqp_client(2)
    _declare(c, "rows-dlq", durable=True)
    _declare(
        c,
        "rows",
        durable=True,
        **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "rows-dlq"},
    )
    bodies = [f"r{i:03d}".encode() * (i % 7 + 1) for i in range(300)]
    _fill(c, "rows", bodies, channel=2)
    _consume(c, "rows", prefetch=300)
    assert [t for t, _, _ in receive(c, 300)] == list(range(1, 301))
    c.send(
        row(REJECT, range(1, 101), False)
        + row(NACK, range(101, 151), False)
        + row(REJECT, range(151, 201), True)
        + row(NACK, range(201, 251), True)
        # A row of rejects with both flags: two rows, each settled as its frames.
        + row(REJECT, [251], True)
        + row(REJECT, [252], False)
    )
    # The requeued ones come back in their old order, redelivered; 251 with them.
    back = receive(c, 101)
    assert [(r, b) for _, r, b in back] == [(True, b) for b in bodies[150:251]]
    assert [t for t, _, _ in back] == list(range(301, 402))
    _round_trip(c)
    assert _queue_state(broker, "rows")[:2] == (0, 48 + 101)
    # An unknown tag in the middle of a row: the tags before it are settled.
    c.send(row(REJECT, [253, 254, 255, 999, 256, 257], False))
    assert c.expect_channel_close(1)[:2] == (406, "PRECONDITION_FAILED - unknown delivery tag 999")
    c.send_method(1, commands.Channel.CloseOk())
    _round_trip(c, 2)
    # The rest (256 .. 300, the 101 redelivered) went back on the close.
    assert _queue_state(broker, "rows")[:2] == (45 + 101, 0)
    _consume(c, "rows-dlq", channel=2, tag="dead")
    dead = receive(c, 154, channel=2)
    assert [b for _, _, b in dead] == bodies[:150] + bodies[251:255]
    c.close()


def test_a_row_that_names_a_stream_delivery_is_refused_there(
    broker: Harness,
) -> None:
    c = broker.amqp_client(2)
    c.send_method(
        1,
        commands.Queue.Declare(queue="rows-s", durable=True, arguments={"x-queue-type": "stream"}),
    )
    c.expect_method(commands.Queue.DeclareOk)
    _declare(c, "rows-c")
    _fill(c, "rows-s", [b"s%d" % i for i in range(5)], channel=2)
    _fill(c, "rows-c", [b"c%d" % i for i in range(5)], channel=2)
    _consume(c, "rows-c", prefetch=20, tag="classic")
    assert [t for t, _, _ in receive(c, 5)] == [1, 2, 3, 4, 5]
    c.send_method(
        1,
        commands.Basic.Consume(
            queue="rows-s", consumer_tag="stream", arguments={"x-stream-offset": "first"}
        ),
    )
    c.expect_method(commands.Basic.ConsumeOk, channel=1)
    assert [t for t, _, _ in receive(c, 5)] == [6, 7, 8, 9, 10]
    # 4 .. 8: classic ones, then the stream's: refused at 6, 4 and 5 dropped.
    c.send(row(REJECT, range(4, 9), False))
    close = c.expect_method(commands.Connection.Close, channel=0)
    assert close.reply_code == 540 and "not supported by stream queues" in close.reply_text
    # Resources are released as the close is sent: 1 .. 3 back, 4 and 5 gone.
    assert _queue_state(broker, "rows-c")[:2] == (3, 0)
    c.close_socket()
