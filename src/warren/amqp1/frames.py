"""AMQP 1.0 framing (part 2, 2.3): protocol headers, frames, and a sans-IO reader.

A frame is a 4-byte size, a data offset in 4-byte words (doff, at least 2),
a type (0 AMQP, 1 SASL) and a channel, then the extended header (skipped),
then the body: one performative and, for a transfer, the message bytes after
it. An empty body is a heartbeat. The reader takes bytes as they arrive and
returns whole frames; it checks sizes before buffering a frame so a peer
cannot make it hold more than the negotiated max-frame-size (which is 512
until open has been exchanged: MIN_MAX_FRAME_SIZE).

Transfers are the hot path: the reader takes the common transfer shape
straight from the bytes (decode_transfer, the generic codec for the rest), and
a sending link writes its frames from bytes it encoded once (TransferEncoder).
"""

from __future__ import annotations

import dataclasses
import struct
from dataclasses import dataclass
from typing import Any, Final

from warren.amqp1.codec import decode, encode
from warren.amqp1.formats import DecodeError
from warren.amqp1.performatives import AMQP_PERFORMATIVES, SASL_PERFORMATIVES, Transfer

__all__ = [
    "AMQP_HEADER",
    "HEARTBEAT",
    "MIN_MAX_FRAME_SIZE",
    "SASL_HEADER",
    "TYPE_AMQP",
    "TYPE_SASL",
    "Frame",
    "FrameError",
    "FrameReader",
    "TransferEncoder",
    "decode_transfer",
    "encode_frame",
    "transfer_frames",
]

#: The protocol headers that open a connection (2.2) and its SASL layer (5.3.1).
AMQP_HEADER: Final = b"AMQP\x00\x01\x00\x00"
SASL_HEADER: Final = b"AMQP\x03\x01\x00\x00"
TYPE_AMQP: Final = 0
TYPE_SASL: Final = 1
#: The largest frame either peer may send before the open frames are exchanged.
MIN_MAX_FRAME_SIZE: Final = 512
#: An empty AMQP frame on channel 0: keeps an idle connection alive (2.4.5).
HEARTBEAT: Final = b"\x00\x00\x00\x08\x02\x00\x00\x00"

_FRAME_HEADER = struct.Struct(">IBBH")
_U32 = struct.Struct(">I").pack
_U32_AT = struct.Struct(">I").unpack_from
_BODIES: Final = (frozenset(AMQP_PERFORMATIVES), frozenset(SASL_PERFORMATIVES))


class FrameError(DecodeError):
    """Bytes that are not a frame the connection can take (bad size or offset,
    too large, unknown type): the connection closes with a framing error."""

    def __init__(self, message: str, condition: str = "amqp:connection:framing-error") -> None:
        super().__init__(message, condition)


@dataclass(slots=True)
class Frame:
    """One frame: ``performative`` is None for an empty (heartbeat) frame; ``payload``
    is what follows the performative in the body (a transfer's message bytes), a
    view into the bytes read, to copy before keeping it long."""

    channel: int
    performative: Any
    payload: bytes | memoryview = b""
    type: int = TYPE_AMQP


def encode_frame(
    channel: int, performative: Any, payload: bytes | memoryview = b"", type: int = TYPE_AMQP
) -> bytes:
    """One frame: the performative (None for an empty frame) and the payload after it."""
    out = bytearray(8)
    if performative is not None:
        encode(performative, out)
    if payload:
        out += payload
    _FRAME_HEADER.pack_into(out, 0, len(out), 2, type, channel)
    return bytes(out)


def _frame_with(channel: int, performative: bytes | bytearray, chunk: memoryview) -> bytes:
    out = bytearray(8)
    out += performative
    out += chunk
    _FRAME_HEADER.pack_into(out, 0, len(out), 2, TYPE_AMQP, channel)
    return bytes(out)


def transfer_frames(
    channel: int, transfer: Transfer, payload: bytes | memoryview, max_frame_size: int
) -> list[bytes]:
    """A message's transfer frames for a peer's max-frame-size: the payload in as
    few frames as fit, ``more`` true on all but the last (which keeps the
    transfer's own ``more``)."""
    last = bytearray()
    encode(transfer, last)
    total = len(payload)
    if 8 + len(last) + total <= max_frame_size:
        return [_frame_with(channel, last, memoryview(payload))]
    more = bytearray()
    encode(dataclasses.replace(transfer, more=True), more)
    room = max_frame_size - 8 - len(more)
    if room <= 0:
        raise ValueError(f"max frame size {max_frame_size} leaves no room for a transfer's payload")
    last_room = max_frame_size - 8 - len(last)
    view = memoryview(payload)
    frames: list[bytes] = []
    pos = 0
    while total - pos > last_room:
        frames.append(_frame_with(channel, more, view[pos : pos + room]))
        pos += room
    frames.append(_frame_with(channel, last, view[pos:]))
    return frames


def _uint(value: int) -> bytes:
    """A uint as encode_uint writes it (the smallest of its three forms)."""
    if value == 0:
        return b"\x43"
    if value < 256:
        return bytes((0x52, value))
    return b"\x70" + _U32(value)


class TransferEncoder:
    """One sending link's transfer frames, the bytes the link never changes
    (channel, descriptor, handle) encoded once: per delivery only its id, tag
    and settled flag are written, the same bytes `transfer_frames` writes for
    ``Transfer(handle, delivery_id, tag, message_format=0, settled)``. A
    message over the peer's max-frame-size goes through `transfer_frames`."""

    __slots__ = ("channel", "handle", "_handle")

    def __init__(self, channel: int, handle: int) -> None:
        self.channel = channel
        self.handle = handle
        self._handle = _uint(handle)

    def frame(
        self, delivery_id: int, tag: bytes, settled: bool, payload: bytes, max_frame_size: int
    ) -> bytes | None:
        """The message's one frame; None when it needs more than one (or a tag
        longer than 255 bytes)."""
        fields = b"%b%b\xa0%c%b\x43%b" % (
            self._handle,
            _uint(delivery_id),
            len(tag),
            tag,
            b"\x41" if settled else b"\x42",
        )
        size = len(fields) + 1
        total = 13 + size + len(payload)  # header 8, descriptor 3, list8 code and size
        if size > 255 or total > max_frame_size:
            return None
        return b"%b\x02\x00%b\x00\x53\x14\xc0%c\x05%b%b" % (
            _U32(total),
            self.channel.to_bytes(2, "big"),
            size,
            fields,
            payload,
        )


def decode_transfer(buf: bytes, start: int, end: int) -> tuple[Transfer, int] | None:
    """The transfer performative at ``buf[start:end]`` and where its payload
    starts, read straight for the common shape (the short descriptor, a list8
    of at most the first six fields, each in the form a sender writes them:
    uints, a vbin8 tag, booleans, nulls); None for anything else, which the
    generic decoder then reads (and refuses as it always has)."""
    if end - start < 6 or buf[start : start + 4] != b"\x00\x53\x14\xc0":
        return None
    stop = start + 5 + buf[start + 4]  # the list's end (its size counts the count byte)
    count = buf[start + 5]
    if stop > end or count > 6 or count < 1:
        return None
    pos = start + 6
    values: list[Any] = [None, None, None, None, None, None]
    for i in range(count):
        if pos >= stop:
            return None
        code = buf[pos]
        if code == 0x40:
            pos += 1
            continue
        if i == 2:  # delivery-tag: binary
            if code != 0xA0 or pos + 2 > stop or pos + 2 + buf[pos + 1] > stop:
                return None
            n = buf[pos + 1]
            pos += 2 + n
            values[2] = buf[pos - n : pos]
        elif i < 4:  # handle, delivery-id, message-format: uint
            if code == 0x52 and pos + 2 <= stop:
                values[i] = buf[pos + 1]
                pos += 2
            elif code == 0x43:
                values[i] = 0
                pos += 1
            elif code == 0x70 and pos + 5 <= stop:
                values[i] = _U32_AT(buf, pos + 1)[0]
                pos += 5
            else:
                return None
        elif code == 0x41:  # settled, more: boolean
            values[i] = True
            pos += 1
        elif code == 0x42:
            values[i] = False
            pos += 1
        else:
            return None
    if pos != stop or values[0] is None:
        return None
    more = values[5]
    transfer = Transfer(
        handle=values[0],
        delivery_id=values[1],
        delivery_tag=values[2],
        message_format=values[3],
        settled=values[4],
        more=False if more is None else more,
    )
    return transfer, stop


def protocol_id(header: bytes) -> int | None:
    """The protocol id of an AMQP 1.0 protocol header (0 AMQP, 3 SASL), or None
    for anything else (another version, not AMQP)."""
    if len(header) == 8 and header[:4] == b"AMQP" and header[5:] == b"\x01\x00\x00":
        return header[4]
    return None


class FrameReader:
    """Frames out of a byte stream, sans-IO: ``feed`` returns the frames (and
    protocol headers, as their 8 bytes) complete so far.

    A protocol header is expected first if ``expect_header`` (a server reading
    a new connection), after ``expect_header()``, and after SASL frames (the
    client sends the AMQP header once SASL is done, maybe in the same packet).
    ``max_frame_size`` is what this side announced in its open: set it then.
    """

    __slots__ = ("max_frame_size", "_chunks", "_have", "_need", "_header_next", "_after_sasl")

    def __init__(
        self, max_frame_size: int = MIN_MAX_FRAME_SIZE, expect_header: bool = False
    ) -> None:
        self.max_frame_size = max_frame_size
        self._chunks: list[bytes] = []
        self._have = 0
        self._need = 8
        self._header_next = expect_header
        self._after_sasl = False

    def expect_header(self) -> None:
        """The next 8 bytes are a protocol header."""
        self._header_next = True

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame | bytes]:
        """The frames and headers ``data`` completes; FrameError or DecodeError for
        bytes that cannot be (the reader is then unusable: close the connection)."""
        if not data:
            return []
        self._chunks.append(data if type(data) is bytes else bytes(data))
        self._have += len(data)
        if self._have < self._need:
            return []
        buf = self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)
        items, pos = self._parse(buf)
        if pos < len(buf):
            self._chunks = [buf[pos:]]
            self._have = len(buf) - pos
        else:
            self._chunks = []
            self._have = 0
        return items

    def _parse(self, buf: bytes) -> tuple[list[Frame | bytes], int]:
        items: list[Frame | bytes] = []
        view = memoryview(buf)
        n = len(buf)
        pos = 0
        while True:
            if n - pos < 8:
                self._need = 8
                return items, pos
            if self._header_next or (self._after_sasl and buf[pos : pos + 4] == b"AMQP"):
                items.append(buf[pos : pos + 8])
                self._header_next = False
                self._after_sasl = False
                pos += 8
                continue
            size, doff, ftype, channel = _FRAME_HEADER.unpack_from(buf, pos)
            if size < 8:
                raise FrameError(f"frame size {size} is below 8")
            if size > self.max_frame_size:
                raise FrameError(
                    f"frame size {size} is over the max frame size {self.max_frame_size}"
                )
            if doff < 2 or doff * 4 > size:
                raise FrameError(f"data offset {doff} does not fit the frame")
            if ftype > TYPE_SASL:
                raise FrameError(f"unknown frame type {ftype}")
            if n - pos < size:
                self._need = size
                return items, pos
            end = pos + size
            start = pos + doff * 4
            if start == end:
                items.append(Frame(channel, None, b"", ftype))
            else:
                fast = decode_transfer(buf, start, end) if ftype == TYPE_AMQP else None
                if fast is not None:
                    items.append(Frame(channel, fast[0], view[fast[1] : end], ftype))
                    self._after_sasl = False
                    pos = end
                    continue
                performative, after = decode(view[:end], start)
                if type(performative) not in _BODIES[ftype]:
                    kind = "an AMQP" if ftype == TYPE_AMQP else "a SASL"
                    raise DecodeError(
                        f"frame body is not {kind} performative: {performative!r:.60}"
                    )
                items.append(Frame(channel, performative, view[after:end], ftype))
            self._after_sasl = ftype == TYPE_SASL
            pos = end
