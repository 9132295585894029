"""CoAP messages (RFC 7252 section 3) to and from datagrams, sans-IO.

A datagram is a 4-byte header (version 1, type, token length, code, message
id), the token, the options as deltas from the previous option's number, and
the payload after a 0xFF marker. decode() refuses what the RFC calls a
message format error (DecodeError); encode() writes options in number order.
Tested against aiocoap's own codec (tests/protocol/coap/test_coap_codec.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from warren.core.codec_errors import DecodeError

__all__ = [
    "ACK",
    "CON",
    "NON",
    "RST",
    "CoAPMessage",
    "code",
    "decode",
    "encode",
    "encode_uint",
    "decode_uint",
]

# Message types.
CON = 0
NON = 1
ACK = 2
RST = 3


def code(cls: int, detail: int) -> int:
    """The code ``cls.detail`` (2.05 -> code(2, 5))."""
    return cls << 5 | detail


EMPTY = 0
GET = code(0, 1)
POST = code(0, 2)
PUT = code(0, 3)
DELETE = code(0, 4)
CHANGED = code(2, 4)
CONTENT = code(2, 5)
CONTINUE = code(2, 31)  # RFC 7959
BAD_REQUEST = code(4, 0)
UNAUTHORIZED = code(4, 1)
BAD_OPTION = code(4, 2)
FORBIDDEN = code(4, 3)
NOT_FOUND = code(4, 4)
METHOD_NOT_ALLOWED = code(4, 5)
REQUEST_ENTITY_INCOMPLETE = code(4, 8)  # RFC 7959
REQUEST_ENTITY_TOO_LARGE = code(4, 13)
UNSUPPORTED_CONTENT_FORMAT = code(4, 15)
TOO_MANY_REQUESTS = code(4, 29)  # RFC 8516
INTERNAL_SERVER_ERROR = code(5, 0)
SERVICE_UNAVAILABLE = code(5, 3)

# Option numbers (RFC 7252 5.10, RFC 7641, RFC 7959).
ETAG = 4
OBSERVE = 6
URI_PATH = 11
CONTENT_FORMAT = 12
MAX_AGE = 14
URI_QUERY = 15
ACCEPT = 17
BLOCK2 = 23
BLOCK1 = 27
SIZE2 = 28
SIZE1 = 60
#: Options a request may carry that this server reads or may ignore; any other
#: critical option (an odd number) makes a request 4.02 Bad Option.
KNOWN_OPTIONS = frozenset({1, 3, 4, 5, 6, 7, 11, 12, 14, 15, 17, 20, 28, 35, 39, 60})

_MAX_TOKEN = 8


@dataclass(slots=True)
class CoAPMessage:
    """One message; ``options`` as (number, value) in the order received."""

    mtype: int
    code: int
    mid: int
    token: bytes = b""
    options: list[tuple[int, bytes]] = field(default_factory=list)
    payload: bytes = b""

    def option(self, number: int) -> bytes | None:
        """The first value of option ``number`` (None: absent)."""
        for n, value in self.options:
            if n == number:
                return value
        return None

    def all(self, number: int) -> list[bytes]:
        """Every value of a repeatable option (Uri-Path, Uri-Query), in order."""
        return [value for n, value in self.options if n == number]

    def is_request(self) -> bool:
        return 1 <= self.code <= 31


def encode_uint(value: int) -> bytes:
    """An unsigned option value in as few bytes as it takes (0: none)."""
    return value.to_bytes((value.bit_length() + 7) // 8, "big")


def decode_uint(raw: bytes) -> int:
    return int.from_bytes(raw, "big")


def _ext(nibble: int, data: bytes, pos: int) -> tuple[int, int]:
    """An option delta or length nibble and its extended bytes."""
    if nibble < 13:
        return nibble, pos
    if nibble == 13:
        if pos >= len(data):
            raise DecodeError("truncated option")
        return data[pos] + 13, pos + 1
    if nibble == 14:
        if pos + 2 > len(data):
            raise DecodeError("truncated option")
        return (data[pos] << 8 | data[pos + 1]) + 269, pos + 2
    raise DecodeError("reserved option nibble 15")


def decode(data: bytes) -> CoAPMessage:
    """A datagram's message; DecodeError for a message format error."""
    if len(data) < 4:
        raise DecodeError("shorter than a CoAP header")
    first = data[0]
    if first >> 6 != 1:
        raise DecodeError(f"CoAP version {first >> 6}")
    tkl = first & 0x0F
    if tkl > _MAX_TOKEN:
        raise DecodeError(f"token length {tkl}")
    msg = CoAPMessage((first >> 4) & 3, data[1], data[2] << 8 | data[3], data[4 : 4 + tkl])
    pos = 4 + tkl
    if pos > len(data):
        raise DecodeError("truncated token")
    if msg.code == EMPTY and (tkl or pos < len(data)):
        raise DecodeError("an empty message with a token, options or payload")
    number = 0
    end = len(data)
    while pos < end:
        byte = data[pos]
        if byte == 0xFF:
            if pos + 1 == end:
                raise DecodeError("a payload marker without a payload")
            msg.payload = data[pos + 1 :]
            break
        delta, pos = _ext(byte >> 4, data, pos + 1)
        length, pos = _ext(byte & 0x0F, data, pos)
        if pos + length > end:
            raise DecodeError("truncated option value")
        number += delta
        msg.options.append((number, data[pos : pos + length]))
        pos += length
    return msg


def _nibble(value: int) -> tuple[int, bytes]:
    if value < 13:
        return value, b""
    if value < 269:
        return 13, bytes((value - 13,))
    return 14, (value - 269).to_bytes(2, "big")


def encode(msg: CoAPMessage) -> bytes:
    """The datagram of ``msg`` (options sorted by number, stably)."""
    token = msg.token
    out = bytearray(
        (0x40 | msg.mtype << 4 | len(token), msg.code, msg.mid >> 8 & 0xFF, msg.mid & 0xFF)
    )
    out += token
    number = 0
    for n, value in sorted(msg.options, key=lambda o: o[0]):
        dn, dext = _nibble(n - number)
        ln, lext = _nibble(len(value))
        out.append(dn << 4 | ln)
        out += dext
        out += lext
        out += value
        number = n
    if msg.payload:
        out.append(0xFF)
        out += msg.payload
    return bytes(out)
