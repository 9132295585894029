"""The sans-IO MQTT codec (src/warren/mqtt): round trips, split feeding, malformed input.

paho-mqtt is the oracle: its MQTT 5 property encoder, and a real paho Client talking over
TCP to a fake peer that decodes what paho writes and answers with Warren-encoded packets.
"""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from examples import examples
from warren.mqtt import (
    Decoder,
    MalformedPacket,
    MQTTCodecError,
    PacketTooLarge,
    ProtocolError,
    UnsupportedProtocolVersion,
    encode,
)
from warren.mqtt import properties as P
from warren.mqtt.packets import (
    Auth,
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
    SubAck,
    Subscribe,
    Subscription,
    UnsubAck,
    Unsubscribe,
    Will,
)

text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=8)
topic = st.text(st.sampled_from("ab/c"), min_size=1, max_size=8)
pid = st.integers(1, 0xFFFF)
rc = st.sampled_from([0, 0x10, 0x80, 0x87, 0x91])


def props_for(ptype: int) -> st.SearchStrategy[dict]:
    allowed = [k for k, e in P.PROPERTY_TABLE.items() if ptype in e[2]]
    if not allowed:
        return st.just({})

    def value(k: int) -> st.SearchStrategy:
        kind = P.PROPERTY_TYPES[k]
        if k == P.USER_PROPERTY:
            return st.lists(st.tuples(text, text), min_size=1, max_size=3)
        if k == P.SUBSCRIPTION_IDENTIFIER and ptype == P.PUBLISH:
            return st.lists(st.integers(1, 268_435_455), min_size=1, max_size=2)
        return {
            P.BYTE: st.integers(0, 1),
            P.TWO_BYTE_INT: st.integers(1, 0xFFFF),
            P.FOUR_BYTE_INT: st.integers(1, 0xFFFFFFFF),
            P.VARIABLE_BYTE_INT: st.integers(1, 268_435_455),
            P.UTF8_STRING: text,
            P.BINARY_DATA: st.binary(max_size=8),
        }[kind]

    return st.lists(st.sampled_from(allowed), unique=True, max_size=4).flatmap(
        lambda keys: st.fixed_dictionaries({k: value(k) for k in keys})
    )


def packets(level: int) -> st.SearchStrategy:
    v5 = level == 5

    def pr(ptype: int) -> st.SearchStrategy[dict]:
        return props_for(ptype) if v5 else st.just({})

    r = rc if v5 else st.just(0)
    will = st.builds(
        Will, topic, st.binary(max_size=8), st.integers(0, 2), st.booleans(), pr(P.WILL)
    )
    connect = st.builds(
        Connect,
        text,
        st.just(level),
        st.booleans(),
        st.integers(0, 0xFFFF),
        st.none() | text,
        st.none() | st.binary(max_size=8),
        st.none() | will,
        pr(P.CONNECT),
    ).filter(lambda c: v5 or c.password is None or c.username is not None)
    publish = st.integers(0, 2).flatmap(
        lambda q: st.builds(
            Publish,
            topic,
            st.binary(max_size=16),
            st.just(q),
            st.booleans(),
            st.booleans() if q else st.just(False),
            pid if q else st.none(),
            pr(P.PUBLISH),
        )
    )
    sub = st.builds(
        Subscription,
        topic,
        st.integers(0, 2),
        st.booleans() if v5 else st.just(False),
        st.booleans() if v5 else st.just(False),
        st.integers(0, 2) if v5 else st.just(0),
    )
    acks = [
        st.builds(cls, pid, r, pr(t))
        for cls, t in (
            (PubAck, P.PUBACK),
            (PubRec, P.PUBREC),
            (PubRel, P.PUBREL),
            (PubComp, P.PUBCOMP),
        )
    ]
    options = [
        connect,
        st.builds(ConnAck, st.booleans(), st.integers(0, 5) if not v5 else rc, pr(P.CONNACK)),
        publish,
        *acks,
        st.builds(Subscribe, pid, st.lists(sub, min_size=1, max_size=3), pr(P.SUBSCRIBE)),
        st.builds(
            SubAck, pid, st.lists(st.sampled_from([0, 1, 2, 0x80]), max_size=3), pr(P.SUBACK)
        ),
        st.builds(Unsubscribe, pid, st.lists(topic, min_size=1, max_size=3), pr(P.UNSUBSCRIBE)),
        st.builds(
            UnsubAck,
            pid,
            st.lists(st.sampled_from([0, 0x11]), max_size=3) if v5 else st.just([]),
            pr(P.UNSUBACK),
        ),
        st.just(PingReq()),
        st.just(PingResp()),
        st.builds(Disconnect, r, pr(P.DISCONNECT)),
    ]
    if v5:
        options.append(st.builds(Auth, st.sampled_from([0, 0x18, 0x19]), pr(P.AUTH)))
    return st.one_of(options)


@pytest.mark.parametrize("level", [4, 5])
def test_round_trip(level: int) -> None:
    @settings(max_examples=examples(300), deadline=None)
    @given(packets(level))
    def check(packet: object) -> None:
        data = encode(packet, level)  # type: ignore[arg-type]
        assert Decoder(level).feed(data) == [packet]

    check()


@pytest.mark.parametrize("level", [4, 5])
def test_many_packets_split_anywhere(level: int) -> None:
    @settings(max_examples=examples(60), deadline=None)
    @given(st.lists(packets(level), min_size=1, max_size=6), st.data())
    def check(batch: list, data: st.DataObject) -> None:
        wire = b"".join(encode(p, level) for p in batch)
        assert Decoder(level).feed(wire) == batch
        cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=5)))
        dec = Decoder(level)
        got: list = []
        prev = 0
        for cut in [*cuts, len(wire)]:
            got += dec.feed(wire[prev:cut])
            prev = cut
        assert got == batch

    check()


def test_byte_at_a_time() -> None:
    batch = [
        Connect("c", 5, properties={P.USER_PROPERTY: [("a", "b"), ("a", "c")]}),
        Publish("a/b", b"x" * 200, 1, packet_id=7, properties={P.SUBSCRIPTION_IDENTIFIER: [1, 2]}),
        PingReq(),
    ]
    wire = b"".join(encode(p, 5) for p in batch)
    dec = Decoder()
    got = [p for i in range(len(wire)) for p in dec.feed(wire[i : i + 1])]
    assert got == batch
    assert dec.level == 5


@settings(max_examples=examples(300), deadline=None)
@given(st.sampled_from([None, 4, 5]), st.binary(max_size=64))
def test_fuzz_raises_only_codec_errors(level: int | None, data: bytes) -> None:
    with contextlib.suppress(MQTTCodecError):
        Decoder(level).feed(data)


def _err(data: bytes, level: int | None = 5, **kw: int) -> MQTTCodecError:
    with pytest.raises(MQTTCodecError) as info:
        Decoder(level, **kw).feed(data)
    return info.value


@pytest.mark.parametrize(
    ("data", "cls", "code"),
    [
        (b"\x30\xff\xff\xff\xff\x01", MalformedPacket, 0x81),  # remaining length > 4 bytes
        (b"\x82\x05\x00\x01\x00\x01a", MalformedPacket, 0x81),  # truncated SUBSCRIBE option
        (b"\x80\x03\x00\x01\x00", MalformedPacket, 0x81),  # SUBSCRIBE flags 0
        (b"\xa0\x05\x00\x01\x00\x00\x00", MalformedPacket, 0x81),  # UNSUBSCRIBE flags 0
        (b"\x60\x02\x00\x01", MalformedPacket, 0x81),  # PUBREL flags 0
        (b"\x36\x05\x00\x01a\x00\x01", MalformedPacket, 0x81),  # QoS 3
        (b"\x30\x04\x00\x01+\x00", MalformedPacket, 0x81),  # wildcard topic
        (b"\x30\x04\x00\x01#\x00", MalformedPacket, 0x81),
        (b"\x30\x04\x00\x01\xff\x00", MalformedPacket, 0x81),  # invalid UTF-8
        (b"\x30\x04\x00\x01\x00\x00", MalformedPacket, 0x81),  # U+0000
        (b"\x82\x03\x00\x01\x00", ProtocolError, 0x82),  # empty subscription list
        (b"\xa2\x03\x00\x01\x00", ProtocolError, 0x82),  # empty unsubscribe list
        (b"\x30\x08\x00\x01a\x04\x01\x01\x01\x01", ProtocolError, 0x82),  # duplicate PFI
        (b"\x30\x07\x00\x01a\x02\x21\x00\x01", ProtocolError, 0x82),  # Receive Max in PUBLISH
        (b"\x30\x06\x00\x01a\x02\x01\x02", ProtocolError, 0x82),  # PFI 2
        (b"\x30\x06\x00\x01a\x02\x7f\x00", MalformedPacket, 0x81),  # unknown property
        (b"\x30\x03\x00\x00\x00", ProtocolError, 0x82),  # empty topic without alias
        (b"\x00\x00", MalformedPacket, 0x81),  # reserved type 0
    ],
)
def test_malformed(data: bytes, cls: type, code: int) -> None:
    err = _err(data)
    assert type(err) is cls
    assert err.reason_code == code
    assert str(err)


def test_other_limits() -> None:
    assert _err(encode(Publish("a", b"x" * 100)), max_packet_size=50).reason_code == 0x95
    assert isinstance(_err(b"\x30\xff\xff\x7f", max_packet_size=1000), PacketTooLarge)
    assert _err(b"\xf0\x00", 4).reason_code == 0x81  # AUTH in 3.1.1
    assert _err(b"\xc0\x00", None).reason_code == 0x82  # first packet not CONNECT
    connect3 = bytes.fromhex("100c00044d5154540302003c0000")
    assert isinstance(_err(connect3, None), UnsupportedProtocolVersion)
    assert _err(b"\x82\x06\x00\x01\x00\x01a\x03", 4).reason_code == 0x81  # sub QoS 3
    assert _err(b"\x82\x07\x00\x01\x00\x00\x01a\x30", 5).reason_code == 0x82  # retain handling 3


def test_properties_match_paho() -> None:
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    paho = Properties(PacketTypes.PUBLISH)
    paho.PayloadFormatIndicator = 1
    paho.MessageExpiryInterval = 30
    paho.ContentType = "text/plain"
    paho.ResponseTopic = "r/t"
    paho.CorrelationData = b"\x01\x02"
    paho.UserProperty = [("k", "v"), ("k", "w")]
    ours = {
        P.PAYLOAD_FORMAT_INDICATOR: 1,
        P.MESSAGE_EXPIRY_INTERVAL: 30,
        P.CONTENT_TYPE: "text/plain",
        P.RESPONSE_TOPIC: "r/t",
        P.CORRELATION_DATA: b"\x01\x02",
        P.USER_PROPERTY: [("k", "v"), ("k", "w")],
    }
    wire = paho.pack()
    packet = b"\x30" + bytes((3 + len(wire) + 2,)) + b"\x00\x01a" + wire + b"hi"
    [got] = Decoder(5).feed(packet)
    assert got == Publish("a", b"hi", properties=ours)
    assert encode(got, 5) == packet


def test_topic_helpers() -> None:
    from warren.mqtt.topics import (
        amqp_to_mqtt,
        is_valid_topic_filter,
        is_valid_topic_name,
        mqtt_to_amqp,
        parse_shared,
    )

    assert is_valid_topic_name("a/b") and is_valid_topic_name("/")
    assert not is_valid_topic_name("a/+") and not is_valid_topic_name("#")
    assert not is_valid_topic_name("") and not is_valid_topic_name("a\x00")
    for good in ["#", "+", "a/#", "+/+/c", "a//b", "/#", "$share/g/a/+", "$share/g/#"]:
        assert is_valid_topic_filter(good), good
    for bad in ["a#", "a/#/b", "a+", "a/b+/c", "", "$share/g", "$share//a", "$share/g+/a"]:
        assert not is_valid_topic_filter(bad), bad
    assert parse_shared("$share/grp/a/b") == ("grp", "a/b")
    assert parse_shared("a/b") == (None, "a/b")
    with pytest.raises(ValueError):
        parse_shared("$share/grp/")
    assert mqtt_to_amqp("a/+/c/#") == "a.*.c.#"
    assert amqp_to_mqtt("a.b.c") == "a/b/c"
    assert amqp_to_mqtt(mqtt_to_amqp("home/+/temp")) == "home/+/temp"


def _paho_session(protocol: int) -> None:
    import socket

    import paho.mqtt.client as mqtt
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    level = 5 if protocol == mqtt.MQTTv5 else 4
    seen: dict[str, object] = {}
    server = socket.create_server(("127.0.0.1", 0))
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="cid", protocol=protocol)
    client.username_pw_set("user", "pw")
    client.will_set("w/t", b"bye", qos=1, retain=True)
    client.on_connect = lambda c, u, f, rc, p: seen.__setitem__(
        "connect", (f.session_present, rc.value)
    )
    client.on_subscribe = lambda c, u, mid, rcs, p: seen.__setitem__(
        "subscribe", [r.value for r in rcs]
    )
    client.on_message = lambda c, u, m: seen.__setitem__("message", m)
    conn_props = None
    if level == 5:
        conn_props = Properties(PacketTypes.CONNECT)
        conn_props.SessionExpiryInterval = 60
        conn_props.UserProperty = [("a", "1"), ("a", "2")]
    client.connect("127.0.0.1", server.getsockname()[1], keepalive=30, properties=conn_props)
    peer, _ = server.accept()
    peer.settimeout(2)
    decoder = Decoder()

    def read_one() -> object:
        while True:
            got = decoder.feed(peer.recv(65536))
            if got:
                assert len(got) == 1
                return got[0]

    try:
        connect = read_one()
        assert isinstance(connect, Connect)
        assert (connect.client_id, connect.protocol_level, connect.keep_alive) == ("cid", level, 30)
        assert (connect.username, connect.password) == ("user", b"pw")
        assert connect.will == Will("w/t", b"bye", 1, True)
        if level == 5:
            assert connect.properties == {
                P.SESSION_EXPIRY_INTERVAL: 60,
                P.USER_PROPERTY: [("a", "1"), ("a", "2")],
            }
        peer.sendall(encode(ConnAck(True, 0), level))
        client.loop(0.5)
        assert seen["connect"] == (True, 0)

        client.subscribe([("s/+", 1), ("s/#", 2)])
        sub = read_one()
        assert isinstance(sub, Subscribe)
        assert [(s.topic_filter, s.qos) for s in sub.subscriptions] == [("s/+", 1), ("s/#", 2)]
        peer.sendall(encode(SubAck(sub.packet_id, [1, 0x80]), level))
        client.loop(0.5)
        assert seen["subscribe"] == [1, 0x80]

        pub_props = None
        if level == 5:
            pub_props = Properties(PacketTypes.PUBLISH)
            pub_props.ContentType = "text/plain"
            pub_props.CorrelationData = b"corr"
        for qos in (0, 1, 2):
            client.publish("p/t", b"payload%d" % qos, qos=qos, properties=pub_props)
            pub = read_one()
            assert isinstance(pub, Publish)
            assert (pub.topic, pub.payload, pub.qos) == ("p/t", b"payload%d" % qos, qos)
            if level == 5:
                assert pub.properties == {P.CONTENT_TYPE: "text/plain", P.CORRELATION_DATA: b"corr"}
            if qos == 2:
                assert pub.packet_id is not None
                peer.sendall(encode(PubRec(pub.packet_id), level))
                client.loop(0.5)
                assert read_one() == PubRel(pub.packet_id)

        props = (
            {P.USER_PROPERTY: [("k", "v")], P.SUBSCRIPTION_IDENTIFIER: [3]} if level == 5 else {}
        )
        peer.sendall(encode(Publish("s/x", b"hello", 0, properties=props), level))
        client.loop(0.5)
        message = seen["message"]
        assert message.topic == "s/x" and message.payload == b"hello"  # type: ignore[attr-defined]
        if level == 5:
            assert message.properties.UserProperty == [("k", "v")]  # type: ignore[attr-defined]
            assert message.properties.SubscriptionIdentifier == [3]  # type: ignore[attr-defined]

        client.unsubscribe("s/+")
        unsub = read_one()
        assert isinstance(unsub, Unsubscribe) and unsub.topic_filters == ["s/+"]
        client._send_pingreq()
        assert read_one() == PingReq()
        client.disconnect()
        assert read_one() == Disconnect()
    finally:
        peer.close()
        server.close()
        sock = client.socket()
        if sock is not None:
            sock.close()


def test_paho_client_v311() -> None:
    import paho.mqtt.client as mqtt

    _paho_session(mqtt.MQTTv311)


def test_paho_client_v5() -> None:
    import paho.mqtt.client as mqtt

    _paho_session(mqtt.MQTTv5)


@pytest.mark.parametrize("level", [4, 5])
def test_fuzz_mutated_valid_packets(level: int) -> None:
    @settings(max_examples=examples(200), deadline=None)
    @given(packets(level), st.data())
    def check(packet: object, data: st.DataObject) -> None:
        wire = bytearray(encode(packet, level))  # type: ignore[arg-type]
        for _ in range(data.draw(st.integers(1, 3))):
            i = data.draw(st.integers(0, len(wire) - 1))
            wire[i] = data.draw(st.integers(0, 255))
        with contextlib.suppress(MQTTCodecError):
            Decoder(level).feed(bytes(wire))

    check()
