"""The stream protocol's publishers and consumers in the management API, in
memory (the harness's connections, rstream's frame encoder, the management
app without a socket): single active consumers waiting and active, a
consumer's offset and lag as records arrive, a publisher's refused records,
and the protocol="stream" counters of a closed connection."""

from __future__ import annotations

import struct
from urllib.parse import quote

from harness import harness_fixture
from harness.broker import Harness
from harness.stream import MemoryStream
from metricshelp import scrape_api, value
from rstream import encoding, schema
from rstream.amqp import AMQPMessage

from warren.stream_protocol import commands as c
from warren.stream_protocol.constants import Compression, OffsetType, ResponseCode
from warren.stream_protocol.frames import decode_frame
from warren.stream_protocol.publish import Publish, PublishedMessage
from warren.stream_protocol.wire import OffsetSpec

broker = harness_fixture(manual_clock=True)

OK = ResponseCode.OK
FIRST = schema.OffsetSpecification(offset_type=1, offset=None)  # type: ignore[arg-type]
SAC = [schema.Property("single-active-consumer", "true"), schema.Property("name", "g")]


def opened(broker: Harness, stream: str | None = "s", port: int = 45000) -> MemoryStream:
    """An open connection (its name, ``peer -> local``, from the peer ``port``)."""
    client = MemoryStream(broker, peer=("127.0.0.1", port))
    assert client.open().response_code == OK
    if stream is not None:
        client.request(schema.Create(client.next_id(), stream, []))
    return client


def publish(client: MemoryStream, ids: list[int], pid: int = 1) -> list[object]:
    msgs = [PublishedMessage.simple(i, bytes(AMQPMessage(body=b"m%d" % i))) for i in ids]
    return [decode_frame(f) for f in client.raw(Publish.of(pid, msgs).encode())]


def subscribe(client: MemoryStream, sid: int, props: list[schema.Property]) -> list[object]:
    frame = encoding.encode_frame(schema.Subscribe(client.next_id(), sid, "s", FIRST, 1, props))
    return [decode_frame(f) for f in client.raw(bytes(frame))]


def consumers(broker: Harness) -> dict[int, dict[str, object]]:
    return {c["subscription_id"]: c for c in broker.http().get("/api/stream/consumers")}


def test_consumers_offsets_and_single_active_status(broker: Harness) -> None:
    client = opened(broker)
    assert client.request(schema.DeclarePublisher(client.next_id(), 1, "", "s")).response_code == OK
    publish(client, [1, 2, 3])
    one, two = opened(broker, None, 45001), opened(broker, None, 45002)
    answers = subscribe(one, 1, SAC)
    assert [type(a) for a in answers] == [c.SubscribeResponse, c.ConsumerUpdate]
    assert [type(a) for a in subscribe(two, 2, SAC)] == [c.SubscribeResponse]
    listed = consumers(broker)
    # Active and asked where to start, nothing sent yet: all three records to go.
    assert {k: listed[1][k] for k in ("active", "activity_status", "consumed", "offset_lag")} == {
        "active": True,
        "activity_status": "single_active",
        "consumed": 0,
        "offset_lag": 3,
    }
    assert (listed[2]["active"], listed[2]["activity_status"]) == (False, "waiting")
    assert listed[2]["properties"] == {"single-active-consumer": "true", "name": "g"}
    update = answers[1]
    assert isinstance(update, c.ConsumerUpdate)
    reply = c.ConsumerUpdateResponse(update.correlation_id, OK, OffsetSpec(OffsetType.FIRST))
    one.raw(reply.encode())
    listed = consumers(broker)
    # One credit: one chunk (a turn's records) sent, then no credit left.
    assert (listed[1]["consumed"], listed[1]["offset"], listed[1]["offset_lag"]) == (3, 2, 0)
    assert listed[1]["credits"] == 0
    publish(client, [4])
    assert consumers(broker)[1]["offset_lag"] == 1
    http = broker.http()
    [conn] = [x for x in http.get("/api/stream/connections") if x["name"] == one.conn.name]
    assert conn["subscriptions"] == 1 and conn["protocol"] == "stream"
    path = "/api/stream/connections/%2F/" + quote(one.conn.name, safe="")
    assert [x["subscription_id"] for x in http.get(path + "/consumers")] == [1]


def test_refused_records_count_as_errored(broker: Harness) -> None:
    # A stream deduplicating by header reads each record: a snappy batch is refused.
    args = {"x-queue-type": "stream", "x-message-deduplication": True}
    broker.amqp_connection().channel().queue_declare("s", durable=True, arguments=args)
    client = opened(broker, stream=None)
    ref = "app"
    declare = schema.DeclarePublisher(client.next_id(), 3, ref, "s")
    assert client.request(declare).response_code == OK
    publish(client, [1, 2], pid=3)
    publish(client, [2], pid=3)  # a duplicate: confirmed, not stored
    entry = struct.pack(">BHII", 0x80 | (Compression.SNAPPY << 4), 1, 100, 8) + b"\x00" * 8
    answers = [
        decode_frame(f) for f in client.raw(Publish.of(3, [PublishedMessage(9, entry)]).encode())
    ]
    assert isinstance(answers[0], c.PublishError)
    [pub] = broker.http().get("/api/stream/publishers/%2F/s")
    assert {
        k: pub[k] for k in ("publisher_id", "reference", "published", "confirmed", "errored")
    } == {
        "publisher_id": 3,
        "reference": "app",
        "published": 4,
        "confirmed": 3,
        "errored": 1,
    }
    m = scrape_api(broker.http())
    assert value(m, "rabbitmq_global_messages_received_total", protocol="stream") == 2
    assert value(m, "rabbitmq_global_messages_confirmed_total", protocol="stream") == 3
    assert value(m, "rabbitmq_global_publishers", protocol="stream") == 1
    # Gone with its connection; its counts stay.
    broker.call(client.conn.connection_lost)
    broker.settle()
    assert broker.http().get("/api/stream/publishers") == []
    m = scrape_api(broker.http())
    assert value(m, "rabbitmq_global_messages_received_total", protocol="stream") == 2
    assert value(m, "rabbitmq_global_messages_confirmed_total", protocol="stream") == 3
    assert value(m, "rabbitmq_global_publishers", protocol="stream") == 0
