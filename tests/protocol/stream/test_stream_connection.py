"""The stream protocol connection in memory (connection.py, control.py), with
rstream's frame encoder and decoder as the client (tests/harness/stream.py):
the handshake and its refusals, the commands that carry no message, the
codes of bad frames, the heartbeat on the broker's ManualClock."""

from __future__ import annotations

import struct

from harness import harness_fixture
from harness.broker import Harness
from harness.stream import MemoryStream, split_frames
from rstream import schema

from warren.stream_protocol import commands as c
from warren.stream_protocol.constants import INITIAL_FRAME_MAX, ResponseCode
from warren.stream_protocol.frames import decode_frame

broker = harness_fixture(manual_clock=True)

OK = ResponseCode.OK


def opened(broker: Harness, **kw: object) -> MemoryStream:
    client = MemoryStream(broker)
    answer = client.open(**kw)  # type: ignore[arg-type]
    assert answer.response_code == OK
    return client


def test_the_handshake_tunes_and_opens_with_the_advertised_address(broker: Harness) -> None:
    client = MemoryStream(broker)
    props = client.request(schema.PeerProperties(1, [schema.Property("product", "t")]))
    assert {p.key: p.value for p in props.properties}["product"] == "Warren"
    handshake = client.request(schema.SaslHandshake(2))
    assert handshake.mechanisms == ["PLAIN", "ANONYMOUS"]
    answers = client.send(schema.SaslAuthenticate(3, "PLAIN", b"\0guest\0guest"))
    assert answers[0].response_code == OK
    assert answers[1] == schema.Tune(frame_max=1 << 20, heartbeat=60)
    assert client.send(schema.Tune(frame_max=65536, heartbeat=5)) == []
    assert (client.conn.frame_max, client.conn.heartbeat) == (65536, 5)
    opened_ = client.request(schema.Open(4, "/"))
    assert opened_.response_code == OK
    assert {p.key: p.value for p in opened_.properties} == {
        "advertised_host": "127.0.0.1",
        "advertised_port": "5552",
    }
    assert client.conn.info()["protocol"] == "stream"
    assert client.conn in broker.broker.connections


def test_a_client_without_limits_gets_the_brokers_in_tune(broker: Harness) -> None:
    client = MemoryStream(broker)
    client.request(schema.SaslHandshake(1))
    client.send(schema.SaslAuthenticate(2, "PLAIN", b"\0guest\0guest"))
    client.send(schema.Tune(frame_max=0, heartbeat=0))
    assert (client.conn.frame_max, client.conn.heartbeat) == (1 << 20, 60)


def test_bad_credentials_are_refused_and_the_connection_closes(broker: Harness) -> None:
    client = MemoryStream(broker)
    client.request(schema.SaslHandshake(1))
    answer = client.request(schema.SaslAuthenticate(2, "PLAIN", b"\0guest\0wrong"))
    assert answer.response_code == ResponseCode.AUTHENTICATION_FAILURE
    assert client.lost


def test_an_unknown_mechanism_is_refused(broker: Harness) -> None:
    client = MemoryStream(broker)
    answer = client.request(schema.SaslAuthenticate(1, "AMQPLAIN", b""))
    assert answer.response_code == ResponseCode.SASL_MECHANISM_NOT_SUPPORTED
    assert client.lost


def test_a_missing_vhost_is_refused(broker: Harness) -> None:
    client = MemoryStream(broker)
    answer = client.open(vhost="nowhere")
    assert answer.response_code == ResponseCode.VIRTUAL_HOST_ACCESS_FAILURE
    assert client.lost
    assert client.conn not in broker.broker.connections


def test_a_command_before_open_cuts_the_client_off(broker: Harness) -> None:
    client = MemoryStream(broker)
    assert client.send(schema.Create(1, "s", [])) == []
    assert client.lost


def test_a_frame_over_8_kib_before_open_cuts_the_client_off(broker: Harness) -> None:
    client = MemoryStream(broker)
    big = schema.PeerProperties(1, [schema.Property("x", "y" * INITIAL_FRAME_MAX)])
    assert client.send(big) == []
    assert client.lost


def test_create_metadata_stats_and_delete(broker: Harness) -> None:
    client = opened(broker)
    args = [schema.Property("max-length-bytes", "1000000"), schema.Property("max-age", "1h")]
    assert client.request(schema.Create(10, "events", args)).response_code == OK
    q = broker.broker.vhosts["/"].queues["events"]
    assert q.queue_type == "stream"
    assert q.arguments["x-max-length-bytes"] == 1000000
    assert q.arguments["x-max-age"] == "1h"
    again = client.request(schema.Create(11, "events", args[::-1]))
    assert again.response_code == ResponseCode.STREAM_ALREADY_EXISTS
    # other arguments: inequivalent, as RabbitMQ's Create says
    other = client.request(schema.Create(14, "events", []))
    assert other.response_code == ResponseCode.PRECONDITION_FAILED
    bad = client.request(schema.Create(12, "other", [schema.Property("max-age", "soon")]))
    assert bad.response_code == ResponseCode.PRECONDITION_FAILED
    reserved = client.request(schema.Create(13, "amq.s", []))
    assert reserved.response_code == ResponseCode.PRECONDITION_FAILED

    meta = client.request(schema.Metadata(14, ["events", "missing"]))
    assert [(b.reference, b.host, b.port) for b in meta.brokers] == [(0, "127.0.0.1", 5552)]
    by_name = {m.name: m for m in meta.metadata}
    assert by_name["events"].response_code == OK and by_name["events"].leader_ref == 0
    assert by_name["missing"].response_code == ResponseCode.STREAM_DOES_NOT_EXIST

    answers = client.raw(c.StreamStats(15, "events").encode())
    stats = decode_frame(answers[0])
    assert isinstance(stats, c.StreamStatsResponse)
    assert stats.stats == {"first_chunk_id": -1, "committed_chunk_id": -1}

    assert client.request(schema.Delete(16, "events")).response_code == OK
    assert "events" not in broker.broker.vhosts["/"].queues
    gone = client.request(schema.Delete(17, "events"))
    assert gone.response_code == ResponseCode.STREAM_DOES_NOT_EXIST


def test_store_and_query_offset(broker: Harness) -> None:
    client = opened(broker)
    client.request(schema.Create(10, "s", []))
    none = client.request(schema.QueryOffset(11, "app", "s"))
    assert (none.response_code, none.offset) == (ResponseCode.NO_OFFSET, 0)
    assert client.send(schema.StoreOffset("app", "s", 41)) == []  # no answer
    stored = client.request(schema.QueryOffset(12, "app", "s"))
    assert (stored.response_code, stored.offset) == (OK, 41)
    # The core keeps the next offset to read, as AMQP's tracked consumers do.
    assert broker.broker.vhosts["/"].queues["s"].stream.tracked("app") == 42
    missing = client.request(schema.QueryOffset(13, "app", "nope"))
    assert missing.response_code == ResponseCode.STREAM_DOES_NOT_EXIST


def test_publishers_are_declared_queried_and_deleted(broker: Harness) -> None:
    client = opened(broker)
    client.request(schema.Create(10, "s", []))
    declare = client.request(schema.DeclarePublisher(11, 1, "ref", "s"))
    assert declare.response_code == OK
    same_id = client.request(schema.DeclarePublisher(12, 1, "", "s"))
    assert same_id.response_code == ResponseCode.PRECONDITION_FAILED
    same_ref = client.request(schema.DeclarePublisher(13, 2, "ref", "s"))
    assert same_ref.response_code == ResponseCode.PRECONDITION_FAILED
    no_stream = client.request(schema.DeclarePublisher(14, 3, "", "nope"))
    assert no_stream.response_code == ResponseCode.STREAM_DOES_NOT_EXIST
    seq = client.request(schema.QueryPublisherSequence(15, "ref", "s"))
    assert (seq.response_code, seq.sequence) == (OK, 0)
    assert client.request(schema.DeletePublisher(16, 1)).response_code == OK
    again = client.request(schema.DeletePublisher(17, 1))
    assert again.response_code == ResponseCode.PUBLISHER_DOES_NOT_EXIST


def test_deleting_a_stream_tells_its_publishers_connections(broker: Harness) -> None:
    owner, other = opened(broker), opened(broker)
    owner.request(schema.Create(10, "s", []))
    assert other.request(schema.DeclarePublisher(11, 1, "", "s")).response_code == OK
    assert owner.request(schema.Delete(12, "s")).response_code == OK
    update = other.send(schema.Heartbeat())
    assert len(update) == 1
    assert update[0].metadata_info.code == ResponseCode.STREAM_NOT_AVAILABLE
    assert update[0].metadata_info.stream == "s"
    assert other.conn.control.publishers == {}


def test_a_stream_deleted_over_another_protocol_is_noticed_at_the_heartbeat_check(
    broker: Harness,
) -> None:
    client = opened(broker, heartbeat=5)
    client.request(schema.Create(10, "s", []))
    assert client.request(schema.DeclarePublisher(11, 1, "", "s")).response_code == OK
    broker.call(lambda: broker.broker.vhosts["/"].delete_queue("s"))
    now = broker.broker.clock.now_ms()
    broker.call(lambda: client.conn.tick(now + 1000))
    frames = [decode_frame(f) for f in split_frames(client.take())]
    assert frames == [c.MetadataUpdate(ResponseCode.STREAM_NOT_AVAILABLE, "s")]
    assert client.conn.control.publishers == {}


def test_subscriptions_are_checked_and_kept(broker: Harness) -> None:
    client = opened(broker)
    client.request(schema.Create(10, "s", []))
    first = schema.OffsetSpecification(offset_type=1, offset=None)  # type: ignore[arg-type]
    assert client.request(schema.Subscribe(11, 1, "s", first, 10, [])).response_code == OK
    dup = client.request(schema.Subscribe(12, 1, "s", first, 10, []))
    assert dup.response_code == ResponseCode.SUBSCRIPTION_ID_ALREADY_EXISTS
    missing = client.request(schema.Subscribe(13, 2, "nope", first, 10, []))
    assert missing.response_code == ResponseCode.STREAM_DOES_NOT_EXIST
    sac = [schema.Property("single-active-consumer", "true")]
    nameless = client.request(schema.Subscribe(14, 3, "s", first, 10, sac))
    assert nameless.response_code == ResponseCode.PRECONDITION_FAILED
    assert client.send(schema.Credit(1, 5)) == []
    assert client.conn.control.subscriptions[1].credit == 15
    unknown = client.request(schema.Credit(9, 5))
    assert unknown.response_code == ResponseCode.SUBSCRIPTION_ID_DOES_NOT_EXIST
    assert client.request(schema.Unsubscribe(15, 1)).response_code == OK
    again = client.request(schema.Unsubscribe(16, 1))
    assert again.response_code == ResponseCode.SUBSCRIPTION_ID_DOES_NOT_EXIST


def test_route_and_partitions_answer_as_for_a_missing_super_stream(broker: Harness) -> None:
    client = opened(broker)
    route = client.request(schema.SuperStreamRoute(10, "key", "super"))
    assert route.response_code == ResponseCode.STREAM_DOES_NOT_EXIST
    answer = decode_frame(client.raw(c.Partitions(11, "super").encode())[0])
    assert isinstance(answer, c.PartitionsResponse)
    assert answer.code == ResponseCode.STREAM_DOES_NOT_EXIST


def test_exchange_command_versions(broker: Harness) -> None:
    client = opened(broker)
    answer = client.request(schema.ExchangeCommandVersionRequest(10, []))
    assert answer.response_code == OK
    keys = {v.key_command for v in answer.command_versions}
    assert {0x02, 0x08, 0x1C} <= keys


def test_an_unknown_frame_after_open_is_closed_with_its_code(broker: Harness) -> None:
    client, bystander = opened(broker), opened(broker)
    frames = client.raw(struct.pack(">IHH", 4, 0x7F00, 1))
    close = decode_frame(frames[0])
    assert isinstance(close, c.Close) and close.code == ResponseCode.UNKNOWN_FRAME
    assert not client.lost
    assert client.raw(c.CloseResponse(close.correlation_id).encode()) == []
    assert client.lost
    # Another connection goes on.
    assert bystander.request(schema.Create(10, "s", [])).response_code == OK


def test_a_frame_over_frame_max_after_open_is_closed_with_frame_too_large(broker: Harness) -> None:
    client = opened(broker)
    frames = client.raw(struct.pack(">IHH", (1 << 20) + 1, 0x0D, 1))
    close = decode_frame(frames[0])
    assert isinstance(close, c.Close) and close.code == ResponseCode.FRAME_TOO_LARGE


def test_a_client_close_is_answered(broker: Harness) -> None:
    client = opened(broker)
    answer = client.request(schema.Close(10, 1, "bye"))
    assert answer.response_code == OK
    assert client.lost
    assert client.conn not in broker.broker.connections


def test_heartbeats_on_the_brokers_clock(broker: Harness) -> None:
    client = opened(broker, heartbeat=5)
    conn = client.conn
    clock = broker.broker.clock
    start = clock.now_ms()
    assert broker.call(lambda: conn.tick(start + 4999)) >= 1
    assert client.take() == b""
    broker.call(lambda: conn.tick(start + 5000))
    assert client.take() == c.Heartbeat().encode()
    # Nothing from the client for two intervals: taken for dead.
    broker.call(lambda: conn.tick(start + 10_000))
    assert conn.closed


def test_the_default_user_from_elsewhere_is_refused_as_loopback_only(broker: Harness) -> None:
    client = MemoryStream(broker, peer=("192.0.2.7", 40000))
    answer = client.request(schema.SaslAuthenticate(1, "PLAIN", b"\0guest\0guest"))
    assert answer.response_code == ResponseCode.SASL_AUTHENTICATION_FAILURE_LOOPBACK
    assert client.lost


def test_anonymous_and_external_log_in(broker: Harness) -> None:
    anonymous = MemoryStream(broker)
    answers = anonymous.send(schema.SaslAuthenticate(1, "ANONYMOUS", b""))
    assert answers[0].response_code == OK
    assert anonymous.conn.user is not None and anonymous.conn.user.name == "guest"
    external = MemoryStream(broker, cert_login="guest")
    assert external.request(schema.SaslHandshake(1)).mechanisms[0] == "EXTERNAL"
    answers = external.send(schema.SaslAuthenticate(2, "EXTERNAL", b""))
    assert answers[0].response_code == OK


def test_permissions_refuse_with_access_refused(broker: Harness) -> None:
    def add_user() -> None:
        users = broker.broker.users
        users.add_user("reader", "pw")
        users.set_permissions("reader", "/", "^$", "^$", ".*")

    broker.call(add_user)
    admin = opened(broker)
    admin.request(schema.Create(1, "s", []))
    client = opened(broker, user="reader", password="pw")
    create = client.request(schema.Create(10, "t", []))
    assert create.response_code == ResponseCode.ACCESS_REFUSED
    delete = client.request(schema.Delete(11, "s"))
    assert delete.response_code == ResponseCode.ACCESS_REFUSED
    publisher = client.request(schema.DeclarePublisher(12, 1, "", "s"))
    assert publisher.response_code == ResponseCode.ACCESS_REFUSED
    query = client.request(schema.QueryOffset(13, "app", "s"))
    assert query.response_code == ResponseCode.NO_OFFSET  # read is allowed
    assert "s" in broker.broker.vhosts["/"].queues


def test_the_management_api_lists_and_closes_a_stream_connection(broker: Harness) -> None:
    client = opened(broker)
    client.request(schema.Create(10, "s", []))
    client.request(schema.DeclarePublisher(11, 1, "", "s"))
    http = broker.http()
    [listed] = http.get("connections")
    assert (listed["protocol"], listed["user"], listed["vhost"]) == ("stream", "guest", "/")
    assert listed["publishers"] == 1 and listed["frame_max"] == 1 << 20
    http.delete(f"/api/connections/{listed['name'].replace(' ', '%20').replace('>', '%3E')}")
    frames = [decode_frame(f) for f in split_frames(client.take())]
    assert isinstance(frames[-1], c.Close)
    # closed at once, without waiting for CloseResponse, as RabbitMQ ends the
    # connection (rstream's own tests wait for the socket to close)
    assert client.lost
