"""The delivery acknowledgement timeout: broker-wide consumer_timeout and the
queue's x-consumer-timeout close a channel that holds a delivery too long (406).

The broker checks once a second of its clock (amqp/ack_timeout.py): a delivery
is first seen by the check after it, and its channel closed by the first check
at least the timeout after that one. The tests give the broker a ManualClock,
deliver with the clock standing still at a check, and move it to the closing
check (nothing before it).

In memory (issue 29): a tests/harness broker and MemoryAMQP connections whose
frames pamqp decodes (pika over a socket before); the timeout is the broker's
timer on its clock either way.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from harness import Harness, MemoryAMQP, harness_fixture
from pamqp import commands
from rawamqp import publish_frames

from warren.core.clock import ManualClock

broker = harness_fixture()
clocked = harness_fixture(manual_clock=True)


def uniq() -> str:
    return f"test-q-{uuid.uuid4().hex[:10]}"


def declare(c: MemoryAMQP, queue: str, **arguments: int) -> None:
    c.send_method(1, commands.Queue.Declare(queue=queue, arguments=arguments or None))
    c.expect_method(commands.Queue.DeclareOk)


def barrier(c: MemoryAMQP, channel: int = 1) -> None:
    """A round trip on ``channel``: answered, so the channel is still open (a
    channel.close before the answer fails it)."""
    c.send_method(channel, commands.Exchange.Declare(exchange="amq.direct", passive=True))
    c.expect_method(commands.Exchange.DeclareOk, channel=channel)


def closed_by_timeout(c: MemoryAMQP) -> tuple[int, str]:
    """The channel.close that comes next on channel 1 (answered): code and text."""
    code, text, _, _ = c.expect_channel_close(1)
    c.send_method(1, commands.Channel.CloseOk())
    return code, text


def test_x_consumer_timeout_closes_the_channel(clocked: Harness) -> None:
    c = clocked.amqp_client()
    q = uniq()
    declare(c, q, **{"x-consumer-timeout": 500})
    c.send(publish_frames(1, b"slow", q))
    c.send_method(1, commands.Basic.Consume(queue=q))
    c.expect_method(commands.Basic.ConsumeOk)
    c.expect_method(commands.Basic.Deliver)
    assert c.expect_content()[1] == b"slow"
    clocked.advance(1999)  # seen by the check at 1 s, not yet 500 ms old at the next
    barrier(c)  # still open
    clocked.advance(1)
    code, text = closed_by_timeout(c)
    assert code == 406
    assert text == (
        "PRECONDITION_FAILED - delivery acknowledgement on channel 1 timed out. "
        "Timeout value used: 500 ms. This timeout value can be configured, see "
        "consumers doc guide to learn more"
    )
    # The message went back to the queue for someone else.
    c.open_channel(2)
    method, _, body = c.basic_get(q, channel=2)
    assert method is not None
    assert body == b"slow" and method.redelivered
    c.close()


def test_acked_in_time_keeps_the_channel(clocked: Harness) -> None:
    c = clocked.amqp_client()
    q = uniq()
    declare(c, q, **{"x-consumer-timeout": 1500})
    c.send_method(1, commands.Basic.Consume(queue=q))
    c.expect_method(commands.Basic.ConsumeOk)
    for i in range(5):
        c.send(publish_frames(1, str(i).encode(), q))
    for _ in range(5):
        deliver = c.expect_method(commands.Basic.Deliver)
        c.expect_content()
        c.send_method(1, commands.Basic.Ack(delivery_tag=deliver.delivery_tag))
    barrier(c)  # the acks are in
    clocked.advance(5000)  # well past the timeout: all acked, still open
    barrier(c)
    c.close()


def test_broker_wide_consumer_timeout(tmp_path: Path) -> None:
    with Harness(tmp_path / "data", consumer_timeout=400, clock=ManualClock()) as b:
        c = b.amqp_client()
        q = uniq()
        declare(c, q)
        c.send(publish_frames(1, b"m", q))
        method, _, _ = c.basic_get(q, no_ack=False)  # basic.get deliveries count too
        assert method is not None
        b.advance(1999)
        barrier(c)
        b.advance(1)
        _, text = closed_by_timeout(c)
        assert "Timeout value used: 400 ms" in text
        c.close()


def test_zero_disables_the_timeout(tmp_path: Path) -> None:
    # No heartbeats either: an hour without them would close the connection.
    with Harness(tmp_path / "data", consumer_timeout=0, heartbeat=0, clock=ManualClock()) as b:
        c = b.amqp_client()
        q = uniq()
        declare(c, q)
        c.send(publish_frames(1, b"m", q))
        method, _, _ = c.basic_get(q, no_ack=False)
        assert method is not None
        b.advance(3_600_000)  # an hour, past the default timeout (30 min)
        barrier(c)
        c.send_method(1, commands.Basic.Ack(delivery_tag=method.delivery_tag))
        barrier(c)
        c.close()


def test_invalid_x_consumer_timeout_is_refused(broker: Harness) -> None:
    c = broker.amqp_client()
    c.send_method(1, commands.Queue.Declare(queue=uniq(), arguments={"x-consumer-timeout": 0}))
    assert c.expect_channel_close(1)[0] == 406
    c.close()
