"""Raw-frame helpers shared by the publish-run and ack-run tests (not a test
module): tests/protocol/amqp's in-memory ones (test_ack_runs.py,
test_reject_rows.py) and the socket ones beside real clients
(test_backlog_acks.py, test_backlog_spans.py). The frame helpers take any
AMQPFrames (RawAMQP or the harness's MemoryAMQP); the state helpers take a
BrokerThread or a Harness (both run a function on the broker's loop)."""

from __future__ import annotations

import importlib
import struct
from typing import Any

from conftest import BrokerThread
from harness import Harness
from pamqp import commands
from rawamqp import AMQPFrames, body_frame, header_frame, method_frame

from warren.amqp import publish_run

PERSISTENT = commands.Basic.Properties(delivery_mode=2)

try:
    _fast: Any = importlib.import_module("warren._fastpath")
except ImportError:
    _fast = None

#: A broker the test reaches on its loop: over sockets or in memory.
Broker = BrokerThread | Harness


def publish(
    body: bytes,
    rk: str,
    channel: int = 1,
    exchange: str = "",
    properties: commands.Basic.Properties | None = None,
) -> bytes:
    out = method_frame(channel, commands.Basic.Publish(exchange=exchange, routing_key=rk))
    out += header_frame(channel, len(body), properties)
    if body:
        out += body_frame(channel, body)
    return out


def _runs(data: bytes) -> list[Any]:
    runs = [publish_run.scan_publishes(data, 0, 131072, 1 << 30, 1000)]
    if _fast is not None:
        runs.append(_fast.scan_publishes(data, 0, 131072, 1 << 30, 1000))
    return runs


def _declare(c: AMQPFrames, name: str, durable: bool = False, **arguments: Any) -> None:
    c.send_method(
        1, commands.Queue.Declare(queue=name, durable=durable, arguments=arguments or None)
    )
    c.expect_method(commands.Queue.DeclareOk)


def _consume(
    c: AMQPFrames, queue: str, prefetch: int = 0, channel: int = 1, tag: str = "ct"
) -> None:
    if prefetch:
        c.send_method(channel, commands.Basic.Qos(prefetch_count=prefetch))
        c.expect_method(commands.Basic.QosOk, channel=channel)
    c.send_method(channel, commands.Basic.Consume(queue=queue, consumer_tag=tag))
    c.expect_method(commands.Basic.ConsumeOk, channel=channel)


def _receive(c: AMQPFrames, n: int) -> list[tuple[int, bool, bytes, Any]]:
    """(delivery tag, redelivered, body, properties) of the next n deliveries."""
    out = []
    for _ in range(n):
        deliver = c.expect_method(commands.Basic.Deliver)
        header, body = c.expect_content()
        out.append((deliver.delivery_tag, deliver.redelivered, body, header.properties))
    return out


def _run_counts(b: Broker) -> list[int]:
    """Deliveries held as runs, per open AMQP channel with any."""

    def count() -> list[int]:
        out = []
        for conn in b.broker.connections:
            for ch in getattr(conn, "channels", {}).values():
                runs = ch.deliveries.unsettled.runs
                if runs:
                    out.append(sum(len(r) for r in runs))
        return out

    return b.call(count)


def _queue_state(b: Broker, name: str) -> tuple[int, int, int, int, int]:
    def state() -> tuple[int, int, int, int, int]:
        q = b.broker.vhosts["/"].queues[name]
        return q.message_count, q.unacked, q.stats.publish, q.stats.deliver, q.stats.ack

    return b.call(state)


def _fill(c: AMQPFrames, queue: str, bodies: list[bytes], channel: int = 1) -> None:
    """Publish with confirms on ``channel`` (which must not be the consumer's)."""
    c.send_method(channel, commands.Confirm.Select())
    c.expect_method(commands.Confirm.SelectOk)
    c.send(b"".join(publish(b, queue, channel, properties=PERSISTENT) for b in bodies))
    confirmed = 0
    while confirmed < len(bodies):
        ack = c.expect_method(commands.Basic.Ack)
        confirmed = ack.delivery_tag if ack.multiple else confirmed + 1


def _round_trip(c: AMQPFrames, channel: int = 1) -> None:
    """What was sent before has been handled (channel.flow answers in order)."""
    c.send_method(channel, commands.Channel.Flow(active=True))
    c.expect_method(commands.Channel.FlowOk, channel=channel)


def ack_frame(channel: int, tag: int, bits: int = 0, end: int = 0xCE, method: int = 80) -> bytes:
    return struct.pack(">BHIHHQB", 1, channel, 13, 60, method, tag, bits) + bytes((end,))


def _spans(b: Broker) -> list[int]:
    """The unacked runs' lengths on every open channel, in tag order."""

    def runs() -> list[int]:
        return [
            len(r)
            for conn in b.broker.connections
            for ch in getattr(conn, "channels", {}).values()
            for r in ch.deliveries.unsettled.runs
        ]

    return b.call(runs)


def _segment_files(b: Broker, queue: str) -> int:
    def count() -> int:
        store = b.broker.vhosts["/"].queues[queue].store
        return len(list(store.directory.glob("msgs.*")))

    return b.call(count)
