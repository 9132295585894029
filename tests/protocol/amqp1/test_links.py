"""AMQP 1.0 links in memory: credit, drain, dispositions both ways, transfers over
several frames, limits, permissions, the anonymous terminus and the /management
hook, with Qpid Proton's engine as the client (harness/amqp1.py)."""

from __future__ import annotations

from typing import Any

import pytest
from harness import Harness, harness_fixture
from harness.amqp1 import ProtonClient

from warren.amqp1.frames import Frame, FrameReader, encode_frame
from warren.amqp1.links import ManagementHandler
from warren.amqp1.message import AmqpMessage, AmqpValue, Properties
from warren.amqp1.performatives import Accepted, Disposition, Transfer

proton = pytest.importorskip("proton")
Delivery = proton.Delivery

broker = harness_fixture(manual_clock=True)


def client(harness: Harness, **options: Any) -> ProtonClient:
    return ProtonClient(harness, **options).open()


def declare(harness: Harness, name: str, durable: bool = False, **arguments: Any) -> None:
    harness.call(
        lambda: harness.broker.vhosts["/"].declare_queue(
            name, durable=durable, arguments=arguments or None
        )
    )


def count(harness: Harness, name: str) -> int:
    return harness.broker.vhosts["/"].queues[name].message_count


def fill(c: ProtonClient, queue: str, n: int) -> None:
    sender = c.sender(f"/queues/{queue}", name=f"fill-{queue}-{n}")
    for i in range(n):
        c.send(sender, proton.Message(body=f"m{i}"))
    sender.close()
    c.pump()


# -- publishing ------------------------------------------------------------------------
def test_credit_is_topped_up_half_way(broker: Harness) -> None:
    declare(broker, "q")
    c = client(broker)
    sender = c.sender("/queues/q")
    assert sender.credit == 170
    for i in range(85):
        sender.delivery(f"d{i}")
        sender.send(proton.Message(body=i).encode())
        sender.advance()
    c.pump()
    assert sender.credit == 170  # 85 used: topped up again
    assert count(broker, "q") == 85


def test_presettled_publishes_get_no_disposition(broker: Harness) -> None:
    declare(broker, "q")
    c = client(broker)
    sender = c.sender("/queues/q", settled=True)
    c.send(sender, proton.Message(body="fire and forget"))
    assert count(broker, "q") == 1
    assert b"\x00\x53\x15" not in bytes(c.received)  # no disposition frame


def test_a_message_over_many_frames_both_ways(broker: Harness) -> None:
    declare(broker, "big")
    c = client(broker, max_frame_size=512)
    body = bytes(range(256)) * 40  # 10 KiB
    sender = c.sender("/queues/big")
    message = proton.Message(body=body)
    d = c.send(sender, message)
    assert d.remote_state == Delivery.ACCEPTED
    receiver = c.receiver("/queues/big", credit=1)
    ((delivery, got),) = c.receive(receiver)
    assert got.body == body
    c.settle(delivery)
    assert count(broker, "big") == 0


def test_an_aborted_transfer_is_dropped(broker: Harness) -> None:
    declare(broker, "q")
    c = client(broker)
    sender = c.sender("/queues/q")
    d = sender.delivery("aborted")
    sender.stream(b"\x00\x53\x75\xa0\x10partial")  # part of a message, more to come
    c.pump()
    d.abort()
    c.pump()
    c.send(sender, proton.Message(body="next"))
    assert count(broker, "q") == 1


def test_a_message_over_max_message_size_detaches(broker: Harness) -> None:
    broker.config.max_message_size = 1000
    declare(broker, "q")
    c = client(broker)
    sender = c.sender("/queues/q")
    c.send(sender, proton.Message(body=b"x" * 2000))
    assert sender.remote_condition.name == "amqp:link:message-size-exceeded"
    assert count(broker, "q") == 0


def test_unconfirmed_publishes_wait_for_the_sync(tmp_path: Any, monkeypatch: Any) -> None:
    """A durable queue's publish is accepted only once its store is synced:
    with the round's file syncs held, no disposition is out; then it comes."""
    from harness.held_syncs import HeldSyncs

    syncs = HeldSyncs(monkeypatch)
    with Harness(tmp_path / "data") as harness:
        declare(harness, "durable", durable=True)
        c = client(harness)
        sender = c.sender("/queues/durable")
        harness.settle()
        syncs.hold()
        try:
            d = sender.delivery("held")
            sender.send(proton.Message(body="keep me", durable=True).encode())
            sender.advance()
            c.pump(ready_only=True)
            assert syncs.waiting.wait(30), "no sync round started"
            c.pump(ready_only=True)
            assert d.remote_state == 0  # nothing yet
        finally:
            syncs.release()
        c.pump()
        assert d.remote_state == Delivery.ACCEPTED


def test_unroutable_is_released_and_refused_is_rejected(broker: Harness) -> None:
    declare(broker, "short", **{"x-max-length": 1, "x-overflow": "reject-publish"})
    c = client(broker)
    nowhere = c.sender("/exchanges/amq.direct/nowhere", name="nowhere")
    assert c.send(nowhere, proton.Message(body="x")).remote_state == Delivery.RELEASED
    short = c.sender("/queues/short", name="short")
    assert c.send(short, proton.Message(body="1")).remote_state == Delivery.ACCEPTED
    refused = c.send(short, proton.Message(body="2"))
    assert refused.remote_state == Delivery.REJECTED
    assert refused.remote.condition.name == "amqp:resource-limit-exceeded"


def test_the_anonymous_terminus_routes_by_to(broker: Harness) -> None:
    declare(broker, "a")
    c = client(broker)
    sender = c.sender(None)
    ok = c.send(sender, proton.Message(address="/queues/a", body="to a"))
    assert ok.remote_state == Delivery.ACCEPTED
    bad = c.send(sender, proton.Message(address="/exchanges/missing", body="lost"))
    assert bad.remote_state == Delivery.REJECTED
    assert bad.remote.condition.name == "amqp:not-found"
    none = c.send(sender, proton.Message(body="no to"))
    assert none.remote.condition.name == "amqp:precondition-failed"
    assert sender.state & proton.Endpoint.REMOTE_ACTIVE  # the link stays
    assert count(broker, "a") == 1


def test_no_write_permission_refuses_the_link(broker: Harness) -> None:
    declare(broker, "q")
    users = broker.broker.users
    broker.call(lambda: users.add_user("reader", "pw"))
    broker.call(lambda: users.set_permissions("reader", "/", write="^nothing$"))
    c = client(broker, user="reader", password="pw")
    sender = c.sender("/queues/q")
    assert sender.remote_condition.name == "amqp:unauthorized-access"
    receiver = c.receiver("/queues/q", name="r")
    assert receiver.state & proton.Endpoint.REMOTE_ACTIVE


def test_user_id_must_be_the_user(broker: Harness) -> None:
    declare(broker, "q")
    c = client(broker)
    sender = c.sender("/queues/q")
    c.send(sender, proton.Message(body="me", user_id=b"guest"))
    c.send(sender, proton.Message(body="other", user_id=b"admin"))
    assert sender.remote_condition.name == "amqp:unauthorized-access"
    assert count(broker, "q") == 1


# -- consuming -------------------------------------------------------------------------
def test_credit_limits_deliveries_and_drain_gives_the_rest_up(broker: Harness) -> None:
    declare(broker, "q")
    c = client(broker)
    fill(c, "q", 3)
    receiver = c.receiver("/queues/q", credit=2)
    assert len(c.receive(receiver)) == 2
    assert receiver.credit == 0
    receiver.drain(5)
    c.pump()
    assert len(c.receive(receiver)) == 1
    assert receiver.credit == 0 and not receiver.draining()
    assert count(broker, "q") == 0


def test_presettled_consumer_auto_acks(broker: Harness) -> None:
    declare(broker, "q")
    c = client(broker)
    fill(c, "q", 2)
    receiver = c.receiver("/queues/q", credit=5, settled=True)
    got = c.receive(receiver)
    assert [m.body for _, m in got] == ["m0", "m1"]
    assert all(d.settled for d, _ in got)
    assert count(broker, "q") == 0
    assert all(not s.outgoing for s in c.conn.sessions.values())  # nothing waits


@pytest.mark.parametrize(
    ("outcome", "requeued"),
    [
        (Delivery.RELEASED, True),
        (Delivery.REJECTED, False),
        (Delivery.MODIFIED, True),
    ],
)
def test_dispositions(broker: Harness, outcome: int, requeued: bool) -> None:
    declare(broker, "q")
    c = client(broker)
    fill(c, "q", 1)
    receiver = c.receiver("/queues/q", credit=1)
    ((delivery, _),) = c.receive(receiver)
    c.settle(delivery, outcome)
    assert count(broker, "q") == (1 if requeued else 0)
    if requeued:
        receiver.flow(1)
        c.pump()
        ((again, message),) = c.receive(receiver)
        assert message.first_acquirer is False
        c.settle(again)
    assert count(broker, "q") == 0


def test_modified_undeliverable_here_dead_letters(broker: Harness) -> None:
    declare(broker, "dlq")
    declare(broker, "q", **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq"})
    c = client(broker)
    fill(c, "q", 1)
    receiver = c.receiver("/queues/q", credit=1)
    ((delivery, _),) = c.receive(receiver)
    delivery.local.undeliverable = True
    c.settle(delivery, Delivery.MODIFIED)
    assert count(broker, "q") == 0
    assert count(broker, "dlq") == 1


def test_detach_and_close_requeue_the_unsettled(broker: Harness) -> None:
    declare(broker, "q")
    c = client(broker)
    fill(c, "q", 2)
    receiver = c.receiver("/queues/q", credit=2)
    assert len(c.receive(receiver)) == 2
    assert count(broker, "q") == 0
    receiver.close()
    c.pump()
    assert count(broker, "q") == 2
    again = c.receiver("/queues/q", credit=2, name="again")
    assert len(c.receive(again)) == 2
    c.close()
    assert count(broker, "q") == 2


def test_a_deleted_queue_detaches_its_consumers(broker: Harness) -> None:
    declare(broker, "doomed")
    c = client(broker)
    receiver = c.receiver("/queues/doomed", credit=1)
    broker.call(lambda: broker.broker.vhosts["/"].delete_queue("doomed"))
    c.pump()
    assert receiver.remote_condition.name == "amqp:resource-deleted"


def test_stream_offset_spec_starts_a_stream_consumer(broker: Harness) -> None:
    declare(broker, "s", durable=True, **{"x-queue-type": "stream"})
    c = client(broker)
    fill(c, "s", 3)

    def from_offset(receiver: Any) -> None:
        receiver.source.filter.put_dict(
            {proton.symbol("rabbitmq:stream-offset-spec"): proton.ulong(1)}
        )

    receiver = c.receiver("/queues/s", credit=10, configure=from_offset)
    got = c.receive(receiver)
    assert [m.body for _, m in got] == ["m1", "m2"]
    for d, _ in got:
        c.settle(d)


# -- the /management hook ----------------------------------------------------------------
def test_management_link_pair_routes_requests_to_the_handler(broker: Harness) -> None:
    seen: list[AmqpMessage] = []

    later: list[Any] = []

    def factory(session: Any, vhost: Any, reply_later: Any) -> ManagementHandler:
        def handle(request: AmqpMessage) -> list[AmqpMessage]:
            seen.append(request)
            props = request.properties or Properties()
            reply = AmqpMessage(
                properties=Properties(correlation_id=props.message_id, subject="200"),
                body=[AmqpValue({"vhost": vhost.name, "user": session.user.name})],
            )
            if props.subject == "PUT":  # held, as a declare's reply is
                later.append(lambda: reply_later(reply))
                return []
            return [reply]

        return handle

    c = client(broker, management=factory)
    session = c.session()
    sender = c.sender("/management", session=session, name="mgmt")
    receiver = c.receiver("/management", session=session, name="mgmt", credit=1)
    assert sender.credit == 8
    request = proton.Message(id="req-1", subject="GET", address="/queues/q", body={})
    d = c.send(sender, request)
    assert d.remote_state == Delivery.ACCEPTED
    ((_, reply),) = c.receive(receiver)
    assert reply.correlation_id == "req-1" and reply.subject == "200"
    assert reply.body == {"vhost": "/", "user": "guest"}
    assert len(seen) == 1
    receiver.flow(1)
    c.send(sender, proton.Message(id="req-2", subject="PUT", body={}))
    assert c.receive(receiver) == []
    later.pop()()
    c.pump()
    ((_, held),) = c.receive(receiver)
    assert held.correlation_id == "req-2"
    sender.close()
    receiver.close()
    c.pump()
    assert all(not s.pairs for s in c.conn.sessions.values())  # the pair ended


def test_without_a_management_node_the_link_is_refused(broker: Harness) -> None:
    c = client(broker)
    sender = c.sender("/management")
    assert sender.remote_condition.name == "amqp:not-found"


def test_unfinished_messages_of_a_connection_are_bounded(broker: Harness) -> None:
    """Partial messages on all links together hold at most max_message_size."""
    broker.config.max_message_size = 1000
    declare(broker, "q")
    c = client(broker, max_frame_size=512)
    session = c.session()
    first = c.sender("/queues/q", session=session, name="first")
    second = c.sender("/queues/q", session=session, name="second")
    first.delivery("a")
    first.stream(b"\x00\x53\x75\xb0\x00\x00\x03\x00" + b"a" * 600)
    c.pump()
    second.delivery("b")
    second.stream(b"\x00\x53\x75\xb0\x00\x00\x03\x00" + b"b" * 600)
    c.pump()
    assert second.remote_condition.name == "amqp:link:transfer-limit-exceeded"
    assert first.state & proton.Endpoint.REMOTE_ACTIVE
    assert c.conn.unfinished > 0
    first.close()
    c.pump()
    assert c.conn.unfinished == 0


def test_the_clients_session_window_bounds_what_is_sent(broker: Harness) -> None:
    """Proton announces a window of two frames: the broker's first answer to the
    credit holds two transfers; the rest follow as proton's flows open it."""
    declare(broker, "q")
    c = client(broker, max_frame_size=512)
    fill(c, "q", 6)
    session = c.connection.session()
    session.incoming_capacity = 2 * 512  # proton's window: two frames
    session.open()
    c.pump()
    receiver = session.receiver("r")
    receiver.source.address = "/queues/q"
    receiver.open()
    receiver.flow(10)
    mark = len(c.received)
    c.pump(rounds=1)
    reader = FrameReader(1 << 20)
    frames = reader.feed(bytes(c.received[mark:]))
    transfers = [f for f in frames if isinstance(f, Frame) and isinstance(f.performative, Transfer)]
    assert len(transfers) == 2
    c.pump()
    got = c.receive(receiver)
    assert len(got) == 6


def test_link_priority_is_the_consumers(broker: Harness) -> None:
    declare(broker, "q")
    c = client(broker)

    def high(receiver: Any) -> None:
        receiver.properties = {proton.symbol("rabbitmq:priority"): proton.int32(5)}

    low = c.receiver("/queues/q", credit=10, name="low")
    top = c.receiver("/queues/q", credit=10, name="top", configure=high)
    fill(c, "q", 3)
    assert len(c.receive(top)) == 3
    assert c.receive(low) == []


def test_a_disposition_range_settles_every_delivery_in_it(broker: Harness) -> None:
    """first..last in one disposition (proton settles one by one: the frame is
    written here, on the receiver's session channel)."""
    declare(broker, "q")
    c = client(broker)
    fill(c, "q", 4)
    session = c.session()
    receiver = c.receiver("/queues/q", session=session, credit=4)
    got = c.receive(receiver)
    assert len(got) == 4
    (ours,) = [s for s in c.conn.sessions.values() if s.outgoing]
    ids = sorted(ours.outgoing)
    frame = encode_frame(
        ours.channel,
        Disposition(role=True, first=ids[0], last=ids[2], settled=True, state=Accepted()),
    )
    c.broker.feed(frame)
    c.pump()
    assert sorted(ours.outgoing) == [ids[3]]
    receiver.close()
    c.pump()
    assert count(broker, "q") == 1  # the unsettled fourth went back


unsynced = harness_fixture(manual_clock=True, sync=False)


def test_with_sync_off_accepted_after_the_turns_write_out(unsynced: Harness) -> None:
    declare(unsynced, "durable", durable=True)
    c = client(unsynced)
    sender = c.sender("/queues/durable")
    d = c.send(sender, proton.Message(body="written out", durable=True))
    assert d.remote_state == Delivery.ACCEPTED
    assert count(unsynced, "durable") == 1


def test_a_resource_alarm_withholds_credit(broker: Harness) -> None:
    declare(broker, "q")
    c = client(broker)
    sender = c.sender("/queues/q")
    broker.call(lambda: c.conn.set_blocked(True))
    for i in range(85):
        sender.delivery(f"d{i}")
        sender.send(proton.Message(body=i).encode())
        sender.advance()
    c.pump()
    assert sender.credit == 85  # not topped up while blocked
    broker.call(lambda: c.conn.set_blocked(False))
    c.pump()
    assert sender.credit == 170


def _temporary(terminus: Any) -> None:
    terminus.dynamic = True
    terminus.capabilities.put_array(False, proton.Data.SYMBOL)
    terminus.capabilities.enter()
    terminus.capabilities.put_symbol("temporary-queue")
    terminus.capabilities.exit()


def test_a_dynamic_source_is_a_temporary_queue(broker: Harness) -> None:
    """RabbitMQ 4's temporary queues (its clients' reply queues): a dynamic
    source with the temporary-queue capability gets an exclusive queue, its
    address in the attach's answer, deleted with the link."""
    c = client(broker)
    session = c.session()
    receiver = session.receiver("replies")
    _temporary(receiver.source)
    receiver.open()
    receiver.flow(1)
    c.pump()
    address = receiver.remote_source.address
    assert address.startswith("/queues/amq.gen-")
    assert receiver.remote_source.dynamic
    name = address[len("/queues/") :]
    queue = broker.broker.vhosts["/"].queues[name]
    assert queue.exclusive_owner is c.conn
    sender = c.sender(address, session=session)
    assert c.send(sender, proton.Message(body="reply")).remote_state == Delivery.ACCEPTED
    ((delivery, message),) = c.receive(receiver)
    assert message.body == "reply"
    c.settle(delivery)
    receiver.close()
    c.pump()
    assert name not in broker.broker.vhosts["/"].queues


def test_a_dynamic_target_is_a_temporary_queue(broker: Harness) -> None:
    c = client(broker)
    session = c.session()
    sender = session.sender("requests")
    _temporary(sender.target)
    sender.open()
    c.pump()
    address = sender.remote_target.address
    name = address[len("/queues/") :]
    assert c.send(sender, proton.Message(body="x")).remote_state == Delivery.ACCEPTED
    assert count(broker, name) == 1
    sender.close()
    c.pump()
    assert name not in broker.broker.vhosts["/"].queues


def test_a_dynamic_source_without_the_capability_is_refused(broker: Harness) -> None:
    c = client(broker)
    session = c.session()
    receiver = session.receiver("r")
    receiver.source.dynamic = True
    receiver.open()
    c.pump()
    assert receiver.remote_condition.name == "amqp:not-implemented"


def test_the_consumer_timeout_releases_what_waits_too_long(broker: Harness) -> None:
    """Unsettled past the timeout (at most one check late): back in the queue,
    the client told released; the link stays and gets it again."""
    declare(broker, "q")
    c = client(broker)
    fill(c, "q", 1)
    receiver = c.receiver("/queues/q", credit=1)
    ((delivery, _),) = c.receive(receiver)
    clock = broker.broker.clock
    check = c.conn.check_consumer_timeouts
    broker.call(lambda: check(clock.now_ms(), 1000))  # the first mark
    broker.advance(999)
    broker.call(lambda: check(clock.now_ms(), 1000))
    c.pump()
    assert delivery.remote_state == 0 and count(broker, "q") == 0
    broker.advance(1)
    broker.call(lambda: check(clock.now_ms(), 1000))
    c.pump()
    assert delivery.remote_state == Delivery.RELEASED
    assert count(broker, "q") == 1
    c.settle(delivery)  # too late: ignored
    assert count(broker, "q") == 1
    receiver.flow(1)
    c.pump()
    ((again, message),) = c.receive(receiver)
    assert message.first_acquirer is False
    c.settle(again)
    assert count(broker, "q") == 0


def test_a_transaction_coordinator_is_refused(broker: Harness) -> None:
    c = client(broker)
    session = c.session()
    sender = session.sender("txn")
    sender.target.type = proton.Terminus.COORDINATOR
    sender.open()
    c.pump()
    assert sender.remote_condition.name == "amqp:not-implemented"
