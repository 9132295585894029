"""A cluster follower's stream protocol read service in memory (stream_protocol/replica.py).

The leader is the harness broker: rstream's frames publish to it, and a
ReplicaStreamConnection reads its data directory through a ReplicaCatalog,
as a follower reads its byte-identical copy. rstream encodes the client's
frames and decodes the answers; chunks are checked as the leader's are."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness import harness_fixture
from harness.broker import Harness
from harness.stream import MemoryStream, split_frames
from rstream import encoding, schema
from rstream.amqp import AMQPMessage, amqp_decoder

from warren.app import AMQP1StreamMessages
from warren.store.replica_catalog import ReplicaCatalog
from warren.store.stream_tracking import TRACKING_WRITE_MS
from warren.stream_protocol import commands as c
from warren.stream_protocol.chunk import decode_delivered_chunk, read_records
from warren.stream_protocol.constants import ResponseCode
from warren.stream_protocol.frames import decode_frame
from warren.stream_protocol.publish import Deliver, Publish, PublishedMessage
from warren.stream_protocol.replica import HANDSHAKE_TIMEOUT_MS, ReplicaStreamConnection

broker = harness_fixture(manual_clock=True)

OK = ResponseCode.OK
LEADER = ("leader.example", 5552)
REPLICA = ("replica.example", 5553)
FIRST = schema.OffsetSpecification(offset_type=1, offset=None)  # type: ignore[arg-type]
NEXT = schema.OffsetSpecification(offset_type=3, offset=None)  # type: ignore[arg-type]


class ReplicaWire:
    """A client of the follower's read service: rstream's frames in, the
    service's frames out (as its transport would write them)."""

    def __init__(self, root: Path) -> None:
        self.now = 0
        self.correlation = 0
        self.catalog = ReplicaCatalog(root)
        self.conn = ReplicaStreamConnection(
            self.catalog,
            "reader",
            REPLICA,
            lambda: (LEADER, [REPLICA]),
            lambda: self.now,
            AMQP1StreamMessages(),
        )

    def next_id(self) -> int:
        self.correlation += 1
        return self.correlation

    def raw(self, data: bytes = b"") -> list[bytes]:
        """Feed ``data``; then, as the server does once the follower applied
        more, refresh the open streams and pump."""
        self.conn.feed(data)
        self.catalog.refresh()
        self.conn.pump()
        return split_frames(b"".join(self.conn.take_output()))

    def send(self, frame: Any) -> list[Any]:
        return [encoding.decode_frame(f) for f in self.raw(encoding.encode_frame(frame))]

    def send_raw(self, data: bytes) -> list[Any]:
        return [encoding.decode_frame(f) for f in self.raw(data)]

    def request(self, frame: Any) -> Any:
        """The one answer to ``frame`` (None: none)."""
        answers = self.send(frame)
        assert len(answers) <= 1, answers
        return answers[0] if answers else None

    def open(self, user: str = "guest", password: str = "guest") -> Any:
        self.request(schema.PeerProperties(self.next_id(), [schema.Property("product", "t")]))
        assert self.request(schema.SaslHandshake(self.next_id())).mechanisms == ["PLAIN"]
        auth = b"\0" + user.encode() + b"\0" + password.encode()
        answers = self.send(schema.SaslAuthenticate(self.next_id(), "PLAIN", auth))
        if answers[0].response_code != OK:
            return answers[0]
        self.send(schema.Tune(1 << 20, 60))
        return self.request(schema.Open(self.next_id(), "/"))


def leader_client(broker: Harness, stream: str = "s") -> MemoryStream:
    client = MemoryStream(broker)
    assert client.open().response_code == OK
    assert client.request(schema.Create(client.next_id(), stream, [])).response_code == OK
    answer = client.request(schema.DeclarePublisher(client.next_id(), 1, "", stream))
    assert answer.response_code == OK
    return client


def publish(client: MemoryStream, ids: list[int], filters: dict[int, str] | None = None) -> None:
    msgs = [
        PublishedMessage.simple(i, bytes(AMQPMessage(body=b"m%d" % i)), (filters or {}).get(i))
        for i in ids
    ]
    client.raw(Publish.of(1, msgs).encode())


def deliveries(frames: list[bytes]) -> list[tuple[int, int, list[bytes]]]:
    """(subscription, first offset, bodies) of each Deliver frame."""
    out = []
    for f in frames:
        d = decode_frame(f)
        if isinstance(d, Deliver):
            header, data, entries = decode_delivered_chunk(d.chunk)
            records = [r for e in entries for r in read_records(data, e)]
            bodies = [amqp_decoder(r).body for r in records]
            out.append((d.subscription_id, header.first_offset, bodies))
    return out


def stats(wire: ReplicaWire, stream: str = "s") -> dict[str, int]:
    """StreamStats (rstream 1.1 has no encoder for it: Warren's, checked in
    test_stream_codec.py)."""
    [frame] = wire.raw(c.StreamStats(wire.next_id(), stream).encode())
    answer = decode_frame(frame)
    assert isinstance(answer, c.StreamStatsResponse) and answer.code == OK
    return answer.stats


def replica(broker: Harness) -> ReplicaWire:
    wire = ReplicaWire(Path(broker.broker.config.data_dir))
    opened = wire.open()
    assert opened.response_code == OK
    assert dict((p.key, p.value) for p in opened.properties) == {
        "advertised_host": REPLICA[0],
        "advertised_port": str(REPLICA[1]),
    }
    return wire


def test_metadata_names_the_leader_and_this_replica(broker: Harness) -> None:
    leader_client(broker)
    wire = replica(broker)
    answer = wire.request(schema.Metadata(wire.next_id(), ["s", "nope"]))
    assert [(b.reference, b.host, b.port) for b in answer.brokers] == [(0, *LEADER), (1, *REPLICA)]
    by_name = {m.name: m for m in answer.metadata}
    assert (by_name["s"].response_code, by_name["s"].leader_ref) == (OK, 0)
    assert by_name["s"].replicas_refs == [1]
    assert by_name["nope"].response_code == ResponseCode.STREAM_DOES_NOT_EXIST


def test_a_subscription_reads_what_the_leader_stored_and_reads_on(broker: Harness) -> None:
    client = leader_client(broker)
    publish(client, [1, 2, 3])
    wire = replica(broker)
    frames = wire.raw(encoding.encode_frame(schema.Subscribe(wire.next_id(), 7, "s", FIRST, 1, [])))
    assert encoding.decode_frame(frames[0]).response_code == OK
    assert deliveries(frames[1:]) == [(7, 0, [b"m1", b"m2", b"m3"])]
    # Its one credit is spent: what the leader appends next waits for Credit.
    publish(client, [4, 5])
    assert wire.raw() == []
    frames = wire.raw(encoding.encode_frame(schema.Credit(7, 1)))
    assert deliveries(frames) == [(7, 3, [b"m4", b"m5"])]
    answer = wire.request(schema.Unsubscribe(wire.next_id(), 7))
    assert answer.response_code == OK


def test_next_and_filters_as_on_the_leader(broker: Harness) -> None:
    client = leader_client(broker)
    publish(client, [1, 2, 3], {1: "red", 2: "blue"})
    wire = replica(broker)
    red = [schema.Property("filter.0", "red")]
    frames = wire.raw(
        encoding.encode_frame(schema.Subscribe(wire.next_id(), 1, "s", FIRST, 9, red))
    )
    assert deliveries(frames) == [(1, 0, [b"m1"])]
    both = [*red, schema.Property("match-unfiltered", "true")]
    sub = schema.Subscribe(wire.next_id(), 2, "s", FIRST, 9, both)
    assert deliveries(wire.raw(encoding.encode_frame(sub))) == [(2, 0, [b"m1"]), (2, 2, [b"m3"])]
    sub = schema.Subscribe(wire.next_id(), 3, "s", NEXT, 9, [])
    assert deliveries(wire.raw(encoding.encode_frame(sub))) == []
    publish(client, [4])
    # Subscription 2 matches unfiltered records, 1 does not.
    assert deliveries(wire.raw()) == [(2, 3, [b"m4"]), (3, 3, [b"m4"])]


def test_offsets_and_stats_are_the_leaders(broker: Harness) -> None:
    client = leader_client(broker)
    publish(client, [1, 2])
    client.send(schema.StoreOffset("app", "s", 1))
    broker.advance(TRACKING_WRITE_MS)  # the leader writes its tracking file
    wire = replica(broker)
    answer = wire.request(schema.QueryOffset(wire.next_id(), "app", "s"))
    assert (answer.response_code, answer.offset) == (OK, 1)
    answer = wire.request(schema.QueryOffset(wire.next_id(), "other", "s"))
    assert answer.response_code == ResponseCode.NO_OFFSET
    assert stats(wire) == {"first_chunk_id": 0, "committed_chunk_id": 1}


def test_what_would_change_anything_is_refused(broker: Harness) -> None:
    client = leader_client(broker)
    publish(client, [1])
    wire = replica(broker)
    answer = wire.request(schema.DeclarePublisher(wire.next_id(), 1, "", "s"))
    assert answer.response_code == ResponseCode.STREAM_NOT_AVAILABLE
    frames = wire.raw(Publish.of(1, [PublishedMessage.simple(5, b"x")]).encode())
    [error] = [encoding.decode_frame(f) for f in frames]
    assert isinstance(error, schema.PublishError)
    assert [(e.publishing_id, e.response_code) for e in error.errors] == [
        (5, ResponseCode.PUBLISHER_DOES_NOT_EXIST)
    ]
    for frame in (
        schema.Create(wire.next_id(), "t", []),
        schema.Delete(wire.next_id(), "s"),
    ):
        assert wire.request(frame).response_code == ResponseCode.ACCESS_REFUSED
    assert wire.send(schema.StoreOffset("app", "s", 0)) == []  # no answer; logged
    # Without a way to reach the leader (no connect), single active consumers are refused.
    sac = [schema.Property("single-active-consumer", "true"), schema.Property("name", "g")]
    answer = wire.request(schema.Subscribe(wire.next_id(), 1, "s", FIRST, 1, sac))
    assert answer.response_code == ResponseCode.PRECONDITION_FAILED
    # Nothing changed: the leader's stream has its one record, and no tracking.
    assert stats(wire)["committed_chunk_id"] == 0
    answer = wire.request(schema.QueryOffset(wire.next_id(), "app", "s"))
    assert answer.response_code == ResponseCode.NO_OFFSET


def test_a_wrong_password_and_an_unknown_stream(broker: Harness) -> None:
    wire = ReplicaWire(Path(broker.broker.config.data_dir))
    assert wire.open(password="wrong").response_code == ResponseCode.AUTHENTICATION_FAILURE
    assert wire.conn.closed
    wire = replica(broker)
    answer = wire.request(schema.Subscribe(wire.next_id(), 1, "nope", FIRST, 1, []))
    assert answer.response_code == ResponseCode.STREAM_DOES_NOT_EXIST


def test_a_client_that_does_not_open_in_time_is_cut_off(broker: Harness) -> None:
    wire = ReplicaWire(Path(broker.broker.config.data_dir))
    wire.request(schema.PeerProperties(wire.next_id(), []))
    wire.conn.tick(HANDSHAKE_TIMEOUT_MS - 1)
    assert not wire.conn.closed
    wire.conn.tick(HANDSHAKE_TIMEOUT_MS)
    assert wire.conn.closed


def test_a_broken_frame_before_and_after_open(broker: Harness) -> None:
    wire = ReplicaWire(Path(broker.broker.config.data_dir))
    assert wire.raw(b"\x00\x00\x00\x04\x77\x77\x00\x01") == []
    assert wire.conn.closed  # cut off before Open, as on the leader
    wire = replica(broker)
    [close] = wire.send_raw(b"\x00\x00\x00\x04\x77\x77\x00\x01")
    assert isinstance(close, schema.Close) and close.code == ResponseCode.UNKNOWN_FRAME
    # (rstream writes its CloseResponse without the response bit: Warren's.)
    assert wire.raw(c.CloseResponse(close.correlation_id).encode()) == []
    assert wire.conn.closed


def test_the_heartbeat(broker: Harness) -> None:
    wire = replica(broker)
    wire.now = 60_000
    wire.conn.tick(wire.now)
    [beat] = split_frames(b"".join(wire.conn.take_output()))
    assert isinstance(encoding.decode_frame(beat), schema.Heartbeat)
    wire.now = 120_000
    wire.conn.tick(wire.now)
    assert wire.conn.closed


def test_the_leaders_metadata_lists_the_followers_read_services(broker: Harness) -> None:
    client = leader_client(broker)
    broker.broker.stream_protocol_replicas = lambda: ["f1.example:5553", "f2.example:5553"]
    answer = client.request(schema.Metadata(client.next_id(), ["s"]))
    assert [(b.reference, b.host, b.port) for b in answer.brokers] == [
        (0, "127.0.0.1", 5552),
        (1, "f1.example", 5553),
        (2, "f2.example", 5553),
    ]
    [meta] = answer.metadata
    assert (meta.leader_ref, meta.replicas_refs) == (0, [1, 2])
    # The read services are plain without [main] tls_cert: not named to a TLS client.
    client.conn.transport_name = "stream/TLS"
    answer = client.request(schema.Metadata(client.next_id(), ["s"]))
    assert [b.reference for b in answer.brokers] == [0]
    assert answer.metadata[0].replicas_refs == []
