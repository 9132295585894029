"""AMQP 1.0 message <-> the core's message (src/warren/amqp1/mapping.py), row by row of
docs/amqp1.md's "Message mapping" (RabbitMQ 4's conversions), and round trips.

The 0-9-1 side is read with the core's own decoder (core/properties.py) and the
headers' type tags from the table's bytes; the 1.0 side is encoded and decoded by
python-qpid-proton where it meets a client.
"""

from __future__ import annotations

import datetime
import math
import struct
import uuid
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warren.amqp1.mapping import AMQP10_TYPE, for_delivery, from_core, to_core
from warren.amqp1.message import (
    AmqpMessage,
    AmqpSequence,
    AmqpValue,
    ApplicationProperties,
    Data,
    Footer,
    Header,
    MessageAnnotations,
    Properties,
    decode_message,
    encode_message,
    encode_sections,
)
from warren.amqp1.types import (
    Array,
    Byte,
    Char,
    Decimal32,
    Described,
    Float,
    Int,
    Long,
    Short,
    Symbol,
    Timestamp,
    UByte,
    UInt,
    ULong,
    UShort,
)
from warren.core.properties import (
    BasicProperties,
    decode_properties,
    headers_offset,
    validate_properties,
)
from warren.core.table_edit import table_entries
from warren.core.table_tags import ArgumentTable, encode_arguments

proton = pytest.importorskip("proton")

_UTC = datetime.UTC
UUID = uuid.UUID("550e8400-e29b-41d4-a716-446655440000")
URN = "urn:uuid:550e8400-e29b-41d4-a716-446655440000"


def core(msg: AmqpMessage) -> tuple[BasicProperties, bytes]:
    """to_core's properties decoded (after the publisher's check every 0-9-1
    property list passes) and its body."""
    raw, body = to_core(msg)
    validate_properties(raw)
    return decode_properties(raw), body


def tags(raw: bytes) -> dict[str, str]:
    """The type tag of each top-level header, from the table's bytes."""
    offset = headers_offset(raw)
    if offset is None:
        return {}
    entries, _ = table_entries(raw, offset)
    return {key: chr(raw[start + 1 + raw[start]]) for key, start, _ in entries}


def data_message(**sections: Any) -> AmqpMessage:
    return AmqpMessage(body=[Data(b"body")], **sections)


def with_props(**fields: Any) -> AmqpMessage:
    return data_message(properties=Properties(**fields))


def props_with_headers(table: dict[str, Any], tag_of: dict[str, int], **fields: Any) -> bytes:
    """0-9-1 properties whose headers have the given type tags (the way pamqp or
    a Java client picks them), the other properties as ``fields``."""
    headers = encode_arguments(ArgumentTable(table, tag_of))
    raw = BasicProperties(**fields).encode()
    flags = raw[0] << 8 | raw[1]
    pos = 2
    for bit in (15, 14):  # content_type, content_encoding come first
        if flags & 1 << bit:
            pos += 1 + raw[pos]
    flags |= 1 << 13
    return struct.pack(">H", flags) + raw[2:pos] + headers + raw[pos:]


# -- AMQP 1.0 -> 0-9-1 -----------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "annotations", "mode"),
    [
        (Header(durable=True), None, 2),
        (Header(durable=False), None, 1),
        (Header(), None, None),
        (None, None, None),
        (None, {"x-basic-delivery-mode": UByte(2)}, 2),
        (Header(durable=False), {"x-basic-delivery-mode": UByte(2)}, 1),
    ],
)
def test_durable_is_delivery_mode(
    header: Header | None, annotations: dict[str, Any] | None, mode: int | None
) -> None:
    ma = MessageAnnotations(annotations) if annotations else None
    props, _ = core(data_message(header=header, message_annotations=ma))
    assert props.delivery_mode == mode
    assert props.headers is None  # x-basic-* annotations are RabbitMQ's own


def test_priority_and_ttl() -> None:
    props, _ = core(data_message(header=Header(priority=9, ttl=60_000)))
    assert (props.priority, props.expiration) == (9, "60000")
    ma = MessageAnnotations({"x-basic-priority": UByte(3), "x-basic-expiration": "5"})
    props, _ = core(data_message(message_annotations=ma))
    assert (props.priority, props.expiration) == (3, "5")
    ma = MessageAnnotations({"x-basic-priority": True, "x-basic-expiration": "-5"})
    props, _ = core(data_message(message_annotations=ma))
    assert (props.priority, props.expiration) == (None, None)


@pytest.mark.parametrize(
    ("field", "prop", "header"),
    [
        ("message_id", "message_id", "x-message-id"),
        ("correlation_id", "correlation_id", "x-correlation-id"),
    ],
)
def test_message_and_correlation_ids(field: str, prop: str, header: str) -> None:
    cases: list[tuple[Any, Any, Any, str | None]] = [
        ("id-1", "id-1", None, None),
        ("é" * 127, "é" * 127, None, None),  # 254 bytes: still a shortstr
        ("a" * 256, None, "a" * 256, "S"),
        (UUID, URN, None, None),
        (ULong(42), "42", None, None),
        (b"\x00\xffbin", None, b"\x00\xffbin", "x"),
    ]
    for value, expected, in_header, tag in cases:
        raw, _ = to_core(with_props(**{field: value}))
        props = decode_properties(raw)
        assert getattr(props, prop) == expected, value
        assert (props.headers or {}).get(header) == in_header
        assert tags(raw).get(header) == tag


@pytest.mark.parametrize(
    ("user_id", "expected"),
    [
        (b"guest", "guest"),
        (b"\xff", None),
        (b"a\x00b", None),
        (b"a" * 256, None),
        (b"a" * 255, "a" * 255),
    ],
)
def test_user_id(user_id: bytes, expected: str | None) -> None:
    assert core(with_props(user_id=user_id))[0].user_id == expected


@pytest.mark.parametrize(
    ("reply_to", "expected"),
    [
        ("/queues/replies", "replies"),
        ("/queues/a%2Fb%20c", "a/b c"),
        ("/queues/%C3%A9", "é"),
        ("/queues/bad%2", None),
        ("/queues/%FF", None),
        ("/exchanges/amq.topic/rk", "/exchanges/amq.topic/rk"),
        ("plain-queue", "plain-queue"),
        ("/queues/" + "a" * 250, None),
    ],
)
def test_reply_to(reply_to: str, expected: str | None) -> None:
    assert core(with_props(reply_to=reply_to))[0].reply_to == expected


def test_the_other_properties() -> None:
    props, _ = core(
        with_props(
            to="/queues/q",
            subject="subj",
            content_type="application/json",
            content_encoding="gzip",
            absolute_expiry_time=9_999_999,
            creation_time=1_700_000_000_999,
            group_id="group",
            group_sequence=3,
            reply_to_group_id="rg",
        )
    )
    assert props == BasicProperties(
        content_type="application/json",
        content_encoding="gzip",
        timestamp=1_700_000_000,
        app_id="group",
    )


def test_negative_and_far_creation_times_are_left_out() -> None:
    assert core(with_props(creation_time=-1))[0].timestamp is None
    assert core(with_props(creation_time=(253_402_300_799 + 1) * 1000))[0].timestamp is None


_AP_TYPES: list[tuple[Any, str, Any]] = [
    ("text", "S", "text"),
    (Symbol("sym"), "S", "sym"),
    (b"\xff\x01", "S", b"\xff\x01"),  # RabbitMQ 4 sends a binary as a longstr
    (b"utf8", "S", "utf8"),
    (True, "t", True),
    (None, "V", None),
    (Byte(-3), "b", -3),
    (UByte(200), "B", 200),
    (Short(-300), "s", -300),
    (UShort(60_000), "u", 60_000),
    (Int(-70_000), "I", -70_000),
    (UInt(4_000_000_000), "i", 4_000_000_000),
    (Long(-(2**40)), "l", -(2**40)),
    (7, "l", 7),
    (ULong(2**62), "l", 2**62),
    (1.5, "d", 1.5),
    (Float(0.25), "f", 0.25),
    (Timestamp(1_700_000_000_500), "T", datetime.datetime.fromtimestamp(1_700_000_000, _UTC)),
    ([1, "a"], "A", [1, "a"]),
    ({"k": UInt(1)}, "F", {"k": 1}),
    (Array(0x70, (UInt(1), UInt(2))), "A", [1, 2]),
]


@pytest.mark.parametrize(("value", "tag", "decoded"), _AP_TYPES)
def test_application_property_types(value: Any, tag: str, decoded: Any) -> None:
    raw, _ = to_core(data_message(application_properties=ApplicationProperties({"p": value})))
    validate_properties(raw)
    assert tags(raw) == {"p": tag}
    assert decode_properties(raw).headers == {"p": decoded}


@pytest.mark.parametrize(
    "value",
    [
        uuid.uuid4(),
        Char("c"),
        Decimal32(b"\x00" * 4),
        Described(Symbol("d"), 1),
        ULong(2**63),
        math.nan,
        Timestamp(-1000),
    ],
)
def test_values_without_a_conversion_are_left_out(value: Any) -> None:
    ap = ApplicationProperties({"p": value, "q": 1})
    assert core(data_message(application_properties=ap))[0].headers == {"q": 1}


def test_long_keys_are_left_out() -> None:
    ap = ApplicationProperties({"k" * 256: 1, "k" * 255: 2})
    assert core(data_message(application_properties=ap))[0].headers == {"k" * 255: 2}


def test_message_annotations_to_headers() -> None:
    ma = MessageAnnotations(
        {
            Symbol("x-custom"): UInt(5),
            Symbol("x-stream-offset"): Long(10),
            Symbol("not-x"): 1,
            Symbol("x-exchange"): "ex",
            Symbol("x-routing-key"): "rk",
            Symbol("x-death"): "ignored",
            Symbol("x-basic-type"): "t",
            Symbol("x-cc"): ["a", "b"],
            Symbol("x-opt-rabbitmq-received-time"): Timestamp(1_700_000_000_123),
            ULong(7): "a ulong key",
        }
    )
    raw, _ = to_core(data_message(message_annotations=ma))
    props = decode_properties(raw)
    assert props.headers == {
        "x-custom": 5,
        "x-stream-offset": 10,
        "CC": ["a", "b"],
        "timestamp_in_ms": 1_700_000_000_123,
    }
    assert tags(raw) == {"x-custom": "i", "x-stream-offset": "l", "CC": "A", "timestamp_in_ms": "l"}
    assert props.type == "t"


def test_an_annotation_wins_over_an_application_property() -> None:
    msg = data_message(
        message_annotations=MessageAnnotations({"x-k": "annotation"}),
        application_properties=ApplicationProperties({"x-k": "property"}),
    )
    assert core(msg)[0].headers == {"x-k": "annotation"}


def _death(**extra: Any) -> dict[Any, Any]:
    return {
        Symbol("queue"): "q",
        Symbol("reason"): Symbol("expired"),
        Symbol("count"): ULong(2),
        Symbol("first-time"): Timestamp(1_700_000_000_000),
        Symbol("last-time"): Timestamp(1_700_000_100_000),
        Symbol("exchange"): "ex",
        Symbol("routing-keys"): Array(0xA1, ("rk",)),
        **extra,
    }


def test_x_opt_deaths_is_x_death() -> None:
    deaths = Array(0xC1, (_death(**{Symbol("ttl"): UInt(500)}),))
    ma = MessageAnnotations({"x-opt-deaths": deaths, "x-first-death-queue": "q"})
    props, _ = core(data_message(message_annotations=ma))
    assert props.headers == {
        "x-death": [
            {
                "count": 2,
                "exchange": "ex",
                "original-expiration": "500",
                "queue": "q",
                "reason": "expired",
                "routing-keys": ["rk"],
                "time": datetime.datetime.fromtimestamp(1_700_000_000, _UTC),
            }
        ],
        "x-first-death-queue": "q",
    }
    broken = MessageAnnotations({"x-opt-deaths": Array(0xC1, ({Symbol("queue"): "q"},))})
    assert core(data_message(message_annotations=broken))[0].headers is None


def test_data_bodies() -> None:
    assert core(data_message())[1] == b"body"
    msg = AmqpMessage(body=[Data(b"a"), Data(b"b")], footer=Footer({"x-h": 1}))
    props, body = core(msg)
    assert (body, props.type) == (b"ab", None)


@pytest.mark.parametrize(
    "body",
    [[AmqpValue({"k": [1, 2]})], [AmqpValue("text")], [AmqpSequence([1]), AmqpSequence(["a"])]],
)
def test_other_bodies_are_kept_encoded(body: list[Any]) -> None:
    msg = AmqpMessage(body=body, footer=Footer({"x-sig": b"s"}))
    props, raw_body = core(msg)
    assert props.type == AMQP10_TYPE
    assert raw_body == encode_sections([*body, Footer({"x-sig": b"s"})])
    # as received, when the message was decoded
    decoded = decode_message(encode_message(msg))
    assert to_core(decoded)[1] == raw_body


def test_a_plain_message_takes_a_precomputed_encoding() -> None:
    a = to_core(AmqpMessage(header=Header(durable=True), body=[Data(b"x")]))
    b = to_core(AmqpMessage(header=Header(durable=True), body=[Data(b"y")]))
    assert a[0] is b[0]
    assert decode_properties(a[0]) == BasicProperties(delivery_mode=2)
    assert to_core(AmqpMessage(body=[Data(b"")]))[0] == b"\x00\x00"


def test_an_mqtt_consumer_of_a_1_0_message() -> None:
    """What an MQTT 5 subscriber gets (mqtt/mapping.py reads the core's format)."""
    from warren.core.message import Message
    from warren.mqtt import properties as P
    from warren.mqtt.mapping import from_message

    msg = data_message(
        header=Header(durable=True),
        properties=Properties(correlation_id=b"\x01\x02", content_type="text/plain"),
        application_properties=ApplicationProperties({"k": "v", "n": UInt(3)}),
    )
    raw, body = to_core(msg)
    out = from_message(Message("amq.topic", "a.b", raw, body, timestamp=0))
    assert out.qos == 1
    assert out.properties is not None
    assert out.properties[P.CORRELATION_DATA] == b"\x01\x02"
    assert out.properties[P.CONTENT_TYPE] == "text/plain"
    assert out.properties[P.USER_PROPERTY] == [("k", "v"), ("n", "3")]


# -- 0-9-1 -> AMQP 1.0 -----------------------------------------------------------


def test_basic_properties_to_amqp1() -> None:
    raw = BasicProperties(
        content_type="text/plain",
        content_encoding="utf-8",
        delivery_mode=2,
        priority=5,
        correlation_id=URN,
        reply_to="my/replies",
        expiration="1500",
        message_id="m-1",
        timestamp=1_700_000_000,
        type="greeting",
        user_id="guest",
        app_id="app",
        cluster_id="dropped",
    ).encode()
    msg = from_core(raw, b"payload")
    assert msg.header == Header(durable=True, priority=5, ttl=1500)
    assert msg.properties == Properties(
        message_id="m-1",
        user_id=b"guest",
        reply_to="/queues/my%2Freplies",
        correlation_id=UUID,
        content_type="text/plain",
        content_encoding="utf-8",
        creation_time=1_700_000_000_000,
        group_id="app",
    )
    assert isinstance(msg.properties.content_type, Symbol)  # type: ignore[union-attr]
    assert msg.message_annotations == MessageAnnotations({"x-basic-type": "greeting"})
    assert msg.application_properties is None
    assert msg.body == [Data(b"payload")]


@pytest.mark.parametrize(
    ("fields", "header"),
    [
        ({}, Header(durable=False)),
        ({"delivery_mode": 1}, Header(durable=False)),
        ({"expiration": "junk"}, Header(durable=False)),
        ({"expiration": str(2**32)}, Header(durable=False)),
        ({"expiration": "0"}, Header(durable=False, ttl=0)),
    ],
)
def test_header_from_core(fields: dict[str, Any], header: Header) -> None:
    msg = from_core(BasicProperties(**fields).encode(), b"")
    assert msg.header == header
    assert msg.properties is None


def test_header_types_to_amqp1() -> None:
    table = {
        "b": -1, "B": 255, "s": -2, "u": 65535, "I": -3, "i": 2**32 - 1, "l": 2**40,
        "d": 2.5, "t": False, "S": "text", "S-bin": b"\xff", "S-nul": "a\x00b",
        "x": b"bytes", "T": datetime.datetime.fromtimestamp(1_700_000_000, _UTC), "V": None,
        "D": __import__("decimal").Decimal("1.5"), "A": [1, "a"], "F": {"k": 1},
        "x-A": [UInt(1), [2]], "x-F": {"k": "v"}, "x-i": 7,
    }  # fmt: skip
    tag_of = {k: ord(k[0]) for k in table}
    tag_of.update(
        {"S-bin": ord("S"), "S-nul": ord("S"), "x-i": ord("i"), "x-A": ord("A"), "x-F": ord("F")}
    )
    raw = props_with_headers(table, tag_of)
    msg = from_core(raw, b"")
    assert msg.application_properties is not None and msg.message_annotations is not None
    ap = msg.application_properties.content
    expected: dict[str, tuple[type, Any]] = {
        "b": (Byte, -1), "B": (UByte, 255), "s": (Short, -2), "u": (UShort, 65535),
        "I": (Int, -3), "i": (UInt, 2**32 - 1), "l": (Long, 2**40),
        "d": (float, 2.5), "t": (bool, False), "S": (str, "text"), "S-bin": (bytes, b"\xff"),
        "S-nul": (bytes, b"a\x00b"), "x": (bytes, b"bytes"),
        "T": (Timestamp, 1_700_000_000_000), "V": (type(None), None),
    }  # fmt: skip
    assert set(ap) == set(expected)  # no decimal; arrays and tables are not properties
    for key, (kind, value) in expected.items():
        assert type(ap[key]) is kind and ap[key] == value, key
    ma = msg.message_annotations.content
    assert ma == {"x-A": [1, [2]], "x-F": {"k": "v"}, "x-i": 7}
    assert all(type(k) is Symbol for k in ma) and type(ma["x-i"]) is UInt
    assert type(next(iter(ma["x-F"]))) is Symbol  # table keys become symbols


def test_a_float_header_stays_a_float() -> None:
    entry = b"\x01ff" + struct.pack(">f", 0.5)
    raw = b"\x20\x00" + struct.pack(">I", len(entry)) + entry
    value = from_core(raw, b"").application_properties.content["f"]  # type: ignore[union-attr]
    assert type(value) is Float and value == 0.5


def test_what_a_symbol_cannot_carry_is_left_out() -> None:
    """1.0 symbols are ASCII: a 0-9-1 content type, x- header name or table key that
    is not has no place as one."""
    raw = props_with_headers({"x-é": 1, "x-t": {"é": 1, "k": 2}}, {}, content_type="tëxt")
    msg = from_core(raw, b"")
    assert msg.properties is None
    assert msg.message_annotations == MessageAnnotations({"x-t": {"é": 1, "k": 2}})
    keys = list(msg.message_annotations.content["x-t"])
    assert [type(k) for k in keys] == [str, Symbol]


def test_cc_and_x_death_to_amqp1() -> None:
    death = {
        "count": 3,
        "reason": "rejected",
        "queue": "q",
        "time": datetime.datetime.fromtimestamp(1_700_000_000, _UTC),
        "exchange": "",
        "routing-keys": ["q"],
        "original-expiration": "100",
    }
    raw = BasicProperties(
        headers={"CC": ["a"], "x-death": [death], "x-first-death-reason": "rejected"}
    ).encode()
    msg = from_core(raw, b"")
    ma = msg.message_annotations.content  # type: ignore[union-attr]
    assert ma["x-cc"] == ["a"] and ma["x-first-death-reason"] == "rejected"
    (entry,) = ma["x-opt-deaths"].items
    assert entry == {
        "ttl": 100,
        "queue": "q",
        "reason": "rejected",
        "count": 3,
        "first-time": 1_700_000_000_000,
        "last-time": 1_700_000_000_000,
        "exchange": "",
        "routing-keys": Array(0xA1, ("q",)),
    }
    assert type(entry["reason"]) is Symbol and type(entry["count"]) is ULong
    assert "x-death" not in ma and msg.application_properties is None
    # and back: x-opt-deaths -> x-death
    back = decode_properties(to_core(msg)[0]).headers
    assert back is not None and back["x-death"] == [death] and back["CC"] == ["a"]


def test_an_amqp10_body_is_decoded_back() -> None:
    original = AmqpMessage(body=[AmqpValue([1, "two"])], footer=Footer({"x-f": 1}))
    raw, body = to_core(original)
    msg = from_core(raw, body)
    assert msg.body == [AmqpValue([1, "two"])]
    assert msg.footer == Footer({"x-f": 1})
    assert msg.message_annotations is None
    junk = BasicProperties(type=AMQP10_TYPE).encode()
    msg = from_core(junk, b"not sections")
    assert msg.body == [Data(b"not sections")]
    assert msg.message_annotations == MessageAnnotations({"x-basic-type": AMQP10_TYPE})


def test_a_mqtt_publish_to_amqp1() -> None:
    """An MQTT 5 PUBLISH in the core's format (mqtt/mapping.py) as a 1.0 consumer sees it."""
    from warren.mqtt import properties as P
    from warren.mqtt.mapping import to_properties

    raw = to_properties(
        1, False, False, {P.CONTENT_TYPE: "text/plain", P.USER_PROPERTY: [("k", "v")]}
    )
    msg = from_core(raw, b"hi")
    assert msg.header == Header(durable=True)
    assert msg.properties == Properties(content_type="text/plain")
    assert msg.application_properties == ApplicationProperties({"k": "v"})
    assert msg.message_annotations is not None
    assert msg.message_annotations.content["x-mqtt-publish-qos"] == 1


# -- deliveries to 1.0 consumers -------------------------------------------------


def test_for_delivery_as_proton_reads_it() -> None:
    msg = from_core(BasicProperties(delivery_mode=2, headers={"x-h": 1}).encode(), b"abc")
    pm = proton.Message()
    pm.decode(for_delivery(msg, "amq.direct", "key"))
    assert (pm.durable, pm.first_acquirer, pm.delivery_count) == (True, True, 0)
    assert pm.annotations == {"x-exchange": "amq.direct", "x-routing-key": "key", "x-h": 1}
    assert bytes(pm.body) == b"abc"
    pm.decode(for_delivery(msg, "", "q", delivery_count=2, redelivered=True))
    assert (pm.first_acquirer, pm.delivery_count) == (False, 2)


def test_for_delivery_keeps_the_bare_message() -> None:
    pm = proton.Message(body=b"x", inferred=True, id="i", properties={"p": 1}, durable=True)
    pm.instructions = {proton.symbol("x-next-hop-only"): 1}
    pm.annotations = {proton.symbol("x-exchange"): "spoofed", proton.symbol("x-a"): 1}
    msg = decode_message(pm.encode())
    out = for_delivery(msg, "ex", "rk", delivery_count=1)
    assert out.endswith(msg.bare)
    again = decode_message(out)
    assert again.delivery_annotations is None
    assert again.message_annotations == MessageAnnotations(
        {"x-exchange": "ex", "x-routing-key": "rk", "x-a": 1}
    )
    assert again.header == Header(durable=True, first_acquirer=False, delivery_count=1)


def test_a_converted_message_is_encoded_once() -> None:
    msg = from_core(BasicProperties(message_id="m").encode(), b"abc")
    first = for_delivery(msg, "e", "k")
    assert msg.raw is not None
    kept = msg.raw
    assert for_delivery(msg, "e", "k") == first and msg.raw is kept
    assert decode_message(first).bare == kept


@pytest.mark.parametrize(
    ("header", "error"),
    [
        (Header(priority=256), "ubyte"),
        (Header(ttl=-1), "uint"),
        (Header(delivery_count=2**32), "uint"),
    ],
)
def test_header_values_out_of_range(header: Header, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        encode_message(AmqpMessage(header=header, body=[Data(b"")]))


def test_a_dead_lettered_message_is_not_first_acquired() -> None:
    death = {"count": 1, "reason": "expired", "queue": "q", "exchange": "", "routing-keys": ["q"],
             "time": datetime.datetime.fromtimestamp(1_700_000_000, _UTC)}  # fmt: skip
    msg = from_core(BasicProperties(headers={"x-death": [death]}).encode(), b"")
    assert decode_message(for_delivery(msg, "", "q")).header.first_acquirer is False  # type: ignore[union-attr]


# -- round trips -----------------------------------------------------------------

_key_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
_short = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
_ints = st.one_of(
    st.builds(Byte, st.integers(-128, 127)),
    st.builds(UByte, st.integers(0, 255)),
    st.builds(Short, st.integers(-(2**15), 2**15 - 1)),
    st.builds(UShort, st.integers(0, 2**16 - 1)),
    st.builds(Int, st.integers(-(2**31), 2**31 - 1)),
    st.builds(UInt, st.integers(0, 2**32 - 1)),
    st.builds(Long, st.integers(-(2**63), 2**63 - 1)),
)
_kept_values = st.one_of(
    st.none(),
    st.booleans(),
    _ints,
    st.floats(allow_nan=False, allow_infinity=False),
    st.builds(Float, st.floats(width=32, allow_nan=False, allow_infinity=False)),
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=30),
    st.builds(lambda s: Timestamp(s * 1000), st.integers(0, 253_402_300_799)),
)
_ids = st.one_of(st.none(), st.uuids(), _short.filter(lambda s: not s.startswith("urn:uuid:")))
_queue_names = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)


@st.composite
def _kept_messages(draw: st.DrawFn) -> AmqpMessage:
    """AMQP 1.0 messages made only of what a 0-9-1 message can carry."""
    durable = draw(st.booleans())
    header = Header(durable=durable, priority=draw(st.one_of(st.none(), st.integers(0, 255))),
                    ttl=draw(st.one_of(st.none(), st.integers(0, 2**32 - 1))))  # fmt: skip
    reply = draw(st.one_of(st.none(), _queue_names))
    props = Properties(
        message_id=draw(_ids),
        correlation_id=draw(_ids),
        user_id=draw(
            st.one_of(st.none(), _short.filter(lambda s: "\x00" not in s).map(str.encode))
        ),
        reply_to=None if reply is None else "/queues/" + quote(reply, safe=""),
        content_type=draw(
            st.one_of(st.none(), st.text(st.characters(max_codepoint=127), max_size=20))
        ),
        content_encoding=draw(
            st.one_of(st.none(), st.text(st.characters(max_codepoint=127), max_size=20))
        ),
        creation_time=draw(
            st.one_of(st.none(), st.integers(0, 253_402_300_799).map(lambda s: s * 1000))
        ),
        group_id=draw(st.one_of(st.none(), _short)),
    )
    ap = draw(
        st.dictionaries(
            _key_text.filter(lambda k: not k.startswith("x-") and k != "CC"),
            _kept_values,
            max_size=5,
        )
    )
    ma_keys = st.builds(
        lambda s: Symbol("x-" + s), st.text(st.characters(max_codepoint=127), max_size=10)
    ).filter(
        lambda k: (
            k
            not in (
                "x-exchange",
                "x-routing-key",
                "x-death",
                "x-cc",
                "x-message-id",
                "x-correlation-id",
            )
            and not k.startswith(("x-basic-", "x-opt-"))
        )
    )
    ma = draw(
        st.dictionaries(
            ma_keys, st.one_of(_kept_values, st.lists(_kept_values, max_size=3)), max_size=4
        )
    )
    return AmqpMessage(
        header=header,
        message_annotations=MessageAnnotations(ma) if ma else None,
        properties=None if props == Properties() else props,
        application_properties=ApplicationProperties(ap) if ap else None,
        body=[Data(draw(st.binary(max_size=50)))],
    )


def _same(a: Any, b: Any) -> bool:
    """Equal, and of the same AMQP type (a uint stays a uint), all the way down."""
    if isinstance(a, dict):
        return (
            isinstance(b, dict)
            and a.keys() == b.keys()
            and all(_same(v, b[k]) for k, v in a.items())
        )
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(_same, a, b))
    same_type = type(a) is type(b) or (type(a) is int and type(b) is Long)
    return same_type and a == b


@settings(max_examples=300, deadline=None)
@given(_kept_messages())
def test_amqp1_to_core_and_back_keeps_what_rabbitmq_keeps(msg: AmqpMessage) -> None:
    raw, body = to_core(decode_message(encode_message(msg)))
    validate_properties(raw)
    back = from_core(raw, body)
    assert back.header == msg.header
    assert back.properties == msg.properties
    assert back.body == msg.body
    for ours, theirs in ((msg.application_properties, back.application_properties),
                         (msg.message_annotations, back.message_annotations)):  # fmt: skip
        assert (ours is None) == (theirs is None)
        if ours is not None and theirs is not None:
            assert _same(ours.content, theirs.content), (ours, theirs)
    # and a 1.0 client reads it
    pm = proton.Message()
    pm.decode(for_delivery(back, "e", "k"))
    assert bytes(pm.body) == msg.body[0].content  # type: ignore[union-attr]


@settings(max_examples=200, deadline=None)
@given(
    st.builds(
        BasicProperties,
        content_type=st.one_of(st.none(), st.text(st.characters(max_codepoint=127), max_size=20)),
        delivery_mode=st.one_of(st.none(), st.sampled_from([1, 2])),
        priority=st.one_of(st.none(), st.integers(0, 255)),
        correlation_id=st.one_of(st.none(), _short),
        reply_to=st.one_of(st.none(), _short),
        expiration=st.one_of(st.none(), st.integers(0, 2**32 - 1).map(str)),
        message_id=st.one_of(st.none(), _short, st.uuids().map(lambda u: f"urn:uuid:{u}")),
        timestamp=st.one_of(st.none(), st.integers(0, 253_402_300_799)),
        type=st.one_of(st.none(), _short.filter(lambda s: s != AMQP10_TYPE)),
        user_id=st.one_of(st.none(), _short.filter(lambda s: "\x00" not in s)),
        app_id=st.one_of(st.none(), _short),
    )
)
def test_core_to_amqp1_and_back(props: BasicProperties) -> None:
    """A 0-9-1 message through a 1.0 client (say, a shovel) comes back the same,
    but for a missing delivery mode (1.0's durable is false: delivery mode 1)."""
    raw = props.encode()
    msg = decode_message(encode_message(from_core(raw, b"b")))
    again, body = to_core(msg)
    expected = decode_properties(raw)  # a copy (the compiled class has no __slots__)
    expected.delivery_mode = props.delivery_mode or 1
    assert decode_properties(again) == expected
    assert body == b"b"


_any_values = st.recursive(
    st.one_of(
        _kept_values,
        st.binary(max_size=20),
        st.uuids(),
        st.builds(ULong, st.integers(0, 2**64 - 1)),
        st.builds(Timestamp, st.integers(-(2**63), 2**63 - 1)),
        st.floats(),
        st.builds(Char, st.characters(blacklist_categories=("Cs",))),
        st.builds(Decimal32, st.binary(min_size=4, max_size=4)),
        st.text(max_size=5000).filter(lambda s: len(s) < 10 or len(s) > 4000),
    ),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_key_text, inner, max_size=3),
    max_leaves=8,
)
_any_ids = st.one_of(st.none(), st.uuids(), st.text(max_size=300), st.binary(max_size=20),
                     st.builds(ULong, st.integers(0, 2**64 - 1)))  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    st.builds(
        Properties,
        message_id=_any_ids,
        correlation_id=_any_ids,
        user_id=st.one_of(st.none(), st.binary(max_size=300)),
        reply_to=st.one_of(
            st.none(), st.text(max_size=300), st.text(max_size=20).map(lambda s: "/queues/" + s)
        ),
        content_type=st.one_of(st.none(), st.text(st.characters(max_codepoint=127), max_size=300)),
        creation_time=st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)),
        group_id=st.one_of(st.none(), st.text(max_size=300)),
    ),
    st.dictionaries(st.text(max_size=300), _any_values, max_size=4),
    st.dictionaries(
        st.builds(
            lambda s: Symbol("x-" + s), st.text(st.characters(max_codepoint=127), max_size=300)
        ),
        _any_values,
        max_size=4,
    ),  # fmt: skip
)
def test_whatever_a_1_0_client_publishes_is_a_safe_0_9_1_message(
    props: Properties, ap: dict[str, Any], ma: dict[Any, Any]
) -> None:
    """The 0-9-1 view passes the check every publish's properties pass (no value a
    0-9-1 client library could not decode) and the core decodes it."""
    msg = data_message(properties=props, application_properties=ApplicationProperties(ap),
                       message_annotations=MessageAnnotations(ma))  # fmt: skip
    raw, _ = to_core(decode_message(encode_message(msg)))
    validate_properties(raw)
    decode_properties(raw)
