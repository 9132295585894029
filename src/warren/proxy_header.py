"""The PROXY protocol header (HAProxy's, v1 text and v2 binary), sans-IO.

A load balancer in front of the broker (HAProxy, AWS NLB, ...) may open each
connection with one header that names the client it accepted; with a
listener's ``proxy_protocol`` on, that client is the connection's peer
(RabbitMQ's and LavinMQ's ``proxy_protocol``). :func:`parse` takes the bytes
read so far and gives the header, or how many more bytes may be read without
reading past its end: the caller reads exactly that many, so the first byte of
what follows (a TLS ClientHello, an AMQP protocol header) stays in the socket
for the listener's own protocol. v2's TLVs are walked, checked and ignored.
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass
from typing import Final

__all__ = ["V1_MAX", "V2_SIGNATURE", "ProxyHeader", "ProxyHeaderError", "parse"]

#: v2's 12-byte signature.
V2_SIGNATURE: Final = b"\r\n\r\n\x00\r\nQUIT\n"
_V1_PREFIX: Final = b"PROXY "
#: v1's longest line, CRLF included (the spec's 107).
V1_MAX: Final = 107
#: No header is shorter ("PROXY UNKNOWN\r\n"; v2's fixed part is 16): what to read first.
_MIN_HEADER: Final = 15
_V2_FIXED: Final = 16
#: v2 address block sizes by family nibble (INET, INET6, UNIX).
_V2_ADDRESS_SIZE: Final = {0x1: 12, 0x2: 36, 0x3: 216}

Address = tuple[str, int]


class ProxyHeaderError(ValueError):
    """The bytes are not a valid PROXY header: the connection is to be closed."""


@dataclass(frozen=True, slots=True)
class ProxyHeader:
    """A parsed header. ``source``/``dest`` are None when the connection's own
    socket addresses stand (v1 UNKNOWN, v2 LOCAL, v2 UNSPEC or UNIX)."""

    version: int
    #: Its length in bytes (what the caller consumed).
    length: int
    source: Address | None = None
    dest: Address | None = None
    #: v2's LOCAL command (a health check by the proxy itself).
    local: bool = False
    #: v2's TLVs (type, value), in order; ignored by the broker.
    tlvs: tuple[tuple[int, bytes], ...] = ()


def parse(data: bytes | bytearray) -> ProxyHeader | int:
    """The header ``data`` starts with, or (an int >= 1) how many more bytes can
    be read without passing its end. ProxyHeaderError as soon as ``data`` cannot
    begin a valid header."""
    if len(data) < _MIN_HEADER:
        head = bytes(data[:12])
        if not (V2_SIGNATURE.startswith(head) or _prefix_match(head, _V1_PREFIX)):
            raise ProxyHeaderError("not a PROXY protocol header")
        return _MIN_HEADER - len(data)
    if data.startswith(_V1_PREFIX):
        return _parse_v1(data)
    if data.startswith(V2_SIGNATURE):
        return _parse_v2(data)
    raise ProxyHeaderError("not a PROXY protocol header")


def _prefix_match(head: bytes, prefix: bytes) -> bool:
    n = min(len(head), len(prefix))
    return head[:n] == prefix[:n]


def _parse_v1(data: bytes | bytearray) -> ProxyHeader | int:
    end = data.find(b"\r\n", 0, V1_MAX)
    if end < 0:
        if len(data) >= V1_MAX:
            raise ProxyHeaderError("v1 header longer than 107 bytes")
        if b"\n" in data or any(b < 0x20 or b > 0x7E for b in data[:-1]):
            raise ProxyHeaderError("v1 header with a control character")
        return 1 if data[-1:] == b"\r" else 2
    try:
        line = bytes(data[len(_V1_PREFIX) : end]).decode("ascii")
    except UnicodeDecodeError:
        raise ProxyHeaderError("v1 header not ASCII") from None
    parts = line.split(" ")
    if parts[0] == "UNKNOWN":
        return ProxyHeader(1, end + 2)
    if len(parts) != 5 or parts[0] not in ("TCP4", "TCP6"):
        raise ProxyHeaderError(f"v1 header not TCP4, TCP6 or UNKNOWN: {line[:60]!r}")
    version = 4 if parts[0] == "TCP4" else 6
    source = (_v1_ip(parts[1], version), _v1_port(parts[3]))
    dest = (_v1_ip(parts[2], version), _v1_port(parts[4]))
    return ProxyHeader(1, end + 2, source, dest)


def _v1_ip(text: str, version: int) -> str:
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        raise ProxyHeaderError(f"v1 header: bad address {text[:45]!r}") from None
    if address.version != version:
        raise ProxyHeaderError(f"v1 header: {text!r} is not an IPv{version} address")
    return str(address)


def _v1_port(text: str) -> int:
    if not text.isdigit() or len(text) > 5 or (len(text) > 1 and text[0] == "0"):
        raise ProxyHeaderError(f"v1 header: bad port {text[:8]!r}")
    port = int(text)
    if port > 65535:
        raise ProxyHeaderError(f"v1 header: port {port} out of range")
    return port


def _parse_v2(data: bytes | bytearray) -> ProxyHeader | int:
    if len(data) < _V2_FIXED:
        return _V2_FIXED - len(data)
    ver_cmd, fam_proto, length = struct.unpack_from("!BBH", data, 12)
    if ver_cmd >> 4 != 2:
        raise ProxyHeaderError(f"v2 header: version {ver_cmd >> 4}")
    command = ver_cmd & 0xF
    if command > 1:
        raise ProxyHeaderError(f"v2 header: command {command}")
    family, proto = fam_proto >> 4, fam_proto & 0xF
    if family > 3 or proto > 2:
        raise ProxyHeaderError(f"v2 header: family/protocol {fam_proto:#04x}")
    total = _V2_FIXED + length
    if len(data) < total:
        return total - len(data)
    body = bytes(data[_V2_FIXED:total])
    used = _V2_ADDRESS_SIZE.get(family, 0)
    if len(body) < used:
        raise ProxyHeaderError(f"v2 header: {len(body)} bytes for a {used}-byte address block")
    # UNSPEC's bytes are unspecified (the spec: ignore them); others end with TLVs.
    tlvs = _tlvs(body, used) if family else ()
    if command == 0:
        return ProxyHeader(2, total, local=True, tlvs=tlvs)
    if family == 0x1:
        src, dst, sport, dport = struct.unpack_from("!4s4sHH", body)
    elif family == 0x2:
        src, dst, sport, dport = struct.unpack_from("!16s16sHH", body)
    else:  # UNSPEC or UNIX: no host:port to give, the socket's stand
        return ProxyHeader(2, total, tlvs=tlvs)
    source = (str(ipaddress.ip_address(src)), sport)
    dest = (str(ipaddress.ip_address(dst)), dport)
    return ProxyHeader(2, total, source, dest, tlvs=tlvs)


def _tlvs(body: bytes, offset: int) -> tuple[tuple[int, bytes], ...]:
    """The TLVs after the address block, each checked to fit in the header."""
    out: list[tuple[int, bytes]] = []
    while offset < len(body):
        if len(body) - offset < 3:
            raise ProxyHeaderError("v2 header: truncated TLV")
        kind, size = struct.unpack_from("!BH", body, offset)
        offset += 3
        if size > len(body) - offset:
            raise ProxyHeaderError(f"v2 header: TLV {kind:#04x} overruns the header")
        out.append((kind, body[offset : offset + size]))
        offset += size
    return tuple(out)
