"""AMQP 1.0 publish runs in memory: the transfers of one read published together
(incoming.py's PublishRun, Queue.publish_run) and answered in ranges, with the
same outcomes, credit and order as one by one; Qpid Proton's engine as the
client (harness/amqp1.py), raw frames where it would not send them."""

from __future__ import annotations

from typing import Any

import pytest
from harness import Harness, harness_fixture
from harness.amqp1 import ProtonClient

from warren.amqp1.formats import DecodeError
from warren.amqp1.frames import Frame, FrameReader, encode_frame
from warren.amqp1.incoming import IncomingLink
from warren.amqp1.performatives import (
    RECEIVER,
    Accepted,
    Disposition,
    Flow,
    Rejected,
    Transfer,
)

proton = pytest.importorskip("proton")
Delivery = proton.Delivery

broker = harness_fixture(manual_clock=True)


def client(harness: Harness) -> ProtonClient:
    return ProtonClient(harness).open()


def declare(harness: Harness, name: str, **arguments: Any) -> None:
    harness.call(
        lambda: harness.broker.vhosts["/"].declare_queue(name, arguments=arguments or None)
    )


def count(harness: Harness, name: str) -> int:
    return harness.broker.vhosts["/"].queues[name].message_count


def send_in_one_read(
    c: ProtonClient, sender: Any, messages: list[Any], settled: frozenset[int] = frozenset()
) -> tuple[list[Any], list[Any]]:
    """Every message in one read of the broker's (no pump in between): the
    deliveries, and the frames the broker wrote back."""
    deliveries = []
    for i, message in enumerate(messages):
        delivery = sender.delivery(f"d{i}")
        sender.send(message.encode())
        sender.advance()
        if i in settled:
            delivery.settle()
        deliveries.append(delivery)
    mark = len(c.received)
    c.pump()
    items = FrameReader(1 << 30).feed(bytes(c.received[mark:]))
    return deliveries, [i.performative for i in items if isinstance(i, Frame)]


def dispositions(frames: list[Any]) -> list[tuple[int, int, str]]:
    return [
        (f.first, f.first if f.last is None else f.last, type(f.state).__name__)
        for f in frames
        if isinstance(f, Disposition) and f.role == RECEIVER
    ]


def our_link(c: ProtonClient) -> tuple[int, IncomingLink]:
    """The broker's session channel and its publishing link."""
    for channel, session in c.conn.sessions.items():
        for link in session.links.values():
            if isinstance(link, IncomingLink):
                return channel, link
    raise AssertionError("no publishing link")


def test_a_read_of_transfers_gets_one_ranged_disposition(broker: Harness) -> None:
    declare(broker, "q")
    c = client(broker)
    sender = c.sender("/queues/q")
    msgs = [proton.Message(body=f"m{i}") for i in range(50)]
    deliveries, frames = send_in_one_read(c, sender, msgs)
    assert dispositions(frames) == [(0, 49, "Accepted")]
    assert all(d.remote_state == Delivery.ACCEPTED for d in deliveries)
    assert count(broker, "q") == 50


def test_a_settled_transfer_in_the_middle_splits_the_range(broker: Harness) -> None:
    declare(broker, "q")
    c = client(broker)
    sender = c.sender("/queues/q")
    msgs = [proton.Message(body=f"m{i}") for i in range(10)]
    _, frames = send_in_one_read(c, sender, msgs, settled=frozenset({4}))
    assert dispositions(frames) == [(0, 3, "Accepted"), (5, 9, "Accepted")]
    assert count(broker, "q") == 10


def test_a_queue_refusing_part_of_a_run(broker: Harness) -> None:
    """A full queue (reject-publish) rejects what is over its length, each on
    its own; what it took is accepted in one range."""
    declare(broker, "q", **{"x-max-length": 5, "x-overflow": "reject-publish"})
    c = client(broker)
    sender = c.sender("/queues/q")
    msgs = [proton.Message(body=f"m{i}") for i in range(8)]
    deliveries, frames = send_in_one_read(c, sender, msgs)
    got = sorted(dispositions(frames))
    assert got == [(0, 4, "Accepted"), (5, 5, "Rejected"), (6, 6, "Rejected"), (7, 7, "Rejected")]
    assert [d.remote_state for d in deliveries] == [Delivery.ACCEPTED] * 5 + [Delivery.REJECTED] * 3
    assert count(broker, "q") == 5


def test_order_is_kept_around_a_message_that_goes_alone(broker: Harness) -> None:
    """A message with a TTL (an expiration: not for a run) in the middle of a
    read: the run before it is published first, the rest after it."""
    declare(broker, "q")
    c = client(broker)
    sender = c.sender("/queues/q")
    msgs = [proton.Message(body=f"m{i}") for i in range(9)]
    msgs[4].ttl = 60
    _, frames = send_in_one_read(c, sender, msgs)
    assert dispositions(frames) == [(0, 8, "Accepted")]
    receiver = c.receiver("/queues/q", credit=20)
    assert [m.body for _, m in c.receive(receiver)] == [f"m{i}" for i in range(9)]


def test_credit_stays_exact_over_a_run(broker: Harness) -> None:
    """170 credit: 100 transfers in one read leave 70, topped up to 170 once
    the run is in (one flow; one by one, the 85th would have topped it up and
    the read left 155); 171 in one read publish 170 and the last one detaches
    the link (transfer-limit-exceeded)."""
    declare(broker, "q")
    c = client(broker)
    c.sender("/queues/q", settled=True)
    channel, link = our_link(c)
    assert link.credit == 170
    body = proton.Message(body="x").encode()

    def transfers(first: int, n: int) -> bytes:
        return b"".join(
            encode_frame(
                channel,
                Transfer(handle=link.handle, delivery_id=i, delivery_tag=b"%d" % i, settled=True),
                body,
            )
            for i in range(first, first + n)
        )

    c.broker.feed(transfers(0, 100))
    mark = len(c.received)
    broker.settle()
    c.received += c.broker.take()
    assert (link.credit, link.delivery_count) == (170, 100)
    flows = [
        i.performative
        for i in FrameReader(1 << 30).feed(bytes(c.received[mark:]))
        if isinstance(i, Frame) and isinstance(i.performative, Flow)
    ]
    assert [(f.delivery_count, f.link_credit) for f in flows] == [(100, 170)]
    assert count(broker, "q") == 100
    c.broker.feed(transfers(100, 171))
    broker.settle()
    out = c.broker.take()
    assert count(broker, "q") == 270
    assert b"amqp:link:transfer-limit-exceeded" in out
    assert link.handle not in c.conn.sessions[channel].links


def test_a_consumer_takes_a_run_within_its_credit_in_order(broker: Harness) -> None:
    """An unsettled receiver with 10 credit: a run of 30 gives it 10, in order,
    the queue keeps 20; its ranged disposition settles them together."""
    declare(broker, "q")
    c = client(broker)
    receiver = c.receiver("/queues/q", credit=10)
    sender = c.sender("/queues/q")
    send_in_one_read(c, sender, [proton.Message(body=f"m{i}") for i in range(30)])
    got = c.receive(receiver)
    assert [m.body for _, m in got] == [f"m{i}" for i in range(10)]
    assert count(broker, "q") == 20
    (ours,) = [s for s in c.conn.sessions.values() if s.outgoing]
    ids = sorted(ours.outgoing)
    assert len(ids) == 10
    c.broker.feed(
        encode_frame(
            ours.channel,
            Disposition(role=True, first=ids[0], last=ids[-1], settled=True, state=Accepted()),
        )
    )
    c.pump()
    assert not ours.outgoing
    receiver.flow(20)
    c.pump()
    assert [m.body for _, m in c.receive(receiver)] == [f"m{i}" for i in range(10, 30)]
    assert count(broker, "q") == 0


def test_a_presettled_consumer_gets_a_run_in_order(broker: Harness) -> None:
    declare(broker, "q")
    c = client(broker)
    receiver = c.receiver("/queues/q", credit=100, settled=True)
    sender = c.sender("/queues/q", settled=True)
    send_in_one_read(
        c, sender, [proton.Message(body=f"m{i}") for i in range(40)], settled=frozenset(range(40))
    )
    got = c.receive(receiver)
    assert [m.body for _, m in got] == [f"m{i}" for i in range(40)]
    assert all(d.settled for d, _ in got)
    assert count(broker, "q") == 0


def test_rejected_outcome_type_is_the_spec_one(broker: Harness) -> None:
    """The run's rejections carry amqp:resource-limit-exceeded, as one by one."""
    declare(broker, "q", **{"x-max-length": 1, "x-overflow": "reject-publish"})
    c = client(broker)
    sender = c.sender("/queues/q")
    _, frames = send_in_one_read(c, sender, [proton.Message(body="a"), proton.Message(body="b")])
    (rejected,) = [
        f for f in frames if isinstance(f, Disposition) and isinstance(f.state, Rejected)
    ]
    assert rejected.state.error.condition == "amqp:resource-limit-exceeded"


def test_a_durable_run_is_accepted_once_synced(tmp_path: Any, monkeypatch: Any) -> None:
    """Persistent messages into a durable queue: the run waits for the sync as
    one settlement batch; none is accepted before it, all in one range after."""
    from harness.held_syncs import HeldSyncs

    syncs = HeldSyncs(monkeypatch)
    with Harness(tmp_path / "data") as harness:
        harness.call(lambda: harness.broker.vhosts["/"].declare_queue("d", durable=True))
        c = client(harness)
        sender = c.sender("/queues/d")
        harness.settle()
        syncs.hold()
        try:
            deliveries = []
            for i in range(20):
                delivery = sender.delivery(f"d{i}")
                sender.send(proton.Message(body=f"m{i}", durable=True).encode())
                sender.advance()
                deliveries.append(delivery)
            mark = len(c.received)
            c.pump(ready_only=True)
            assert syncs.waiting.wait(30), "no sync round started"
            c.pump(ready_only=True)
            assert all(d.remote_state == 0 for d in deliveries)  # nothing yet
        finally:
            syncs.release()
        c.pump()
        assert all(d.remote_state == Delivery.ACCEPTED for d in deliveries)
        items = FrameReader(1 << 30).feed(bytes(c.received[mark:]))
        frames = [i.performative for i in items if isinstance(i, Frame)]
        assert dispositions(frames) == [(0, 19, "Accepted")]
        assert count(harness, "d") == 20


def test_a_presettled_consumer_takes_no_more_of_a_run_than_its_credit(broker: Harness) -> None:
    """A no-ack consumer's run stops at the link's credit (Consumer.no_ack_credit):
    5 credit, a run of 20: 5 delivered, 15 stay in the queue, in order."""
    declare(broker, "q")
    c = client(broker)
    receiver = c.receiver("/queues/q", credit=5, settled=True)
    sender = c.sender("/queues/q", settled=True)
    msgs = [proton.Message(body=f"m{i}") for i in range(20)]
    send_in_one_read(c, sender, msgs, settled=frozenset(range(20)))
    assert [m.body for _, m in c.receive(receiver)] == [f"m{i}" for i in range(5)]
    assert count(broker, "q") == 15
    receiver.flow(15)
    c.pump()
    assert [m.body for _, m in c.receive(receiver)] == [f"m{i}" for i in range(5, 20)]


def test_round_robin_of_a_run_keeps_each_links_credit(broker: Harness) -> None:
    """Two pre-settled receivers, one with 2 credit: the run is not dealt out
    round-robin beyond it; the other takes the rest."""
    declare(broker, "q")
    c = client(broker)
    wide = c.receiver("/queues/q", credit=100, settled=True, name="wide")
    narrow = c.receiver("/queues/q", credit=2, settled=True, name="narrow")
    sender = c.sender("/queues/q", settled=True)
    msgs = [proton.Message(body=f"m{i}") for i in range(20)]
    send_in_one_read(c, sender, msgs, settled=frozenset(range(20)))
    got_narrow = [m.body for _, m in c.receive(narrow)]
    got_wide = [m.body for _, m in c.receive(wide)]
    assert len(got_narrow) == 2
    assert sorted(got_narrow + got_wide, key=lambda b: int(b[1:])) == [f"m{i}" for i in range(20)]
    assert count(broker, "q") == 0


def test_settling_single_deliveries_of_a_run(broker: Harness) -> None:
    """A run delivered to an unsettled receiver is one unsettled entry: one
    delivery released from its middle goes back alone, one rejected is
    dropped, the rest accepted one by one; counted as 10 deliveries."""
    declare(broker, "q")
    c = client(broker)
    receiver = c.receiver("/queues/q", credit=10)
    sender = c.sender("/queues/q")
    send_in_one_read(c, sender, [proton.Message(body=f"m{i}") for i in range(10)])
    got = c.receive(receiver)
    assert [m.body for _, m in got] == [f"m{i}" for i in range(10)]
    (ours,) = [s for s in c.conn.sessions.values() if s.outgoing]
    assert ours.stats.deliver == 10
    for i, (delivery, _) in enumerate(got):
        outcome = {4: Delivery.RELEASED, 6: Delivery.REJECTED}.get(i, Delivery.ACCEPTED)
        c.settle(delivery, outcome)
    assert not ours.outgoing
    assert count(broker, "q") == 1
    receiver.flow(1)
    c.pump()
    ((again, message),) = c.receive(receiver)
    assert message.body == "m4"
    c.settle(again)
    assert count(broker, "q") == 0


def test_a_detach_puts_an_unsettled_run_back(broker: Harness) -> None:
    declare(broker, "q")
    c = client(broker)
    receiver = c.receiver("/queues/q", credit=10)
    sender = c.sender("/queues/q")
    send_in_one_read(c, sender, [proton.Message(body=f"m{i}") for i in range(10)])
    got = c.receive(receiver)
    assert len(got) == 10
    c.settle(got[0][0])
    assert count(broker, "q") == 0
    receiver.close()
    c.pump()
    assert count(broker, "q") == 9
    again = c.receiver("/queues/q", credit=20, name="again")
    assert [m.body for _, m in c.receive(again)] == [f"m{i}" for i in range(1, 10)]


# -- a body-only message's decoding (message.decode_message's short cut) -----------------
@pytest.mark.parametrize("size", [0, 1, 16, 250])
def test_a_data_only_message_decodes_as_the_section_loop_does(size: int) -> None:
    from warren.amqp1.message import AmqpMessage, Data, decode_message, encode_message

    body = bytes(range(size % 256)) * (size // 256) + bytes(range(size % 256))
    payload = encode_message(AmqpMessage(body=[Data(body)]))
    msg = decode_message(payload)
    assert msg.body == [Data(body)]
    assert (msg.raw, msg.bare_at, msg.body_at, msg.footer_at) == (payload, 0, 0, len(payload))
    assert encode_message(msg) == payload
    # Two data sections, or a length that does not fill the payload: the loop.
    two = decode_message(payload + payload)
    assert two.body == [Data(body), Data(body)]
    with pytest.raises(DecodeError):
        decode_message(payload + b"\x00")


def test_proton_body_only_messages_decode_alike() -> None:
    """proton's own encoding of a binary body (an independent encoder)."""
    from warren.amqp1.message import Data, decode_message

    raw = proton.Message(body=b"hello", inferred=True).encode()
    msg = decode_message(raw)
    assert [type(s) for s in msg.body] == [Data]
    assert msg.body[0].content == b"hello"


def test_a_detach_in_the_same_read_comes_after_the_run(broker: Harness) -> None:
    """Transfers, then the sender's detach, in one read: the run is
    published before the link goes (and answered before its detach)."""
    declare(broker, "q")
    c = client(broker)
    sender = c.sender("/queues/q", settled=True)
    for i in range(5):
        delivery = sender.delivery(f"d{i}")
        sender.send(proton.Message(body=f"m{i}").encode())
        sender.advance()
        delivery.settle()
    sender.close()
    c.pump()
    assert count(broker, "q") == 5
    links = [lk for s in c.conn.sessions.values() for lk in s.links.values()]
    assert not [lk for lk in links if isinstance(lk, IncomingLink)]


def test_a_message_too_large_in_a_run_detaches_after_those_before(broker: Harness) -> None:
    """The run before a refused transfer is published; the link detaches
    (message-size-exceeded) and what follows on it is not."""
    broker.config.max_message_size = 1000
    declare(broker, "q")
    c = client(broker)
    sender = c.sender("/queues/q", settled=True)
    bodies = ["a", "b", "x" * 2000, "c"]
    for i, body in enumerate(bodies):
        delivery = sender.delivery(f"d{i}")
        sender.send(proton.Message(body=body).encode())
        sender.advance()
        delivery.settle()
    c.pump()
    assert sender.remote_condition.name == "amqp:link:message-size-exceeded"
    assert count(broker, "q") == 2
