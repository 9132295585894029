"""A stream's backlog delivered in spans: many records framed in one pass (C's
deliver_records) and acknowledged as runs, as the one-by-one path would.

In memory, the C framer against the reference (StreamCursor.next and the
frames AMQPConsumer.deliver writes) over real segment files, damaged ones
too; over real sockets (pika), a backlog read with prefetch, acked singly, by
multiple and not at all, with offset tracking across reconnects. The socket
tests run in both passes (pure Python delivers one by one). They keep pika's
batching of a socket's reads (in memory each ack is a loop turn of its own,
and the offset tracking file is rewritten per turn: 50% slower here), so
their pika helpers are below (tests/core/test_streams.py moved to the harness).
"""

from __future__ import annotations

import random
import struct
from pathlib import Path
from typing import Any

import pika
import pytest
from conftest import BrokerThread
from damage_helpers import flip
from hypothesis import given, settings
from hypothesis import strategies as st
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection
from pikahelp import connect, uniq, wait_until

import warren
from examples import examples
from warren.amqp.frames import message_frames
from warren.core.message import Message
from warren.store.stream_store import StreamCursor, StreamStore

_native = warren.native_module("_fastpath")

STREAM = {"x-queue-type": "stream"}


def declare_stream(ch: BlockingChannel, name: str | None = None, **arguments: Any) -> str:
    name = name or uniq("stream")
    ch.queue_declare(name, durable=True, arguments={**STREAM, **arguments})
    return name


def publish(ch: BlockingChannel, queue: str, *bodies: bytes, **props: Any) -> None:
    """Publish with confirms (the channel is put in confirm mode once)."""
    for body in bodies:
        ch.basic_publish("", queue, body, pika.BasicProperties(**props))


class Collector:
    """A consumer on its own channel that records (offset, body) and acks (or
    not) as it goes."""

    def __init__(
        self,
        conn: BlockingConnection,
        queue: str,
        prefetch: int = 100,
        ack: bool = True,
        tag: str = "",
        **arguments: Any,
    ) -> None:
        self.conn = conn
        self.ch = conn.channel()
        self.ch.basic_qos(prefetch_count=prefetch)
        self.got: list[tuple[int, bytes]] = []
        self.tags: list[int] = []
        self.ack = ack
        self.tag = self.ch.basic_consume(
            queue, self._on_message, consumer_tag=tag or None, arguments=arguments
        )

    def _on_message(self, ch: Any, method: Any, props: Any, body: bytes) -> None:
        self.got.append(((props.headers or {})["x-stream-offset"], body))
        self.tags.append(method.delivery_tag)
        if self.ack:
            ch.basic_ack(method.delivery_tag)

    def wait(self, n: int, timeout: float = 5.0) -> list[int]:
        wait_until(self.conn, lambda: len(self.got) >= n, timeout)
        return self.offsets()

    def offsets(self) -> list[int]:
        return [offset for offset, _ in self.got]

    def bodies(self) -> list[bytes]:
        return [body for _, body in self.got]


HEAD = b"\x00\x3c\x00\x3c\x05ctag1"
CHANNEL = 3


def message(i: int) -> Message:
    """Bodies of 0 to ~5,000 bytes (several frames at a small frame_max), properties
    with and without headers, a few exchanges and routing keys."""
    rng = random.Random(i)
    props = [b"\x00\x00", b"\x10\x00\x02", b"\x80\x00\x0atext/plain"][i % 3]
    body = bytes(rng.randrange(256) for _ in range(rng.choice((0, 10, 100, 5000))))
    return Message(["", "ex", "e" * 200][i % 3], f"key-{i % 5}", props, body, 1000 + i)


def reference(cursor: StreamCursor, tag: int, frame_max: int) -> tuple[bytes, int] | None:
    """One delivery as AMQPConsumer.deliver frames it, and its body size."""
    item = cursor.next()
    if item is None:
        return None
    msg = item[1]
    payload = HEAD + struct.pack(">QB", tag, 0) + msg.exchange_and_key()
    return b"".join(message_frames(CHANNEL, payload, msg.properties, msg.body, frame_max)), len(
        msg.body
    )


def spans(cursor: StreamCursor, tag: int, frame_max: int, sizes: list[int]) -> tuple[bytes, int]:
    """What the span path frames from ``cursor``: C's deliver_records while it takes
    records, the reference for one where it stops (damage); (frames, next tag)."""
    assert _native is not None
    rng = random.Random(tag)
    out = []
    while (span := cursor.span()) is not None:
        buf, pos, seed, left = span
        want = min(left, rng.choice((1, 2, 7, 100, 10_000)))
        frames, n, end, raw, _offsets = _native.deliver_records(
            buf, pos, len(buf), seed, want, CHANNEL, HEAD, tag, frame_max
        )
        assert n <= want
        if n:
            cursor.skip(n, end)
            out.append(frames)
            sizes.extend(struct.unpack(f"={n}I", raw))
            tag += n
            continue
        one = reference(cursor, tag, frame_max)
        if one is None:
            break
        out.append(one[0])
        sizes.append(one[1])
        tag += 1
    return b"".join(out), tag


@pytest.mark.skipif(_native is None, reason="warren._fastpath is not built")
@settings(max_examples=examples(15), deadline=None)
@given(
    start=st.integers(0, 70),
    frame_max=st.sampled_from([4096, 131072]),
    damaged=st.lists(st.integers(0, 79), max_size=3),
)
def test_c_frames_a_span_as_the_one_by_one_path(
    tmp_path_factory: pytest.TempPathFactory, start: int, frame_max: int, damaged: list[int]
) -> None:
    d = tmp_path_factory.mktemp("spans") / "s"
    store = StreamStore(d, 16384)  # several segments
    for i in range(80):
        assert store.append(message(i)) == i
    store.flush()
    for i in damaged:  # a flipped byte in a body or the CRC: the record is never served
        sid, pos, _ = store.position_of(i)
        flip(d / f"msgs.{sid:010d}", pos + 40)
    want: list[bytes] = []
    want_sizes = []
    cursor = store.cursor(start)
    tag = 1
    while (one := reference(cursor, tag, frame_max)) is not None:
        want.append(one[0])
        want_sizes.append(one[1])
        tag += 1
    cursor.close()
    sizes: list[int] = []
    cursor = store.cursor(start)
    got, end_tag = spans(cursor, 1, frame_max, sizes)
    cursor.close()
    store.close()
    assert got == b"".join(want)
    assert (sizes, end_tag) == (want_sizes, tag)


def test_a_backlog_read_with_prefetch_and_every_kind_of_ack(broker: BrokerThread) -> None:
    """3,000 messages already in the stream, prefetch 500: every offset once, in
    order, with its body, whether acked singly or by multiple; then a tracking
    consumer that acks the first 1,200 (of 1,600 delivered) resumes at 1,200
    after a reconnect, and after a partial multiple ack where that ended."""
    n = 3000
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    s = declare_stream(ch)
    publish(ch, s, *[f"m{i}".encode() * (i % 50) for i in range(n)])
    reader = Collector(conn, s, prefetch=500, ack=False, **{"x-stream-offset": "first"})
    acked = 0
    while acked < n:
        reader.wait(acked + 1)
        got = len(reader.got)
        if (got // 100) % 2:
            reader.ch.basic_ack(reader.tags[got - 1], multiple=True)
        else:
            for tag in reader.tags[acked:got]:
                reader.ch.basic_ack(tag)
        acked = got
    assert reader.offsets() == list(range(n))
    assert reader.bodies() == [f"m{i}".encode() * (i % 50) for i in range(n)]
    assert reader.tags == list(range(1, n + 1))

    args = {"x-stream-offset": "first", "x-stream-automatic-offset-tracking": True}
    tracked = Collector(conn, s, prefetch=400, ack=False, tag="tracked", **args)
    acked = 0
    while acked < 1200:
        got = min(len(tracked.wait(acked + 1)), 1200)
        for tag in tracked.tags[acked:got]:
            tracked.ch.basic_ack(tag)
        acked = got
    assert tracked.wait(1600)[:1600] == list(range(1600))  # 1,200 .. 1,599 not acked
    conn.close()  # gives them back: tracking stays at 1,200
    conn = connect(broker)
    again = Collector(conn, s, prefetch=300, ack=False, tag="tracked", **args)
    assert again.wait(300)[:300] == list(range(1200, 1500))
    again.ch.basic_ack(again.tags[99], multiple=True)  # up to 1,299
    # The credit brings 1,500 .. 1,599: received before the close, so that pika has
    # nothing pending to reject while closing.
    assert again.wait(400) == list(range(1200, 1600))
    conn.close()
    conn = connect(broker)
    resumed = Collector(conn, s, prefetch=1000, tag="tracked", **args)
    assert resumed.wait(n - 1300, timeout=10) == list(range(1300, n))
    conn.close()


def test_a_tiny_prefetch_and_a_live_tail(broker: BrokerThread, tmp_path: Path) -> None:
    """Prefetch 1 (one by one) and 2 (the smallest span) over a backlog that keeps
    growing while it is read: nothing skipped or repeated."""
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    s = declare_stream(ch)
    publish(ch, s, *[str(i).encode() for i in range(200)])
    readers = [Collector(conn, s, prefetch=p, **{"x-stream-offset": "first"}) for p in (1, 2, 3)]
    publish(ch, s, *[str(i).encode() for i in range(200, 400)])
    for r in readers:
        assert r.wait(400) == list(range(400))
        assert r.bodies() == [str(i).encode() for i in range(400)]
    conn.close()
