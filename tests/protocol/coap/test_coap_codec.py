"""CoAP's wire format (coap/codec.py) against aiocoap's own codec: what one
encodes the other decodes, and what RFC 7252 calls a format error is refused."""

from __future__ import annotations

import pytest
from aiocoap.message import Direction
from aiocoap.message import Message as Oracle
from aiocoap.numbers.codes import Code
from aiocoap.numbers.types import Type
from hypothesis import given
from hypothesis import strategies as st

from warren.coap import codec as C
from warren.core.codec_errors import DecodeError

# Opaque options (aiocoap decodes the others to strings and integers).
OPTION_NUMBERS = st.sampled_from([1, 4, 252, 292, 2049, 65000])


@given(
    mtype=st.integers(0, 3),
    code=st.integers(1, 255),
    mid=st.integers(0, 0xFFFF),
    token=st.binary(max_size=8),
    options=st.lists(st.tuples(OPTION_NUMBERS, st.binary(max_size=300)), max_size=6),
    payload=st.binary(max_size=200),
)
def test_what_warren_encodes_aiocoap_decodes(
    mtype: int, code: int, mid: int, token: bytes, options: list[tuple[int, bytes]], payload: bytes
) -> None:
    msg = C.CoAPMessage(mtype, code, mid, token, options, payload)
    data = C.encode(msg)
    oracle = Oracle.decode(data)
    assert (oracle.mtype, int(oracle.code), oracle.mid, oracle.token) == (mtype, code, mid, token)
    assert oracle.payload == payload
    got = sorted((o.number, o.encode()) for o in oracle.opt.option_list())
    assert got == sorted((n, v) for n, v in options)
    assert C.decode(data) == C.CoAPMessage(
        mtype, code, mid, token, sorted(options, key=lambda o: o[0]), payload
    )


def test_what_aiocoap_encodes_warren_decodes() -> None:
    oracle = Oracle(
        code=Code.POST,
        uri="coap://h/ps/a/b?u=guest&p=guest",
        payload=b"21.5",
        content_format=50,
        observe=0,
    )
    oracle.mtype = Type.CON
    oracle.mid = 0x1234
    oracle.token = b"\x01\x02"
    oracle.direction = Direction.OUTGOING
    msg = C.decode(oracle.encode())
    assert (msg.mtype, msg.code, msg.mid, msg.token) == (C.CON, C.POST, 0x1234, b"\x01\x02")
    assert msg.all(C.URI_PATH) == [b"ps", b"a", b"b"]
    assert msg.all(C.URI_QUERY) == [b"u=guest", b"p=guest"]
    assert msg.option(C.CONTENT_FORMAT) == C.encode_uint(50)
    assert msg.option(C.OBSERVE) == b""  # 0: no bytes
    assert msg.payload == b"21.5"


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x40\x01\x00",  # shorter than a header
        b"\x80\x01\x00\x01",  # version 2
        b"\x49\x01\x00\x01" + b"t" * 9,  # token length 9
        b"\x44\x01\x00\x01ab",  # token cut short
        b"\x41\x00\x00\x01t",  # an empty message with a token
        b"\x40\x01\x00\x01\xff",  # a marker without payload
        b"\x40\x01\x00\x01\xf1x",  # option delta 15
        b"\x40\x01\x00\x01\xb5ab",  # option value cut short
        b"\x40\x01\x00\x01\xd1",  # extended delta missing
    ],
)
def test_format_errors_are_refused(data: bytes) -> None:
    with pytest.raises(DecodeError):
        C.decode(data)


def test_uints_take_the_fewest_bytes() -> None:
    assert [C.encode_uint(v) for v in (0, 1, 255, 256, 1 << 24)] == [
        b"",
        b"\x01",
        b"\xff",
        b"\x01\x00",
        b"\x01\x00\x00\x00",
    ]
    assert C.decode_uint(b"\x01\x00") == 256
