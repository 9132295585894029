"""Stream queues (x-queue-type: stream) as a client sees them.

Offsets from 0 on every delivery, every x-stream-offset form, independent
consumers, server-side offset tracking across a reconnect and a restart (an
unacked delivery is never skipped), filters, retention by whole segments, and
what a stream refuses.

In memory (issue 29): a tests/harness broker, pika's calls over MemoryAMQP
(harness.channel, frames by pamqp; pika over a socket before); a restart is a
new Harness on the same data dir, retention by age runs on its ManualClock.
aio-pika reading a stream stays on a socket: the client library is the point.
"""

from __future__ import annotations

import asyncio
import datetime
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aio_pika
import pytest
from conftest import BrokerThread, start_broker
from harness import Channel, ChannelClosed, Connection, ConnectionClosed, Harness, harness_fixture
from harness.channel import uniq
from pamqp import commands

from warren.core.clock import ManualClock

STREAM = {"x-queue-type": "stream"}

broker = harness_fixture()


def connect(broker: Harness) -> Connection:
    return broker.amqp_connection()


def declare_stream(ch: Channel, name: str | None = None, **arguments: Any) -> str:
    name = name or uniq("stream")
    ch.queue_declare(name, durable=True, arguments={**STREAM, **arguments})
    return name


def publish(ch: Channel, queue: str, *bodies: bytes, **props: Any) -> None:
    """Publish with confirms (the channel is put in confirm mode once)."""
    for body in bodies:
        ch.basic_publish("", queue, body, commands.Basic.Properties(**props))


class Collector:
    """A consumer on its own channel that records (offset, body, headers) and acks
    (or not) as it goes."""

    def __init__(
        self,
        conn: Connection,
        queue: str,
        prefetch: int = 100,
        ack: bool = True,
        tag: str = "",
        **arguments: Any,
    ) -> None:
        self.conn = conn
        self.ch = conn.channel()
        self.ch.basic_qos(prefetch_count=prefetch)
        self.got: list[tuple[int, bytes, dict[str, Any]]] = []
        self.tags: list[int] = []
        self.ack = ack
        self.tag = self.ch.basic_consume(
            queue, self._on_message, consumer_tag=tag or None, arguments=arguments
        )

    def _on_message(self, ch: Any, method: Any, props: Any, body: bytes) -> None:
        headers = props.headers or {}
        self.got.append((headers["x-stream-offset"], body, headers))
        self.tags.append(method.delivery_tag)
        if self.ack:
            ch.basic_ack(method.delivery_tag)

    def wait(self, n: int) -> list[int]:
        """The offsets once ``n`` have come (frames read until then)."""
        while len(self.got) < n:
            self.conn.read_one()
        return [offset for offset, _, _ in self.got]

    def offsets(self) -> list[int]:
        return [offset for offset, _, _ in self.got]

    def bodies(self) -> list[bytes]:
        return [body for _, body, _ in self.got]


@pytest.fixture
def conn(broker: Harness) -> Iterator[Connection]:
    c = connect(broker)
    try:
        yield c
    finally:
        if c.is_open:
            c.close()


def test_offsets_start_at_zero_and_every_delivery_carries_them(conn: Connection) -> None:
    ch = conn.channel()
    ch.confirm_delivery()
    s = declare_stream(ch)
    before = int(time.time() * 1000)
    publish(ch, s, *[f"m{i}".encode() for i in range(5)], headers={"k": "v"})
    assert ch.queue_declare(s, passive=True).method.message_count == 5
    c = Collector(conn, s, **{"x-stream-offset": "first"})
    assert c.wait(5) == [0, 1, 2, 3, 4]
    assert c.bodies() == [b"m0", b"m1", b"m2", b"m3", b"m4"]
    for _, _, headers in c.got:
        assert headers["k"] == "v"
        assert before <= headers["x-stream-timestamp"] <= int(time.time() * 1000)
    # Consuming removed nothing.
    assert ch.queue_declare(s, passive=True).method.message_count == 5


def test_every_x_stream_offset_form(conn: Connection) -> None:
    ch = conn.channel()
    ch.confirm_delivery()
    s = declare_stream(ch)
    publish(ch, s, *[f"m{i}".encode() for i in range(10)])
    cases: list[tuple[Any, list[int]]] = [
        ("first", list(range(10))),
        ("last", [9]),
        (4, [4, 5, 6, 7, 8, 9]),
        (-3, list(range(10))),  # a negative offset is the start, as in RabbitMQ
        (datetime.datetime(2000, 1, 1, tzinfo=datetime.UTC), list(range(10))),
        ("1h", list(range(10))),
    ]
    collectors = [(Collector(conn, s, **{"x-stream-offset": v}), want) for v, want in cases]
    nxt = Collector(conn, s, **{"x-stream-offset": "next"})
    default = Collector(conn, s)  # no argument: next, as in RabbitMQ
    ahead = Collector(conn, s, **{"x-stream-offset": 11})  # waits for offset 11
    for c, want in collectors:
        assert c.wait(len(want)) == want, c.got
    publish(ch, s, b"later")
    for c, want in collectors:
        assert c.wait(len(want) + 1)[-1] == 10
        assert c.offsets() == [*want, 10]
    assert nxt.wait(1) == [10]
    assert default.wait(1) == [10]
    publish(ch, s, b"even later")
    assert ahead.wait(1) == [11]  # 10 was before its start


def test_consumers_read_independently(conn: Connection) -> None:
    ch = conn.channel()
    ch.confirm_delivery()
    s = declare_stream(ch)
    publish(ch, s, *[str(i).encode() for i in range(50)])
    a = Collector(conn, s, prefetch=7, **{"x-stream-offset": "first"})
    b = Collector(conn, s, prefetch=3, **{"x-stream-offset": 25})
    assert a.wait(50) == list(range(50))
    assert b.wait(25) == list(range(25, 50))


def test_prefetch_bounds_unacked_deliveries(conn: Connection) -> None:
    ch = conn.channel()
    ch.confirm_delivery()
    s = declare_stream(ch)
    publish(ch, s, *[str(i).encode() for i in range(20)])
    c = Collector(conn, s, prefetch=5, ack=False, **{"x-stream-offset": "first"})
    c.wait(5)
    conn.pump()  # all the broker does now: no sixth delivery
    assert c.offsets() == [0, 1, 2, 3, 4]
    c.ch.basic_ack(c.tags[-1], multiple=True)
    assert c.wait(10) == list(range(10))


def test_tracking_resumes_after_the_last_acked_message(broker: Harness) -> None:
    """Automatic tracking stores the offset after the last message acked in order:
    a delivery that was not acked comes again after a reconnect."""
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    s = declare_stream(ch)
    publish(ch, s, *[str(i).encode() for i in range(10)])
    args = {"x-stream-offset": "first", "x-stream-automatic-offset-tracking": True}
    c = Collector(conn, s, prefetch=5, ack=False, tag="tracked", **args)
    c.wait(5)
    c.ch.basic_ack(c.tags[2], multiple=True)  # 0, 1, 2 acked; 3, 4 in flight
    c.ch.basic_ack(c.tags[4])  # 4 acked out of order: 3 still unacked
    # The credit brings 5..8 (not acked either); received before the close.
    assert c.wait(9) == list(range(9))
    conn.close()

    conn = connect(broker)
    again = Collector(conn, s, tag="tracked", **args)
    assert again.wait(7) == [3, 4, 5, 6, 7, 8, 9]
    conn.close()
    conn = connect(broker)  # everything acked now: nothing old comes back
    ch = conn.channel()
    ch.confirm_delivery()
    resumed = Collector(conn, s, tag="tracked", **args)
    publish(ch, s, b"10")
    assert resumed.wait(1) == [10]
    # Another tag is not affected by that one's position.
    other = Collector(conn, s, tag="other", **args)
    assert other.wait(11) == list(range(11))
    conn.close()


def test_tracking_survives_a_restart(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with Harness(data) as broker:
        conn = connect(broker)
        ch = conn.channel()
        ch.confirm_delivery()
        s = declare_stream(ch)
        publish(ch, s, *[str(i).encode() for i in range(6)])
        c = Collector(conn, s, prefetch=10, ack=False, tag="t", **{"x-stream-offset": None})
        c.wait(6)
        c.ch.basic_ack(c.tags[3], multiple=True)  # 0..3 acked, 4 and 5 not
        c.ch.barrier()
    with Harness(data) as broker:
        conn = connect(broker)
        ch = conn.channel()
        ch.confirm_delivery()
        assert ch.queue_declare(s, passive=True).method.message_count == 6
        publish(ch, s, b"6")
        again = Collector(conn, s, tag="t", **{"x-stream-offset": None})
        assert again.wait(3) == [4, 5, 6]
        fresh = Collector(conn, s, **{"x-stream-offset": "first"})
        assert fresh.wait(7) == list(range(7))
        conn.close()


def test_filters(conn: Connection) -> None:
    ch = conn.channel()
    ch.confirm_delivery()
    s = declare_stream(ch)
    for i, value in enumerate(["red", "blue", None, "red", "green"]):
        headers = {} if value is None else {"x-stream-filter-value": value}
        ch.basic_publish("", s, str(i).encode(), commands.Basic.Properties(headers=headers))
    red = Collector(conn, s, **{"x-stream-offset": "first", "x-stream-filter": "red"})
    several = Collector(
        conn,
        s,
        **{
            "x-stream-offset": "first",
            "x-stream-filter": ["blue", "green"],
            "x-stream-match-unfiltered": True,
        },
    )
    everything = Collector(conn, s, **{"x-stream-offset": "first"})
    assert everything.wait(5) == [0, 1, 2, 3, 4]
    assert red.wait(2) == [0, 3]
    assert several.wait(3) == [1, 2, 4]


def test_retention_drops_whole_segments_from_the_front(conn: Connection) -> None:
    ch = conn.channel()
    ch.confirm_delivery()
    s = declare_stream(ch, **{"x-max-length-bytes": 4000, "x-stream-max-segment-size-bytes": 1000})
    publish(ch, s, *[b"x" * 100 for _ in range(100)])
    count = ch.queue_declare(s, passive=True).method.message_count
    assert 0 < count < 100
    c = Collector(conn, s, **{"x-stream-offset": "first"})
    offsets = c.wait(count)
    assert offsets == list(range(100 - count, 100))
    # An offset retention removed starts at the oldest one still there.
    old = Collector(conn, s, **{"x-stream-offset": 0})
    assert old.wait(count)[0] == 100 - count


def test_streams_survive_a_restart(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with Harness(data) as broker:
        conn = connect(broker)
        ch = conn.channel()
        ch.confirm_delivery()
        s = declare_stream(ch, **{"x-stream-max-segment-size-bytes": 500})
        publish(ch, s, *[f"m{i}".encode() for i in range(30)])
        conn.close()
    with Harness(data) as broker:
        conn = connect(broker)
        ch = conn.channel()
        ch.confirm_delivery()
        publish(ch, s, b"m30")
        c = Collector(conn, s, **{"x-stream-offset": 17})
        assert c.wait(14) == list(range(17, 31))
        assert c.bodies()[-1] == b"m30"
        conn.close()


def test_what_a_stream_refuses(broker: Harness) -> None:
    """RabbitMQ's codes and texts: 540 (connection) for basic.get, purge, nack and
    no-ack consumers; 406 (channel) for a consumer without a prefetch limit, a
    consumer priority, and non-durable, exclusive or auto-delete streams."""
    conn = connect(broker)
    s = declare_stream(conn.channel())
    what = f"queue '{s}' in vhost '/'"
    refused_540: list[tuple[Any, str]] = [
        (lambda ch: ch.basic_get(s), f"basic.get not supported by stream queues {what}"),
        (lambda ch: ch.queue_purge(s), f"queue.purge not supported by stream queues {what}"),
        (
            lambda ch: ch.basic_consume(s, lambda *a: None, auto_ack=True),
            f"automatic acknowledgement not supported by stream queues {what}",
        ),
    ]
    for call, text in refused_540:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=10)
        with pytest.raises(ConnectionClosed) as closed:
            call(ch)
        assert (closed.value.reply_code, closed.value.reply_text) == (
            540,
            f"NOT_IMPLEMENTED - {text}",
        )
        conn = connect(broker)

    ch = conn.channel()
    ch.confirm_delivery()
    publish(ch, s, b"m")
    c = Collector(conn, s, ack=False, **{"x-stream-offset": "first"})
    c.wait(1)
    with pytest.raises(ConnectionClosed) as closed:
        c.ch.basic_nack(c.tags[0], requeue=True)
        conn.pump()
    assert closed.value.reply_code == 540
    conn = connect(broker)

    ch = conn.channel()  # no basic.qos: no prefetch limit
    with pytest.raises(ChannelClosed) as caught:
        ch.basic_consume(s, lambda *a: None)
    assert caught.value.reply_text == (
        f"PRECONDITION_FAILED - consumer prefetch count is not set for '{what}'"
    )
    ch = conn.channel()
    ch.basic_qos(prefetch_count=1)
    with pytest.raises(ChannelClosed) as caught:
        ch.basic_consume(s, lambda *a: None, arguments={"x-priority": 5})
    assert caught.value.reply_code == 406
    for flag, name in (
        ("durable", "non-durable"),
        ("exclusive", "exclusive-owner"),
        ("auto_delete", "auto-delete"),
    ):
        ch = conn.channel()
        bad = uniq("bad")
        kwargs = {"durable": flag != "durable", flag: flag != "durable"}
        with pytest.raises(ChannelClosed) as caught:
            ch.queue_declare(bad, arguments=STREAM, **kwargs)
        assert caught.value.reply_text == (
            f"PRECONDITION_FAILED - invalid property '{name}' for queue '{bad}' in vhost '/'"
        )
    conn.close()


@pytest.fixture
def socket_broker(tmp_path: Path) -> Iterator[BrokerThread]:
    b = start_broker(tmp_path / "socket")
    try:
        yield b
    finally:
        b.stop()


def test_aio_pika_reads_a_stream(socket_broker: BrokerThread) -> None:
    broker = socket_broker

    async def run() -> list[int]:
        connection = await aio_pika.connect(broker.url)
        async with connection:
            channel = await connection.channel(publisher_confirms=True)
            queue = await channel.declare_queue(uniq("aio"), durable=True, arguments=STREAM)
            for i in range(3):
                await channel.default_exchange.publish(
                    aio_pika.Message(str(i).encode()), routing_key=queue.name
                )
            await channel.set_qos(prefetch_count=10)
            offsets: list[int] = []
            async with queue.iterator(arguments={"x-stream-offset": "first"}) as it:
                async for message in it:
                    await message.ack()
                    offsets.append(int(message.headers["x-stream-offset"]))  # type: ignore[arg-type]
                    if len(offsets) == 3:
                        break
            return offsets

    assert asyncio.run(run()) == [0, 1, 2]


def test_retention_by_count_and_by_policy(broker: Harness) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    by_count = declare_stream(ch, **{"x-max-length": 20, "x-stream-max-segment-size-bytes": 1000})
    publish(ch, by_count, *[b"x" * 100 for _ in range(100)])
    kept = ch.queue_declare(by_count, passive=True).method.message_count
    assert 20 <= kept < 40  # whole segments: at least the limit, less than one more segment

    by_policy = declare_stream(ch, **{"x-stream-max-segment-size-bytes": 1000})
    publish(ch, by_policy, *[b"x" * 100 for _ in range(100)])
    assert ch.queue_declare(by_policy, passive=True).method.message_count == 100
    broker.call(
        lambda: broker.broker.set_policy(
            "/", "stream-bytes", f"^{by_policy}$", {"max-length-bytes": 3000}, 0, "queues"
        )
    )
    count = ch.queue_declare(by_policy, passive=True).method.message_count
    assert 0 < count < 50
    c = Collector(conn, by_policy, **{"x-stream-offset": "first"})
    assert c.wait(count) == list(range(100 - count, 100))
    conn.close()


def test_retention_by_age(tmp_path: Path) -> None:
    """Segments whose newest message is older than x-max-age go on the next publish
    (the broker's ManualClock is moved past the age)."""
    with Harness(tmp_path / "data", clock=ManualClock()) as broker:
        conn = connect(broker)
        ch = conn.channel()
        ch.confirm_delivery()
        s = declare_stream(ch, **{"x-max-age": "1s", "x-stream-max-segment-size-bytes": 1000})
        publish(ch, s, *[b"x" * 100 for _ in range(30)])
        assert ch.queue_declare(s, passive=True).method.message_count == 30
        broker.advance(1000)
        publish(ch, s, b"edge")  # the first 30 are 1 s old: not older than the age
        assert ch.queue_declare(s, passive=True).method.message_count == 31
        broker.advance(1)
        publish(ch, s, b"new")  # now they are: their full segments go
        count = ch.queue_declare(s, passive=True).method.message_count
        assert 2 <= count < 32
        c = Collector(conn, s, **{"x-stream-offset": "first"})
        assert c.wait(count) == list(range(32 - count, 32))
        assert c.bodies()[-2:] == [b"edge", b"new"]
        conn.close()


def test_late_acks_of_a_cancelled_tracking_consumer_do_not_move_its_position(
    broker: Harness,
) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    s = declare_stream(ch)
    publish(ch, s, *[str(i).encode() for i in range(6)])
    args = {"x-stream-offset": "first", "x-stream-automatic-offset-tracking": True}
    old = Collector(conn, s, prefetch=3, ack=False, tag="t", **args)
    old.wait(3)
    old.ch.basic_cancel(old.tag)  # position stored: 0 (nothing acked)
    newer = Collector(conn, s, tag="t", **args)
    assert newer.wait(6) == list(range(6))  # resumed at 0, acked all: position 6
    newer.ch.basic_cancel(newer.tag)  # stores 6
    old.ch.basic_ack(old.tags[-1], multiple=True)  # late acks of the cancelled one
    publish(ch, s, b"6")
    again = Collector(conn, s, tag="t", **args)
    assert again.wait(1) == [6]
    conn.close()
