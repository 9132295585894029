"""Hostile and broken MQTT clients: each is closed with the right reason code (MQTT 5:
DISCONNECT or CONNACK with the code; 3.1.1: a plain close, or a CONNACK return code)
while a well-behaved paho client on the same broker (the `Bystander`) keeps
publishing and receiving without loss. Keepalive and CONNECT timeouts,
authentication and authorisation; then clients that are valid but greedy or odd
(never reading, never releasing QoS 2, tiny Receive Maximum or Maximum Packet Size,
huge packets, long topics and property names, share groups, AMQP routing keys that
are no MQTT topic), none of which may hurt another client.

Moved to the in-memory harness (issue 29). The hostile client is a
harness.RawMQTT (the test writes every byte; the broker's are read by
harness.mqtt_decode, not by Warren's codec). The `Bystander` is paho's own
client in memory (memclients.Bystander): with no thread to publish alongside,
it has QoS 1 messages in flight while the hostile client acts and publishes
more in `check`, which asserts that all came back in order and that it was
never disconnected. Keep-alive and CONNECT timeouts run on a ManualClock. The
client that never reads stays on a socket: what it shows is backpressure
(tests/protocol/mqtt/test_mqtt_sockets.py).
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import Harness
from memclients import Bystander, Factory, RawClient, harnesses, live_ids, wait_for
from pamqp import commands
from rawamqp import body_frame, header_frame, raw_frame

from warren.core.clock import ManualClock
from warren.mqtt import properties as P
from warren.mqtt.codec import _e_vbi, encode
from warren.mqtt.packets import (
    MQTT_5,
    ConnAck,
    Connect,
    Disconnect,
    PingReq,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    UnsubAck,
    Unsubscribe,
    Will,
)
from warren.mqtt.server import CONNECT_TIMEOUT_MS

pytestmark = pytest.mark.timeout(60)

V311 = 4


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[Factory]:
    yield from harnesses(tmp_path)


@pytest.fixture
def broker(broker_factory: Factory) -> Harness:
    return broker_factory()


def mqtt_port(b: Harness) -> Harness:
    return b


@pytest.fixture
def bystander(broker: Harness) -> Iterator[Bystander]:
    b = Bystander(broker)
    try:
        yield b
    finally:
        b.close()


def publish_raw(topic: bytes, level: int, first: int = 0x30, pid: bytes = b"") -> bytes:
    body = len(topic).to_bytes(2, "big") + topic + pid + (b"\x00" if level == MQTT_5 else b"")
    body += b"payload"
    return bytes((first,)) + _e_vbi(len(body)) + body


def connect_raw(level: int, name: bytes = b"MQTT", client_id: bytes = b"old") -> bytes:
    body = len(name).to_bytes(2, "big") + name + bytes((level, 0x02, 0, 60))
    body += len(client_id).to_bytes(2, "big") + client_id
    return bytes((0x10,)) + _e_vbi(len(body)) + body


# Sent after a successful CONNECT: (bytes at level 4, bytes at level 5, MQTT 5 reason).
AFTER_CONNECT: dict[str, tuple[bytes | None, bytes, int]] = {
    "remaining length over 4 bytes": (
        b"\x30\xff\xff\xff\xff\x7f",
        b"\x30\xff\xff\xff\xff\x7f",
        P.MALFORMED_PACKET,
    ),
    "remaining length past the content": (b"\xc0\x01\x00", b"\xc0\x01\x00", P.MALFORMED_PACKET),
    "publish qos 3": (
        publish_raw(b"a", V311, 0x36, b"\x00\x01"),
        publish_raw(b"a", MQTT_5, 0x36, b"\x00\x01"),
        P.MALFORMED_PACKET,
    ),
    "pubrel flags 0": (b"\x60\x02\x00\x01", b"\x60\x02\x00\x01", P.MALFORMED_PACKET),
    "subscribe flags 0": (
        b"\x80\x06\x00\x01\x00\x01a\x01",
        b"\x80\x07\x00\x01\x00\x00\x01a\x01",
        P.MALFORMED_PACKET,
    ),
    "qos 0 with dup": (
        publish_raw(b"a", V311, 0x38),
        publish_raw(b"a", MQTT_5, 0x38),
        P.MALFORMED_PACKET,
    ),
    "invalid utf-8 topic": (
        publish_raw(b"a/\xff\xfe", V311),
        publish_raw(b"a/\xff\xfe", MQTT_5),
        P.MALFORMED_PACKET,
    ),
    "nul in topic": (
        publish_raw(b"a\x00b", V311),
        publish_raw(b"a\x00b", MQTT_5),
        P.MALFORMED_PACKET,
    ),
    "wildcard in publish topic": (
        encode(Publish("a/+/b", b"x"), V311),
        encode(Publish("a/#", b"x"), MQTT_5),
        P.MALFORMED_PACKET,
    ),
    # The topic becomes an AMQP routing key (a shortstr): this used to raise in the
    # publisher's connection (fatal error on transport).
    "topic over 255 bytes": (
        encode(Publish("long/" + "x" * 300, b"x", 1, packet_id=1), V311),
        encode(Publish("long/" + "\u00e9" * 126, b"x"), MQTT_5),
        P.TOPIC_NAME_INVALID,
    ),
    "second connect": (
        encode(Connect("again", V311)),
        encode(Connect("again", MQTT_5)),
        P.PROTOCOL_ERROR,
    ),
    "reserved packet type 0": (b"\x00\x00", b"\x00\x00", P.MALFORMED_PACKET),
    "garbage": (
        b"\xde\xad\xbe\xef" * 8,
        b"\xde\xad\xbe\xef" * 8,
        P.MALFORMED_PACKET,
    ),
    "auth packet": (b"\xf0\x00", b"\xf0\x02\x19\x00", P.PROTOCOL_ERROR),
    "unknown topic alias": (
        None,
        encode(Publish("", b"x", properties={P.TOPIC_ALIAS: 5}), MQTT_5),
        P.PROTOCOL_ERROR,
    ),
    "session expiry set on disconnect after 0": (
        None,
        encode(Disconnect(0, {P.SESSION_EXPIRY_INTERVAL: 60}), MQTT_5),
        P.PROTOCOL_ERROR,
    ),
    "topic alias above the maximum": (
        None,
        encode(Publish("t", b"x", properties={P.TOPIC_ALIAS: 17}), MQTT_5),
        P.TOPIC_ALIAS_INVALID,
    ),
    "unknown property": (None, b"\x30\x06\x00\x01a\x01\x7f\x00", P.MALFORMED_PACKET),
}

CASES = [
    pytest.param(level, name, id=f"{name}-{'5' if level == MQTT_5 else '3.1.1'}")
    for name, (v4, _v5, _rc) in AFTER_CONNECT.items()
    for level in (V311, MQTT_5)
    if level == MQTT_5 or v4 is not None
]


@pytest.mark.parametrize("level,case", CASES)
def test_malformed_after_connect_closes_only_that_connection(
    broker: Harness, bystander: Bystander, level: int, case: str
) -> None:
    v4, v5, code = AFTER_CONNECT[case]
    with RawClient(mqtt_port(broker), level) as c:
        assert c.connect("hostile").reason_code == 0
        data = v5 if level == MQTT_5 else v4
        assert data is not None
        c.send_raw(data)
        tail = c.wait_closed()
        if level == MQTT_5:
            assert [(type(p), getattr(p, "reason_code", None)) for p in tail] == [
                (Disconnect, code)
            ]
        else:
            assert tail == []
    wait_for(lambda: "hostile" not in live_ids(broker), what="the session to be released")
    bystander.check()


def test_packet_larger_than_the_advertised_maximum(
    broker_factory: Any,
) -> None:
    b = broker_factory(max_message_size=1024)
    by = Bystander(b)
    try:
        with RawClient(mqtt_port(b)) as c:
            ack = c.connect("big")
            limit = ack.properties[P.MAXIMUM_PACKET_SIZE]
            assert isinstance(limit, int) and limit > 1024
            # Exactly at the limit: accepted.
            head = 1 + len(_e_vbi(limit))
            fits = encode(Publish("big/ok", b"", 1, packet_id=1), MQTT_5)
            pad = limit - len(fits) - (len(_e_vbi(limit - head)) - len(_e_vbi(len(fits) - 2)))
            ok = encode(Publish("big/ok", b"x" * pad, 1, packet_id=1), MQTT_5)
            assert len(ok) == limit
            c.send_raw(ok)
            assert c.expect(PubAck).packet_id == 1
            # One byte over, announced by the fixed header alone (no body follows).
            c.send_raw(b"\x30" + _e_vbi(limit - head + 1))
            assert [(type(p), p.reason_code) for p in c.wait_closed()] == [  # type: ignore[attr-defined]
                (Disconnect, P.PACKET_TOO_LARGE)
            ]
        by.check()
    finally:
        by.close()


# -- before and at CONNECT ----------------------------------------------------------------

# (bytes, decoder level for the answer, the answer: None for a plain close, else the
# CONNACK reason / return code)
AT_CONNECT: dict[str, tuple[bytes, int, int | None]] = {
    "publish before connect": (encode(Publish("a", b"x"), V311), V311, None),
    "subscribe before connect": (b"\x82\x06\x00\x01\x00\x01a\x01", V311, None),
    "pingreq before connect": (b"\xc0\x00", V311, None),
    "garbage before connect": (b"\x00\x00garbage", V311, None),
    "http request": (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"x" * 64, V311, None),
    "protocol level 3": (connect_raw(3), V311, P.V311_UNACCEPTABLE_PROTOCOL_VERSION),
    "protocol level 6": (connect_raw(6), V311, P.V311_UNACCEPTABLE_PROTOCOL_VERSION),
    "protocol name MQIsdp": (connect_raw(4, b"MQIsdp"), V311, None),
    # A real MQTT 3.1 client: told its version is not accepted, which it understands.
    "MQTT 3.1 (MQIsdp, level 3)": (
        connect_raw(3, b"MQIsdp"),
        V311,
        P.V311_UNACCEPTABLE_PROTOCOL_VERSION,
    ),
    "connect too large": (b"\x10" + _e_vbi(70000), V311, None),
    "connect reserved flag 5": (
        encode(Connect("x", MQTT_5)).replace(b"\x05\x02", b"\x05\x03", 1),
        MQTT_5,
        P.MALFORMED_PACKET,
    ),
    "connect reserved flag 3.1.1": (
        encode(Connect("x", V311)).replace(b"\x04\x02", b"\x04\x03", 1),
        V311,
        None,
    ),
    "enhanced auth": (
        encode(Connect("x", MQTT_5, properties={P.AUTHENTICATION_METHOD: "SCRAM-SHA-1"})),
        MQTT_5,
        P.BAD_AUTHENTICATION_METHOD,
    ),
    "will topic over 255 bytes 5": (
        encode(Connect("x", MQTT_5, will=Will("w/" + "x" * 300, b"w"))),
        MQTT_5,
        P.TOPIC_NAME_INVALID,
    ),
    "will topic over 255 bytes 3.1.1": (
        encode(Connect("x", V311, will=Will("w/" + "x" * 300, b"w"))),
        V311,
        P.V311_NOT_AUTHORIZED,
    ),
    "client id too long 5": (encode(Connect("c" * 300, MQTT_5)), MQTT_5, 0x85),
    "client id too long 3.1.1": (
        encode(Connect("c" * 300, V311)),
        V311,
        P.V311_IDENTIFIER_REJECTED,
    ),
    "empty client id without clean session": (
        encode(Connect("", V311, clean_start=False)),
        V311,
        P.V311_IDENTIFIER_REJECTED,
    ),
}


@pytest.mark.parametrize("case", list(AT_CONNECT))
def test_bad_connect_closes_only_that_connection(
    broker: Harness, bystander: Bystander, case: str
) -> None:
    data, level, code = AT_CONNECT[case]
    with RawClient(mqtt_port(broker), level) as c:
        c.send_raw(data)
        tail = c.wait_closed()
        if code is None:
            assert tail == []
        else:
            assert len(tail) == 1 and isinstance(tail[0], ConnAck), tail
            assert (tail[0].session_present, tail[0].reason_code) == (False, code)
    assert live_ids(broker) == {"bystander"}
    bystander.check()


# -- timeouts: the broker's ManualClock, moved to each deadline ----------------------------


@pytest.fixture
def clocked(broker_factory: Factory) -> Harness:
    return broker_factory(clock=ManualClock())


@pytest.fixture
def clocked_bystander(clocked: Harness) -> Iterator[Bystander]:
    b = Bystander(clocked)
    try:
        yield b
    finally:
        b.close()


def _protocols(b: Harness) -> int:
    listener = b.mqtt_listener()
    return b.call(lambda: len(listener.protocols))


@pytest.mark.parametrize("level", [V311, MQTT_5])
def test_keepalive_timeout_closes_and_publishes_the_will(
    clocked: Harness, clocked_bystander: Bystander, level: int
) -> None:
    port = mqtt_port(clocked)
    with RawClient(port) as watcher, RawClient(port, level) as silent:
        watcher.connect("ka-watcher")
        watcher.subscribe("ka/#", qos=0)
        silent.connect("silent", keep_alive=1, will=Will("ka/will", b"timed out"))
        clocked.advance(1499)  # one and a half keep alive periods, less 1 ms
        assert "silent" in live_ids(clocked)
        clocked.advance(1)
        tail = silent.wait_closed(5)
        if level == MQTT_5:
            assert [(type(p), p.reason_code) for p in tail] == [  # type: ignore[attr-defined]
                (Disconnect, P.KEEP_ALIVE_TIMEOUT)
            ]
        else:
            assert tail == []
        will = watcher.expect(Publish)
        assert (will.topic, will.payload) == ("ka/will", b"timed out")
    clocked_bystander.check()


def test_keepalive_not_kept_by_a_trickled_partial_packet(clocked: Harness) -> None:
    """Keep alive counts complete control packets: bytes of a PUBLISH that never
    completes, one every 0.3 s, do not keep the connection (slow loris)."""
    with RawClient(mqtt_port(clocked)) as c:
        c.connect("trickle", keep_alive=1)
        partial = encode(Publish("t", b"x" * 100), MQTT_5)
        for byte in partial[:5]:
            c.send_raw(bytes((byte,)))
            clocked.advance(299)  # 1.495 s in all
        assert "trickle" in live_ids(clocked)
        c.send_raw(partial[5:6])
        clocked.advance(5)
        got = c.wait_closed(5)
        assert [(type(p), p.reason_code) for p in got] == [  # type: ignore[attr-defined]
            (Disconnect, P.KEEP_ALIVE_TIMEOUT)
        ]


def test_keepalive_kept_by_pings(clocked: Harness) -> None:
    with RawClient(mqtt_port(clocked)) as c:
        c.connect("pinger", keep_alive=1)
        for _ in range(5):  # well past 1.5 keep alive periods
            clocked.advance(1000)
            c.send(PingReq())
            c.expect(PingResp)  # the broker has it: no DISCONNECT meanwhile
        clocked.advance(1499)
        assert "pinger" in live_ids(clocked)
        clocked.advance(2)  # silent for 1.5 periods (the timer's 1 ms after): gone
        assert [(type(p), p.reason_code) for p in c.wait_closed(5)] == [  # type: ignore[attr-defined]
            (Disconnect, P.KEEP_ALIVE_TIMEOUT)
        ]


def test_no_connect_within_the_timeout(
    clocked: Harness, clocked_bystander: Bystander
) -> None:
    port = mqtt_port(clocked)
    before = _protocols(clocked)
    with RawClient(port) as idle, RawClient(port) as partial:
        partial.send_raw(encode(Connect("partial", V311))[:5])  # never completed
        wait_for(lambda: _protocols(clocked) == before + 2, what="both accepted")
        clocked.advance(CONNECT_TIMEOUT_MS - 1)
        assert _protocols(clocked) == before + 2
        clocked.advance(1)
        assert idle.wait_closed(5) == []
        assert partial.wait_closed(5) == []
    clocked_bystander.check()


# -- authentication and authorisation -------------------------------------------------------


@pytest.fixture
def users(broker: Harness) -> Harness:
    def setup() -> None:
        u = broker.broker.users
        u.add_user("alice", "secret")
        u.set_permissions("alice", "/")
        u.add_user("nobody", "secret")  # no permission on any vhost
        # May bind her own queues, may not publish to amq.topic.
        u.add_user("reader", "secret")
        u.set_permissions("reader", "/", ".*", "^mqtt-.*", ".*")
        # May publish, may not read from amq.topic (so may not subscribe).
        u.add_user("writer", "secret")
        u.set_permissions("writer", "/", ".*", ".*", "^mqtt-.*")
        broker.broker.add_vhost("other")

    broker.call(setup)
    return broker


REFUSED_LOGINS = [
    # (user name, password, MQTT 5 reason, 3.1.1 return code)
    pytest.param("alice", b"wrong", P.BAD_USER_NAME_OR_PASSWORD, 4, id="wrong password"),
    pytest.param("mallory", b"secret", P.BAD_USER_NAME_OR_PASSWORD, 4, id="unknown user"),
    pytest.param("nohost:alice", b"secret", P.NOT_AUTHORIZED, 5, id="unknown vhost"),
    pytest.param("nobody", b"secret", P.NOT_AUTHORIZED, 5, id="no permission"),
    pytest.param("other:alice", b"secret", P.NOT_AUTHORIZED, 5, id="no permission on vhost"),
    pytest.param("alice", b"\xff\xfe", P.BAD_USER_NAME_OR_PASSWORD, 4, id="binary password"),
]


@pytest.mark.parametrize("level", [V311, MQTT_5], ids=["3.1.1", "5"])
@pytest.mark.parametrize("username,password,code5,code4", REFUSED_LOGINS)
def test_login_refused(
    users: Harness,
    level: int,
    username: str,
    password: bytes,
    code5: int,
    code4: int,
) -> None:
    with RawClient(mqtt_port(users), level) as c:
        c.send(Connect("login", level, username=username, password=password))
        tail = c.wait_closed()
        assert len(tail) == 1 and isinstance(tail[0], ConnAck), tail
        assert tail[0].reason_code == (code5 if level == MQTT_5 else code4)
    assert "login" not in live_ids(users)


@pytest.mark.parametrize("level", [V311, MQTT_5], ids=["3.1.1", "5"])
def test_login_accepted_with_vhost_prefix(users: Harness, level: int) -> None:
    with RawClient(mqtt_port(users), level) as c:
        ack = c.connect("login", username="/:alice", password=b"secret")
        assert ack.reason_code == 0
        c.disconnect()


def test_anonymous_refused_when_disabled(broker_factory: Any) -> None:
    b = broker_factory(mqtt_allow_anonymous=False)
    for level, code in ((MQTT_5, P.BAD_USER_NAME_OR_PASSWORD), (V311, 4)):
        with RawClient(mqtt_port(b), level) as c:
            c.send(Connect("anon", level))
            tail = c.wait_closed()
            assert [(type(p), p.reason_code) for p in tail] == [(ConnAck, code)]  # type: ignore[attr-defined]


def test_publish_refused_mqtt5_keeps_the_connection(users: Harness) -> None:
    port = mqtt_port(users)
    with RawClient(port) as watcher, RawClient(port) as c:
        watcher.connect("refused-watcher")
        watcher.subscribe("deny/#", qos=1)
        assert c.connect("reader-5", username="reader", password=b"secret").reason_code == 0
        c.send(Publish("deny/a", b"q1", qos=1, packet_id=1))
        ack = c.expect(PubAck)
        assert (ack.packet_id, ack.reason_code) == (1, P.NOT_AUTHORIZED)
        c.send(Publish("deny/a", b"q2", qos=2, packet_id=2))
        rec = c.expect(PubRec)
        assert (rec.packet_id, rec.reason_code) == (2, P.NOT_AUTHORIZED)
        c.send(Publish("deny/a", b"q0"))
        # Still connected, and nothing of the three was routed.
        c.send(PingReq())
        c.expect(PingResp)
        ok = RawClient(port)
        ok.connect("allowed-pub")
        ok.send(Publish("deny/a", b"allowed", qos=1, packet_id=1))
        ok.expect(PubAck)
        ok.disconnect()
        assert watcher.expect(Publish).payload == b"allowed"
        c.disconnect()


def test_publish_refused_mqtt311_closes(users: Harness, bystander: Bystander) -> None:
    with RawClient(mqtt_port(users), V311) as c:
        assert c.connect("reader-4", username="reader", password=b"secret").reason_code == 0
        c.send(Publish("deny/a", b"q1", qos=1, packet_id=1))
        assert c.wait_closed() == []
    bystander.check()


@pytest.mark.parametrize(
    "level,code", [(V311, P.V311_SUBACK_FAILURE), (MQTT_5, P.NOT_AUTHORIZED)], ids=["3.1.1", "5"]
)
def test_subscribe_refused(users: Harness, level: int, code: int) -> None:
    with RawClient(mqtt_port(users), level) as c:
        assert c.connect("writer-sub", username="writer", password=b"secret").reason_code == 0
        assert c.subscribe("any/#", qos=1).reason_codes == [code]
        # Still connected; a publish it may make is not delivered to it.
        c.send(Publish("any/x", b"x", qos=1, packet_id=5))
        ack = c.expect(PubAck)
        assert ack.packet_id == 5
        c.send(PingReq())
        c.expect(PingResp)  # no PUBLISH before it: nothing was bound
        c.disconnect()


def test_will_refused_without_write_permission(users: Harness) -> None:
    for level, code in ((MQTT_5, P.NOT_AUTHORIZED), (V311, 5)):
        with RawClient(mqtt_port(users), level) as c:
            c.send(
                Connect(
                    "will-reader",
                    level,
                    username="reader",
                    password=b"secret",
                    will=Will("deny/will", b"x"),
                )
            )
            tail = c.wait_closed()
            assert [(type(p), p.reason_code) for p in tail] == [(ConnAck, code)]  # type: ignore[attr-defined]


# -- one client's subscriptions must not hurt another's publishes ----------------------------


@pytest.mark.parametrize("level", [V311, MQTT_5], ids=["3.1.1", "5"])
def test_first_shared_subscription_delivers_and_spares_the_publisher(
    broker: Harness, bystander: Bystander, level: int
) -> None:
    port = mqtt_port(broker)
    with RawClient(port, level) as member, RawClient(port, level) as pub:
        member.connect("member")
        assert member.subscribe("$share/g/sh/#", qos=1).reason_codes == [1]
        pub.connect("sh-pub")
        for i in range(3):
            pub.send(Publish("sh/x", b"%d" % i, qos=1, packet_id=i + 1))
            assert pub.expect(PubAck).packet_id == i + 1
        got = member.publishes(3)
        assert [(p.topic, p.payload, p.qos) for p in got] == [
            ("sh/x", b"0", 1),
            ("sh/x", b"1", 1),
            ("sh/x", b"2", 1),
        ]
        member.send(*(PubAck(p.packet_id or 0) for p in got))
        # A subscription of its own next to the share: each keeps its options.
        assert member.subscribe("own/#", qos=0, pid=2).reason_codes == [0]
        pub.send(Publish("sh/x", b"shared", qos=1, packet_id=9))
        assert pub.expect(PubAck).packet_id == 9
        p = member.expect(Publish)
        assert (p.payload, p.qos) == (b"shared", 1)
        member.send(PubAck(p.packet_id or 0))
        # Subscribing again replaces the share's options (here its QoS).
        assert member.subscribe("$share/g/sh/#", qos=0, pid=3).reason_codes == [0]
        pub.send(Publish("sh/x", b"at-qos-0", qos=1, packet_id=10))
        assert pub.expect(PubAck).packet_id == 10
        p = member.expect(Publish)
        assert (p.payload, p.qos) == (b"at-qos-0", 0)
        pub.send(PingReq())
        pub.expect(PingResp)
        member.disconnect()
        pub.disconnect()
    bystander.check()


def test_messages_queued_after_unsubscribe_still_go_out(
    broker: Harness, bystander: Bystander
) -> None:
    """UNSUBSCRIBE with messages still queued for the session (held back by its
    Receive Maximum): they are delivered, the connection lives on."""
    port = mqtt_port(broker)
    with RawClient(port) as sub, RawClient(port) as pub:
        sub.connect("unsub", properties={P.RECEIVE_MAXIMUM: 1})
        sub.subscribe("u/#", qos=1)
        pub.connect("unsub-pub")
        for i in range(3):
            pub.send(Publish("u/x", b"%d" % i, qos=1, packet_id=i + 1))
            assert pub.expect(PubAck).packet_id == i + 1
        first = sub.expect(Publish)
        sub.send(Unsubscribe(5, ["u/#"]))
        assert sub.expect(UnsubAck).reason_codes == [0]
        payloads = [first.payload]
        sub.send(PubAck(first.packet_id or 0))
        for _ in range(2):
            p = sub.expect(Publish)
            payloads.append(p.payload)
            sub.send(PubAck(p.packet_id or 0))
        assert payloads == [b"0", b"1", b"2"]
        # Not subscribed any more: a new message is not delivered.
        pub.send(Publish("u/x", b"late", qos=1, packet_id=9))
        ack = pub.expect(PubAck)
        assert (ack.packet_id, ack.reason_code) == (9, P.NO_MATCHING_SUBSCRIBERS)
        sub.send(PingReq())
        sub.expect(PingResp)
        sub.disconnect()
    bystander.check()


@pytest.mark.parametrize(
    "perms",
    [
        pytest.param((".*", "^mqtt-subscription-.*", ".*"), id="no write on the shared queue"),
        pytest.param((".*", ".*", "^(amq\\.topic|mqtt-subscription-.*)$"), id="no read on it"),
    ],
)
def test_refused_shared_subscription_gets_nothing(
    users: Harness, perms: tuple[str, str, str]
) -> None:
    users.call(lambda: users.broker.users.set_permissions("reader", "/", *perms))
    port = mqtt_port(users)
    with RawClient(port) as alice, RawClient(port) as other:
        alice.connect("alice-share", username="alice", password=b"secret")
        assert alice.subscribe("$share/g/t/#", qos=1).reason_codes == [1]
        other.connect("other-share", username="reader", password=b"secret")
        assert other.subscribe("$share/g/t/#", qos=1).reason_codes == [P.NOT_AUTHORIZED]
        assert (
            users.call(lambda: users.broker.vhosts["/"].queues["mqtt-shared-g-t.#"].consumer_count)
            == 1
        )
        for i in range(4):
            alice.send(Publish("t/x", b"%d" % i, qos=1, packet_id=i + 1))
        got = []
        while len(got) < 4:
            p = alice.recv()
            if isinstance(p, Publish):
                got.append(p.payload)
                alice.send(PubAck(p.packet_id or 0))
        assert got == [b"0", b"1", b"2", b"3"]
        other.send(PingReq())
        other.expect(PingResp)  # and no PUBLISH before it
        other.disconnect()
        alice.disconnect()


def test_the_clients_maximum_packet_size_is_respected(
    broker: Harness, bystander: Bystander
) -> None:
    """A message larger than the subscriber's Maximum Packet Size is skipped for it
    (MQTT-3.1.2-25), not sent and not fatal."""
    port = mqtt_port(broker)
    with RawClient(port) as small, RawClient(port) as pub:
        small.connect("small", properties={P.MAXIMUM_PACKET_SIZE: 200})
        small.subscribe("size/#", qos=1)
        pub.connect("sizer")
        for pid, payload in ((1, b"a" * 100), (2, b"b" * 500), (3, b"c" * 150)):
            pub.send(Publish("size/x", payload, 1, packet_id=pid))
            assert pub.expect(PubAck).packet_id == pid
        got = small.publishes(2)
        assert [p.payload for p in got] == [b"a" * 100, b"c" * 150]
        small.send(*(PubAck(p.packet_id or 0) for p in got))
        small.send(PingReq())
        small.expect(PingResp)
        small.disconnect()
        pub.disconnect()
    bystander.check()


def test_qos2_subscriber_that_never_completes_is_held_to_its_receive_maximum(
    broker: Harness, bystander: Bystander
) -> None:
    """Receive Maximum counts QoS 2 messages until PUBCOMP (MQTT-3.3.4-9): PUBREC
    alone does not open the window, else the broker's released set (and its
    packet ids) would grow without bound."""
    port = mqtt_port(broker)
    with RawClient(port) as sub, RawClient(port) as pub:
        sub.connect("never-comp", properties={P.RECEIVE_MAXIMUM: 3})
        sub.subscribe("rm/#", qos=2)
        pub.connect("rm-pub")
        for i in range(6):
            pub.send(Publish("rm/x", b"%d" % i, qos=2, packet_id=i + 1))
            assert pub.expect(PubRec).packet_id == i + 1
            pub.send(PubRel(i + 1))
            assert pub.expect(PubComp).packet_id == i + 1
        first = sub.publishes(3)
        assert all(p.qos == 2 for p in first)
        assert [p.payload for p in first] == [b"0", b"1", b"2"]
        for p in first:
            sub.send(PubRec(p.packet_id or 0))
            assert sub.expect(PubRel).packet_id == p.packet_id
        # Three PUBRELs out, no PUBCOMP: the window is still full.
        sub.send(PingReq())
        sub.expect(PingResp)  # and no PUBLISH before it
        sub.send(PubComp(first[0].packet_id or 0))
        nxt = sub.expect(Publish)
        assert nxt.payload == b"3"
        sub.send(PingReq())
        sub.expect(PingResp)
        sub.disconnect()
        pub.disconnect()
    bystander.check()


@pytest.mark.parametrize("level", [V311, MQTT_5], ids=["3.1.1", "5"])
def test_qos2_publisher_that_never_releases_is_stopped(
    broker: Harness, bystander: Bystander, level: int
) -> None:
    """Every QoS 2 message awaiting PUBREL is in the session's record (rewritten on
    each): their number is capped (MQTT 5: the advertised Receive Maximum, then
    DISCONNECT 0x93) rather than growing to 65535 with the broker's loop busy
    rewriting ever larger records."""
    from warren.mqtt.session import MAX_AWAITING_RELEASE

    with RawClient(mqtt_port(broker), level) as c:
        ack = c.connect(
            "hoarder",
            **(
                {"clean": False}
                if level == V311
                else {"clean": False, "properties": {P.SESSION_EXPIRY_INTERVAL: 60}}
            ),
        )
        if level == MQTT_5:
            assert ack.properties[P.RECEIVE_MAXIMUM] == MAX_AWAITING_RELEASE
        n = MAX_AWAITING_RELEASE
        c.send_raw(
            b"".join(
                encode(Publish("hoard/x", b"x", 2, packet_id=i), level) for i in range(1, n + 1)
            )
        )
        assert [c.expect(PubRec).packet_id for _ in range(n)] == list(range(1, n + 1))
        # Released ids may be used again; a new one over the cap may not.
        c.send(PubRel(1))
        assert c.expect(PubComp).packet_id == 1
        c.send(Publish("hoard/x", b"x", 2, packet_id=1))
        assert c.expect(PubRec).packet_id == 1
        c.send(Publish("hoard/x", b"x", 2, packet_id=n + 1))
        tail = c.wait_closed()
        if level == MQTT_5:
            assert [(type(p), p.reason_code) for p in tail] == [  # type: ignore[attr-defined]
                (Disconnect, P.RECEIVE_MAXIMUM_EXCEEDED)
            ]
        else:
            assert tail == []
    bystander.check()


def test_receive_maximum_holds_for_retained_messages(
    broker: Harness, bystander: Bystander
) -> None:
    """The retained burst on SUBSCRIBE waits for room in the client's window
    (MQTT-3.3.4-9) and comes before queued messages; acknowledging a retained
    message lets the rest (and the queue) go on."""
    port = mqtt_port(broker)
    with RawClient(port) as pub:
        pub.connect("ret-pub")
        for i in range(5):
            pub.send(Publish(f"rw/{i}", b"r%d" % i, qos=1, retain=True, packet_id=i + 1))
            assert pub.expect(PubAck).packet_id == i + 1
        with RawClient(port) as sub:
            sub.connect("ret-window", properties={P.RECEIVE_MAXIMUM: 2})
            sub.subscribe("rw/#", qos=1)
            pub.send(Publish("rw/live", b"live", qos=1, packet_id=9))
            assert pub.expect(PubAck).packet_id == 9
            got: list[Publish] = sub.publishes(2)
            sub.send(PingReq())
            sub.expect(PingResp)  # the window is full: nothing else came
            while len(got) < 6:
                sub.send(PubAck(got[len(got) - 2].packet_id or 0))
                got.append(sub.expect(Publish))
            assert [(p.topic, p.payload, p.retain) for p in got] == [
                *((f"rw/{i}", b"r%d" % i, True) for i in range(5)),
                ("rw/live", b"live", False),
            ]
            sub.send(*(PubAck(p.packet_id or 0) for p in got[-2:]))
            sub.send(PingReq())
            sub.expect(PingResp)
            sub.disconnect()
        pub.disconnect()
    bystander.check()


def test_a_large_packet_arriving_in_pieces_is_gathered_in_linear_time() -> None:
    """The decoder joined what it had buffered with every read: a large PUBLISH
    (up to max_message_size, 128 MB by default) coming in 64 KB reads was copied
    over and over, the broker's loop busy for seconds (32 MB: 2.6 s; 128 MB: ~40 s)."""
    from warren.mqtt.codec import Decoder

    pkt = encode(Publish("big/t", b"x" * (32 << 20), 1, packet_id=1), MQTT_5)
    decoder = Decoder(MQTT_5, max_packet_size=1 << 30)
    start = time.process_time()  # CPU time: a busy machine's wait for a core is no cost
    out = []
    for i in range(0, len(pkt), 65536):
        out += decoder.feed(pkt[i : i + 65536])
    elapsed = time.process_time() - start
    assert len(out) == 1 and isinstance(out[0], Publish) and len(out[0].payload) == 32 << 20
    assert elapsed < 1.5, f"{elapsed:.2f} s"


def test_large_publish_in_pieces(broker: Harness, bystander: Bystander) -> None:
    port = mqtt_port(broker)
    payload = bytes(range(256)) * (16 << 12)  # 16 MB
    with RawClient(port) as sub, RawClient(port) as pub:
        sub.connect("big-sub")
        sub.subscribe("big/#", qos=1)
        pub.connect("big-pub")
        pkt = encode(Publish("big/x", payload, 1, packet_id=7), MQTT_5)
        for i in range(0, len(pkt), 65536):
            pub.send_raw(pkt[i : i + 65536])
        assert pub.expect(PubAck, 30).packet_id == 7
        got = sub.expect(Publish, 30)
        assert got.payload == payload
        sub.send(PubAck(got.packet_id or 0))
        sub.disconnect()
        pub.disconnect()
    bystander.check()


def test_topic_of_255_bytes_is_fine(broker: Harness) -> None:
    topic = "edge/" + "y" * 250
    with RawClient(mqtt_port(broker)) as c:
        c.connect("edge")
        c.subscribe("edge/#", qos=1)
        c.send(Publish(topic, b"fits", 1, packet_id=1))
        got = [c.recv(), c.recv()]  # the delivery may overtake the PUBACK
        assert [p.packet_id for p in got if isinstance(p, PubAck)] == [1]
        assert [p.topic for p in got if isinstance(p, Publish)] == [topic]
        c.disconnect()


def test_user_property_names_amqp_cannot_carry(broker: Harness, bystander: Bystander) -> None:
    """A user property name over 255 bytes cannot be an AMQP header name: it is
    dropped (the message and its other properties go on) instead of raising in the
    publisher's connection; the same in a will."""
    port = mqtt_port(broker)
    long_name = "\u00e9" * 200  # 400 bytes
    props = {P.USER_PROPERTY: [(long_name, "dropped"), ("kept", "yes")]}
    with RawClient(port) as sub, RawClient(port) as pub:
        sub.connect("up-sub")
        sub.subscribe("up/#", qos=1)
        pub.connect("up-pub")
        pub.send(Publish("up/x", b"m", 1, packet_id=1, properties=props))
        got = [sub.expect(Publish), pub.expect(PubAck)]
        assert got[1].reason_code == 0
        assert got[0].properties.get(P.USER_PROPERTY) == [("kept", "yes")]
        sub.send(PubAck(got[0].packet_id or 0))
        willer = RawClient(port)
        willer.connect("up-will", will=Will("up/will", b"gone", 1, False, props))
        willer.close()
        will = sub.expect(Publish)
        assert (will.topic, will.properties.get(P.USER_PROPERTY)) == ("up/will", [("kept", "yes")])
        sub.send(PubAck(will.packet_id or 0))
        sub.disconnect()
        pub.disconnect()
    bystander.check()


def amqp_publish(b: Harness, routing_keys: list[bytes]) -> None:
    """Publish to amq.topic over AMQP with exactly these routing key bytes."""
    with b.amqp_client() as amqp:
        amqp.send_method(1, commands.Confirm.Select())
        amqp.expect_method(commands.Confirm.SelectOk, channel=1)
        for rk in routing_keys:
            method = struct.pack(">HHH", 60, 40, 0) + b"\x09amq.topic"
            method += bytes((len(rk),)) + rk + b"\x00"
            amqp.send(raw_frame(1, 1, method) + header_frame(1, 2) + body_frame(1, b"xx"))
        acked = 0
        while acked < len(routing_keys):  # (one ack may cover several: multiple)
            acked = amqp.expect_method(commands.Basic.Ack, channel=1).delivery_tag


def test_amqp_routing_keys_that_are_no_mqtt_topic(broker: Harness) -> None:
    """A message published over AMQP whose routing key maps to no valid MQTT topic
    name ("", a wildcard, U+0000, invalid UTF-8) is not sent to MQTT clients: it
    was sent as an invalid PUBLISH that a client must treat as malformed, and for a
    persistent session again on every reconnect. (No bystander: "#" is the only
    filter "" matches.)"""
    port = mqtt_port(broker)
    bad = [b"", b"a.*", b"a.#", b"a+b", b"x\x00y", b"bad.\xff\xfe"]
    for level in (V311, MQTT_5):
        keep = {P.SESSION_EXPIRY_INTERVAL: 60} if level == MQTT_5 else {}
        with RawClient(port, level) as sub:
            sub.connect("rk-sub", clean=False, properties=keep)
            sub.subscribe("#", qos=1)
            sub.disconnect()
        amqp_publish(broker, [*bad, b"good.away"])
        for expected in (["good/away", "good/here"], ["good/here"]):
            with RawClient(port, level) as sub:
                assert sub.connect("rk-sub", clean=False, properties=keep).session_present
                amqp_publish(broker, [*bad, b"good.here"])
                got = []
                for _ in expected:
                    p = sub.expect(Publish)
                    got.append(p.topic)
                    sub.send(PubAck(p.packet_id or 0))
                assert got == expected
                sub.send(PingReq())
                sub.expect(PingResp)  # nothing else
                sub.disconnect()
        with RawClient(port, level) as sub:
            sub.connect("rk-sub", clean=True)
            sub.disconnect()
