"""Field table codec: round trips, hand-built wire bytes, pamqp cross-checks, malformed input."""

from __future__ import annotations

import contextlib
import datetime
import decimal
import math
import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import decode as pdecode
from pamqp import encode as pencode

from examples import examples
from warren.core.codec_errors import DecodeError
from warren.core.table import decode_field_array, decode_field_value, decode_table
from warren.core.table_encode import encode_field_array, encode_field_value, encode_table

UTC = datetime.UTC
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=UTC)
SETTINGS = settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _fits_shortstr(s: str) -> bool:
    return len(s.encode("utf-8", "surrogateescape")) <= 255


def _decimal(scale: int, unscaled: int) -> decimal.Decimal:
    return decimal.Decimal(unscaled).scaleb(-scale)


# Keys: ordinary text plus arbitrary bytes smuggled through surrogateescape.
keys = st.one_of(
    st.text(max_size=30).filter(_fits_shortstr),
    st.binary(max_size=30).map(lambda b: b.decode("utf-8", "surrogateescape")),
)
timestamps = st.integers(0, 253402300799).map(lambda s: EPOCH + datetime.timedelta(seconds=s))
decimals = st.builds(_decimal, st.integers(0, 255), st.integers(-(2**31), 2**31 - 1))
scalars = st.one_of(
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),
    decimals,
    st.text(max_size=40),
    st.binary(max_size=40),
    timestamps,
    st.none(),
)


def containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.lists(children, max_size=5),
        st.dictionaries(keys, children, max_size=5),
    )


values = st.recursive(scalars, containers, max_leaves=12)
tables = st.dictionaries(keys, values, max_size=8)


# pamqp-compatible subsets (see test docstrings for why each restriction exists).
p_keys = st.text(max_size=30).filter(lambda k: len(k.encode()) <= 128)
p_small_ts = st.integers(0, 2**32 - 1).map(lambda s: EPOCH + datetime.timedelta(seconds=s))


def _p_containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.lists(children, max_size=4), st.dictionaries(p_keys, children, max_size=4))


# Values Warren encodes and pamqp decodes to the same thing.
to_pamqp_values = st.recursive(
    st.one_of(
        st.booleans(),
        st.integers(-(2**63), 2**63 - 1),
        st.floats(allow_nan=False),
        st.builds(_decimal, st.integers(0, 20), st.integers(0, 2**31 - 1)),
        st.text(max_size=40),
        st.binary(max_size=40),
        p_small_ts,
        st.none(),
    ),
    _p_containers,
    max_leaves=15,
)
# Values pamqp can encode (bytearray for 'x', float32 for floats) that Warren must decode.
from_pamqp_values = st.recursive(
    st.one_of(
        st.booleans(),
        st.integers(-(2**63), 2**63 - 1),
        st.floats(allow_nan=False, width=32),
        st.builds(_decimal, st.integers(0, 20), st.integers(-(2**31), 2**31 - 1)),
        st.text(max_size=40),
        st.binary(max_size=40).map(bytearray),
        p_small_ts,
        st.none(),
    ),
    _p_containers,
    max_leaves=15,
)


def assert_same(a: Any, b: Any) -> None:
    """Deep equality that also checks types where the codec promises them."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys()
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, list | tuple):
        assert isinstance(b, list) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    elif isinstance(a, bytes | bytearray):
        assert isinstance(b, bytes | bytearray) and bytes(a) == bytes(b)
    elif isinstance(a, float):
        assert isinstance(b, float)
        assert a == b and math.copysign(1, a) == math.copysign(1, b)
    elif isinstance(a, decimal.Decimal):
        assert isinstance(b, decimal.Decimal) and a == b
    else:
        assert type(a) is type(b) and a == b, (a, b)


# ---------------------------------------------------------------------------
# Round trips
# ---------------------------------------------------------------------------


@SETTINGS
@given(tables)
def test_table_round_trip(table: dict[str, Any]) -> None:
    raw = encode_table(table)
    assert struct.unpack_from(">I", raw)[0] == len(raw) - 4
    decoded, end = decode_table(raw, 0)
    assert end == len(raw)
    assert_same(table, decoded)


@SETTINGS
@given(tables, st.binary(max_size=8), st.binary(max_size=8))
def test_table_round_trip_at_offset_in_memoryview(
    table: dict[str, Any], before: bytes, after: bytes
) -> None:
    raw = encode_table(table)
    decoded, end = decode_table(memoryview(before + raw + after), len(before))
    assert end == len(before) + len(raw)
    assert_same(table, decoded)


@SETTINGS
@given(st.lists(values, max_size=6))
def test_array_round_trip(items: list[Any]) -> None:
    raw = encode_field_array(items)
    decoded, end = decode_field_array(raw, 0)
    assert end == len(raw)
    assert_same(items, decoded)


@SETTINGS
@given(values)
def test_field_value_round_trip(value: Any) -> None:
    raw = encode_field_value(value)
    decoded, end = decode_field_value(raw, 0)
    assert end == len(raw)
    assert_same(value, decoded)


@SETTINGS
@given(decimals)
def test_decimal_keeps_its_exponent(value: decimal.Decimal) -> None:
    decoded, _ = decode_field_value(encode_field_value(value))
    assert decoded.as_tuple() == value.as_tuple()


def test_none_and_empty_encode_to_empty_table() -> None:
    assert encode_table(None) == b"\x00\x00\x00\x00"
    assert encode_table({}) == b"\x00\x00\x00\x00"
    assert decode_table(b"\x00\x00\x00\x00", 0) == ({}, 4)


# ---------------------------------------------------------------------------
# Hand-built wire bytes for every type tag
# ---------------------------------------------------------------------------


def _entry(tag: bytes, payload: bytes, key: bytes = b"k") -> bytes:
    body = bytes([len(key)]) + key + tag + payload
    return struct.pack(">I", len(body)) + body


NESTED_TABLE = _entry(b"I", struct.pack(">i", 7), key=b"n")
ARRAY_BODY = b"b\xff" + b"S" + struct.pack(">I", 2) + b"hi" + b"V"

WIRE_CASES: list[tuple[str, bytes, bytes, Any]] = [
    ("bool true", b"t", b"\x01", True),
    ("bool nonzero", b"t", b"\x07", True),
    ("bool false", b"t", b"\x00", False),
    ("int8", b"b", b"\x80", -128),
    ("uint8", b"B", b"\xff", 255),
    ("int16", b"s", b"\x80\x00", -32768),
    ("uint16", b"u", b"\xff\xff", 65535),
    ("int32", b"I", b"\xff\xff\xff\xfe", -2),
    ("uint32", b"i", b"\xff\xff\xff\xfe", 2**32 - 2),
    ("int64", b"l", b"\x80" + b"\x00" * 7, -(2**63)),
    ("int64 as L", b"L", b"\xff" * 8, -1),
    ("float32", b"f", struct.pack(">f", 1.5), 1.5),
    ("float64", b"d", struct.pack(">d", -0.1), -0.1),
    ("decimal", b"D", b"\x02" + struct.pack(">i", 12345), decimal.Decimal("123.45")),
    ("decimal negative", b"D", b"\x01" + struct.pack(">i", -5), decimal.Decimal("-0.5")),
    ("longstr utf8", b"S", struct.pack(">I", 3) + "é!".encode(), "é!"),
    ("longstr binary", b"S", struct.pack(">I", 2) + b"\xff\xfe", b"\xff\xfe"),
    ("byte array", b"x", struct.pack(">I", 3) + b"a\x00b", b"a\x00b"),
    ("array", b"A", struct.pack(">I", len(ARRAY_BODY)) + ARRAY_BODY, [-1, "hi", None]),
    ("nested table", b"F", NESTED_TABLE, {"n": 7}),
    (
        "timestamp",
        b"T",
        struct.pack(">Q", 1700000000),
        EPOCH + datetime.timedelta(seconds=1700000000),
    ),
    ("void", b"V", b"", None),
]


@pytest.mark.parametrize(
    ("tag", "payload", "expected"), [c[1:] for c in WIRE_CASES], ids=[c[0] for c in WIRE_CASES]
)
def test_decode_hand_built_tag(tag: bytes, payload: bytes, expected: Any) -> None:
    raw = _entry(tag, payload)
    table, end = decode_table(raw, 0)
    assert end == len(raw)
    assert_same({"k": expected}, table)
    # pamqp agrees on every tag except where it is known to differ (see test below).
    if tag != b"D":
        _, theirs = pdecode.field_table(raw)
        assert_same({"k": expected}, {"k": _normalise_pamqp(theirs["k"])})


def test_all_eighteen_tags_covered() -> None:
    assert {c[1] for c in WIRE_CASES} == {bytes([t]) for t in b"tbBsuIilLfdDSxAFTV"}


def test_timestamp_is_aware_utc() -> None:
    value, _ = decode_field_value(b"T" + struct.pack(">Q", 0))
    assert value == EPOCH and value.tzinfo is UTC


def test_where_pamqp_differs_from_rabbitmq() -> None:
    """Document where pamqp 4 disagrees with RabbitMQ; Warren follows RabbitMQ."""
    # 'L' is a signed 64-bit int for RabbitMQ, pamqp, pika and py-amqp alike.
    raw = _entry(b"L", b"\xff" * 8)
    assert decode_table(raw, 0)[0] == {"k": -1}
    assert pdecode.field_table(raw)[1] == {"k": -1}
    # 'T' is whole seconds; pamqp guesses milliseconds above 2**32.
    big = 2**33
    raw = _entry(b"T", struct.pack(">Q", big))
    assert decode_table(raw, 0)[0]["k"] == EPOCH + datetime.timedelta(seconds=big)
    assert pdecode.field_table(raw)[1]["k"] != EPOCH + datetime.timedelta(seconds=big)


# ---------------------------------------------------------------------------
# Encoder type choices
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "tag"),
    [
        (True, b"t"),
        (False, b"t"),
        (0, b"I"),
        (2**31 - 1, b"I"),
        (-(2**31), b"I"),
        (2**31, b"l"),
        (-(2**31) - 1, b"l"),
        (2**63 - 1, b"l"),
        (-(2**63), b"l"),
        (1.0, b"d"),
        (decimal.Decimal("1.5"), b"D"),
        ("s", b"S"),
        (b"b", b"x"),
        (bytearray(b"b"), b"x"),
        (memoryview(b"b"), b"x"),
        ([1], b"A"),
        ((1,), b"A"),
        ({"a": 1}, b"F"),
        (EPOCH, b"T"),
        (None, b"V"),
    ],
)
def test_encoder_type_choice(value: Any, tag: bytes) -> None:
    assert encode_field_value(value)[:1] == tag


def test_encoder_exact_bytes() -> None:
    assert encode_table({"a": 1}) == b"\x00\x00\x00\x07\x01aI\x00\x00\x00\x01"
    assert encode_field_value(decimal.Decimal("-1.25")) == b"D\x02" + struct.pack(">i", -125)
    assert encode_field_value(decimal.Decimal("5E+2")) == b"D\x00" + struct.pack(">i", 500)
    assert encode_field_value((1, "x")) == encode_field_value([1, "x"])


def test_naive_datetime_is_taken_as_utc() -> None:
    naive = datetime.datetime(2020, 1, 2, 3, 4, 5)
    aware = naive.replace(tzinfo=UTC)
    assert encode_field_value(naive) == encode_field_value(aware)
    other = aware.astimezone(datetime.timezone(datetime.timedelta(hours=5)))
    assert encode_field_value(other) == encode_field_value(aware)


def test_subclasses_use_base_encoders() -> None:
    class MyInt(int):
        pass

    class MyStr(str):
        __slots__ = ()

    assert encode_field_value(MyInt(3)) == encode_field_value(3)
    assert encode_field_value(MyStr("a")) == encode_field_value("a")


@pytest.mark.parametrize(
    ("table", "error"),
    [
        ({"a": 2**63}, ValueError),
        ({"a": 2**64}, ValueError),
        ({"a": -(2**63) - 1}, ValueError),
        ({"a": decimal.Decimal("NaN")}, ValueError),
        ({"a": decimal.Decimal(2**31)}, ValueError),
        ({"a": decimal.Decimal(1).scaleb(-256)}, ValueError),
        ({"a": datetime.datetime(1969, 12, 31, tzinfo=UTC)}, ValueError),
        ({"a": object()}, TypeError),
        ({"a": {1, 2}}, TypeError),
        ({1: "a"}, TypeError),
        ({"k" * 256: 1}, ValueError),
    ],
)
def test_encode_rejects(table: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        encode_table(table)


# ---------------------------------------------------------------------------
# pamqp cross-checks
# ---------------------------------------------------------------------------


def _normalise_pamqp(value: Any) -> Any:
    if isinstance(value, bytearray):
        return bytes(value)
    if isinstance(value, list):
        return [_normalise_pamqp(v) for v in value]
    if isinstance(value, dict):
        return {k: _normalise_pamqp(v) for k, v in value.items()}
    return value


@SETTINGS
@given(st.dictionaries(p_keys, to_pamqp_values, max_size=6))
def test_pamqp_decodes_what_warren_encodes(table: dict[str, Any]) -> None:
    """Restricted to ints within int64, non-negative decimals and timestamps below 2**32:
    pamqp reads 'L' as signed, the decimal mantissa as unsigned, and large timestamps as ms."""
    raw = encode_table(table)
    consumed, theirs = pdecode.field_table(raw)
    assert consumed == len(raw)
    assert_same(table, _normalise_pamqp(theirs))


@SETTINGS
@given(st.dictionaries(p_keys, from_pamqp_values, max_size=6))
def test_warren_decodes_what_pamqp_encodes(table: dict[str, Any]) -> None:
    """pamqp encodes floats as 32-bit 'f' and picks the smallest integer tag (b/s/u/I/i/l)."""
    raw = pencode.field_table(table)
    ours, end = decode_table(raw, 0)
    assert end == len(raw)
    assert_same(_normalise_pamqp(table), ours)


@pytest.mark.parametrize(
    "value", [0, -1, 127, -128, 255, 256, -32768, 65535, 65536, 2**31, 2**32 - 1, 2**32, -(2**63)]
)
def test_pamqp_integer_tags_decode(value: int) -> None:
    raw = pencode.table_integer(value)
    decoded, end = decode_field_value(raw)
    assert (decoded, end) == (value, len(raw))


# ---------------------------------------------------------------------------
# Malformed input
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\x00\x00\x00",
        b"\x00\x00\x00\x05\x01k",  # declared length beyond data
        _entry(b"Z", b""),  # unknown tag
        _entry(b"\x00", b""),  # pamqp treats NUL as void; RabbitMQ does not
        _entry(b"I", b"\x00\x00"),  # short value
        _entry(b"S", struct.pack(">I", 10) + b"abc"),
        _entry(b"x", struct.pack(">I", 10) + b"abc"),
        _entry(b"A", struct.pack(">I", 10) + b"V"),
        _entry(b"F", struct.pack(">I", 10) + b"\x00"),
        _entry(b"A", struct.pack(">I", 1) + b"Z"),  # unknown tag inside array
        _entry(b"T", struct.pack(">Q", 2**64 - 1)),  # beyond datetime's range
        b"\x00\x00\x00\x02\x05k",  # key length runs past table end
        b"\x00\x00\x00\x02\x01k",  # key without a value
        # value overruns the table's declared length though the buffer continues
        b"\x00\x00\x00\x04\x01kI\x00" + b"\x00\x00\x00\x00",
    ],
)
def test_malformed_tables_raise_decode_error(raw: bytes) -> None:
    with pytest.raises(DecodeError):
        decode_table(raw, 0)


@SETTINGS
@given(tables.filter(bool))
def test_every_truncation_raises_decode_error(table: dict[str, Any]) -> None:
    raw = encode_table(table)
    for cut in range(len(raw)):
        with pytest.raises(DecodeError):
            decode_table(raw[:cut], 0)


@settings(max_examples=examples(300), deadline=None)
@given(st.binary(max_size=64), st.integers(0, 8))
def test_arbitrary_bytes_only_raise_decode_error(raw: bytes, offset: int) -> None:
    for decoder in (decode_table, decode_field_array, decode_field_value):
        with contextlib.suppress(DecodeError):
            decoder(raw, offset)


@settings(max_examples=examples(200), deadline=None)
@given(tables, st.data())
def test_mutated_tables_only_raise_decode_error(table: dict[str, Any], data: st.DataObject) -> None:
    raw = bytearray(encode_table(table))
    if len(raw) > 4:
        pos = data.draw(st.integers(0, len(raw) - 1))
        raw[pos] = data.draw(st.integers(0, 255))
    with contextlib.suppress(DecodeError):
        decode_table(bytes(raw), 0)


def test_deep_nesting_is_a_decode_error_not_a_recursion_error() -> None:
    inner = b""
    for _ in range(5000):
        inner = b"A" + struct.pack(">I", len(inner)) + inner
    raw = _entry(inner[:1], inner[1:])
    with pytest.raises(DecodeError):
        decode_table(raw, 0)


def test_moderate_nesting_decodes() -> None:
    value: Any = 1
    for _ in range(50):
        value = {"k": [value]}
    assert decode_table(encode_table(value), 0)[0] == value
