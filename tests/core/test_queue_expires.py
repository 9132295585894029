"""x-expires: a queue unused (no consumers, no basic.get, no redeclare) for the
given time is deleted; consumers keep it alive. Time is the broker's ManualClock,
moved by the tests (core/clock.py).

In memory (issue 29): a tests/harness broker and MemoryAMQP connections whose
frames pamqp decodes (pika over a socket before).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from harness import Harness, MemoryAMQP, harness_fixture
from pamqp import commands
from paths import DATA
from rawamqp import publish_frames

broker = harness_fixture(manual_clock=True)


def uniq() -> str:
    return f"test-q-{uuid.uuid4().hex[:10]}"


def declare(c: MemoryAMQP, queue: str, durable: bool = False, **arguments: Any) -> None:
    c.send_method(
        1, commands.Queue.Declare(queue=queue, durable=durable, arguments=arguments or None)
    )
    c.expect_method(commands.Queue.DeclareOk)


def passive_declare(c: MemoryAMQP, queue: str, channel: int = 1) -> None:
    c.send_method(channel, commands.Queue.Declare(queue=queue, passive=True))
    c.expect_method(commands.Queue.DeclareOk, channel=channel)


def exists(b: Harness, q: str) -> bool:
    return b.call(lambda: q in b.broker.vhosts["/"].queues)


def test_unused_queue_is_deleted(broker: Harness) -> None:
    c = broker.amqp_client()
    q = uniq()
    declare(c, q, **{"x-expires": 300})
    c.send(publish_frames(1, b"publishing does not count as use", q))
    passive_declare(c, q)  # the publish is in before the clock moves
    broker.advance(299)
    assert exists(broker, q)
    broker.advance(1)
    assert not exists(broker, q)
    # and a client finds it gone: 404 on a channel of its own
    c.open_channel(2)
    c.send_method(2, commands.Queue.Declare(queue=q, passive=True))
    assert c.expect_channel_close(2)[0] == 404
    c.close()


def test_a_consumer_keeps_the_queue_and_its_departure_restarts_the_clock(
    broker: Harness,
) -> None:
    c = broker.amqp_client()
    q = uniq()
    declare(c, q, **{"x-expires": 300})
    c.send_method(1, commands.Basic.Consume(queue=q, consumer_tag="ct", no_ack=True))
    c.expect_method(commands.Basic.ConsumeOk)
    broker.advance(800)
    assert exists(broker, q)
    c.send_method(1, commands.Basic.Cancel(consumer_tag="ct"))
    c.expect_method(commands.Basic.CancelOk)
    broker.advance(299)
    assert exists(broker, q)
    broker.advance(1)
    assert not exists(broker, q)
    c.close()


def test_redeclare_and_get_count_as_use(broker: Harness) -> None:
    c = broker.amqp_client()
    q = uniq()
    declare(c, q, **{"x-expires": 600})
    for i in range(6):  # 1.2 s of use, every 200 ms
        broker.advance(200)
        if i % 2:
            declare(c, q, **{"x-expires": 600})
        else:
            c.basic_get(q, no_ack=False)
    assert exists(broker, q)
    broker.advance(600)  # unused since the last declaration: gone
    assert not exists(broker, q)
    c.close()


# -- what counts as use: RabbitMQ 3.10's answers ------------------------------------------

#: Recorded by tests/record_rabbitmq_expires.py: whether each use renews the expiry
#: of a classic and of a quorum queue (a redeclaration renews only a classic one's).
RENEWS = json.loads((DATA / "rabbitmq_expires_renewal.json").read_text())["renews"]


@pytest.mark.parametrize("kind", ["classic", "quorum"])
@pytest.mark.parametrize("use", ["declare", "passive_declare", "basic_get"])
def test_what_renews_the_expiry_is_rabbitmqs(broker: Harness, kind: str, use: str) -> None:
    c = broker.amqp_client()
    q = uniq()
    arguments: dict[str, Any] = {"x-expires": 60_000}
    if kind == "quorum":
        arguments["x-queue-type"] = "quorum"
    declare(c, q, durable=True, **arguments)
    broker.advance(50_000)
    if use == "declare":
        declare(c, q, durable=True, **arguments)
    elif use == "passive_declare":
        passive_declare(c, q)
    else:
        c.basic_get(q, no_ack=False)
    broker.advance(20_000)  # past the first deadline, before a renewed one
    assert exists(broker, q) is RENEWS[kind][use]
    broker.advance(40_000)  # past a renewed deadline too
    assert exists(broker, q) is False
    c.close()
