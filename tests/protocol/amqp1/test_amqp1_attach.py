"""AMQP 1.0 attaches in memory, as RabbitMQ 4 answers them
(rabbit_amqp_session:validate_attach, ensure_source, ensure_target): resuming a
link (unsettled state, a null source) and rcv-settle-mode second are refused
with its conditions, a link detached without closing is attached again by
name, and RabbitMQ 3.x's v1 addresses declare their queues or, on an
exchange, consume a queue bound to it. Qpid Proton's engine is the client
(harness/amqp1.py); attaches proton cannot write are written by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from harness import Harness, harness_fixture
from harness.amqp1 import ProtonClient
from harness.held_syncs import HeldSyncs

from warren.amqp1.frames import Frame, FrameReader, encode_frame
from warren.amqp1.performatives import (
    RECEIVER,
    SENDER,
    Attach,
    Detach,
    Source,
    Target,
)
from warren.amqp1.types import Symbol

proton = pytest.importorskip("proton")
Delivery, Link, Terminus = proton.Delivery, proton.Link, proton.Terminus

broker = harness_fixture(manual_clock=True)


def client(harness: Harness, **options: Any) -> ProtonClient:
    return ProtonClient(harness, **options).open()


def declare(harness: Harness, name: str, durable: bool = False) -> None:
    harness.call(lambda: harness.broker.vhosts["/"].declare_queue(name, durable=durable))


def queues(harness: Harness) -> dict[str, Any]:
    return harness.broker.vhosts["/"].queues


def refused(link: Any) -> str:
    """The condition of a link the broker attached and detached at once."""
    assert link.state & proton.Endpoint.REMOTE_CLOSED, "the link was not detached"
    return str(link.remote_condition.name)


def attached(link: Any) -> bool:
    return bool(link.state & proton.Endpoint.REMOTE_ACTIVE) and link.remote_condition is None


def publish(c: ProtonClient, address: str, body: str, subject: str | None = None) -> int:
    sender = c.sender(address, name=f"p-{body}")
    delivery = c.send(sender, proton.Message(body=body, subject=subject))
    sender.close()
    c.pump()
    return int(delivery.remote_state)


def raw_attach(c: ProtonClient, attach: Attach) -> list[Any]:
    """Write ``attach`` on the client's first session (proton cannot write one
    with unsettled state or a null source); the broker's answers, decoded."""
    (session,) = c.conn.sessions.values()
    mark = len(c.received)
    c.broker.feed(encode_frame(session.channel, attach))
    c.pump()
    frames = FrameReader(1 << 20).feed(bytes(c.received[mark:]))
    return [f.performative for f in frames if isinstance(f, Frame)]


# -- resuming links --------------------------------------------------------------------
@pytest.mark.parametrize(
    "fields",
    [
        {"unsettled": {b"tag-1": None}},
        {"incomplete_unsettled": True},
        {"unsettled": {}, "incomplete_unsettled": True},
    ],
    ids=["unsettled", "incomplete", "both"],
)
@pytest.mark.parametrize("role", [SENDER, RECEIVER], ids=["sending", "receiving"])
def test_an_attach_resuming_a_link_is_refused(
    broker: Harness, role: bool, fields: dict[str, Any]
) -> None:
    """Link recovery (2.6.13): RabbitMQ 4 answers the attach with a null
    terminus and detaches with amqp:not-implemented; the session goes on."""
    declare(broker, "q")
    c = client(broker)
    session = c.session()
    terminus = {"source": Source(address="/queues/q"), "target": Target()}
    if role == SENDER:
        terminus = {"source": Source(), "target": Target(address="/queues/q")}
    answers = raw_attach(
        c,
        Attach(name="resumed", handle=7, role=role, initial_delivery_count=0, **terminus, **fields),
    )
    reply, detach = answers
    assert isinstance(reply, Attach) and reply.role is not role
    assert (reply.source if role == RECEIVER else reply.target) is None
    assert isinstance(detach, Detach) and detach.handle == 7 and detach.closed
    assert detach.error is not None
    assert detach.error.condition == Symbol("amqp:not-implemented")
    assert detach.error.description == "Link recovery not supported"
    receiver = c.receiver("/queues/q", session=session, name="after")
    assert attached(receiver)


def test_an_empty_unsettled_map_is_a_fresh_link(broker: Harness) -> None:
    declare(broker, "q")
    c = client(broker)
    c.session()
    answers = raw_attach(
        c,
        Attach(
            name="fresh",
            handle=7,
            role=RECEIVER,
            source=Source(address="/queues/q"),
            target=Target(),
            unsettled={},
        ),
    )
    (reply,) = answers
    assert isinstance(reply, Attach) and reply.source is not None
    assert reply.source.address == "/queues/q"


def test_a_null_source_is_refused_with_invalid_field(broker: Harness) -> None:
    """A receiver's null source asks the broker for the link's terminus
    (recovering a link, 2.6.3): RabbitMQ 4 has none ("source_required")."""
    c = client(broker)
    c.session()
    reply, detach = raw_attach(c, Attach(name="r", handle=3, role=RECEIVER, target=Target()))
    assert isinstance(reply, Attach) and reply.source is None
    assert isinstance(detach, Detach) and detach.error is not None
    assert detach.error.condition == Symbol("amqp:invalid-field")


def test_a_link_detached_without_closing_is_attached_again_by_name(broker: Harness) -> None:
    """A detach with closed=false suspends the link: RabbitMQ 4 keeps nothing
    of it (the detach is echoed, what it delivered and was not settled goes
    back to the queue), and an attach of the same name is a new link."""
    declare(broker, "q")
    c = client(broker)
    publish(c, "/queues/q", "one")
    session = c.session()
    receiver = c.receiver("/queues/q", session=session, name="durable-sub", credit=1)
    ((delivery, _),) = c.receive(receiver)
    mark = len(c.received)
    receiver.detach()
    c.pump()
    frames = FrameReader(1 << 20).feed(bytes(c.received[mark:]))
    (echo,) = [f.performative for f in frames if isinstance(f, Frame)]
    assert isinstance(echo, Detach) and echo.closed is False and echo.error is None
    assert queues(broker)["q"].message_count == 1  # back in the queue
    again = session.receiver("durable-sub")
    again.source.address = "/queues/q"
    again.open()
    again.flow(1)
    c.pump()
    assert attached(again)
    ((redelivery, message),) = c.receive(again)
    assert message.body == "one" and message.first_acquirer is False
    c.settle(redelivery)
    assert queues(broker)["q"].message_count == 0


def test_a_durable_terminus_and_its_expiry_policy_are_echoed(broker: Harness) -> None:
    """RabbitMQ 4 keeps no terminus state: durability and expiry-policy are
    taken as asked (answered as given) and change nothing for a v2 address."""
    declare(broker, "q")
    c = client(broker)

    def durable(link: Any) -> None:
        link.source.durability = Terminus.DELIVERIES
        link.source.expiry_policy = Terminus.EXPIRE_NEVER

    receiver = c.receiver("/queues/q", configure=durable)
    assert attached(receiver)
    assert receiver.remote_source.durability == Terminus.DELIVERIES
    assert receiver.remote_source.expiry_policy == Terminus.EXPIRE_NEVER


# -- rcv-settle-mode second ------------------------------------------------------------
@pytest.mark.parametrize("snd", [Link.SND_UNSETTLED, Link.SND_MIXED], ids=["unsettled", "mixed"])
@pytest.mark.parametrize("role", ["sender", "receiver"])
def test_rcv_settle_mode_second_is_refused(broker: Harness, role: str, snd: int) -> None:
    """Unless the sender settles first, RabbitMQ 4 refuses second with
    amqp:not-implemented, on either kind of link (validate_attach)."""
    declare(broker, "q")
    c = client(broker)
    session = c.session()
    link = session.sender("l") if role == "sender" else session.receiver("l")
    terminus = link.target if role == "sender" else link.source
    terminus.address = "/queues/q"
    link.snd_settle_mode = snd
    link.rcv_settle_mode = Link.RCV_SECOND
    link.open()
    c.pump()
    assert refused(link) == "amqp:not-implemented"
    assert link.remote_condition.description == "rcv-settle-mode second not supported"
    assert link.remote_rcv_settle_mode == Link.RCV_SECOND  # the refusal echoes it
    assert attached(c.receiver("/queues/q", session=session, name="after"))


def test_rcv_settle_mode_second_with_presettled_deliveries(broker: Harness) -> None:
    """A receiver whose sender settles first may ask for second: the broker
    answers second (it has nothing to settle second) and sends pre-settled."""
    declare(broker, "q")
    c = client(broker)
    publish(c, "/queues/q", "one")

    def second(link: Any) -> None:
        link.rcv_settle_mode = Link.RCV_SECOND

    receiver = c.receiver("/queues/q", settled=True, credit=1, configure=second)
    assert attached(receiver)
    assert receiver.remote_rcv_settle_mode == Link.RCV_SECOND
    assert receiver.remote_snd_settle_mode == Link.SND_SETTLED
    ((delivery, message),) = c.receive(receiver)
    assert message.body == "one" and delivery.settled
    assert queues(broker)["q"].message_count == 0


def test_a_presettled_sender_asking_second_gets_first(broker: Harness) -> None:
    """The client's sender settles first: RabbitMQ 4 attaches it and answers
    rcv-settle-mode first (the broker is the receiver, and settles first)."""
    declare(broker, "q")
    c = client(broker)
    session = c.session()
    sender = session.sender("s")
    sender.target.address = "/queues/q"
    sender.snd_settle_mode = Link.SND_SETTLED
    sender.rcv_settle_mode = Link.RCV_SECOND
    sender.open()
    c.pump()
    assert attached(sender) and sender.remote_rcv_settle_mode == Link.RCV_FIRST
    c.send(sender, proton.Message(body="x"))
    assert queues(broker)["q"].message_count == 1


def test_a_mixed_receiver_is_answered_unsettled(broker: Harness) -> None:
    declare(broker, "q")
    c = client(broker)

    def mixed(link: Any) -> None:
        link.snd_settle_mode = Link.SND_MIXED

    receiver = c.receiver("/queues/q", configure=mixed)
    assert receiver.remote_snd_settle_mode == Link.SND_UNSETTLED
    assert receiver.remote_rcv_settle_mode == Link.RCV_FIRST


# -- v1 addresses ----------------------------------------------------------------------
def test_a_v1_exchange_source_consumes_a_queue_bound_with_the_key(broker: Harness) -> None:
    """``/exchange/X/key``: a new queue bound to X with the key, exclusive to
    the connection, deleted with the link."""
    c = client(broker)
    before = set(queues(broker))
    receiver = c.receiver("/exchange/amq.direct/k1", credit=10)
    assert attached(receiver)
    assert receiver.remote_source.address == "/exchange/amq.direct/k1"
    (name,) = set(queues(broker)) - before
    assert name.startswith("amq.gen-")
    queue = queues(broker)[name]
    assert queue.exclusive_owner is c.conn and not queue.durable
    assert publish(c, "/exchanges/amq.direct/k1", "for k1") == Delivery.ACCEPTED
    assert publish(c, "/exchanges/amq.direct/k2", "for k2") == Delivery.RELEASED
    ((delivery, message),) = c.receive(receiver)
    assert message.body == "for k1"
    c.settle(delivery)
    receiver.close()
    c.pump()
    assert set(queues(broker)) == before


@pytest.mark.parametrize(
    ("address", "exchange", "key"),
    [
        ("/exchange/amq.fanout", "/exchanges/amq.fanout", "any"),
        ("/topic/a.*", "/exchanges/amq.topic", "a.b"),
        ("/exchange/amq.topic/%2Fx.#", "/exchanges/amq.topic", "%2Fx.y.z"),
    ],
)
def test_v1_exchange_sources(broker: Harness, address: str, exchange: str, key: str) -> None:
    """``/exchange/X`` binds with key "", ``/topic/key`` to amq.topic; only
    ``%2F`` is decoded in a v1 address (to ``/``)."""
    c = client(broker)
    receiver = c.receiver(address, credit=10)
    assert attached(receiver)
    assert publish(c, f"{exchange}/{key}", "hit") == Delivery.ACCEPTED
    ((_, message),) = c.receive(receiver)
    assert message.body == "hit"


def test_a_v1_exchange_source_on_a_missing_exchange_is_not_found(broker: Harness) -> None:
    c = client(broker)
    before = set(queues(broker))
    assert refused(c.receiver("/exchange/nope/k")) == "amqp:not-found"
    assert set(queues(broker)) == before


def test_a_topic_permission_refuses_a_v1_topic_source(broker: Harness) -> None:
    """Binding needs what a 0-9-1 bind needs: a topic permission to read the key."""
    users = broker.broker.users
    broker.call(lambda: users.add_user("u", "pw"))
    broker.call(lambda: users.set_permissions("u", "/"))
    broker.call(lambda: users.set_topic_permission("u", "/", "amq.topic", read="^public\\."))
    c = client(broker, user="u", password="pw")
    before = set(queues(broker))
    assert attached(c.receiver("/topic/public.news", name="ok"))
    assert refused(c.receiver("/topic/private.x", name="no")) == "amqp:unauthorized-access"
    assert len(set(queues(broker)) - before) == 1  # the refused link's queue went


def test_v1_queue_addresses_declare_their_queue(broker: Harness) -> None:
    """``/queue/Q`` (source or target) declares Q when it does not exist, a
    classic queue durable when the terminus is (RabbitMQ 4's and 3.x's
    rabbit_amqp1_0_link_util:durable), taken as it is when it exists."""
    c = client(broker)

    def durable(link: Any) -> None:
        link.source.durability = Terminus.CONFIGURATION

    assert attached(c.receiver("/queue/kept", name="r1", configure=durable))
    assert attached(c.receiver("/queue/transient", name="r2"))
    sender = c.sender("/queue/by-target", name="s1")
    assert attached(sender)
    kept, transient, by_target = (queues(broker)[n] for n in ("kept", "transient", "by-target"))
    assert kept.durable and not transient.durable and not by_target.durable
    assert kept.exclusive_owner is None and not kept.auto_delete
    c.send(sender, proton.Message(body="x"))
    assert by_target.message_count == 1
    again = c.receiver("/queue/transient", name="r3", configure=durable)
    assert attached(again) and queues(broker)["transient"] is transient


def test_a_queue_an_attach_declares_is_durable_before_the_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A durable ``/queue/Q`` the attach declares: with the sync round's file
    syncs held, the queue exists but the attach is not answered (a 0-9-1
    declare-ok waits so); the credit the client sent right behind its attach
    waits with it, and is taken once the answer is out."""
    syncs = HeldSyncs(monkeypatch)
    with Harness(tmp_path / "data") as harness:
        c = ProtonClient(harness).open()
        session = c.session()
        harness.settle()
        syncs.hold()
        try:
            receiver = session.receiver("r")
            receiver.source.address = "/queue/kept"
            receiver.source.durability = Terminus.CONFIGURATION
            receiver.open()
            receiver.flow(5)  # in the same write as the attach, as proton sends it
            c.pump(ready_only=True)
            assert syncs.waiting.wait(30), "no sync round started"
            harness.run_ready()
            c.pump(ready_only=True)
            assert queues(harness)["kept"].durable
            assert not receiver.state & proton.Endpoint.REMOTE_ACTIVE, "answered before durable"
        finally:
            syncs.release()
        c.pump()
        assert attached(receiver)
        assert publish(c, "/queues/kept", "after") == Delivery.ACCEPTED
        assert [m.body for _, m in c.receive(receiver)] == ["after"]


def test_a_v1_queue_with_a_reserved_name_is_not_declared(broker: Harness) -> None:
    """As a 0-9-1 declare (and RabbitMQ 3.x's plugin, which declared through
    one): ``amq.`` names are reserved."""
    c = client(broker)
    assert refused(c.sender("/queue/amq.mine")) == "amqp:unauthorized-access"
    assert "amq.mine" not in queues(broker)


def test_v1_amq_queue_must_exist(broker: Harness) -> None:
    c = client(broker)
    assert refused(c.receiver("/amq/queue/missing", name="r")) == "amqp:not-found"
    assert refused(c.sender("/amq/queue/missing", name="s")) == "amqp:not-found"
    assert "missing" not in queues(broker)
    declare(broker, "there")
    assert attached(c.receiver("/amq/queue/there", name="r2"))


def test_v1_queue_needs_configure_permission(broker: Harness) -> None:
    """RabbitMQ 4 declares a v1 queue whether it exists or not: configure
    permission is needed either way."""
    declare(broker, "q")
    users = broker.broker.users
    broker.call(lambda: users.add_user("u", "pw"))
    broker.call(lambda: users.set_permissions("u", "/", configure="^nothing$"))
    c = client(broker, user="u", password="pw")
    assert refused(c.receiver("/queue/q", name="r")) == "amqp:unauthorized-access"
    assert refused(c.sender("/queue/new", name="s")) == "amqp:unauthorized-access"
    assert "new" not in queues(broker)
    assert attached(c.receiver("/queues/q", name="v2"))


def test_a_v1_queue_of_another_connection_is_locked(broker: Harness) -> None:
    owner = client(broker)
    broker.call(
        lambda: broker.broker.vhosts["/"].declare_queue(
            "mine", durable=False, exclusive=True, owner=owner.conn
        )
    )
    other = client(broker)
    assert refused(other.receiver("/queue/mine")) == "amqp:resource-locked"
