"""AMQP 1.0 performatives and composite types (warren.amqp1.performatives) against
python-qpid-proton's Data: ours decoded by proton as described lists with the
right codes and fields, proton's decoded by us, defaults, mandatory fields, and
hypothesis round trips of every registered type."""

from __future__ import annotations

import dataclasses
from typing import Any

import proton
import pytest
from amqp1help import any_instance
from hypothesis import HealthCheck, given, settings
from protonhelp import proton_decode, proton_encode

from warren.amqp1 import codec
from warren.amqp1 import formats as f
from warren.amqp1 import performatives as p
from warren.amqp1.codec import DecodeError, decode
from warren.amqp1.types import Array, Described, Symbol, UByte, UInt, ULong, UShort


def encoded(value: Any) -> bytes:
    out = bytearray()
    codec.encode(value, out)
    return bytes(out)


def described(code: int, *fields: Any) -> Described:
    return Described(ULong(code), list(fields))


SYMS = Array(f.SYM8, (Symbol("a"), Symbol("b")))

#: Ours, and what proton reads in our bytes: defaults are null, trailing nulls gone.
AS_PROTON_READS: list[tuple[Any, Described]] = [
    (p.Open(container_id="c"), described(0x10, "c")),
    (
        p.Open(
            container_id="c",
            hostname="h",
            max_frame_size=65536,
            channel_max=7,
            idle_time_out=30000,
            outgoing_locales=("en",),
            incoming_locales=(Symbol("fr"),),
            offered_capabilities=(Symbol("a"), Symbol("b")),
            desired_capabilities=("x",),
            properties={"product": "warren", Symbol("v"): UInt(1)},
        ),
        described(
            0x10,
            "c",
            "h",
            UInt(65536),
            UShort(7),
            UInt(30000),
            Array(f.SYM8, (Symbol("en"),)),
            Array(f.SYM8, (Symbol("fr"),)),
            SYMS,
            Array(f.SYM8, (Symbol("x"),)),
            {Symbol("product"): "warren", Symbol("v"): UInt(1)},
        ),
    ),
    (p.Open(container_id="c", max_frame_size=p.UINT_MAX, channel_max=65535), described(0x10, "c")),
    (
        p.Begin(
            remote_channel=0,
            next_outgoing_id=1,
            incoming_window=2048,
            outgoing_window=2048,
            handle_max=255,
        ),
        described(0x11, UShort(0), UInt(1), UInt(2048), UInt(2048), UInt(255)),
    ),
    (
        p.Begin(next_outgoing_id=0, incoming_window=0, outgoing_window=0),
        described(0x11, None, UInt(0), UInt(0), UInt(0)),
    ),
    (
        p.Attach(
            name="l",
            handle=3,
            role=p.RECEIVER,
            snd_settle_mode=p.SND_SETTLED,
            rcv_settle_mode=p.RCV_SECOND,
            source=p.Source(
                address="/queues/q",
                durable=2,
                expiry_policy=Symbol("never"),
                filter={"f": Described(Symbol("x:f"), "a")},
            ),
            target=p.Target(address=None, dynamic=True),
            max_message_size=ULong(1 << 40),
            initial_delivery_count=5,
        ),
        described(
            0x12,
            "l",
            UInt(3),
            True,
            UByte(1),
            UByte(1),
            described(
                0x28,
                "/queues/q",
                UInt(2),
                Symbol("never"),
                None,
                None,
                None,
                None,
                {Symbol("f"): Described(Symbol("x:f"), "a")},
            ),
            described(0x29, None, None, None, None, True),
            None,
            None,
            UInt(5),
            ULong(1 << 40),
        ),
    ),
    (
        p.Attach(name="l", handle=0, role=p.SENDER, snd_settle_mode=p.SND_MIXED),
        described(0x12, "l", UInt(0), False),
    ),
    (
        p.Flow(
            next_incoming_id=1,
            incoming_window=10,
            next_outgoing_id=2,
            outgoing_window=10,
            handle=0,
            delivery_count=3,
            link_credit=100,
            drain=True,
            echo=False,
        ),
        described(
            0x13, UInt(1), UInt(10), UInt(2), UInt(10), UInt(0), UInt(3), UInt(100), None, True
        ),
    ),
    (
        p.Transfer(
            handle=0,
            delivery_id=7,
            delivery_tag=b"\x00\x01",
            message_format=0,
            settled=True,
            more=False,
        ),
        described(0x14, UInt(0), UInt(7), b"\x00\x01", UInt(0), True),
    ),
    (
        p.Transfer(handle=1, more=True, state=p.Accepted()),
        described(0x14, UInt(1), None, None, None, None, True, None, described(0x24)),
    ),
    (
        p.Disposition(
            role=p.RECEIVER,
            first=1,
            last=9,
            settled=True,
            state=p.Modified(delivery_failed=True, message_annotations={"x-k": 1}),
        ),
        described(
            0x15, True, UInt(1), UInt(9), True, described(0x27, True, None, {Symbol("x-k"): 1})
        ),
    ),
    (
        p.Disposition(
            role=p.SENDER, first=0, state=p.Rejected(p.Error(Symbol("amqp:x"), "why", {"k": "v"}))
        ),
        described(
            0x15,
            False,
            UInt(0),
            None,
            None,
            described(0x25, described(0x1D, Symbol("amqp:x"), "why", {Symbol("k"): "v"})),
        ),
    ),
    (
        p.Disposition(role=p.SENDER, first=0, state=p.Received(section_number=1, section_offset=2)),
        described(0x15, False, UInt(0), None, None, described(0x23, UInt(1), ULong(2))),
    ),
    (
        p.Disposition(role=p.SENDER, first=0, state=p.Released()),
        described(0x15, False, UInt(0), None, None, described(0x26)),
    ),
    (
        p.Detach(handle=2, closed=True, error=p.Error(Symbol("amqp:not-found"))),
        described(0x16, UInt(2), True, described(0x1D, Symbol("amqp:not-found"))),
    ),
    (p.End(), described(0x17)),
    (
        p.Close(error=p.Error(Symbol("amqp:connection:forced"), "bye")),
        described(0x18, described(0x1D, Symbol("amqp:connection:forced"), "bye")),
    ),
    (
        p.SaslMechanisms(sasl_server_mechanisms=("PLAIN", "ANONYMOUS")),
        described(0x40, Array(f.SYM8, (Symbol("PLAIN"), Symbol("ANONYMOUS")))),
    ),
    (
        p.SaslInit(mechanism=Symbol("PLAIN"), initial_response=b"\x00u\x00p", hostname="h"),
        described(0x41, Symbol("PLAIN"), b"\x00u\x00p", "h"),
    ),
    (p.SaslChallenge(challenge=b"c"), described(0x42, b"c")),
    (p.SaslResponse(response=b""), described(0x43, b"")),
    (p.SaslOutcome(code=p.SASL_AUTH, additional_data=b"d"), described(0x44, UByte(1), b"d")),
    (p.SaslOutcome(code=p.SASL_OK), described(0x44, UByte(0))),
    (
        p.Source(
            outcomes=("amqp:accepted:list",),
            capabilities=("queue",),
            default_outcome=p.Released(),
            distribution_mode=Symbol("move"),
            timeout=5,
            dynamic_node_properties={"lifetime-policy": p.DeleteOnClose()},
        ),
        described(
            0x28,
            None,
            None,
            None,
            UInt(5),
            None,
            {Symbol("lifetime-policy"): described(0x2B)},
            Symbol("move"),
            None,
            described(0x26),
            Array(f.SYM8, (Symbol("amqp:accepted:list"),)),
            Array(f.SYM8, (Symbol("queue"),)),
        ),
    ),
    (p.DeleteOnNoLinks(), described(0x2C)),
    (p.DeleteOnNoMessages(), described(0x2D)),
    (p.DeleteOnNoLinksOrMessages(), described(0x2E)),
]


@pytest.mark.parametrize(("ours", "theirs"), AS_PROTON_READS, ids=lambda v: type(v).__name__)
def test_proton_reads_ours_and_we_read_protons(ours: Any, theirs: Described) -> None:
    raw = encoded(ours)
    assert proton_decode(raw) == theirs
    assert decode(raw) == (ours, len(raw))
    assert decode(proton_encode(theirs))[0] == ours


def _types_in(value: Any) -> set[type]:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        found = {type(value)}
        for fld in dataclasses.fields(value):
            found |= _types_in(getattr(value, fld.name))
        return found
    if isinstance(value, dict):
        return set().union(*map(_types_in, value.values()))
    return set()


def test_every_registered_type_is_exercised() -> None:
    assert set().union(*(_types_in(ours) for ours, _ in AS_PROTON_READS)) - {Described} == set(
        p.LAYOUTS
    )


def test_absent_and_null_fields_take_their_defaults() -> None:
    attach = decode(proton_encode(described(0x12, "l", UInt(0), True)))[0]
    assert attach == p.Attach(name="l", handle=0, role=True)
    assert (attach.snd_settle_mode, attach.rcv_settle_mode, attach.incomplete_unsettled) == (
        2,
        0,
        False,
    )
    opened = decode(proton_encode(described(0x10, "c", None, None, None)))[0]
    assert (opened.max_frame_size, opened.channel_max, opened.hostname) == (4294967295, 65535, None)
    source = decode(proton_encode(described(0x28)))[0]
    assert (source.durable, source.expiry_policy, source.timeout, source.dynamic) == (
        0,
        "session-end",
        0,
        False,
    )
    begin = decode(proton_encode(described(0x11, None, UInt(0), UInt(1), UInt(1))))[0]
    assert begin.handle_max == 4294967295
    assert decode(proton_encode(described(0x14, UInt(0))))[0].more is False


def test_longer_lists_than_the_spec_are_read() -> None:
    """A later version's extra fields are ignored, not refused."""
    assert decode(proton_encode(described(0x17, None, "extra")))[0] == p.End()


def test_a_single_symbol_for_a_multiple_field() -> None:
    opened = decode(
        proton_encode(described(0x10, "c", None, None, None, None, None, None, Symbol("one")))
    )[0]
    assert opened.offered_capabilities == (Symbol("one"),)


def test_descriptor_by_name() -> None:
    raw = proton_encode(Described(Symbol("amqp:flow:list"), [None, UInt(1), UInt(2), UInt(3)]))
    assert decode(raw)[0] == p.Flow(incoming_window=1, next_outgoing_id=2, outgoing_window=3)


@pytest.mark.parametrize(
    "theirs",
    [
        described(0x10),
        described(0x10, None, "h"),
        described(0x11, None, UInt(0), UInt(1)),
        described(0x12, "l", UInt(0)),
        described(0x14),
        described(0x15, True),
        described(0x16),
        described(0x1D),
        described(0x23, UInt(1)),
        described(0x41),
        described(0x44),
        described(0x15, False, UInt(0), None, None, described(0x25, described(0x1D))),
    ],
    ids=repr,
)
def test_missing_mandatory_field_is_invalid_field(theirs: Described) -> None:
    with pytest.raises(DecodeError) as caught:
        decode(proton_encode(theirs))
    assert caught.value.condition == "amqp:invalid-field"


@pytest.mark.parametrize(
    "theirs",
    [
        described(0x10, 5),
        described(0x10, "c", None, -1),
        described(0x10, "c", None, ULong(1 << 33)),
        described(0x10, "c", None, None, UInt(70000)),
        described(0x12, "l", UInt(0), UInt(1)),
        described(0x12, "l", UInt(0), True, UInt(300)),
        described(0x14, UInt(0), None, "tag"),
        described(0x14, UInt(0), None, None, None, None, UInt(1)),
        described(0x10, "c", None, None, None, None, None, None, [UInt(1)]),
        described(0x10, "c", None, None, None, None, None, None, None, None, [1]),
        described(0x16, UInt(0), None, "not an error"),
        described(0x41, UInt(1)),
        described(0x10, True),
    ],
    ids=repr,
)
def test_wrong_field_types_are_decode_errors(theirs: Described) -> None:
    with pytest.raises(DecodeError) as caught:
        decode(proton_encode(theirs))
    assert caught.value.condition == "amqp:decode-error"


def test_not_a_list_is_a_decode_error() -> None:
    with pytest.raises(DecodeError):
        decode(proton_encode(Described(ULong(0x10), {"a": 1})))


def test_encoding_a_mandatory_none_is_refused() -> None:
    # Compiled (mypyc), the dataclass itself refuses None for an int field.
    with pytest.raises((ValueError, TypeError)):
        encoded(p.Transfer(handle=None))  # type: ignore[arg-type]


def test_large_performatives_use_list32() -> None:
    big = p.Open(container_id="c" * 300)
    raw = encoded(big)
    assert raw[3] == f.LIST32
    assert proton_decode(raw) == described(0x10, "c" * 300)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(any_instance)
def test_round_trips_through_us_and_proton(value: Any) -> None:
    raw = encoded(value)
    assert decode(raw) == (value, len(raw))
    theirs = proton_decode(raw)
    assert isinstance(theirs, Described)
    assert theirs.descriptor == p.LAYOUTS[type(value)][0]
    assert decode(proton_encode(theirs))[0] == value


def test_data_encodes_performatives_as_proton_would_frame_them() -> None:
    """proton's own encoding of a flow (from its Data API) decodes to ours."""
    data = proton.Data()
    data.put_described()
    data.enter()
    data.put_ulong(0x13)
    data.put_list()
    data.enter()
    data.put_null()
    data.put_uint(100)
    data.put_uint(0)
    data.put_uint(100)
    data.exit()
    data.exit()
    assert decode(data.encode())[0] == p.Flow(
        incoming_window=100, next_outgoing_id=0, outgoing_window=100
    )
