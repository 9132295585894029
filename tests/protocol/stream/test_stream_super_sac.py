"""Single active consumer across a super stream's partitions, in memory
(stream_protocol/single_active.py): a partition's group activates the member
at ``partition index % group size``, and a change of that member goes
through the hand-over (ConsumerUpdate active=false, the old one's answer or
its timeout, then the new one's ConsumerUpdate active=true). The joins and
departures follow rabbit_stream_sac_coordinator_SUITE.erl's; the super stream
is declared over AMQP 0-9-1 (a direct exchange with ``x-super-stream``,
stream queues bound with ``x-stream-partition-order``), and rstream encodes
the client's frames and decodes the broker's."""

from __future__ import annotations

from typing import Any

from harness import harness_fixture
from harness.broker import Harness
from harness.stream import MemoryStream
from rstream import encoding, schema
from rstream.amqp import amqp_decoder

from warren.stream_protocol.chunk import decode_delivered_chunk, read_records
from warren.stream_protocol.constants import ResponseCode
from warren.stream_protocol.frames import decode_frame
from warren.stream_protocol.publish import Deliver
from warren.stream_protocol.single_active import HANDOVER_TIMEOUT_MS, partition_index

broker = harness_fixture(manual_clock=True)

OK = ResponseCode.OK
SUPER = "invoices"
PARTITIONS = [f"{SUPER}-{i}" for i in range(3)]
FIRST = schema.OffsetSpecification(offset_type=1, offset=None)  # type: ignore[arg-type]
NEXT = schema.OffsetSpecification(offset_type=3, offset=None)  # type: ignore[arg-type]
NONE = schema.OffsetSpecification(offset_type=0, offset=None)  # type: ignore[arg-type]


def offset_spec(offset: int) -> schema.OffsetSpecification:
    return schema.OffsetSpecification(offset_type=4, offset=offset)


def declare_super_stream(
    broker: Harness, name: str = SUPER, partitions: int = 3, orders: list[int] | None = None
) -> None:
    """RabbitMQ's topology of a super stream, as its Java client's
    add_super_stream makes it over AMQP 0-9-1."""
    ch = broker.amqp_connection().channel()
    ch.exchange_declare(name, "direct", durable=True, arguments={"x-super-stream": True})
    for i in range(partitions):
        order = i if orders is None else orders[i]
        queue = f"{name}-{order}"
        ch.queue_declare(queue, durable=True, arguments={"x-queue-type": "stream"})
        ch.queue_bind(queue, name, str(i), arguments={"x-stream-partition-order": order})


def publish(broker: Harness, key: str, body: bytes, super_stream: str = SUPER) -> None:
    broker.amqp_connection().channel().basic_publish(super_stream, key, body)


def opened(broker: Harness) -> MemoryStream:
    client = MemoryStream(broker)
    assert client.open().response_code == OK
    return client


def group(name: str = "app", super_stream: str | None = SUPER) -> list[schema.Property]:
    props = [schema.Property("single-active-consumer", "true"), schema.Property("name", name)]
    if super_stream is not None:
        props.append(schema.Property("super-stream", super_stream))
    return props


class Client:
    """A stream connection in memory, with what it was sent but not yet looked at."""

    def __init__(self, broker: Harness) -> None:
        self.stream = opened(broker)
        self.frames: list[Any] = []
        #: The last ConsumerUpdate's correlation id, by subscription.
        self.pending: dict[int, int] = {}

    def feed(self, frame: Any = None) -> None:
        data = b"" if frame is None else bytes(encoding.encode_frame(frame))
        self.frames += self.stream.raw(data)

    def subscribe(self, sid: int, stream: str, props: list[schema.Property], **kw: Any) -> int:
        corr = self.stream.next_id()
        offset = kw.get("offset", FIRST)
        self.feed(schema.Subscribe(corr, sid, stream, offset, kw.get("credit", 10), props))
        return self.response(corr)

    def unsubscribe(self, sid: int) -> int:
        corr = self.stream.next_id()
        self.feed(schema.Unsubscribe(corr, sid))
        return self.response(corr)

    def response(self, corr: int) -> int:
        for i, raw in enumerate(self.frames):
            frame = encoding.decode_frame(raw)
            if getattr(frame, "correlation_id", None) == corr and hasattr(frame, "response_code"):
                del self.frames[i]
                return int(frame.response_code)
        raise AssertionError(f"no answer to {corr}: {self.frames}")

    def updates(self) -> list[tuple[int, bool]]:
        """The ConsumerUpdates received since last asked: (subscription, active)."""
        self.feed()
        out, rest = [], []
        for raw in self.frames:
            frame = encoding.decode_frame(raw)
            if isinstance(frame, schema.ConsumerUpdateResponse):  # rstream's name for it
                out.append((frame.subscription_id, bool(frame.active)))
                self.pending[frame.subscription_id] = frame.correlation_id
            else:
                rest.append(raw)
        self.frames = rest
        return out

    def answer(self, sid: int, offset: schema.OffsetSpecification = NONE) -> None:
        """Answer the last ConsumerUpdate of ``sid`` as rstream's client does."""
        corr = self.pending.pop(sid)
        self.feed(schema.ConsumerUpdateServerResponse(corr, 1, offset))

    def bodies(self) -> dict[int, list[bytes]]:
        """The bodies delivered since last asked, by subscription."""
        self.feed()
        out: dict[int, list[bytes]] = {}
        rest = []
        for raw in self.frames:
            d = decode_frame(raw)
            if not isinstance(d, Deliver):
                rest.append(raw)
                continue
            _, data, entries = decode_delivered_chunk(d.chunk)
            records = [r for e in entries for r in read_records(data, e)]
            out.setdefault(d.subscription_id, []).extend(amqp_decoder(r).body for r in records)
        self.frames = rest
        return out


def test_partition_index_from_the_binding_or_the_name(broker: Harness) -> None:
    declare_super_stream(broker)
    ch = broker.amqp_connection().channel()
    ch.queue_declare("loose-7", durable=True, arguments={"x-queue-type": "stream"})
    ch.queue_declare("loose", durable=True, arguments={"x-queue-type": "stream"})
    ch.exchange_declare("named", "direct", durable=True, arguments={"x-super-stream": True})
    ch.queue_bind("loose-7", "named", "a")
    ch.queue_bind("loose", "named", "b")
    vhost = broker.broker.vhosts["/"]
    assert [partition_index(vhost, SUPER, s) for s in PARTITIONS] == [0, 1, 2]
    # Without the argument RabbitMQ reads the name's suffix; else -1.
    assert partition_index(vhost, "named", "loose-7") == 7
    assert partition_index(vhost, "named", "loose") == -1
    assert partition_index(vhost, "named", "invoices-1") == -1  # not bound there
    assert partition_index(vhost, "missing", "invoices-1") == -1


def test_a_partition_group_as_the_coordinator_suite_joins_and_leaves(broker: Harness) -> None:
    """rabbit_stream_sac_coordinator_SUITE's super_stream_partition_sac_test, on
    partition 1, with the records each active member gets."""
    declare_super_stream(broker)
    one = Client(broker)
    assert one.subscribe(0, "invoices-1", group()) == OK
    assert one.updates() == [(0, True)]
    one.answer(0, FIRST)
    publish(broker, "1", b"a")
    assert one.bodies() == {0: [b"a"]}
    # A second member: 1 % 2 = 1, so the first steps down, told first.
    assert one.subscribe(1, "invoices-1", group()) == OK
    assert one.updates() == [(0, False)]
    publish(broker, "1", b"b")
    assert one.bodies() == {}  # no one is active during the hand-over
    one.answer(0)
    assert one.updates() == [(1, True)]
    one.answer(1, offset_spec(1))
    assert one.bodies() == {1: [b"b"]}
    # A third: 1 % 3 = 1, the active one stays, no one is told.
    assert one.subscribe(2, "invoices-1", group()) == OK
    assert one.updates() == []
    # The first leaves: 1 % 2 = 1 is now subscription 2; 1 steps down.
    assert one.unsubscribe(0) == OK
    assert one.updates() == [(1, False)]
    one.answer(1)
    assert one.updates() == [(2, True)]
    one.answer(2, NEXT)
    publish(broker, "1", b"c")
    assert one.bodies() == {2: [b"c"]}
    # Subscription 1 leaves: 2 stays, alone.
    assert one.unsubscribe(1) == OK
    assert one.updates() == []
    assert one.unsubscribe(2) == OK
    assert one.updates() == []


def test_super_stream_consumers_share_the_partitions(broker: Harness) -> None:
    """Three consumers joining a group over the 3 partitions each (as rstream's
    SuperStreamConsumer subscribes) end with one partition each; when one
    connection goes, the two left share them again."""
    declare_super_stream(broker)
    a, b, c = Client(broker), Client(broker), Client(broker)
    for sid, stream in enumerate(PARTITIONS):
        assert a.subscribe(sid, stream, group()) == OK
    assert a.updates() == [(0, True), (1, True), (2, True)]
    for sid in range(3):
        a.answer(sid, NEXT)
    for sid, stream in enumerate(PARTITIONS):
        assert b.subscribe(sid, stream, group()) == OK
    # Two members: partition 1 goes to b (1 % 2), 0 and 2 stay with a.
    assert a.updates() == [(1, False)]
    assert b.updates() == []
    a.answer(1)
    assert b.updates() == [(1, True)]
    b.answer(1, NEXT)
    for sid, stream in enumerate(PARTITIONS):
        assert c.subscribe(sid, stream, group()) == OK
    # Three: partition 2 goes to c, 0 stays with a and 1 with b.
    assert a.updates() == [(2, False)]
    a.answer(2)
    assert c.updates() == [(2, True)]
    c.answer(2, NEXT)
    assert b.updates() == []
    for key in "012":
        publish(broker, key, key.encode())
    assert (a.bodies(), b.bodies(), c.bodies()) == ({0: [b"0"]}, {1: [b"1"]}, {2: [b"2"]})
    # a's connection goes: members (b, c) share the partitions: 0 -> b,
    # 1 -> c (b steps down first), 2 -> b (c steps down first).
    broker.call(a.stream.conn.connection_lost)
    assert b.updates() == [(0, True), (1, False)]
    assert c.updates() == [(2, False)]
    b.answer(0, NEXT)
    b.answer(1)
    c.answer(2)
    assert b.updates() == [(2, True)]
    assert c.updates() == [(1, True)]
    b.answer(2, NEXT)
    c.answer(1, NEXT)
    for key in "012":
        publish(broker, key, key.encode())
    assert (b.bodies(), c.bodies()) == ({0: [b"0"], 2: [b"2"]}, {1: [b"1"]})


def test_the_hand_over_lets_the_old_consumer_store_its_offset(broker: Harness) -> None:
    """What the hand-over is for: the consumer stepping down stores where it
    got to, the new one asks for it when told it is active and starts after."""
    declare_super_stream(broker)
    for body in (b"a", b"b", b"c"):
        publish(broker, "1", body)
    one, two = Client(broker), Client(broker)
    assert one.subscribe(1, "invoices-1", group()) == OK
    assert one.updates() == [(1, True)]
    one.answer(1, FIRST)
    assert one.bodies() == {1: [b"a", b"b", b"c"]}
    assert two.subscribe(1, "invoices-1", group()) == OK
    assert one.updates() == [(1, False)]
    one.feed(schema.StoreOffset(reference="app", stream="invoices-1", offset=2))
    one.answer(1)
    assert two.updates() == [(1, True)]
    corr = two.stream.next_id()
    two.feed(schema.QueryOffset(corr, reference="app", stream="invoices-1"))
    (query,) = [encoding.decode_frame(f) for f in two.frames]
    two.frames.clear()
    assert isinstance(query, schema.QueryOffsetResponse)
    assert (query.response_code, query.offset) == (OK, 2)
    publish(broker, "1", b"d")
    two.answer(1, offset_spec(query.offset + 1))
    assert two.bodies() == {1: [b"d"]}
    assert one.bodies() == {}


def test_the_hand_over_times_out_on_the_nodes_clock(broker: Harness) -> None:
    """An old consumer that never answers: the new one is activated once
    HANDOVER_TIMEOUT_MS pass; the late answer changes nothing."""
    declare_super_stream(broker)
    one, two = Client(broker), Client(broker)
    assert one.subscribe(1, "invoices-1", group()) == OK
    assert one.updates() == [(1, True)]
    one.answer(1, NEXT)
    assert two.subscribe(1, "invoices-1", group()) == OK
    assert one.updates() == [(1, False)]
    broker.advance(HANDOVER_TIMEOUT_MS - 1)
    assert two.updates() == []
    broker.advance(1)
    assert two.updates() == [(1, True)]
    one.answer(1)  # too late: stale
    assert (one.updates(), two.updates()) == ([], [])
    two.answer(1, NEXT)
    publish(broker, "1", b"x")
    assert (one.bodies(), two.bodies()) == ({}, {1: [b"x"]})


def test_a_consumer_that_leaves_while_stepping_down_hands_over_at_once(broker: Harness) -> None:
    declare_super_stream(broker)
    one, two = Client(broker), Client(broker)
    assert one.subscribe(1, "invoices-1", group()) == OK
    one.updates()
    one.answer(1, NEXT)
    assert two.subscribe(1, "invoices-1", group()) == OK
    assert one.updates() == [(1, False)]
    assert one.unsubscribe(1) == OK
    assert two.updates() == [(1, True)]
    broker.advance(HANDOVER_TIMEOUT_MS)  # the timer went with it
    assert (one.updates(), two.updates()) == ([], [])


def test_a_member_stepping_down_and_chosen_again_is_told_again(broker: Harness) -> None:
    """The SUITE's re-notification regression: partition 3 with two members
    picks the second (3 % 2), the first steps down; a third joins meanwhile
    (3 % 3 = 0: the first again); when the first answers it is chosen and
    must hear it is active again."""
    declare_super_stream(broker, "other", partitions=1, orders=[3])
    one = Client(broker)
    props = group(super_stream="other")
    assert one.subscribe(0, "other-3", props) == OK
    assert one.updates() == [(0, True)]
    one.answer(0, NEXT)
    assert one.subscribe(1, "other-3", props) == OK
    assert one.updates() == [(0, False)]
    assert one.subscribe(2, "other-3", props) == OK
    assert one.updates() == []
    one.answer(0)
    assert one.updates() == [(0, True)]


def test_a_plain_stream_group_keeps_its_first_member(broker: Harness) -> None:
    """Without ``super-stream`` (index -1) the first member stays active as
    others join: no hand-over."""
    declare_super_stream(broker)
    one = Client(broker)
    assert one.subscribe(0, "invoices-1", group(super_stream=None)) == OK
    assert one.updates() == [(0, True)]
    assert one.subscribe(1, "invoices-1", group(super_stream=None)) == OK
    assert one.updates() == []


def test_a_group_with_another_partition_index_is_refused(broker: Harness) -> None:
    """RabbitMQ's partition_index_conflict: PRECONDITION_FAILED, and the
    subscription id stays free."""
    declare_super_stream(broker)
    one = Client(broker)
    assert one.subscribe(0, "invoices-1", group(super_stream=None)) == OK
    assert one.subscribe(1, "invoices-1", group()) == ResponseCode.PRECONDITION_FAILED
    assert one.subscribe(1, "invoices-1", group(name="other")) == OK


def joined(broker: Harness, owners: str, active: int) -> dict[str, Client]:
    """Subscriptions 0, 1, ... on partition 1 by the connections ``owners``
    names (``"aabb"``: 0 and 1 on a, 2 and 3 on b), every ConsumerUpdate
    answered as it comes; subscription ``active`` is then the one reading."""
    clients = {name: Client(broker) for name in sorted(set(owners))}
    for sid, owner in enumerate(owners):
        assert clients[owner].subscribe(sid, "invoices-1", group()) == OK
        while updates := [(c, u) for c in clients.values() for u in c.updates()]:
            for client, (update_sid, is_active) in updates:
                client.answer(update_sid, NEXT if is_active else NONE)
    publish(broker, "1", b"x")
    got = {n: c.bodies() for n, c in clients.items()}
    assert got == {n: {active: [b"x"]} if n == owners[active] else {} for n in clients}
    return clients


def test_connection_down_the_active_one_stays(broker: Harness) -> None:
    """SUITE: handle_connection_down_super_stream_active_stays_test."""
    declare_super_stream(broker)
    clients = joined(broker, "aabb", active=1)
    broker.call(clients["b"].stream.conn.connection_lost)
    assert clients["a"].updates() == []


def test_connection_down_activates_in_the_remaining_connection(broker: Harness) -> None:
    """SUITE: handle_connection_down_super_stream_activate_in_remaining_connection_test:
    the active one's connection goes, 1 % 2 picks subscription 3 at once."""
    declare_super_stream(broker)
    clients = joined(broker, "aabb", active=1)
    broker.call(clients["a"].stream.conn.connection_lost)
    assert clients["b"].updates() == [(3, True)]


def test_connection_down_the_active_one_changes(broker: Harness) -> None:
    """SUITE: handle_connection_down_super_stream_active_changes_test: the
    remaining (1, 3) pick 3; 1 steps down first."""
    declare_super_stream(broker)
    clients = joined(broker, "abab", active=1)
    broker.call(clients["a"].stream.conn.connection_lost)
    assert clients["b"].updates() == [(1, False)]
    clients["b"].answer(1)
    assert clients["b"].updates() == [(3, True)]
