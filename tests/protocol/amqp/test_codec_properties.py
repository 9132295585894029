"""Basic content-header properties: round trips, peeks, pamqp cross-checks, malformed input."""

from __future__ import annotations

import datetime
import struct
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import commands as pcommands
from pamqp import header as pheader

from examples import examples
from warren.amqp import spec
from warren.amqp.frames import header_payload, split_header_payload
from warren.core import properties as core_properties
from warren.core.codec_errors import DecodeError
from warren.core.properties import (
    EMPTY_PROPERTIES,
    BasicProperties,
    decode_properties,
    peek_delivery_mode,
    peek_expiration,
    peek_headers,
    peek_priority,
)

EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
SETTINGS = settings(max_examples=examples(250), deadline=None, suppress_health_check=[HealthCheck.too_slow])
NAMES = [name for name, _ in spec.BASIC_PROPERTIES]
PEEKS = {
    "headers": peek_headers,
    "delivery_mode": peek_delivery_mode,
    "priority": peek_priority,
    "expiration": peek_expiration,
}

_text = st.text(max_size=40).filter(lambda s: len(s.encode()) <= 255)
_any_shortstr = _text | st.binary(max_size=255).map(lambda b: b.decode("utf-8", "surrogateescape"))
_keys = st.text(max_size=20).filter(lambda k: len(k.encode()) <= 128)
_scalar = st.one_of(
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.text(max_size=20),
    st.binary(max_size=20),
    st.none(),
    st.floats(allow_nan=False),
)
_headers = st.dictionaries(
    _keys,
    st.one_of(_scalar, st.lists(_scalar, max_size=3), st.dictionaries(_keys, _scalar, max_size=3)),
    max_size=5,
)
# pamqp writes floats as 32-bit and byte arrays only from bytearray.
_pamqp_scalar = st.one_of(
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.text(max_size=20),
    st.binary(max_size=20).map(bytearray),
    st.none(),
    st.floats(allow_nan=False, width=32),
)
_pamqp_headers = st.dictionaries(
    _keys, st.one_of(_pamqp_scalar, st.lists(_pamqp_scalar, max_size=3)), max_size=5
)

_TYPE_STRATEGIES = {
    "shortstr": _any_shortstr,
    "table": _headers,
    "octet": st.integers(0, 255),
    "timestamp": st.integers(0, 2**64 - 1),
}


def properties(
    types: dict[str, st.SearchStrategy[Any]] = _TYPE_STRATEGIES,
) -> st.SearchStrategy[BasicProperties]:
    return st.builds(
        BasicProperties,
        **{name: st.none() | types[amqp_type] for name, amqp_type in spec.BASIC_PROPERTIES},
    )


def test_slots_follow_spec_order() -> None:
    # A class compiled by mypyc has no __slots__ attribute (its fields are C slots).
    assert getattr(BasicProperties, "__slots__", tuple(NAMES)) == tuple(NAMES)
    assert all(hasattr(BasicProperties(), name) for name in NAMES)
    assert len(NAMES) == 14
    # core/ keeps its own copy of the layout (it imports no protocol package).
    assert core_properties.BASIC_PROPERTIES == spec.BASIC_PROPERTIES
    assert dict(spec.BASIC_PROPERTIES) == {
        "content_type": "shortstr",
        "content_encoding": "shortstr",
        "headers": "table",
        "delivery_mode": "octet",
        "priority": "octet",
        "correlation_id": "shortstr",
        "reply_to": "shortstr",
        "expiration": "shortstr",
        "message_id": "shortstr",
        "timestamp": "timestamp",
        "type": "shortstr",
        "user_id": "shortstr",
        "app_id": "shortstr",
        "cluster_id": "shortstr",
    }


@SETTINGS
@given(properties())
def test_round_trip(props: BasicProperties) -> None:
    raw = props.encode()
    decoded = decode_properties(raw)
    assert decoded == props
    assert decode_properties(memoryview(raw)) == props
    assert decode_properties(raw + b"trailing") == props
    assert decoded.encode() == raw
    for name in NAMES:
        assert getattr(decoded, name) == getattr(props, name)


@SETTINGS
@given(properties())
def test_peeks_agree_with_full_decode(props: BasicProperties) -> None:
    raw = props.encode()
    full = decode_properties(raw)
    for name, peek in PEEKS.items():
        assert peek(raw) == getattr(full, name)
        assert peek(memoryview(raw)) == getattr(full, name)


@SETTINGS
@given(properties().filter(lambda p: p.encode() != EMPTY_PROPERTIES))
def test_every_truncation_is_a_decode_error(props: BasicProperties) -> None:
    raw = props.encode()
    for cut in range(len(raw)):
        with pytest.raises(DecodeError):
            decode_properties(raw[:cut])


@SETTINGS
@given(properties(), st.data())
def test_truncated_peeks_return_or_raise_decode_error(
    props: BasicProperties, data: st.DataObject
) -> None:
    raw = props.encode()
    cut = data.draw(st.integers(0, len(raw)))
    for name, peek in PEEKS.items():
        try:
            value = peek(raw[:cut])
        except DecodeError:
            continue
        # A peek may succeed on a truncated buffer only if its own field is intact.
        assert value == getattr(props, name)


@settings(max_examples=examples(300), deadline=None)
@given(st.binary(max_size=64))
def test_arbitrary_bytes_only_raise_decode_error(raw: bytes) -> None:
    try:
        props = decode_properties(raw)
    except DecodeError:
        props = None
    for name, peek in PEEKS.items():
        try:
            value = peek(raw)
        except DecodeError:
            continue
        if props is not None:
            assert value == getattr(props, name)


# ---------------------------------------------------------------------------
# Wire format details
# ---------------------------------------------------------------------------


def test_exact_bytes() -> None:
    assert BasicProperties().encode() == EMPTY_PROPERTIES == b"\x00\x00"
    assert BasicProperties(delivery_mode=2).encode() == b"\x10\x00\x02"
    assert BasicProperties(content_type="a", priority=9).encode() == b"\x88\x00\x01a\x09"
    assert BasicProperties(cluster_id="").encode() == b"\x00\x04\x00"
    assert BasicProperties(timestamp=1).encode() == b"\x00\x40" + struct.pack(">Q", 1)
    assert BasicProperties(headers={}).encode() == b"\x20\x00\x00\x00\x00\x00"


def test_empty_string_is_present_not_absent() -> None:
    props = decode_properties(BasicProperties(expiration="").encode())
    assert props.expiration == "" and props.content_type is None
    assert peek_expiration(BasicProperties(expiration="").encode()) == ""
    assert peek_headers(BasicProperties(headers={}).encode()) == {}


def test_peeks_skip_earlier_fields_without_decoding_headers() -> None:
    # A headers table containing an unknown type tag: the peeks jump over it by length.
    bad_table = b"\x00\x00\x00\x03\x01kZ"
    raw = b"\xf9\x00" + b"\x02ct" + b"\x00" + bad_table + b"\x02\x07" + b"\x03100"
    # flags: content_type, content_encoding, headers, delivery_mode, priority, expiration
    assert peek_delivery_mode(raw) == 2
    assert peek_priority(raw) == 7
    assert peek_expiration(raw) == "100"
    with pytest.raises(DecodeError):
        peek_headers(raw)
    with pytest.raises(DecodeError):
        decode_properties(raw)


def test_absent_properties_peek_none() -> None:
    raw = BasicProperties(content_type="x").encode()
    assert all(peek(raw) is None for peek in PEEKS.values())


def test_continuation_flag_word() -> None:
    # Continuation bit set, followed by an all-zero flag word: same as no continuation.
    raw = b"\x10\x01\x00\x00\x02"
    assert decode_properties(raw) == BasicProperties(delivery_mode=2)
    assert peek_delivery_mode(raw) == 2
    # Chained continuation words.
    assert decode_properties(b"\x10\x01\x00\x01\x00\x00\x02") == BasicProperties(delivery_mode=2)
    # Flags for properties basic does not have cannot be skipped safely.
    with pytest.raises(DecodeError):
        decode_properties(b"\x10\x01\x80\x00\x02")
    with pytest.raises(DecodeError):
        peek_delivery_mode(b"\x10\x01\x80\x00\x02")
    with pytest.raises(DecodeError):
        decode_properties(b"\x10\x01\x00")


def test_reserved_fifteenth_flag_is_ignored_like_rabbitmq() -> None:
    assert decode_properties(b"\x10\x02\x02") == BasicProperties(delivery_mode=2)


@pytest.mark.parametrize(
    "props",
    [
        BasicProperties(content_type="x" * 256),
        BasicProperties(delivery_mode=256),
        BasicProperties(priority=-1),
        BasicProperties(timestamp=2**64),
        BasicProperties(headers={"k": object()}),
    ],
)
def test_encode_rejects_out_of_range(props: BasicProperties) -> None:
    with pytest.raises((ValueError, TypeError)):
        props.encode()


def test_equality_and_repr() -> None:
    a = BasicProperties(content_type="text/plain", delivery_mode=2)
    assert a == BasicProperties(delivery_mode=2, content_type="text/plain")
    assert a != BasicProperties(delivery_mode=1, content_type="text/plain")
    assert a != object()
    assert repr(a) == "BasicProperties(content_type='text/plain', delivery_mode=2)"


# ---------------------------------------------------------------------------
# Content header payload
# ---------------------------------------------------------------------------


@SETTINGS
@given(st.integers(0, 2**64 - 1), properties())
def test_header_payload_round_trip(body_size: int, props: BasicProperties) -> None:
    raw = props.encode()
    payload = header_payload(body_size, raw)
    assert payload[:4] == b"\x00\x3c\x00\x00"
    assert split_header_payload(payload) == (60, body_size, raw)
    assert split_header_payload(memoryview(payload)) == (60, body_size, raw)
    assert isinstance(split_header_payload(memoryview(payload))[2], bytes)


def test_split_header_payload_errors() -> None:
    for n in range(14):
        with pytest.raises(DecodeError):
            split_header_payload(bytes(n))
    assert split_header_payload(b"\x00\x14\x00\x00" + bytes(8) + b"\x00\x00") == (
        20,
        0,
        b"\x00\x00",
    )
    with pytest.raises(ValueError):
        header_payload(-1, EMPTY_PROPERTIES)


# ---------------------------------------------------------------------------
# pamqp as an independent oracle
# ---------------------------------------------------------------------------

_PAMQP_NAME = {"type": "message_type"}


@SETTINGS
@given(
    properties(
        {
            "shortstr": _text,
            "table": _headers,
            "octet": st.integers(0, 255),
            # pamqp treats timestamps above 2**32 as milliseconds
            "timestamp": st.integers(0, 2**32 - 1),
        }
    ),
    st.integers(0, 2**63 - 1),
)
def test_pamqp_decodes_warren_encoding(props: BasicProperties, body_size: int) -> None:
    payload = header_payload(body_size, props.encode())
    theirs = pheader.ContentHeader()
    theirs.unmarshal(payload)
    assert (theirs.class_id, theirs.weight, theirs.body_size) == (60, 0, body_size)
    for name in NAMES:
        value = getattr(theirs.properties, _PAMQP_NAME.get(name, name))
        expected = getattr(props, name)
        if name == "timestamp" and expected is not None:
            expected = EPOCH + datetime.timedelta(seconds=expected)
        if name == "headers" and value is not None:
            value = {k: bytes(v) if isinstance(v, bytearray) else v for k, v in value.items()}
        if name == "cluster_id" and expected is None:
            expected = ""  # pamqp's default for an absent cluster-id
        assert value == expected, name


@SETTINGS
@given(
    properties(
        {
            # pamqp drops empty strings, so they would not round-trip through it
            "shortstr": _text.filter(bool),
            "table": _pamqp_headers,
            "octet": st.integers(0, 255),
            "timestamp": st.integers(0, 2**32 - 1),
        }
    ),
    st.integers(0, 2**63 - 1),
)
def test_warren_decodes_pamqp_encoding(props: BasicProperties, body_size: int) -> None:
    kwargs: dict[str, Any] = {}
    for name in NAMES:
        value = getattr(props, name)
        if name == "timestamp" and value is not None:
            value = EPOCH + datetime.timedelta(seconds=value)
        if value is None and name == "cluster_id":
            value = ""
        kwargs[_PAMQP_NAME.get(name, name)] = value
    # pamqp validates delivery_mode / cluster_id; the codec must accept any octet/string.
    with mock.patch.object(pcommands.Basic.Properties, "validate", lambda self: None):
        theirs = pcommands.Basic.Properties(**kwargs)
        payload = pheader.ContentHeader(0, body_size, theirs).marshal()
    class_id, size, raw = split_header_payload(payload)
    assert (class_id, size) == (60, body_size)
    ours = decode_properties(raw)
    assert ours == props
    for name, peek in PEEKS.items():
        assert peek(raw) == getattr(props, name)


_stream_headers = st.one_of(
    _headers,
    st.builds(
        lambda h, k, v: {**h, k: v},
        _headers,
        st.sampled_from(["x-stream-offset", "x-stream-timestamp", "x-stream-filter-value"]),
        _scalar,
    ),
)


@SETTINGS
@given(
    properties({**_TYPE_STRATEGIES, "table": _stream_headers}),
    st.integers(0, 2**63 - 1),
    st.integers(0, 2**63 - 1),
)
def test_stream_stamping_splices_what_edit_properties_builds(
    props: BasicProperties, offset: int, ts: int
) -> None:
    """A stream append's fast splice of its two headers gives edit_properties' bytes."""
    from warren.store.stream_records import stamp_properties

    raw = props.encode()
    longs = {"x-stream-offset": offset, "x-stream-timestamp": ts}
    expected = core_properties.edit_properties(
        raw, set_headers={k: b"l" + struct.pack(">q", v) for k, v in longs.items()}
    )
    assert stamp_properties(raw, offset, ts) == expected
    headers = decode_properties(expected).headers
    assert headers is not None and {k: headers[k] for k in longs} == longs
