"""Generated method codec: spec table, round trips, pamqp cross-checks, hostile input."""

from __future__ import annotations

import datetime
import decimal
import struct
import sys
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import base as pbase
from pamqp import commands as pcommands
from pamqp import frame as pframe
from paths import REPO

from examples import examples
from warren.amqp import spec
from warren.amqp.spec import METHODS, Method, decode_method
from warren.core.codec_errors import DecodeError, UnknownMethod

pytestmark = pytest.mark.filterwarnings("ignore:This command is deprecated:DeprecationWarning")

ALL_METHODS = sorted(METHODS.values(), key=lambda c: c.INDEX)
WITH_FIELDS = [c for c in ALL_METHODS if c.FIELDS]
IN_PAMQP = [c for c in ALL_METHODS if c.INDEX in pcommands.INDEX_MAPPING]
# Warren follows the spec's argument name; pamqp renames this one.
PAMQP_NAMES = {("exchange.declare", "type"): "exchange_type"}
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)

PER_METHOD = settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
FUZZ = settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])


def method_id(cls: type[Method]) -> str:
    return cls.NAME


# ---------------------------------------------------------------------------
# Strategies built from FIELDS
# ---------------------------------------------------------------------------


def _shortstr_text() -> st.SearchStrategy[str]:
    return st.text(max_size=60).filter(lambda s: len(s.encode()) <= 255) | st.text(
        min_size=240, max_size=255, alphabet="ab"
    )


def _shortstr_any() -> st.SearchStrategy[str]:
    # Arbitrary bytes must survive via surrogateescape.
    return _shortstr_text() | st.binary(max_size=255).map(
        lambda b: b.decode("utf-8", "surrogateescape")
    )


def _table_strategy(for_pamqp_encoder: bool) -> st.SearchStrategy[dict[str, Any]]:
    """Tables both codecs agree on.

    Ints stay within int64 and timestamps below 2**32 (pamqp reads 'L' as signed and
    guesses milliseconds for large timestamps).  When pamqp is the encoder, floats must
    be float32 (it writes 'f') and byte arrays bytearray; otherwise decimals stay
    non-negative (pamqp reads the mantissa as unsigned).
    """
    scalars = st.one_of(
        st.booleans(),
        st.integers(-(2**63), 2**63 - 1),
        st.floats(allow_nan=False, width=32 if for_pamqp_encoder else 64),
        st.text(max_size=20),
        st.binary(max_size=20).map(bytearray) if for_pamqp_encoder else st.binary(max_size=20),
        st.integers(0, 2**32 - 1).map(lambda s: EPOCH + datetime.timedelta(seconds=s)),
        st.builds(
            lambda s, u: decimal.Decimal(u).scaleb(-s),
            st.integers(0, 9),
            st.integers(-(2**31) if for_pamqp_encoder else 0, 2**31 - 1),
        ),
        st.none(),
    )
    keys = st.text(max_size=20).filter(lambda k: len(k.encode()) <= 128)
    return st.dictionaries(
        keys,
        st.one_of(
            scalars,
            st.lists(scalars, max_size=3),
            st.dictionaries(keys, scalars, max_size=3),
        ),
        max_size=5,
    )


_TABLES = {False: _table_strategy(False), True: _table_strategy(True)}

_INT_RANGES = {
    "octet": (0, 2**8 - 1),
    "short": (0, 2**16 - 1),
    "long": (0, 2**32 - 1),
    "longlong": (0, 2**64 - 1),
    "timestamp": (0, 2**64 - 1),
}


def field_values(amqp_type: str, pamqp: str = "") -> st.SearchStrategy[Any]:
    """Values Warren must round-trip.

    pamqp="decoder" / "encoder" narrows them to values pamqp handles identically
    in that role.
    """
    if amqp_type in _INT_RANGES:
        lo, hi = _INT_RANGES[amqp_type]
        if pamqp and amqp_type == "longlong":
            hi = 2**63 - 1  # pamqp reads longlong as signed
        return st.integers(lo, hi) | st.sampled_from([lo, hi])
    if amqp_type == "shortstr":
        return _shortstr_text() if pamqp else _shortstr_any()
    if amqp_type == "longstr":
        return st.binary(max_size=300)
    if amqp_type == "bit":
        return st.booleans()
    if amqp_type == "table":
        return _TABLES[pamqp == "encoder"]
    raise AssertionError(amqp_type)


def method_values(cls: type[Method], pamqp: str = "") -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({name: field_values(t, pamqp) for name, t in cls.FIELDS})


# ---------------------------------------------------------------------------
# Spec table
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "class_id", "method_id_"),
    [
        ("BasicPublish", 60, 40),
        ("BasicNack", 60, 120),
        ("ConfirmSelect", 85, 10),
        ("ConnectionBlocked", 10, 60),
        ("ConnectionUnblocked", 10, 61),
        ("ConnectionUpdateSecret", 10, 70),
        ("BasicDeliver", 60, 60),
        ("BasicAck", 60, 80),
        ("BasicReject", 60, 90),
        ("ExchangeBind", 40, 30),
        ("ExchangeUnbindOk", 40, 51),
        ("QueueUnbind", 50, 50),
        ("TxSelect", 90, 10),
    ],
)
def test_rabbitmq_method_ids(name: str, class_id: int, method_id_: int) -> None:
    cls = getattr(spec, name)
    assert (class_id, method_id_) == (cls.CLASS_ID, cls.METHOD_ID)
    assert (class_id << 16 | method_id_) == cls.INDEX
    assert METHODS[cls.INDEX] is cls


def test_every_class_in_brief_exists() -> None:
    names = (  # noqa: SIM905 - reads as the brief's list
        "ConnectionStart ConnectionStartOk ConnectionSecure ConnectionSecureOk ConnectionTune "
        "ConnectionTuneOk ConnectionOpen ConnectionOpenOk ConnectionClose ConnectionCloseOk "
        "ConnectionBlocked ConnectionUnblocked ConnectionUpdateSecret ConnectionUpdateSecretOk "
        "ChannelOpen ChannelOpenOk ChannelFlow ChannelFlowOk ChannelClose ChannelCloseOk "
        "AccessRequest AccessRequestOk ExchangeDeclare ExchangeDeclareOk ExchangeDelete "
        "ExchangeDeleteOk ExchangeBind ExchangeBindOk ExchangeUnbind ExchangeUnbindOk "
        "QueueDeclare QueueDeclareOk QueueBind QueueBindOk QueuePurge QueuePurgeOk QueueDelete "
        "QueueDeleteOk QueueUnbind QueueUnbindOk BasicQos BasicQosOk BasicConsume "
        "BasicConsumeOk BasicCancel BasicCancelOk BasicPublish BasicReturn BasicDeliver "
        "BasicGet BasicGetOk BasicGetEmpty BasicAck BasicReject BasicRecoverAsync BasicRecover "
        "BasicRecoverOk BasicNack TxSelect TxSelectOk TxCommit TxCommitOk TxRollback "
        "TxRollbackOk ConfirmSelect ConfirmSelectOk"
    ).split()
    assert {getattr(spec, n) for n in names} == set(METHODS.values())
    assert len(METHODS) == len(names) == 66


def test_method_metadata() -> None:
    assert spec.BasicPublish.NAME == "basic.publish"
    assert spec.QueueDeclareOk.NAME == "queue.declare-ok"
    assert {c.NAME for c in ALL_METHODS if c.CONTENT} == {
        "basic.publish",
        "basic.return",
        "basic.deliver",
        "basic.get-ok",
    }
    assert spec.QueueDeclare.SYNCHRONOUS and not spec.QueueDeclareOk.SYNCHRONOUS
    assert not spec.BasicPublish.SYNCHRONOUS and spec.ConfirmSelect.SYNCHRONOUS
    assert spec.BasicPublish.FIELDS == (
        ("ticket", "short"),
        ("exchange", "shortstr"),
        ("routing_key", "shortstr"),
        ("mandatory", "bit"),
        ("immediate", "bit"),
    )
    # domains resolved to base types
    assert dict(spec.QueueDeclareOk.FIELDS) == {
        "queue": "shortstr",
        "message_count": "long",
        "consumer_count": "long",
    }
    assert dict(spec.BasicConsume.FIELDS)["ticket"] == "short"
    assert dict(spec.ConnectionStart.FIELDS)["server_properties"] == "table"
    assert ("global_", "bit") in spec.BasicQos.FIELDS
    for cls in ALL_METHODS:
        assert set(cls.__slots__) == {n for n, _ in cls.FIELDS}
        assert {t for _, t in cls.FIELDS} <= {
            "octet",
            "short",
            "long",
            "longlong",
            "shortstr",
            "longstr",
            "bit",
            "table",
            "timestamp",
        }


def test_constants() -> None:
    assert (spec.FRAME_METHOD, spec.FRAME_HEADER, spec.FRAME_BODY, spec.FRAME_HEARTBEAT) == (
        1,
        2,
        3,
        8,
    )
    assert (spec.FRAME_MIN_SIZE, spec.FRAME_END, spec.REPLY_SUCCESS) == (4096, 206, 200)
    assert spec.NOT_FOUND == 404 and spec.REPLY_TEXT[404] == "NOT_FOUND"
    assert spec.REPLY_TEXT[spec.PRECONDITION_FAILED] == "PRECONDITION_FAILED"
    assert spec.NOT_IMPLEMENTED == 540 and spec.INTERNAL_ERROR == 541
    assert {311, 312, 313, 403, 404, 405, 406} == spec.SOFT_ERRORS
    assert {320, 402, 501, 502, 503, 504, 505, 506, 530, 540, 541} == spec.HARD_ERRORS
    assert not spec.SOFT_ERRORS & spec.HARD_ERRORS
    for code in spec.SOFT_ERRORS | spec.HARD_ERRORS:
        assert getattr(spec, spec.REPLY_TEXT[code]) == code
    assert spec.BASIC_CLASS_ID == 60
    assert [n for n, _ in spec.BASIC_PROPERTIES][:4] == [
        "content_type",
        "content_encoding",
        "headers",
        "delivery_mode",
    ]


def test_defaults() -> None:
    start = spec.ConnectionStart()
    assert (start.version_major, start.version_minor) == (0, 9)
    assert start.mechanisms == b"PLAIN" and start.locales == b"en_US"
    assert start.server_properties == {}
    assert spec.ConnectionOpen().virtual_host == "/"
    assert spec.ExchangeDeclare().type == "direct"
    assert spec.BasicNack().requeue is True and spec.BasicReject().requeue is True
    assert spec.AccessRequestOk().ticket == 1
    assert spec.BasicAck().delivery_tag == 0 and spec.BasicAck().multiple is False
    # Mutable defaults are not shared between instances.
    a, b = spec.QueueDeclare(), spec.QueueDeclare()
    a.arguments["x"] = 1
    assert b.arguments == {}
    assert spec.ChannelOpenOk().channel_id == b""


def test_equality_and_repr() -> None:
    a = spec.BasicAck(delivery_tag=5, multiple=True)
    assert a == spec.BasicAck(5, True)
    assert a != spec.BasicAck(5, False)
    assert a != spec.BasicNack(5, True)
    assert spec.TxSelect() == spec.TxSelect() and spec.TxSelect() != spec.TxCommit()
    assert a != object()
    assert repr(a) == "BasicAck(delivery_tag=5, multiple=True)"
    assert repr(spec.TxSelect()) == "TxSelect()"


def test_generated_file_is_up_to_date() -> None:
    sys.path.insert(0, str(REPO / "tools"))
    try:
        import gen_amqp_spec
    finally:
        sys.path.pop(0)
    if not gen_amqp_spec.DEFAULT_SPEC.exists():
        pytest.skip("spec JSON not available")
    text = gen_amqp_spec.generate(
        gen_amqp_spec.load_spec(gen_amqp_spec.DEFAULT_SPEC), gen_amqp_spec.DEFAULT_SPEC.name
    )
    assert text == (REPO / "src/warren/amqp/spec.py").read_text(encoding="utf-8")
    assert text.startswith("# Generated by tools/gen_amqp_spec.py")


# ---------------------------------------------------------------------------
# Exact wire bytes
# ---------------------------------------------------------------------------


def test_basic_publish_wire_bytes() -> None:
    raw = b"\x00\x3c\x00\x28" + b"\x00\x00" + b"\x03amq" + b"\x02rk" + b"\x01"
    assert spec.BasicPublish(exchange="amq", routing_key="rk", mandatory=True).encode() == raw
    assert decode_method(raw) == spec.BasicPublish(0, "amq", "rk", True, False)


def test_basic_deliver_and_nack_wire_bytes() -> None:
    m = spec.BasicDeliver("c", 2**64 - 1, True, "", "r")
    assert m.encode() == b"\x00\x3c\x00\x3c\x01c" + b"\xff" * 8 + b"\x01\x00\x01r"
    nack = spec.BasicNack(delivery_tag=7, multiple=False, requeue=True)
    assert nack.encode() == b"\x00\x3c\x00\x78" + struct.pack(">Q", 7) + b"\x02"


def test_bits_pack_lsb_first_into_one_octet() -> None:
    m = spec.ExchangeDeclare(exchange="e", passive=True, nowait=True)
    raw = m.encode()
    # ticket, exchange, type 'direct', bits, empty table
    assert raw == b"\x00\x28\x00\x0a\x00\x00\x01e\x06direct\x11\x00\x00\x00\x00"
    req = spec.AccessRequest(
        realm="", exclusive=False, passive=True, active=False, write=True, read=True
    )
    assert req.encode()[-1] == 0b11010
    qd = spec.QueueDeclare(auto_delete=True, arguments={"x-max-length": 5})
    decoded = decode_method(qd.encode())
    assert isinstance(decoded, spec.QueueDeclare)
    assert (
        decoded.auto_delete and not decoded.exclusive and decoded.arguments == {"x-max-length": 5}
    )


def test_field_value_types() -> None:
    m = spec.ConnectionStartOk(
        client_properties={"product": "x"}, mechanism="PLAIN", response="\0u\0p", locale="en_US"
    )
    assert m.response == b"\0u\0p"  # longstr given as str is stored utf-8 encoded
    decoded = decode_method(m.encode())
    assert isinstance(decoded, spec.ConnectionStartOk)
    assert decoded == m and isinstance(decoded.response, bytes)


def test_shortstr_limits() -> None:
    assert decode_method(spec.BasicConsumeOk("x" * 255).encode()) == spec.BasicConsumeOk("x" * 255)
    with pytest.raises(ValueError):
        spec.BasicConsumeOk("x" * 256).encode()
    with pytest.raises(ValueError):
        spec.BasicPublish(routing_key="é" * 128).encode()  # 256 bytes
    with pytest.raises(ValueError):
        spec.BasicAck(delivery_tag=2**64).encode()
    with pytest.raises(ValueError):
        spec.ConnectionTune(channel_max=-1).encode()


def test_shortstr_arbitrary_bytes_round_trip() -> None:
    raw = b"\x00\x3c\x00\x15" + b"\x03\xff\xfe\x80"
    m = decode_method(raw)
    assert isinstance(m, spec.BasicConsumeOk)
    assert m.encode() == raw


# ---------------------------------------------------------------------------
# Round trips for every method
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("cls", ALL_METHODS, ids=method_id)
@PER_METHOD
@given(data=st.data())
def test_round_trip(cls: type[Method], data: st.DataObject) -> None:
    values = data.draw(method_values(cls))
    m = cls(**values)
    payload = m.encode()
    assert isinstance(payload, bytes)
    assert payload[:4] == struct.pack(">HH", cls.CLASS_ID, cls.METHOD_ID)
    decoded = decode_method(payload)
    assert type(decoded) is cls
    assert decoded == m
    for name, _ in cls.FIELDS:
        assert getattr(decoded, name) == values[name]
    assert decode_method(memoryview(payload)) == m
    assert decode_method(bytearray(payload)) == m
    assert cls.decode(b"\xaa" * 7 + payload, 11) == m
    # RabbitMQ rejects bytes after the last argument (501), so the codec does too.
    with pytest.raises(DecodeError):
        decode_method(payload + b"\x00trailing")
    assert decoded.encode() == payload


@pytest.mark.parametrize("cls", WITH_FIELDS, ids=method_id)
@settings(max_examples=examples(15), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_truncation_is_a_decode_error(cls: type[Method], data: st.DataObject) -> None:
    payload = cls(**data.draw(method_values(cls))).encode()
    for cut in range(len(payload)):
        with pytest.raises(DecodeError):
            decode_method(payload[:cut])
        with pytest.raises(DecodeError):
            cls.decode(memoryview(payload)[:cut])


def test_argumentless_methods_ignore_body() -> None:
    for cls in ALL_METHODS:
        if not cls.FIELDS:
            assert cls().encode() == struct.pack(">HH", cls.CLASS_ID, cls.METHOD_ID)
            assert decode_method(cls().encode()) == cls()
    for cut in range(4):
        with pytest.raises(DecodeError):
            decode_method(spec.TxSelect().encode()[:cut])


# ---------------------------------------------------------------------------
# pamqp as an independent oracle
# ---------------------------------------------------------------------------


def _pamqp_name(cls: type[Method], name: str) -> str:
    return PAMQP_NAMES.get((cls.NAME, name), name)


def _normalise(value: Any) -> Any:
    if isinstance(value, bytearray):
        return bytes(value)
    if isinstance(value, list):
        return [_normalise(v) for v in value]
    if isinstance(value, dict):
        return {k: _normalise(v) for k, v in value.items()}
    return value


def _frame(payload: bytes) -> bytes:
    return struct.pack(">BHI", 1, 1, len(payload)) + payload + b"\xce"


@pytest.mark.parametrize("cls", IN_PAMQP, ids=method_id)
@PER_METHOD
@given(data=st.data())
def test_pamqp_decodes_warren_encoding(cls: type[Method], data: st.DataObject) -> None:
    values = data.draw(method_values(cls, pamqp="decoder"))
    frame = _frame(cls(**values).encode())
    consumed, channel, theirs = pframe.unmarshal(frame)
    assert (consumed, channel) == (len(frame), 1)
    assert isinstance(theirs, pbase.Frame) and theirs.index == cls.INDEX
    for name, amqp_type in cls.FIELDS:
        got = getattr(theirs, _pamqp_name(cls, name))
        if amqp_type == "longstr":  # pamqp returns str when the bytes are UTF-8
            got = got.encode() if isinstance(got, str) else bytes(got)
        assert _normalise(got) == values[name], name


@pytest.mark.parametrize("cls", IN_PAMQP, ids=method_id)
@PER_METHOD
@given(data=st.data())
def test_warren_decodes_pamqp_encoding(cls: type[Method], data: st.DataObject) -> None:
    values = data.draw(method_values(cls, pamqp="encoder"))
    pcls: Any = pcommands.INDEX_MAPPING[cls.INDEX]
    kwargs: dict[str, Any] = {}
    for name, amqp_type in cls.FIELDS:
        value = values[name]
        if amqp_type == "longstr":
            # pamqp only encodes str longstrs; keep to bytes that are valid UTF-8
            value = value.decode("utf-8", "replace")
            values[name] = value.encode()
        kwargs[_pamqp_name(cls, name)] = value
    # pamqp validates values against RabbitMQ's naming rules; the codec must not care.
    with mock.patch.object(pcls, "validate", lambda self: None):
        payload = struct.pack(">I", pcls.index) + pcls(**kwargs).marshal()
    ours = decode_method(payload)
    assert type(ours) is cls
    for name, _ in cls.FIELDS:
        assert getattr(ours, name) == values[name], name


def test_pamqp_field_types_match_ours() -> None:
    for cls in IN_PAMQP:
        pcls: Any = pcommands.INDEX_MAPPING[cls.INDEX]
        ours = [(_pamqp_name(cls, n), t) for n, t in cls.FIELDS]
        theirs = [(a, pcls.amqp_type(a)) for a in pcls.__slots__]
        assert ours == theirs, cls.NAME
    # pamqp 4 lacks the (RabbitMQ-deprecated but still defined) access class.
    assert {c.NAME for c in ALL_METHODS if c not in IN_PAMQP} == {
        "access.request",
        "access.request-ok",
    }


# ---------------------------------------------------------------------------
# Hostile input
# ---------------------------------------------------------------------------


def _decode_or_decode_error(payload: bytes) -> Method | None:
    try:
        result = decode_method(payload)
    except DecodeError:
        return None
    assert isinstance(result, Method)
    return result


@FUZZ
@given(st.binary(max_size=80))
def test_arbitrary_bytes(payload: bytes) -> None:
    _decode_or_decode_error(payload)


@FUZZ
@given(st.sampled_from(sorted(METHODS)), st.binary(max_size=120))
def test_arbitrary_arguments_for_known_ids(index: int, body: bytes) -> None:
    result = _decode_or_decode_error(struct.pack(">I", index) + body)
    if result is not None:
        assert index == result.INDEX
        assert isinstance(result.encode(), bytes)


@FUZZ
@given(st.sampled_from(ALL_METHODS), st.data())
def test_mutated_encodings(cls: type[Method], data: st.DataObject) -> None:
    payload = bytearray(cls(**data.draw(method_values(cls))).encode())
    for _ in range(data.draw(st.integers(1, 3))):
        pos = data.draw(st.integers(0, len(payload) - 1))
        payload[pos] = data.draw(st.integers(0, 255))
    _decode_or_decode_error(bytes(payload))


def test_unknown_method() -> None:
    with pytest.raises(UnknownMethod) as info:
        decode_method(b"\x00\x3c\x00\x29rest")
    assert (info.value.class_id, info.value.method_id) == (60, 41)
    assert isinstance(info.value, DecodeError) and isinstance(info.value, ValueError)
    with pytest.raises(UnknownMethod):
        decode_method(b"\xff\xff\xff\xff")


def test_known_bad_payloads() -> None:
    cases = [
        b"",
        b"\x00",
        b"\x00\x3c\x00",
        b"\x00\x3c\x00\x50\x00",  # ack with a 1-byte delivery tag
        b"\x00\x3c\x00\x3c\x05ab",  # deliver with a short consumer tag
        b"\x00\x32\x00\x0a\x00\x00\x00\x00\x00\xff\xff\xff\xff",  # queue.declare, huge table length
        b"\x00\x32\x00\x0a\x00\x00\x00\x00\x00\x00\x00\x03\x01kZ",  # unknown table tag
    ]
    for payload in cases:
        with pytest.raises(DecodeError):
            decode_method(payload)
