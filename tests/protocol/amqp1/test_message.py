"""AMQP 1.0 message sections (src/warren/amqp1/message.py): round trips, the kept bare
message, malformed messages.

python-qpid-proton is the oracle: ``proton.Message`` encodes messages Warren decodes
and decodes the messages Warren encodes.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from examples import examples
from warren.amqp1 import message as M
from warren.amqp1.codec import DecodeError
from warren.amqp1.message import (
    AmqpMessage,
    AmqpSequence,
    AmqpValue,
    ApplicationProperties,
    Data,
    DeliveryAnnotations,
    Footer,
    Header,
    MessageAnnotations,
    Properties,
    decode_message,
    decode_sections,
    encode_message,
    encode_sections,
)
from warren.amqp1.types import Symbol, UInt, ULong

proton = pytest.importorskip("proton")


def _full_message() -> AmqpMessage:
    return AmqpMessage(
        header=Header(durable=True, priority=7, ttl=60_000, first_acquirer=False, delivery_count=2),
        delivery_annotations=DeliveryAnnotations({Symbol("x-trace"): "hop1"}),
        message_annotations=MessageAnnotations({Symbol("x-opt-a"): 1, Symbol("x-b"): "two"}),
        properties=Properties(
            message_id=uuid.UUID("550e8400-e29b-41d4-a716-446655440000"),
            user_id=b"guest",
            to="/queues/q1",
            subject="greeting",
            reply_to="/queues/replies",
            correlation_id=ULong(42),
            content_type="text/plain",
            content_encoding="gzip",
            absolute_expiry_time=1_700_000_060_000,
            creation_time=1_700_000_000_000,
            group_id="group",
            group_sequence=3,
            reply_to_group_id="rgroup",
        ),
        application_properties=ApplicationProperties({"colour": "red", "n": UInt(5)}),
        body=[Data(b"hello"), Data(b" world")],
        footer=Footer({Symbol("x-hash"): b"\x01\x02"}),
    )


def test_every_section_round_trips() -> None:
    msg = _full_message()
    raw = encode_message(msg)
    back = decode_message(raw)
    assert back == msg
    assert back.data() == b"hello world"
    assert encode_message(back) == raw


def test_proton_decodes_what_warren_encodes() -> None:
    pm = proton.Message()
    pm.decode(encode_message(_full_message()))
    assert (pm.durable, pm.priority, pm.ttl, pm.first_acquirer, pm.delivery_count) == (
        True,
        7,
        60.0,
        False,
        2,
    )
    assert pm.instructions == {"x-trace": "hop1"}
    assert pm.annotations == {"x-opt-a": 1, "x-b": "two"}
    assert pm.id == uuid.UUID("550e8400-e29b-41d4-a716-446655440000")
    assert pm.user_id == b"guest"
    assert (pm.address, pm.subject, pm.reply_to) == ("/queues/q1", "greeting", "/queues/replies")
    assert pm.correlation_id == 42
    assert (pm.content_type, pm.content_encoding) == ("text/plain", "gzip")
    assert (pm.expiry_time, pm.creation_time) == (1_700_000_060.0, 1_700_000_000.0)
    assert (pm.group_id, pm.group_sequence, pm.reply_to_group_id) == ("group", 3, "rgroup")
    assert pm.properties == {"colour": "red", "n": 5}
    assert isinstance(pm.properties["n"], proton.uint)


def test_warren_decodes_what_proton_encodes() -> None:
    pm = proton.Message(
        body=b"payload",
        inferred=True,
        id="id-1",
        correlation_id=uuid.UUID(int=7),
        user_id=b"u",
        address="/exchanges/amq.topic/a.b",
        subject="s",
        reply_to="/queues/r",
        content_type="application/json",
        creation_time=1_700_000_000.25,
        group_id="g",
        group_sequence=9,
        durable=True,
        priority=9,
        ttl=1.5,
        properties={"k": "v", "i": proton.int32(-3)},
        annotations={proton.symbol("x-opt-x"): proton.ulong(1)},
        instructions={proton.symbol("x-d"): True},
    )
    msg = decode_message(pm.encode())
    assert msg.header is not None
    assert (msg.header.durable, msg.header.priority, msg.header.ttl) == (True, 9, 1500)
    assert msg.delivery_annotations == DeliveryAnnotations({"x-d": True})
    assert msg.message_annotations == MessageAnnotations({"x-opt-x": 1})
    p = msg.properties
    assert p is not None
    assert (p.message_id, p.correlation_id, p.user_id) == ("id-1", uuid.UUID(int=7), b"u")
    assert (p.to, p.subject, p.reply_to) == ("/exchanges/amq.topic/a.b", "s", "/queues/r")
    assert p.content_type == "application/json" and isinstance(p.content_type, Symbol)
    assert (p.creation_time, p.group_id, p.group_sequence) == (1_700_000_000_250, "g", 9)
    assert msg.application_properties == ApplicationProperties({"k": "v", "i": -3})
    assert msg.body == [Data(b"payload")]


@pytest.mark.parametrize(
    ("body", "sections"),
    [
        ({"a": [1, 2]}, [AmqpValue({"a": [1, 2]})]),
        ("text", [AmqpValue("text")]),
    ],
)
def test_amqp_value_bodies_from_proton(body: Any, sections: list[Any]) -> None:
    assert decode_message(proton.Message(body=body).encode()).body == sections


def test_a_message_without_a_body_is_refused() -> None:
    """proton leaves out a None body; RabbitMQ 4 refuses such a message too
    (the body is mandatory, 3.2)."""
    with pytest.raises(DecodeError, match="without a body"):
        decode_message(proton.Message(body=None).encode())


def test_amqp_sequence_body_from_proton() -> None:
    pm = proton.Message(body=[1, "two"], inferred=True)
    assert decode_message(pm.encode()).body == [AmqpSequence([1, "two"])]


def test_sequence_and_value_bodies_for_proton() -> None:
    pm = proton.Message()
    pm.decode(encode_message(AmqpMessage(body=[AmqpSequence([1, "a"])])))
    assert pm.body == [1, "a"] and pm.inferred
    pm.decode(encode_message(AmqpMessage(body=[AmqpValue({"k": b"v"})])))
    assert pm.body == {"k": b"v"}


def test_the_bare_message_is_kept_as_received() -> None:
    """A decoded message re-encodes its head only: the bare message and the footer
    are the bytes that came, whatever their (legal, non-canonical) encoding."""
    # Properties as a list32 with an explicit trailing null: not how Warren encodes.
    props = b"\x00\x53\x73\xd0\x00\x00\x00\x08\x00\x00\x00\x02\xa1\x01a\x40"
    data = b"\x00\x53\x75\xb0\x00\x00\x00\x02hi"
    footer = b"\x00\x53\x78\xc1\x01\x00"
    header = encode_sections([Header(durable=True)])
    raw = header + props + data + footer
    msg = decode_message(raw)
    assert msg.properties == Properties(message_id="a")
    assert msg.bare == props + data
    assert msg.body_and_footer == data + footer
    msg.header = Header(durable=False, delivery_count=1)
    msg.message_annotations = MessageAnnotations({"x-exchange": "e"})
    out = encode_message(msg)
    assert out.endswith(props + data + footer)
    again = decode_message(out)
    assert again.message_annotations == MessageAnnotations({"x-exchange": "e"})
    assert again.header == Header(durable=False, delivery_count=1)
    # Without raw, the sections are encoded anew (canonically).
    msg.raw = None
    assert decode_message(encode_message(msg)) == again


def test_symbolic_descriptors() -> None:
    raw = b"\x00\xa3\x10amqp:data:binary\xa0\x01x"
    assert decode_message(raw).body == [Data(b"x")]
    raw = b"\x00\xa3\x11amqp:amqp-value:*\xa1\x01y"
    assert decode_message(raw).body == [AmqpValue("y")]


def test_descriptor_as_long_ulong() -> None:
    raw = b"\x00\x80" + (0x75).to_bytes(8, "big") + b"\xa0\x01x"
    assert decode_message(raw).body == [Data(b"x")]


def test_header_defaults_and_absent_fields() -> None:
    msg = decode_message(b"\x00\x53\x70\x45" + b"\x00\x53\x75\xa0\x00")
    assert msg.header == Header()
    assert msg.body == [Data(b"")]


_DATA = b"\x00\x53\x75\xa0\x01x"
_VALUE = b"\x00\x53\x77\x40"
_SEQ = b"\x00\x53\x76\x45"
_HEADER = b"\x00\x53\x70\x45"
_PROPS = b"\x00\x53\x73\x45"
_FOOTER = b"\x00\x53\x78\xc1\x01\x00"


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b"", "without a body"),
        (_HEADER, "without a body"),
        (_PROPS + _HEADER + _DATA, "out of order"),
        (_HEADER + _HEADER + _DATA, "out of order"),
        (_DATA + _PROPS, "out of order"),
        (_DATA + _FOOTER + _DATA, "out of order"),
        (_DATA + _VALUE, "amqp-value"),
        (_VALUE + _VALUE, "amqp-value"),
        (_DATA + _SEQ, "mixes"),
        (_SEQ + _DATA, "mixes"),
        (b"\x00\x53\x79\x40" + _DATA, "unknown message section"),
        (b"\xa0\x01x", "described"),
        (b"\x00\x53\x75\xa1\x01x", "binary"),
        (b"\x00\x53\x75\xb0\x00\x00\x00\x09x", "past the end"),
        (b"\x00\x53\x73\xa1\x01x" + _DATA, "not a list"),
        (b"\x00\x53\x74\x45" + _DATA, "not a map"),
        (_DATA[:-2], "truncated"),
        (b"\x00\x53\x70\xc0\x03\x01\xa1\x00" + _DATA, "wrong type"),  # durable ""
        (b"\x00\x53\x70\xc0\x05\x02\x40\x60\x01\x00" + _DATA, "not a ubyte"),  # ushort 256
        (
            b"\x00\x53\x70\xc0\x0c\x03\x40\x40\x81" + (-1).to_bytes(8, "big", signed=True) + _DATA,
            "not a uint",
        ),
        (b"\x00\x53\x73\xc0\x02\x01\x41" + _DATA, "wrong type"),  # message-id true
        (b"\x00\x53\x73\xc0\x04\x02\x40\xa1\x00" + _DATA, "wrong type"),  # user-id a string
        (b"\x00\x53", "truncated"),
    ],
)
def test_malformed_messages(raw: bytes, why: str) -> None:
    with pytest.raises(DecodeError, match=why):
        decode_message(raw)


def test_decode_sections_takes_a_body_and_footer() -> None:
    raw = encode_sections([AmqpValue([1]), Footer({"x-f": 1})])
    assert decode_sections(raw) == [AmqpValue([1]), Footer({"x-f": 1})]
    with pytest.raises(DecodeError):
        decode_sections(raw[:-1])


def test_encoding_needs_a_body() -> None:
    with pytest.raises(ValueError, match="body"):
        encode_message(AmqpMessage(properties=Properties(message_id="x")))


def test_a_data_section_of_256_bytes_and_more() -> None:
    for n in (255, 256, 70_000):
        msg = AmqpMessage(body=[Data(bytes(n))])
        raw = encode_message(msg)
        assert decode_message(raw).body == [Data(bytes(n))]
        pm = proton.Message()
        pm.decode(raw)
        assert bytes(pm.body) == bytes(n)


def test_plain_python_values_take_the_fields_types() -> None:
    """Plain ints and strs given for typed fields are encoded as their AMQP types."""
    msg = AmqpMessage(
        header=Header(priority=1, ttl=2, delivery_count=3),
        properties=Properties(message_id=5, content_type="a/b", creation_time=7, group_sequence=8),
        message_annotations=MessageAnnotations({"x-plain": 1}),
        body=[Data(b"")],
    )
    pm = proton.Message()
    pm.decode(encode_message(msg))
    assert pm.id == 5
    assert isinstance(next(iter(pm.annotations)), proton.symbol)
    back = decode_message(encode_message(msg))
    assert isinstance(back.properties.message_id, ULong)  # type: ignore[union-attr]
    assert isinstance(back.header.ttl, UInt)  # type: ignore[union-attr]


# -- hypothesis: random messages round trip, and proton reads them --------------

_text = st.text(max_size=20)
_simple = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    _text,
    st.binary(max_size=20),
    st.builds(UInt, st.integers(0, 2**32 - 1)),
)
_ids = st.one_of(
    st.none(),
    _text,
    st.builds(ULong, st.integers(0, 2**64 - 1)),
    st.uuids(),
    st.binary(max_size=20),
)
_headers = st.builds(
    Header,
    st.one_of(st.none(), st.booleans()),
    st.one_of(st.none(), st.integers(0, 255)),
    st.one_of(st.none(), st.integers(0, 2**32 - 1)),
    st.one_of(st.none(), st.booleans()),
    st.one_of(st.none(), st.integers(0, 2**32 - 1)),
)
_times = st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1))
_properties = st.builds(
    Properties,
    _ids,
    st.one_of(st.none(), st.binary(max_size=10)),
    st.one_of(st.none(), _text),
    st.one_of(st.none(), _text),
    st.one_of(st.none(), _text),
    _ids,
    st.one_of(st.none(), st.text(st.characters(max_codepoint=127), max_size=10)),
    st.one_of(st.none(), st.text(st.characters(max_codepoint=127), max_size=10)),
    _times,
    _times,
    st.one_of(st.none(), _text),
    st.one_of(st.none(), st.integers(0, 2**32 - 1)),
    st.one_of(st.none(), _text),
)
_symbol_maps = st.dictionaries(
    st.builds(Symbol, st.text(st.characters(max_codepoint=127), max_size=8)), _simple, max_size=4
)
_bodies = st.one_of(
    st.lists(st.builds(Data, st.binary(max_size=300)), min_size=1, max_size=3),
    st.lists(st.builds(AmqpSequence, st.lists(_simple, max_size=4)), min_size=1, max_size=2),
    st.builds(lambda v: [AmqpValue(v)], _simple),
)
_messages = st.builds(
    AmqpMessage,
    header=st.one_of(st.none(), _headers),
    delivery_annotations=st.one_of(st.none(), st.builds(DeliveryAnnotations, _symbol_maps)),
    message_annotations=st.one_of(st.none(), st.builds(MessageAnnotations, _symbol_maps)),
    properties=st.one_of(st.none(), _properties),
    application_properties=st.one_of(
        st.none(),
        st.builds(ApplicationProperties, st.dictionaries(_text, _simple, max_size=4)),
    ),
    body=_bodies,
    footer=st.one_of(st.none(), st.builds(Footer, _symbol_maps)),
)


@settings(max_examples=examples(300), deadline=None)
@given(_messages)
def test_random_messages_round_trip(msg: AmqpMessage) -> None:
    raw = encode_message(msg)
    back = decode_message(raw)
    assert back == msg
    assert encode_message(back) == raw
    assert back.bare + (back.raw[back.footer_at :] if back.raw else b"") == raw[back.bare_at :]


@settings(max_examples=examples(200), deadline=None)
@given(_messages)
def test_proton_reads_random_messages(msg: AmqpMessage) -> None:
    pm = proton.Message()
    pm.decode(encode_message(msg))
    # proton re-encodes what it decoded; Warren reads that back to the same sections
    # (proton drops the footer and delivery-annotations of an empty map, and writes
    # a header it always has).
    # proton keeps one body section, and leaves out an amqp-value of null.
    if len(msg.body) > 1 or msg.body == [AmqpValue(None)]:
        return
    again = decode_message(pm.encode())
    assert again.body == msg.body
    if msg.properties is not None and again.properties is not None:
        # proton does not tell an absent number from 0 (it writes group-sequence 0).
        for name in Properties.__slots__:
            ours, theirs = getattr(msg.properties, name), getattr(again.properties, name)
            assert theirs == ours or {ours, theirs} == {None, 0}, name
    if msg.application_properties and msg.application_properties.content:
        assert again.application_properties == msg.application_properties
    if msg.message_annotations and msg.message_annotations.content:
        assert again.message_annotations == msg.message_annotations


def test_module_constants() -> None:
    assert (M.DATA, M.AMQP_VALUE, M.APPLICATION_PROPERTIES) == (0x75, 0x77, 0x74)
