"""Hostile AMQP 1.0 peers in memory: after a real open (proton's engine), frames
of random performatives with awkward field values (unknown handles, credit past
2^31, dispositions over wrapping ranges, transfers on sending links, attaches
of every address form, ends and begins out of place). The connection must
answer each with a detach, an end or a close, never raise, and lose no message:
once every connection is gone, what was published is back in its queue,
acknowledged (accepted) or dead-lettered (rejected)."""

from __future__ import annotations

import random
from typing import Any

import pytest
from harness import Harness, harness_fixture
from harness.amqp1 import ProtonClient

from warren.amqp1.frames import HEARTBEAT, encode_frame
from warren.amqp1.performatives import (
    Accepted,
    Attach,
    Begin,
    Detach,
    Disposition,
    End,
    Flow,
    Modified,
    Received,
    Rejected,
    Released,
    Source,
    Target,
    Transfer,
)
from warren.amqp1.types import Symbol

proton = pytest.importorskip("proton")

broker = harness_fixture(manual_clock=True)

ADDRESSES = [
    "/queues/q",
    "/queues/missing",
    "/exchanges/amq.direct/k",
    None,
    "/management",
    "q",
    "/topic/x",
    "/exchange/amq.fanout",
    "%%%",
]


def _number(rnd: random.Random) -> Any:
    return rnd.choice([0, 1, 2, 3, 169, 170, 0xFFFFFFFF, 1 << 31, None])


def _state(rnd: random.Random) -> Any:
    return rnd.choice(
        [
            None,
            Accepted(),
            Rejected(),
            Released(),
            Modified(
                delivery_failed=rnd.choice([None, True, False]),
                undeliverable_here=rnd.choice([None, True, False]),
            ),
            Received(section_number=0, section_offset=0),
        ]
    )


def _frame(rnd: random.Random) -> bytes:
    # Mostly the links the test attached (0-2), now and then an unknown one.
    handle = rnd.choices([0, 1, 2, 7, 300], [30, 30, 30, 5, 5])[0]
    # Mostly link frames; what ends a session or the connection now and then.
    kind = rnd.choices(range(8), weights=[20, 20, 20, 15, 8, 2, 2, 3])[0]
    payload = b""
    performative: Any
    if kind == 0:
        performative = Flow(
            next_incoming_id=_number(rnd),
            incoming_window=rnd.choice([0, 1, 5000, 0xFFFFFFFF]),
            next_outgoing_id=rnd.choice([0, 5, 0xFFFFFFFF]),
            outgoing_window=5,
            handle=rnd.choice([None, handle]),
            delivery_count=_number(rnd),
            link_credit=_number(rnd),
            drain=rnd.random() < 0.3,
            echo=rnd.random() < 0.3,
        )
    elif kind == 1:
        performative = Transfer(
            handle=handle,
            delivery_id=_number(rnd),
            delivery_tag=b"t",
            settled=rnd.choice([None, True, False]),
            more=rnd.random() < 0.3,
            aborted=rnd.random() < 0.1,
        )
        payload = rnd.choice([b"", b"\x00Sw\xa1\x01x", b"\x00Sw", b"garbage"])
    elif kind == 2:
        first = rnd.choice([0, 1, 2, 0xFFFFFFF0])
        performative = Disposition(
            role=rnd.choice([True, False]),
            first=first,
            last=rnd.choice([None, first, (first + 3) % (1 << 32), 0]),
            settled=rnd.random() < 0.7,
            state=_state(rnd),
        )
    elif kind == 3:
        role = rnd.choice([True, False])
        address = rnd.choice(ADDRESSES)
        offset = {Symbol("rabbitmq:stream-offset-spec"): "first"}
        source = Source(address=address if role else None, filter=rnd.choice([None, offset]))
        target = Target(address=None if role else address)
        performative = Attach(
            name=rnd.choice(["a", "b", "mgmt"]),
            handle=handle,
            role=role,
            snd_settle_mode=rnd.choice([0, 1, 2]),
            source=rnd.choice([source, None]),
            target=rnd.choice([target, None]),
            initial_delivery_count=_number(rnd),
        )
    elif kind == 4:
        performative = Detach(handle=handle, closed=rnd.random() < 0.5)
    elif kind == 5:
        performative = End()
    elif kind == 6:
        performative = Begin(
            next_outgoing_id=rnd.choice([0, 0xFFFFFFFF]),
            incoming_window=rnd.choice([0, 10]),
            outgoing_window=10,
            remote_channel=rnd.choice([None, None, 1]),
            handle_max=rnd.choice([0, 5, 0xFFFFFFFF]),
        )
    else:
        return HEARTBEAT
    channel = 1 if isinstance(performative, Begin) else rnd.choices([0, 1, 5], [90, 8, 2])[0]
    return encode_frame(channel, performative, payload)


def _echo(session: Any, vhost: Any, later: Any) -> Any:
    return lambda message: [message]


@pytest.mark.parametrize("seed", range(3))
def test_random_performatives_after_the_open(broker: Harness, seed: int) -> None:
    rnd = random.Random(seed)
    vhost = broker.broker.vhosts["/"]
    # What a client rejects is dead-lettered, not dropped: nothing leaves both.
    dlx = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq"}
    broker.call(lambda: vhost.declare_queue("dlq", durable=False))
    broker.call(lambda: vhost.declare_queue("q", durable=False, arguments=dlx))
    published = 0
    for _ in range(20):
        c = ProtonClient(broker, management=_echo).open()
        session = c.session()
        sender = c.sender("/queues/q", session=session)
        for _ in range(2):
            c.send(sender, proton.Message(body="m"))
        published += 2
        c.receiver("/queues/q", session=session, credit=1)  # handle 1, one delivery
        c.sender("/management", session=session, name="mgmt")  # handle 2
        for _ in range(40):
            if c.broker.lost:
                break
            c.broker.feed(_frame(rnd))
            broker.settle()
            c.broker.take()
        broker.call(c.conn.connection_lost)
    broker.settle()
    # Transfers of the random frames may have published more, never fewer.
    q, dlq = vhost.queues["q"], vhost.queues["dlq"]
    assert q.message_count + q.stats.ack + dlq.message_count >= published
