"""A follower's read-only stream service (amqp/replica.py) over real sockets:
a leader broker and a follower in one process, pika reading the follower's
copy of a stream as it grows, and the leader naming the follower to clients."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import pytest
from conftest import new_event_loop
from test_replication import Leader

from warren import Config
from warren.amqp.replica_server import ReplicaReadServer
from warren.cluster.follower import Follower


class ReadingFollower:
    """A follower whose loop also serves stream reads from its directory."""

    def __init__(self, data_dir: Path, node_id: str, port: int) -> None:
        self.loop = new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        config = Config(data_dir=str(data_dir), clustering_stream_read_port=0)
        self.reads = ReplicaReadServer(config, data_dir, lambda: "amqp://leader.example:5672")
        self.run(self.reads.start())
        self.follower = Follower(
            data_dir,
            node_id,
            "s3cret",
            stream_reads=f"127.0.0.1:{self.reads.port}",
            on_synced=self.reads.applied,
        )
        self.task = asyncio.run_coroutine_threadsafe(
            self.follower.run("127.0.0.1", port), self.loop
        )
        self.run(self.follower.synced.wait())

    def run(self, coro: Any, timeout: float = 30) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.task.cancel)
        self.run(self.reads.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[Leader, ReadingFollower]]:
    leader = Leader(tmp_path / "leader")
    follower = None
    try:
        follower = ReadingFollower(tmp_path / "follower", "f1", leader.port)
        yield leader, follower
    finally:
        if follower is not None:
            follower.stop()
        leader.stop()


def _connect(port: int) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))


def _publish(port: int, queue: str, bodies: list[bytes]) -> None:
    with _connect(port) as conn:
        ch = conn.channel()
        ch.queue_declare(queue, durable=True, arguments={"x-queue-type": "stream"})
        ch.confirm_delivery()
        for body in bodies:
            ch.basic_publish("", queue, body, pika.BasicProperties(headers={"n": body.decode()}))


def _read(ch: Any, queue: str, count: int, offset: Any = "first") -> list[tuple[int, bytes]]:
    got: list[tuple[int, bytes]] = []
    ch.basic_qos(prefetch_count=10)
    for method, props, body in ch.consume(queue, arguments={"x-stream-offset": offset}):
        got.append((props.headers["x-stream-offset"], body))
        assert props.headers["n"] == body.decode()
        ch.basic_ack(method.delivery_tag)
        if len(got) == count:
            break
    ch.cancel()
    return got


def test_a_follower_serves_a_stream_as_it_grows(
    cluster: tuple[Leader, ReadingFollower],
) -> None:
    leader, follower = cluster
    _publish(leader.thread.port, "s", [b"m%d" % i for i in range(100)])
    with _connect(follower.reads.port) as conn:
        ch = conn.channel()
        # A passive declare counts what the follower holds: every confirmed message.
        assert ch.queue_declare("s", passive=True).method.message_count == 100
        assert _read(ch, "s", 100) == [(i, b"m%d" % i) for i in range(100)]
        assert _read(ch, "s", 10, offset=90) == [(i, b"m%d" % i) for i in range(90, 100)]
        # A consumer at the end gets what the leader appends next.
        ch.basic_qos(prefetch_count=50)
        tail: list[tuple[int, bytes]] = []

        def on_message(ch: Any, method: Any, props: Any, body: bytes) -> None:
            tail.append((props.headers["x-stream-offset"], body))
            ch.basic_ack(method.delivery_tag)

        tag = ch.basic_consume("s", on_message, arguments={"x-stream-offset": "next"})
        _publish(leader.thread.port, "s", [b"m%d" % i for i in range(100, 150)])
        deadline = time.monotonic() + 30
        while len(tail) < 50 and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.5)
        assert tail == [(i, b"m%d" % i) for i in range(100, 150)]
        ch.basic_cancel(tag)


def test_the_leader_names_the_in_sync_followers_read_service(
    cluster: tuple[Leader, ReadingFollower],
) -> None:
    leader, follower = cluster
    leader.thread.broker.stream_replicas = leader.replicator.stream_replicas
    _publish(leader.thread.port, "s", [b"x"])  # the follower is in the ISR after it
    with _connect(leader.thread.port) as conn:
        props = conn._impl.server_properties
        assert props["warren_stream_replicas"] == [f"127.0.0.1:{follower.reads.port}"]


def test_a_follower_refuses_what_would_change_anything(
    cluster: tuple[Leader, ReadingFollower],
) -> None:
    leader, follower = cluster
    _publish(leader.thread.port, "s", [b"x"])
    with _connect(leader.thread.port) as conn:
        conn.channel().queue_declare("classic", durable=True)
    with _connect(follower.reads.port) as conn:
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            ch.queue_declare("new", durable=True)
        assert refused.value.reply_code == 403
        assert "amqp://leader.example:5672" in refused.value.reply_text
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            ch.queue_declare("missing", passive=True)
        assert refused.value.reply_code == 404
        ch = conn.channel()
        ch.basic_qos(prefetch_count=1)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            ch.basic_consume("classic", lambda *a: None)
        assert refused.value.reply_code == 406
        assert "not a stream queue" in refused.value.reply_text
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            ch.basic_consume("s", lambda *a: None)  # no prefetch: as on the leader
        assert refused.value.reply_code == 406
        ch = conn.channel()
        ch.basic_publish("", "s", b"no")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            ch.queue_declare("s", passive=True)  # the publish's refusal arrives first
        assert refused.value.reply_code == 403
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        pika.BlockingConnection(
            pika.ConnectionParameters(
                "127.0.0.1",
                follower.reads.port,
                credentials=pika.PlainCredentials("guest", "wrong"),
            )
        )


def test_a_follower_serves_the_chunk_records_of_the_stream_protocol(tmp_path: Path) -> None:
    """A Publish stored whole as one chunk record on the leader (the stream
    protocol's fast path) reaches the follower as bytes, and the follower's
    read service splits it into messages with their offsets, as the leader's
    AMQP 0-9-1 consumers get them."""
    from rstream import AMQPMessage, Producer

    leader = Leader(tmp_path / "leader")  # its stream port is open (0: any)
    follower = None
    try:
        follower = ReadingFollower(tmp_path / "follower", "f1", leader.port)
        stream_port = leader.thread.broker.listener("stream").port  # type: ignore[attr-defined]

        async def publish() -> None:
            async with Producer("127.0.0.1", stream_port, username="guest", password="guest") as p:
                await p.create_stream("chunks")
                batch = [AMQPMessage(body=b"c%d" % i) for i in range(20)]
                await p.send_batch("chunks", batch)

        asyncio.run(publish())
        with _connect(follower.reads.port) as conn:
            ch = conn.channel()
            deadline = time.monotonic() + 30
            while ch.queue_declare("chunks", passive=True).method.message_count < 20:
                assert time.monotonic() < deadline
                time.sleep(0.1)
            ch.basic_qos(prefetch_count=10)
            got: list[tuple[int, bytes]] = []
            for method, props, body in ch.consume("chunks", arguments={"x-stream-offset": 5}):
                got.append((props.headers["x-stream-offset"], body))
                ch.basic_ack(method.delivery_tag)
                if len(got) == 15:
                    break
            ch.cancel()
        assert got == [(i, b"c%d" % i) for i in range(5, 20)]
    finally:
        if follower is not None:
            follower.stop()
        leader.stop()
