"""What a follower's read service forwards to the leader, in memory
(stream_protocol/replica_forward.py, leader_link.py): single active consumer
groups and StoreOffset. The leader is the harness broker; each
ReplicaStreamConnection's LeaderLink talks to a StreamConnection of that
broker, their bytes carried both ways until both are quiet. rstream encodes
the clients' frames and decodes the answers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness import harness_fixture
from harness.broker import Harness
from harness.stream import MemoryStream, split_frames
from rstream import encoding, schema
from rstream.amqp import AMQPMessage, amqp_decoder
from test_stream_super_sac import declare_super_stream
from test_stream_super_sac import publish as publish_to

from warren.app import AMQP1StreamMessages
from warren.store.replica_catalog import ReplicaCatalog
from warren.store.stream_tracking import TRACKING_WRITE_MS
from warren.stream_protocol import commands as c
from warren.stream_protocol.chunk import decode_delivered_chunk, read_records
from warren.stream_protocol.constants import ResponseCode
from warren.stream_protocol.frames import decode_frame
from warren.stream_protocol.leader_link import LeaderLink
from warren.stream_protocol.publish import Deliver, Publish, PublishedMessage
from warren.stream_protocol.replica import ReplicaStreamConnection

broker = harness_fixture(manual_clock=True)

OK = ResponseCode.OK
FIRST = schema.OffsetSpecification(offset_type=1, offset=None)  # type: ignore[arg-type]
NEXT = schema.OffsetSpecification(offset_type=3, offset=None)  # type: ignore[arg-type]


#: rstream's names: the broker's ConsumerUpdate, and the client's answer to it.
UPDATE = schema.ConsumerUpdateResponse
ANSWER = schema.ConsumerUpdateServerResponse


def offset_spec(offset: int) -> schema.OffsetSpecification:
    return schema.OffsetSpecification(offset_type=4, offset=offset)


def sac(name: str = "g", super_stream: str | None = None) -> list[schema.Property]:
    props = [schema.Property("single-active-consumer", "true"), schema.Property("name", name)]
    if super_stream is not None:
        props.append(schema.Property("super-stream", super_stream))
    return props


class ForwardingWire:
    """A client of a follower's read service whose links reach the harness
    broker: ``leader_side`` is the leader's connection of the open link."""

    def __init__(self, broker: Harness, reachable: bool = True) -> None:
        self.broker = broker
        self.correlation = 0
        self.reachable = reachable
        self.catalog = ReplicaCatalog(Path(broker.broker.config.data_dir))
        self.links: list[tuple[LeaderLink, MemoryStream]] = []
        self.conn = ReplicaStreamConnection(
            self.catalog,
            "reader",
            ("replica.example", 5553),
            lambda: (("leader.example", 5552), [("replica.example", 5553)]),
            lambda: 0,
            AMQP1StreamMessages(),
            connect=self._connect,
        )

    def _connect(self, link: LeaderLink, conn: ReplicaStreamConnection) -> None:
        assert conn is self.conn
        if not self.reachable:
            link.lost("unreachable")
            return
        self.links.append((link, MemoryStream(self.broker)))

    @property
    def leader_side(self) -> MemoryStream:
        return self.links[-1][1]

    def next_id(self) -> int:
        self.correlation += 1
        return self.correlation

    def carry(self) -> None:
        """Bytes both ways between the links and the leader until both are quiet."""
        moved = True
        while moved:
            moved = False
            for link, side in self.links:
                out = b"".join(link.take_output())
                if out and not side.lost:
                    moved = True

                    def feed(data: bytes = out, side: MemoryStream = side) -> None:
                        side.conn.now_ms = self.broker.broker.clock.now_ms()
                        side.conn.feed(data)

                    self.broker.call(feed)
                self.broker.settle()
                back = side.take() if not side.lost else b""
                if back:
                    moved = True
                    link.feed(back)
                if link.closed and not side.lost:
                    side.lost = True
                    self.broker.call(side.conn.connection_lost)
                    self.broker.settle()

    def raw(self, data: bytes = b"") -> list[bytes]:
        self.conn.feed(data)
        self.carry()
        self.catalog.refresh()
        self.conn.pump()
        return split_frames(b"".join(self.conn.take_output()))

    def send(self, frame: Any) -> list[Any]:
        return [encoding.decode_frame(f) for f in self.raw(encoding.encode_frame(frame))]

    def open(self) -> None:
        self.send(schema.PeerProperties(self.next_id(), []))
        self.send(schema.SaslHandshake(self.next_id()))
        self.send(schema.SaslAuthenticate(self.next_id(), "PLAIN", b"\0guest\0guest"))
        self.send(schema.Tune(1 << 20, 60))
        [opened] = self.send(schema.Open(self.next_id(), "/"))
        assert opened.response_code == OK


def leader_client(broker: Harness, stream: str = "s") -> MemoryStream:
    client = MemoryStream(broker)
    assert client.open().response_code == OK
    client.request(schema.Create(client.next_id(), stream, []))
    answer = client.request(schema.DeclarePublisher(client.next_id(), 1, "", stream))
    assert answer.response_code == OK
    return client


def publish(client: MemoryStream, ids: list[int]) -> None:
    msgs = [PublishedMessage.simple(i, bytes(AMQPMessage(body=b"m%d" % i))) for i in ids]
    client.raw(Publish.of(1, msgs).encode())


def bodies(frames: list[Any]) -> list[bytes]:
    out = []
    for f in frames:
        if isinstance(f, schema.Deliver):
            d = decode_frame(encoding.encode_frame(f)[4:])
            assert isinstance(d, Deliver)
            _, data, entries = decode_delivered_chunk(d.chunk)
            out += [amqp_decoder(r).body for e in entries for r in read_records(data, e)]
    return out


def kinds(frames: list[Any], kind: type) -> list[Any]:
    return [f for f in frames if isinstance(f, kind)]


def test_a_single_active_consumer_on_the_follower_joins_the_leaders_group(
    broker: Harness,
) -> None:
    client = leader_client(broker)
    for i in (1, 2, 3):  # a chunk each (a whole chunk is sent whole)
        publish(client, [i])
    wire = ForwardingWire(broker)
    wire.open()
    frames = wire.send(schema.Subscribe(wire.next_id(), 5, "s", FIRST, 10, sac()))
    answer, update = frames
    assert answer.response_code == OK
    assert isinstance(update, UPDATE)
    assert (update.subscription_id, update.active) == (5, 1)
    # Active: it reads here, from where its answer says.
    frames = wire.send(ANSWER(update.correlation_id, OK, offset_spec(1)))
    assert bodies(frames) == [b"m2", b"m3"]
    # A second member on the leader waits, unannounced.
    other = MemoryStream(broker)
    other.open()
    frames = other.send(schema.Subscribe(other.next_id(), 1, "s", FIRST, 10, sac()))
    assert [type(f) for f in frames] == [schema.SubscribeResponse]
    publish(client, [4])
    assert bodies(wire.send(schema.Credit(5, 1))) == [b"m4"]
    # The follower's member goes: the leader's takes over.
    [gone] = wire.send(schema.Unsubscribe(wire.next_id(), 5))
    assert gone.response_code == OK
    frames = [encoding.decode_frame(f) for f in split_frames(other.take())]
    [update] = kinds(frames, UPDATE)
    assert (update.subscription_id, update.active) == (1, 1)


def test_the_hand_over_to_a_follower_member_when_the_active_one_leaves(
    broker: Harness,
) -> None:
    client = leader_client(broker)
    publish(client, [1, 2])
    first = MemoryStream(broker)
    first.open()
    frames = first.send(schema.Subscribe(first.next_id(), 1, "s", FIRST, 10, sac()))
    [update] = kinds(frames, UPDATE)
    first.send(ANSWER(update.correlation_id, OK, FIRST))
    wire = ForwardingWire(broker)
    wire.open()
    frames = wire.send(schema.Subscribe(wire.next_id(), 3, "s", FIRST, 10, sac()))
    assert [type(f) for f in frames] == [schema.SubscribeResponse]
    publish(client, [3])
    assert wire.raw() == []  # waiting: nothing read here
    # The active one's connection ends: the follower's member is activated.
    broker.call(first.conn.connection_lost)
    broker.settle()
    frames = [encoding.decode_frame(f) for f in wire.raw()]
    [update] = kinds(frames, UPDATE)
    assert (update.subscription_id, update.active) == (3, 1)
    frames = wire.send(ANSWER(update.correlation_id, OK, offset_spec(2)))
    assert bodies(frames) == [b"m3"]


def test_a_partition_handed_over_from_the_follower(broker: Harness) -> None:
    declare_super_stream(broker, partitions=2)
    wire = ForwardingWire(broker)
    wire.open()
    props = sac("app", "invoices")
    frames = wire.send(schema.Subscribe(wire.next_id(), 1, "invoices-1", FIRST, 10, props))
    [update] = kinds(frames, UPDATE)
    frames = wire.send(ANSWER(update.correlation_id, OK, FIRST))
    # A second member: partition 1 (1 % 2) moves to it, this one steps down first.
    other = MemoryStream(broker)
    other.open()
    frames = other.send(schema.Subscribe(other.next_id(), 1, "invoices-1", FIRST, 10, props))
    assert kinds(frames, UPDATE) == []
    frames = [encoding.decode_frame(f) for f in wire.raw()]
    [down] = kinds(frames, UPDATE)
    assert (down.subscription_id, down.active) == (1, 0)
    assert wire.conn.subscriptions[1].sac_active is False
    # Its answer lets the leader activate the other; it reads nothing more here.
    assert wire.send(ANSWER(down.correlation_id, OK, NEXT)) == []
    assert wire.conn.subscriptions[1].sac_active is False
    publish_to(broker, "1", b"late")
    assert wire.raw() == []
    frames = [encoding.decode_frame(f) for f in split_frames(other.take())]
    [up] = kinds(frames, UPDATE)
    assert (up.subscription_id, up.active) == (1, 1)


def test_store_offset_through_the_follower(broker: Harness) -> None:
    client = leader_client(broker)
    publish(client, [1, 2, 3])
    wire = ForwardingWire(broker)
    wire.open()
    assert wire.send(schema.StoreOffset("app", "s", 1)) == []
    answer = client.request(schema.QueryOffset(client.next_id(), "app", "s"))
    assert (answer.response_code, answer.offset) == (OK, 1)
    broker.advance(TRACKING_WRITE_MS)  # the leader writes its tracking: replicated
    [answer] = wire.send(schema.QueryOffset(wire.next_id(), "app", "s"))
    assert (answer.response_code, answer.offset) == (OK, 1)


def test_a_link_that_ends_ends_what_went_through_it(broker: Harness) -> None:
    leader_client(broker)
    wire = ForwardingWire(broker)
    wire.open()
    frames = wire.send(schema.Subscribe(wire.next_id(), 2, "s", FIRST, 10, sac()))
    assert frames[0].response_code == OK
    broker.call(wire.leader_side.conn.connection_lost)  # the leader went
    wire.leader_side.lost = True
    wire.links[-1][0].lost("gone")
    frames = wire.send(schema.Credit(2, 1))
    [update] = kinds(frames, schema.MetadataUpdate)
    info = update.metadata_info
    assert (info.code, info.stream) == (ResponseCode.STREAM_NOT_AVAILABLE, "s")
    assert wire.conn.subscriptions == {}
    # The next need opens a new link.
    frames = wire.send(schema.Subscribe(wire.next_id(), 2, "s", FIRST, 10, sac()))
    assert frames[0].response_code == OK
    assert len(wire.links) == 2


def test_without_a_leader_a_single_active_consumer_is_not_available(broker: Harness) -> None:
    leader_client(broker)
    wire = ForwardingWire(broker, reachable=False)
    wire.open()
    [answer] = wire.send(schema.Subscribe(wire.next_id(), 2, "s", FIRST, 10, sac()))
    assert answer.response_code == ResponseCode.STREAM_NOT_AVAILABLE
    assert wire.send(schema.StoreOffset("app", "s", 0)) == []


def talk(broker: Harness, link: LeaderLink) -> MemoryStream:
    """``link`` to a new connection of the leader, bytes carried until quiet."""
    side = MemoryStream(broker)
    while True:
        data = b"".join(link.take_output())
        if data:
            broker.call(lambda data=data: side.conn.feed(data))
            broker.settle()
        back = side.take()
        if back:
            link.feed(back)
        if not data and not back:
            return side


def test_the_link_waits_for_open_answers_heartbeats_and_reports_a_refused_login(
    broker: Harness,
) -> None:
    client = leader_client(broker)
    lost: list[str] = []
    got: list[c.Command] = []
    link = LeaderLink("guest", "guest", "/", "t", got.append, lambda _, why: lost.append(why))
    link.send(c.StoreOffset("app", "s", 4))  # before Open: it waits
    talk(broker, link)
    assert not link.closed and lost == [] and got == []
    answer = client.request(schema.QueryOffset(client.next_id(), "app", "s"))
    assert (answer.response_code, answer.offset) == (OK, 4)
    link.feed(c.Heartbeat().encode())
    assert link.take_output() == [c.Heartbeat().encode()]
    bad = LeaderLink("guest", "wrong", "/", "t", got.append, lambda _, why: lost.append(why))
    talk(broker, bad)
    assert bad.closed and got == []
    assert lost == [f"the leader refused the login ({int(ResponseCode.AUTHENTICATION_FAILURE)})"]


def test_an_unsubscribe_while_the_leader_has_not_answered_the_subscribe(
    broker: Harness,
) -> None:
    client = leader_client(broker)
    publish(client, [1])
    wire = ForwardingWire(broker)
    wire.open()
    # Both before the link is even open: the Unsubscribe is answered after the Subscribe.
    subscribe = schema.Subscribe(wire.next_id(), 4, "s", FIRST, 10, sac())
    unsubscribe = schema.Unsubscribe(wire.next_id(), 4)
    data = encoding.encode_frame(subscribe) + encoding.encode_frame(unsubscribe)
    frames = [encoding.decode_frame(f) for f in wire.raw(data)]
    answers = [f for f in frames if not isinstance(f, UPDATE)]
    assert [(type(f), f.correlation_id, f.response_code) for f in answers] == [
        (schema.SubscribeResponse, subscribe.correlation_id, OK),
        (schema.UnsubscribeResponse, unsubscribe.correlation_id, OK),
    ]
    assert wire.conn.subscriptions == {} and not wire.conn.forwarding.pending(4)
    # The leader heard: a member of its own is the group's only one.
    other = MemoryStream(broker)
    other.open()
    frames = other.send(schema.Subscribe(other.next_id(), 1, "s", FIRST, 10, sac()))
    [update] = kinds(frames, UPDATE)
    assert (update.subscription_id, update.active) == (1, 1)
    # The id is free again here.
    [again] = wire.send(schema.Subscribe(wire.next_id(), 4, "s", FIRST, 10, sac()))
    assert again.response_code == OK


def test_an_unsubscribe_waiting_on_a_subscribe_the_link_could_not_take(
    broker: Harness,
) -> None:
    leader_client(broker)
    wire = ForwardingWire(broker)
    wire.open()
    subscribe = schema.Subscribe(wire.next_id(), 4, "s", FIRST, 10, sac())
    unsubscribe = schema.Unsubscribe(wire.next_id(), 4)
    wire.conn.feed(encoding.encode_frame(subscribe) + encoding.encode_frame(unsubscribe))
    wire.links[-1][0].lost("gone")  # before the leader answered
    frames = [encoding.decode_frame(f) for f in wire.raw()]
    assert [(type(f), f.correlation_id, f.response_code) for f in frames] == [
        (schema.SubscribeResponse, subscribe.correlation_id, ResponseCode.STREAM_NOT_AVAILABLE),
        (
            schema.UnsubscribeResponse,
            unsubscribe.correlation_id,
            ResponseCode.SUBSCRIPTION_ID_DOES_NOT_EXIST,
        ),
    ]
