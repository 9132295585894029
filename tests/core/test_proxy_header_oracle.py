"""PROXY protocol headers built by the ``proxy-protocol`` package (an encoder
independent of Warren's parser, warren/proxy_header.py), read back as a
listener reads them."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st
from proxyhelp import TRAILER, read_as_listener

pytest.importorskip("proxyprotocol")
from proxyprotocol.result import (  # noqa: E402
    ProxyResultIPv4,
    ProxyResultIPv6,
    ProxyResultLocal,
)
from proxyprotocol.tlv import ProxyProtocolTLV  # noqa: E402
from proxyprotocol.v1 import ProxyProtocolV1  # noqa: E402
from proxyprotocol.v2 import ProxyProtocolV2  # noqa: E402

ipv4 = st.ip_addresses(v=4)
ipv6 = st.ip_addresses(v=6)
ports = st.integers(0, 65535)
tlvs = st.dictionaries(
    st.integers(0xE0, 0xEF), st.binary(max_size=40), max_size=4
)  # custom types: the encoder adds no checksum to them


@given(ipv4, ipv4, ports, ports, st.booleans())
def test_ipv4_from_the_encoder(
    src: ipaddress.IPv4Address, dst: ipaddress.IPv4Address, sport: int, dport: int, v2: bool
) -> None:
    result = ProxyResultIPv4((src, sport), (dst, dport))
    encoder = ProxyProtocolV2() if v2 else ProxyProtocolV1()
    header, rest = read_as_listener(encoder.pack(result) + TRAILER)
    assert rest == TRAILER
    assert header.version == (2 if v2 else 1)
    assert header.source == (str(src), sport)
    assert header.dest == (str(dst), dport)
    assert not header.local


@given(ipv6, ipv6, ports, ports, st.booleans(), tlvs)
def test_ipv6_from_the_encoder(
    src: ipaddress.IPv6Address,
    dst: ipaddress.IPv6Address,
    sport: int,
    dport: int,
    v2: bool,
    tlv: dict[int, bytes],
) -> None:
    if v2:
        result = ProxyResultIPv6((src, sport), (dst, dport), tlv=ProxyProtocolTLV(init=tlv))
        data = ProxyProtocolV2().pack(result)
    else:
        data = ProxyProtocolV1().pack(ProxyResultIPv6((src, sport), (dst, dport)))
    header, rest = read_as_listener(data + TRAILER)
    assert rest == TRAILER
    assert header.source is not None and header.dest is not None
    assert ipaddress.ip_address(header.source[0]) == src and header.source[1] == sport
    assert ipaddress.ip_address(header.dest[0]) == dst and header.dest[1] == dport
    if v2:
        assert {k: v for k, v in header.tlvs if k in tlv} == tlv


def test_local_keeps_the_socket_address() -> None:
    header, rest = read_as_listener(ProxyProtocolV2().pack(ProxyResultLocal()) + TRAILER)
    assert header.local and header.source is None and rest == TRAILER
