"""The PROXY protocol header parser (warren/proxy_header.py), in memory: headers
built by hand per HAProxy's proxy-protocol.txt, read as a listener reads them,
garbage refused, any bytes (Hypothesis); test_proxy_header_oracle.py has the
headers of an independent encoder."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st
from proxyhelp import TRAILER, read_as_listener

from warren.proxy_header import V1_MAX, V2_SIGNATURE, ProxyHeaderError, parse


def test_v1_by_hand() -> None:
    header, _ = read_as_listener(b"PROXY TCP4 192.0.2.7 198.51.100.1 56324 5672\r\n")
    assert header.source == ("192.0.2.7", 56324) and header.dest == ("198.51.100.1", 5672)
    unknown, rest = read_as_listener(b"PROXY UNKNOWN ff:: ::1 1 2\r\nX")
    assert unknown.source is None and rest == b"X"
    addresses = b"ffff:" * 7 + b"ffff " + b"ffff:" * 7 + b"ffff 65535 65535\r\n"
    assert read_as_listener(b"PROXY TCP6 " + addresses)[0].source == ("ffff:" * 7 + "ffff", 65535)
    longest = b"PROXY UNKNOWN " + addresses  # the spec's longest line
    assert len(longest) == V1_MAX and read_as_listener(longest)[0].length == V1_MAX
    with pytest.raises(ProxyHeaderError):
        read_as_listener(b"PROXY UNKNOWN " + b"f" + addresses)


def v2(ver_cmd: int, fam: int, body: bytes) -> bytes:
    return V2_SIGNATURE + struct.pack("!BBH", ver_cmd, fam, len(body)) + body


def test_v2_by_hand_with_tlvs_and_unspec() -> None:
    body = bytes([10, 0, 0, 1, 10, 0, 0, 2]) + struct.pack("!HH", 1234, 5672)
    body += b"\x04\x00\x00" + b"\x20\x00\x02ab"  # NOOP, empty; and a 2-byte one
    header, rest = read_as_listener(v2(0x21, 0x11, body) + TRAILER)
    assert header.source == ("10.0.0.1", 1234) and rest == TRAILER
    assert header.tlvs == ((0x04, b""), (0x20, b"ab"))
    unspec, _ = read_as_listener(v2(0x21, 0x00, b"ignored"))
    assert unspec.source is None and not unspec.local
    unix, _ = read_as_listener(v2(0x21, 0x31, b"/a".ljust(108, b"\0") + b"/b".ljust(108, b"\0")))
    assert unix.source is None


@pytest.mark.parametrize(
    "data",
    [
        b"GET / HTTP/1.1\r\n",
        b"AMQP\x00\x00\x09\x01",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",  # a TLS ClientHello
        b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n",
        b"PROXY TCP5 1.2.3.4 5.6.7.8 1 2\r\n",
        b"PROXY TCP4 1.2.3.400 5.6.7.8 1 2\r\n",
        b"PROXY TCP4 ::1 5.6.7.8 1 2\r\n",
        b"PROXY TCP4 1.2.3.4 5.6.7.8 65536 2\r\n",
        b"PROXY TCP4 1.2.3.4 5.6.7.8 01 2\r\n",
        b"PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n",
        b"PROXY TCP4 1.2.3.4 " + b"x" * 120,
        v2(0x11, 0x11, bytes(12)),  # version 1 in a v2 header
        v2(0x22, 0x11, bytes(12)),  # command 2
        v2(0x21, 0x41, bytes(12)),  # family 4
        v2(0x21, 0x11, bytes(11)),  # address block too short
        v2(0x21, 0x11, bytes(12) + b"\x20\x00\x05ab"),  # TLV overruns
        v2(0x21, 0x11, bytes(12) + b"\x20\x00"),  # truncated TLV
    ],
)
def test_garbage_is_refused(data: bytes) -> None:
    with pytest.raises(ProxyHeaderError):
        read_as_listener(data + bytes(200))


@given(st.binary(max_size=300))
def test_any_bytes_give_a_header_an_error_or_a_read_within_the_header(data: bytes) -> None:
    """Whatever the bytes, parse answers without another exception, never asks for
    more than the longest header could still need, and a header it finds in a
    prefix is the same in the whole."""
    try:
        result = parse(data)
    except ProxyHeaderError:
        return
    if isinstance(result, int):
        assert 1 <= result <= 16 + 65535
    else:
        assert result.length <= len(data)
        assert parse(data[: result.length]) == result


@given(st.binary(min_size=1, max_size=60))
def test_a_v2_header_with_random_body_never_reads_past_its_end(body: bytes) -> None:
    data = v2(0x21, body[0] & 0x33, body[1:])
    try:
        header, rest = read_as_listener(data + TRAILER)
    except ProxyHeaderError:
        return
    assert rest == TRAILER and header.length == len(data)
