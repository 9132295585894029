"""Broker-side helpers for the Spark tests: declare, publish with confirms, drain.

They talk AMQP through warren.client (Warren's raw blocking client) and build
frames with Warren's codec, so test data never goes through the code under
test (the sink's encoder and the source's scanner).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from warren.amqp import spec
from warren.amqp.frames import content_frames, method_frame
from warren.client import AMQPError, Client
from warren.core.properties import BasicProperties, decode_properties

#: What Spark says when a Python worker missed its fixed 10 s to connect back
#: (conftest.py reruns a test that failed with it).
WORKER_DID_NOT_CONNECT = "Python worker failed to connect back"


class SparkWorkerDidNotConnect(Exception):
    """A read failed because Spark's Python worker did not start in time (a
    starved machine), not with the error the test looks for."""


@dataclass(frozen=True)
class BrokerInfo:
    """The broker the Spark tests use: an embedded Warren, or WARREN_SPARK_BROKER_URL."""

    url: str
    #: Warren (embedded or not): the stream contract holds exactly (x-stream-timestamp,
    #: "last" is the last message, deduplication).
    is_warren: bool
    embedded: Any = None  # tests/conftest.py's BrokerThread when embedded


@contextlib.contextmanager
def channel(url: str) -> Iterator[Client]:
    """A connection with channel 1 open."""
    client = Client(url, timeout=30).connect()
    try:
        client.channel_open(1)
        yield client
    finally:
        client.close()


def delete_queue(url: str, name: str) -> None:
    with channel(url) as c, contextlib.suppress(AMQPError):
        c.rpc(1, spec.QueueDelete(queue=name), spec.QueueDeleteOk)


def declare_queue(url: str, name: str, arguments: dict[str, Any] | None = None) -> None:
    with channel(url) as c:
        c.queue_declare(1, name, durable=True, arguments=arguments)


def declare_stream(url: str, name: str, **arguments: Any) -> None:
    declare_queue(url, name, {"x-queue-type": "stream", **arguments})


def publish(
    url: str,
    routing_key: str,
    messages: Sequence[bytes | tuple[bytes, BasicProperties]],
    exchange: str = "",
) -> None:
    """Publish and wait for every confirm (a nack fails the test)."""
    with channel(url) as c:
        c.confirm_select(1)
        method = method_frame(1, spec.BasicPublish(exchange=exchange, routing_key=routing_key))
        frames = []
        for m in messages:
            body, props = (m, BasicProperties()) if isinstance(m, bytes) else m
            frames.append(method + b"".join(content_frames(1, props.encode(), body, c.frame_max)))
        c.send(b"".join(frames))
        # Confirms may come out of order (a persistent message waits for the disk).
        unconfirmed = set(range(1, len(messages) + 1))
        while unconfirmed:
            reply = c.wait_method(1, spec.Method)
            if isinstance(reply, spec.BasicNack):
                raise AssertionError(f"broker nacked message {reply.delivery_tag}")
            if isinstance(reply, spec.BasicAck):
                if reply.multiple:
                    unconfirmed = {t for t in unconfirmed if t > reply.delivery_tag}
                else:
                    unconfirmed.discard(reply.delivery_tag)


def drain(url: str, queue: str) -> list[tuple[BasicProperties, bytes]]:
    """Every message of a classic queue, taken with basic.get (no ack)."""
    out = []
    with channel(url) as c:
        while True:
            c.send_method(1, spec.BasicGet(queue=queue, no_ack=True))
            while True:
                ftype, ch, payload = c.read_frame()
                if ftype != 1:
                    continue
                reply = spec.decode_method(payload)
                if isinstance(reply, (spec.BasicGetOk, spec.BasicGetEmpty)):
                    break
                if isinstance(reply, spec.ChannelClose):
                    raise AssertionError(f"basic.get on {queue!r}: {reply.reply_text}")
            if isinstance(reply, spec.BasicGetEmpty):
                return out
            _, _, header = c.read_frame()
            size = int.from_bytes(header[4:12], "big")
            props = decode_properties(header[12:])
            body = b""
            while len(body) < size:
                body += c.read_frame()[2]
            out.append((props, body))


def message_count(url: str, queue: str) -> int:
    with channel(url) as c:
        ok = c.rpc(1, spec.QueueDeclare(queue=queue, passive=True), spec.QueueDeclareOk)
        return ok.message_count


#: Between two looks at a queue's length while a query writes into it.
POLL_SECONDS = 0.05


def wait_for_count(
    url: str, queue: str, count: int, timeout: float, what: str, running: Callable[[], None]
) -> None:
    """Until ``queue`` holds at least ``count`` messages, on one connection.

    ``running`` fails the wait when the writer behind the queue stopped (it
    asserts). A fresh connection per look, without a pause, cost the tests
    and the broker seconds of CPU for each wait on a streaming query."""
    deadline = time.monotonic() + timeout
    with channel(url) as c:
        while True:
            ok = c.rpc(1, spec.QueueDeclare(queue=queue, passive=True), spec.QueueDeclareOk)
            if ok.message_count >= count:
                return
            assert time.monotonic() < deadline, what
            running()
            time.sleep(POLL_SECONDS)
