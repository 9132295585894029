"""MQTT 3.1.1 and 5 against the broker with paho-mqtt: QoS, retained messages,
subscriptions and the MQTT 5 features, and the bridge to AMQP both ways.

Moved to the in-memory harness (issue 29): paho's own client (memclients.Client,
tests/mqttclient.py's calls) on an in-memory socket to the broker's
MQTTConnection, the AMQP side a harness connection whose frames pamqp decodes
(pika before), and the tests that wrote raw packets a harness.RawMQTT read by
harness.mqtt_decode. "Nothing more" is the broker's loop settled, not a wait.
Only the management API's listing of MQTT connections stays on a socket: the
harness starts no HTTP listener (tests/protocol/mqtt/test_mqtt_sockets.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import Harness, MemoryAMQP
from memclients import V5, V311, Client, Factory, RawClient, harnesses
from mqttclient import props
from paho.mqtt.packettypes import PacketTypes
from pamqp import commands
from rawamqp import publish_frames

from warren.mqtt.packets import ConnAck, Connect, PubAck, Publish

BOTH = pytest.mark.parametrize("protocol", [V311, V5], ids=["3.1.1", "5"])


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[Factory]:
    yield from harnesses(tmp_path)


@pytest.fixture
def mq(broker_factory: Factory) -> Harness:
    """With fdatasync on (the default): QoS 1/2 acknowledgements wait for it."""
    return broker_factory()


@pytest.fixture
def clients(mq: Harness) -> Iterator[list[Client]]:
    made: list[Client] = []
    yield made
    for c in made:
        c.close()


def client(mq: Harness, made: list[Client], **kw: Any) -> Client:
    c = Client(mq, **kw)
    made.append(c)
    return c


def bound_queue(amqp: MemoryAMQP, binding: str) -> str:
    """An exclusive server-named queue bound to amq.topic with ``binding``."""
    amqp.send_method(1, commands.Queue.Declare(queue="", exclusive=True))
    q = amqp.expect_method(commands.Queue.DeclareOk).queue
    amqp.send_method(1, commands.Queue.Bind(queue=q, exchange="amq.topic", routing_key=binding))
    amqp.expect_method(commands.Queue.BindOk)
    return q


@BOTH
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_publish_subscribe_each_qos(
    mq: Harness, clients: list[Client], protocol: int, qos: int
) -> None:
    sub = client(mq, clients, client_id="sub", protocol=protocol)
    sub.connect()
    assert sub.subscribe("sensors/+/temp", qos=2) == [_granted(qos=2, protocol=protocol)]
    pub = client(mq, clients, client_id="pub", protocol=protocol)
    pub.connect()
    for i in range(20):
        pub.publish(f"sensors/{i}/temp", f"{i}".encode(), qos=qos)
    got = [sub.next() for _ in range(20)]
    assert [m.payload for m in got] == [f"{i}".encode() for i in range(20)]
    assert {m.qos for m in got} == {qos}
    assert got[3].topic == "sensors/3/temp"
    assert not any(m.retain or m.dup for m in got)


def _granted(qos: int, protocol: int) -> object:
    from paho.mqtt.reasoncodes import ReasonCode

    return ReasonCode(PacketTypes.SUBACK, identifier=qos) if protocol == V5 else qos


@BOTH
def test_delivered_qos_is_the_lower_of_publish_and_subscription(
    mq: Harness, clients: list[Client], protocol: int
) -> None:
    sub = client(mq, clients, protocol=protocol)
    sub.connect()
    sub.subscribe("a/b", qos=1)
    pub = client(mq, clients, protocol=protocol)
    pub.connect()
    pub.publish("a/b", b"2", qos=2)
    pub.publish("a/b", b"0", qos=0)
    assert [(m.payload, m.qos) for m in (sub.next(), sub.next())] == [(b"2", 1), (b"0", 0)]


def test_wildcards_and_dollar_topics(mq: Harness, clients: list[Client]) -> None:
    sub = client(mq, clients)
    sub.connect()
    sub.subscribe("#", qos=1)
    sub.subscribe("x/+/z", qos=1)
    pub = client(mq, clients)
    pub.connect()
    pub.publish("$SYS/x", b"hidden", qos=1)  # MQTT-4.7.2-1: '#' does not match $ topics
    pub.publish("x/y/z", b"one copy", qos=1)  # two matching filters, one queue: once
    pub.publish("deep/er/topic/levels", b"deep", qos=1)
    assert [m.payload for m in (sub.next(), sub.next())] == [b"one copy", b"deep"]
    assert sub.nothing_more()


@BOTH
def test_retained_messages(mq: Harness, clients: list[Client], protocol: int) -> None:
    pub = client(mq, clients, protocol=protocol)
    pub.connect()
    pub.publish("home/kitchen/temp", b"21", qos=1, retain=True)
    pub.publish("home/kitchen/temp", b"22", qos=1, retain=True)  # replaces
    pub.publish("home/hall/temp", b"19", qos=0, retain=True)
    pub.publish("home/attic/temp", b"5", qos=1, retain=True)
    pub.publish("home/attic/temp", b"", qos=1, retain=True)  # clears
    sub = client(mq, clients, protocol=protocol)
    sub.connect()
    sub.subscribe("home/+/temp", qos=1)
    got = sorted((m.topic, m.payload, m.retain, m.qos) for m in (sub.next(), sub.next()))
    assert got == [
        ("home/hall/temp", b"19", True, 0),
        ("home/kitchen/temp", b"22", True, 1),
    ]
    assert sub.nothing_more()
    # A live publish of a retained message reaches existing subscribers without the flag.
    pub.publish("home/hall/temp", b"20", qos=1, retain=True)
    live = sub.next()
    assert (live.payload, live.retain) == (b"20", False)


def test_retain_as_published_and_retain_handling(mq: Harness, clients: list[Client]) -> None:
    pub = client(mq, clients, protocol=V5)
    pub.connect()
    pub.publish("r/a", b"kept", qos=1, retain=True)
    sub = client(mq, clients, protocol=V5)
    sub.connect()
    sub.subscribe("r/#", qos=1, retain_as_published=True, retain_handling=2)  # none sent
    pub.publish("r/a", b"live", qos=1, retain=True)
    live = sub.next()
    assert (live.payload, live.retain) == (b"live", True)  # retain as published
    sub.subscribe("r/a", qos=1, retain_handling=1)  # new subscription: sent
    assert sub.next().payload == b"live"
    sub.subscribe("r/a", qos=1, retain_handling=1)  # exists already: not sent
    pub.publish("r/b", b"marker", qos=1)
    assert sub.next().payload == b"marker"


def test_no_local(mq: Harness, clients: list[Client]) -> None:
    me = client(mq, clients, client_id="me", protocol=V5)
    me.connect()
    me.subscribe("chat", qos=1, no_local=True)
    other = client(mq, clients, client_id="other", protocol=V5)
    other.connect()
    other.subscribe("chat", qos=1)
    me.publish("chat", b"from me", qos=1)
    other.publish("chat", b"from other", qos=1)
    assert other.next().payload == b"from me"
    assert other.next().payload == b"from other"
    assert me.next().payload == b"from other"
    assert me.nothing_more()


def test_subscription_identifiers(mq: Harness, clients: list[Client]) -> None:
    sub = client(mq, clients, protocol=V5)
    sub.connect()
    sub.subscribe("s/+", qos=1, properties=props(PacketTypes.SUBSCRIBE, SubscriptionIdentifier=7))
    sub.subscribe("s/x", qos=1, properties=props(PacketTypes.SUBSCRIBE, SubscriptionIdentifier=9))
    pub = client(mq, clients, protocol=V5)
    pub.connect()
    pub.publish("s/x", b"both", qos=1)
    pub.publish("s/y", b"one", qos=1)
    both, one = sub.next(), sub.next()
    assert sorted(both.properties.SubscriptionIdentifier) == [7, 9]
    assert one.properties.SubscriptionIdentifier == [7]


def test_shared_subscriptions_split_the_messages(mq: Harness, clients: list[Client]) -> None:
    a = client(mq, clients, client_id="a", protocol=V5)
    b = client(mq, clients, client_id="b", protocol=V5)
    for c in (a, b):
        c.connect()
        c.subscribe("$share/workers/jobs/#", qos=1)
    pub = client(mq, clients, protocol=V5)
    pub.connect()
    for i in range(10):
        pub.publish(f"jobs/{i}", str(i).encode(), qos=1)
    got: list[bytes] = []
    for _ in range(10):  # each round: the broker settles, each member reads what came
        if len(got) >= 10:
            break
        for c in (a, b):
            c.nothing_more()
            got.extend(m.payload for m in c.messages)
            c.messages.clear()
    assert sorted(got) == sorted(str(i).encode() for i in range(10))
    assert a.nothing_more() and b.nothing_more()
    q = mq.broker.vhosts["/"].queues["mqtt-shared-workers-jobs.#"]
    assert len(q.consumers) == 2


def test_mqtt5_properties_round_trip(mq: Harness, clients: list[Client]) -> None:
    sub = client(mq, clients, protocol=V5)
    sub.connect()
    sub.subscribe("req", qos=1)
    pub = client(mq, clients, protocol=V5)
    pub.connect()
    sent = props(
        ContentType="application/json",
        ResponseTopic="replies/42",
        CorrelationData=b"\x00\x01corr",
        UserProperty=[("tenant", "acme"), ("tag", "a"), ("tag", "b")],
        PayloadFormatIndicator=1,
        MessageExpiryInterval=3600,
    )
    pub.publish("req", b"{}", qos=1, properties=sent)
    got = sub.next().properties
    assert got.ContentType == "application/json"
    assert got.ResponseTopic == "replies/42"
    assert got.CorrelationData == b"\x00\x01corr"
    assert got.UserProperty == [("tenant", "acme"), ("tag", "a"), ("tag", "b")]
    assert got.PayloadFormatIndicator == 1
    assert 3590 <= got.MessageExpiryInterval <= 3600


def test_topic_aliases_both_ways(mq: Harness, clients: list[Client]) -> None:
    sub = client(mq, clients, protocol=V5)
    sub.connect(properties=props(PacketTypes.CONNECT, TopicAliasMaximum=4))
    sub.subscribe("alias/#", qos=1)
    pub = client(mq, clients, protocol=V5)
    _, _, connack = pub.connect()
    assert connack.TopicAliasMaximum >= 1
    pub.publish("alias/topic", b"1", qos=1, properties=props(TopicAlias=1))
    pub.publish("", b"2", qos=1, properties=props(TopicAlias=1))  # the alias alone
    got = [sub.next(), sub.next()]
    # The server aliases too: the topic once, then the alias alone (paho hands the
    # application the packet as it came).
    assert [(m.topic, m.payload, m.properties.TopicAlias) for m in got] == [
        ("alias/topic", b"1", 1),
        ("", b"2", 1),
    ]


def test_server_assigned_client_id_and_connack_properties(
    mq: Harness, clients: list[Client]
) -> None:
    c = client(mq, clients, protocol=V5)
    _, rc, connack = c.connect()
    assert rc == 0
    assert connack.AssignedClientIdentifier.startswith("warren-")
    assert connack.MaximumPacketSize > 128 * 1024 * 1024


def test_v311_empty_client_id_needs_clean_session(mq: Harness) -> None:
    """paho refuses to send this CONNECT, so it is written raw."""
    with RawClient(mq, level=4) as c:
        c.send(Connect("", 4, clean_start=False))
        assert c.wait_closed() == [ConnAck(False, 2)]  # identifier rejected, and closed


def test_receive_maximum_bounds_messages_in_flight(mq: Harness, clients: list[Client]) -> None:
    """A client that accepts 2 unacknowledged messages never has more than 2."""
    with RawClient(mq, level=5) as s:
        assert isinstance(s.connect("rm", properties={0x21: 2}), ConnAck)
        s.subscribe("rm/t", qos=1)
        pub = client(mq, clients, protocol=V5)
        pub.connect()
        for i in range(5):
            pub.publish("rm/t", str(i).encode(), qos=1)
        first = s.publishes(2)
        assert [p.payload for p in first] == [b"0", b"1"]
        queue = mq.broker.vhosts["/"].queues["mqtt-subscription-rmqos1"]
        assert mq.call(lambda: queue.message_count) == 3
        s.send(PubAck(first[0].packet_id or 0))
        nxt = s.recv()
        assert isinstance(nxt, Publish) and nxt.payload == b"2"


@BOTH
def test_mqtt_to_amqp(mq: Harness, clients: list[Client], protocol: int) -> None:
    amqp = mq.amqp_client()
    q = bound_queue(amqp, "plant.*.status")
    pub = client(mq, clients, protocol=protocol)
    pub.connect()
    pub.publish("plant/7/status", b"ok", qos=1)
    pub.publish("plant/8/status", b"idle", qos=0)
    m1 = amqp.basic_get(q)
    m2 = amqp.basic_get(q)
    assert m1[0] is not None and m2[0] is not None
    assert (m1[0].routing_key, m1[2], m1[1].delivery_mode) == ("plant.7.status", b"ok", 2)
    assert m1[1].headers["x-mqtt-publish-qos"] == 1
    assert (m2[0].routing_key, m2[2], m2[1].delivery_mode) == ("plant.8.status", b"idle", 1)
    amqp.close()


def test_mqtt5_properties_to_amqp_and_back(mq: Harness, clients: list[Client]) -> None:
    """An MQTT 5 request reaches an AMQP server, whose reply reaches the requester."""
    amqp = mq.amqp_client()
    q = bound_queue(amqp, "rpc.requests")
    requester = client(mq, clients, protocol=V5)
    requester.connect()
    requester.subscribe("rpc/replies/me", qos=1)
    requester.publish(
        "rpc/requests",
        b"2+2",
        qos=1,
        properties=props(
            ResponseTopic="rpc/replies/me",
            CorrelationData=b"req-1",
            ContentType="text/plain",
            UserProperty=[("lang", "en")],
        ),
    )
    method, p, body = amqp.basic_get(q)
    assert method is not None and body == b"2+2"
    assert p.reply_to == "rpc.replies.me"
    assert p.correlation_id == "req-1"
    assert p.content_type == "text/plain"
    assert p.headers["lang"] == "en"
    amqp.send(
        publish_frames(
            1,
            b"4",
            p.reply_to,
            "amq.topic",
            commands.Basic.Properties(
                correlation_id=p.correlation_id, headers={"n": 4}, delivery_mode=2
            ),
        )
    )
    reply = requester.next()
    assert (reply.topic, reply.payload, reply.qos) == ("rpc/replies/me", b"4", 1)
    assert reply.properties.CorrelationData == b"req-1"
    assert reply.properties.UserProperty == [("n", "4")]
    amqp.close()


@BOTH
def test_amqp_to_mqtt(mq: Harness, clients: list[Client], protocol: int) -> None:
    sub = client(mq, clients, protocol=protocol)
    sub.connect()
    sub.subscribe("orders/#", qos=1)
    amqp = mq.amqp_client()
    persistent = commands.Basic.Properties(delivery_mode=2)
    amqp.send(publish_frames(1, b"persistent", "orders.eu.new", "amq.topic", persistent))
    amqp.send(publish_frames(1, b"transient", "orders.us.new", "amq.topic"))
    a, b = sub.next(), sub.next()
    assert (a.topic, a.payload, a.qos) == ("orders/eu/new", b"persistent", 1)
    assert (b.topic, b.payload, b.qos) == ("orders/us/new", b"transient", 0)
    amqp.close()


def test_mqtt_into_a_stream_read_back_by_offset(mq: Harness, clients: list[Client]) -> None:
    amqp = mq.amqp_client()
    stream = {"x-queue-type": "stream"}
    amqp.send_method(1, commands.Queue.Declare(queue="telemetry", durable=True, arguments=stream))
    amqp.expect_method(commands.Queue.DeclareOk)
    amqp.send_method(
        1, commands.Queue.Bind(queue="telemetry", exchange="amq.topic", routing_key="telemetry.#")
    )
    amqp.expect_method(commands.Queue.BindOk)
    pub = client(mq, clients, protocol=V5)
    pub.connect()
    for i in range(10):
        pub.publish(f"telemetry/dev{i}", f"r{i}".encode(), qos=1)
    amqp.send_method(1, commands.Basic.Qos(prefetch_count=100))
    amqp.expect_method(commands.Basic.QosOk)
    amqp.send_method(1, commands.Basic.Consume(queue="telemetry", arguments={"x-stream-offset": 4}))
    amqp.expect_method(commands.Basic.ConsumeOk)
    got: list[tuple[str, bytes, int]] = []
    while len(got) < 6:
        method = amqp.expect_method(commands.Basic.Deliver)
        header, body = amqp.expect_content()
        got.append((method.routing_key, body, header.properties.headers["x-stream-offset"]))
        amqp.send_method(1, commands.Basic.Ack(delivery_tag=method.delivery_tag))
    assert got == [(f"telemetry.dev{i}", f"r{i}".encode(), i) for i in range(4, 10)]
    amqp.close()


def test_unsubscribe_stops_delivery(mq: Harness, clients: list[Client]) -> None:
    sub = client(mq, clients, protocol=V5)
    sub.connect()
    sub.subscribe("u/1", qos=1)
    sub.subscribe("u/2", qos=1)
    sub.unsubscribe("u/1")
    pub = client(mq, clients, protocol=V5)
    pub.connect()
    pub.publish("u/1", b"gone", qos=1)
    pub.publish("u/2", b"kept", qos=1)
    assert sub.next().payload == b"kept"
    assert sub.nothing_more()


def test_no_matching_subscribers_reason_code(mq: Harness, clients: list[Client]) -> None:
    pub = client(mq, clients, protocol=V5)
    pub.connect()
    codes: list[int] = []
    pub.paho.on_publish = lambda c, u, mid, rc, p: codes.append(rc.value)
    pub.publish("nobody/listens", b"x", qos=1)
    assert codes == [0x10]


def test_topic_permissions(mq: Harness, clients: list[Client]) -> None:
    """RabbitMQ's topic permissions on amq.topic: write on the routing key a client
    publishes with, read on the binding key a subscription makes; {client_id} and
    {username} filled in."""

    def setup() -> None:
        users = mq.broker.users
        users.add_user("dev", "secret")
        users.set_permissions("dev", "/")
        users.set_topic_permission(
            "dev",
            "/",
            "amq.topic",
            write="^sensors\\.{client_id}\\.",
            read="^(sensors|{username})\\.",
        )

    mq.call(setup)
    dev = client(mq, clients, client_id="dev1", protocol=V5, username="dev", password="secret")
    dev.connect()
    assert [c.value for c in dev.subscribe("alerts/#", qos=1)] == [0x87]
    assert [c.value for c in dev.subscribe("sensors/#", qos=1)] == [1]
    assert [c.value for c in dev.subscribe("dev/inbox", qos=1)] == [1]
    codes: list[int] = []
    dev.paho.on_publish = lambda c, u, mid, rc, p: codes.append(rc.value)
    dev.publish("sensors/dev1/temp", b"mine", qos=1)
    dev.publish("sensors/dev2/temp", b"not mine", qos=1)
    assert codes == [0, 0x87]
    assert dev.next().payload == b"mine"
    assert dev.nothing_more()


def test_server_keep_alive_and_session_expiry_cap(broker_factory: Factory) -> None:
    b = broker_factory(mqtt_max_keepalive=30, mqtt_max_session_expiry=60)
    c = Client(b, client_id="ka", protocol=V5)
    _, rc, connack = c.connect(
        keepalive=600, properties=props(PacketTypes.CONNECT, SessionExpiryInterval=3600)
    )
    assert rc == 0
    assert connack.ServerKeepAlive == 30
    assert connack.SessionExpiryInterval == 60
    conn = b.call(lambda: next(iter(b.broker.connections)))
    assert conn.keepalive == 30  # type: ignore[attr-defined]
    c.close()


def test_memory_alarm_pauses_publishers(mq: Harness, clients: list[Client]) -> None:
    """While the memory alarm is raised MQTT connections are not read: a PUBLISH
    waits in the socket (here the in-memory transport's buffer, kept while the
    protocol has reading paused) and is routed once the alarm clears."""
    reading = [0]

    def set_memory(used: int) -> bool:
        reading[0] = used
        mq.broker.resource_alarms.memory_reader = lambda: reading[0]
        return mq.broker.resource_alarms.check_memory()

    sub = client(mq, clients, client_id="sub", protocol=V5)
    sub.connect()
    sub.subscribe("alarm/#", qos=1)
    pub = client(mq, clients, client_id="pub", protocol=V5)
    pub.connect()
    pub.publish("alarm/a", b"before", qos=1)
    assert sub.next().payload == b"before"
    limit = mq.call(mq.broker.resource_alarms.memory_limit)
    assert mq.call(lambda: set_memory(limit + 1)) is True
    info = pub.paho.publish("alarm/b", b"during", qos=1)
    assert sub.nothing_more()
    assert pub.nothing_more()  # pub has read what came back: no PUBACK among it
    assert not info.is_published()
    assert mq.call(lambda: set_memory(limit)) is False
    assert sub.next().payload == b"during"
    pub.until(info.is_published, "PUBACK")
    assert info.is_published()
