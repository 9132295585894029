"""The AMQP 1.0 client side of ``warren perf amqp1``: a small blocking client on
warren.amqp1's codec and performatives.

Setup (SASL, open, begin, attach, the first flow) is correct rather than fast:
every frame is decoded. The workers' hot loops use what is here for the rest:
:func:`split_frames` (frame boundaries and the performative's descriptor
code), :func:`transfer_fields` (a transfer's delivery-id and ``more`` without
decoding the frame into objects), :func:`data_offset` (where a message's
first data section starts) and :class:`TransferTemplate` (pre-encoded
transfer frames with fixed-width delivery ids and tags, so that a batch is
one ``struct.pack`` per message and one ``bytes.join``).

One connection carries one session (channel 0) with one link (handle 0).
"""

from __future__ import annotations

import contextlib
import socket
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final

from warren.amqp1.codec import decode
from warren.amqp1.formats import DecodeError
from warren.amqp1.frames import AMQP_HEADER, SASL_HEADER, TYPE_SASL, encode_frame
from warren.amqp1.performatives import (
    RCV_FIRST,
    RECEIVER,
    SENDER,
    SND_SETTLED,
    SND_UNSETTLED,
    Accepted,
    Attach,
    Begin,
    Close,
    Detach,
    Disposition,
    End,
    Error,
    Flow,
    Open,
    SaslInit,
    SaslMechanisms,
    SaslOutcome,
    Source,
    Target,
)
from warren.amqp1.types import Symbol
from warren.client.uri import URI

__all__ = [
    "AMQP1Error",
    "Link",
    "TransferTemplate",
    "WINDOW",
    "data_offset",
    "disposition_frame",
    "error_text",
    "expect",
    "flow_frame",
    "open_link",
    "read_frame",
    "split_frames",
    "transfer_fields",
    "close_link",
]

CONNECT_TIMEOUT = 10.0
#: The max-frame-size this client announces: the broker splits messages only beyond it.
MAX_FRAME_SIZE: Final = 1 << 20
#: Session windows this client announces (transfers): large, so only link credit limits.
WINDOW: Final = 1 << 30
MASK: Final = 0xFFFFFFFF
#: Descriptor codes (the byte after 0x00 0x53) of the performatives the hot loops look for.
TRANSFER: Final = 0x14
FLOW: Final = 0x13
DISPOSITION: Final = 0x15
_SIZE = struct.Struct(">I")
_FRAME_HEADER = struct.Struct(">IBBH")


class AMQP1Error(Exception):
    """The broker refused the login or a link, or ended the connection."""


def error_text(performative: Any) -> str:
    """A detach, end or close from the broker as a message."""
    name = type(performative).__name__.lower()
    err = getattr(performative, "error", None)
    if isinstance(err, Error):
        return f"{name} from the broker: {err.condition}: {err.description or ''}".rstrip(": ")
    return f"{name} from the broker"


def split_frames(buf: bytes, pos: int = 0) -> Iterator[tuple[int, int, int]]:
    """``(body start, end, descriptor code)`` of each whole frame in ``buf`` from ``pos``
    (code 0 for a heartbeat or a body whose descriptor is not a small ulong); stops
    before an incomplete frame: the caller keeps ``buf[end of the last one:]``."""
    n = len(buf)
    while n - pos >= 8:
        size = _SIZE.unpack_from(buf, pos)[0]
        end = pos + size
        if end > n:
            return
        start = pos + buf[pos + 4] * 4
        code = buf[start + 2] if start + 3 <= end and buf[start + 1] == 0x53 else 0
        yield start, end, code
        pos = end


def decode_body(buf: bytes, start: int, end: int) -> Any:
    """The performative of the frame body at ``start`` (None for a heartbeat)."""
    if start >= end:
        return None
    try:
        return decode(memoryview(buf)[:end], start)[0]
    except DecodeError as exc:
        raise AMQP1Error(f"undecodable frame from the broker: {exc}") from None


def _uint_at(buf: bytes, pos: int) -> tuple[int | None, int]:
    c = buf[pos]
    if c == 0x52:
        return buf[pos + 1], pos + 2
    if c == 0x70:
        return _SIZE.unpack_from(buf, pos + 1)[0], pos + 5
    if c == 0x43:
        return 0, pos + 1
    if c == 0x40:
        return None, pos + 1
    raise AMQP1Error(f"a transfer's delivery-id with constructor 0x{c:02x}")


def skip_value(buf: bytes, pos: int) -> int:
    """The offset after the encoded value at ``pos`` (any type: the width is in the
    constructor's upper nibble, 1.6 / 1.2)."""
    c = buf[pos]
    if c == 0x00:  # described: the descriptor, then the value
        return skip_value(buf, skip_value(buf, pos + 1))
    hi = c >> 4
    if hi == 0x4:
        return pos + 1
    if hi <= 0x9:
        return pos + 1 + (1, 2, 4, 8, 16)[hi - 5]
    if hi in (0xA, 0xC, 0xE):
        return pos + 2 + buf[pos + 1]
    return pos + 5 + _SIZE.unpack_from(buf, pos + 1)[0]


def transfer_fields(buf: bytes, start: int) -> tuple[int | None, bool, int]:
    """``(delivery-id, more, end of the performative)`` of the transfer frame body at
    ``start`` (the descriptor 0x00 0x53 0x14 is there)."""
    c = buf[start + 3]
    if c == 0xC0:
        after = start + 5 + buf[start + 4]
        count = buf[start + 5]
        pos = start + 6
    elif c == 0xD0:
        after = start + 8 + _SIZE.unpack_from(buf, start + 4)[0]
        count = _SIZE.unpack_from(buf, start + 8)[0]
        pos = start + 12
    else:
        raise AMQP1Error(f"a transfer with list constructor 0x{c:02x}")
    if count < 2:
        return None, False, after
    pos = skip_value(buf, pos)  # handle: one link
    delivery_id, pos = _uint_at(buf, pos)
    if count < 6:
        return delivery_id, False, after
    for _ in range(3):  # delivery-tag, message-format, settled
        pos = skip_value(buf, pos)
    more = buf[pos] == 0x41 or (buf[pos] == 0x56 and buf[pos + 1] == 1)
    return delivery_id, more, after


def data_offset(buf: bytes, pos: int, end: int) -> int:
    """Where the content of the first data section in the message bytes ``buf[pos:end]``
    starts, or -1 (no data section, or it is not all in these bytes)."""
    while pos + 3 <= end:
        if buf[pos] != 0x00:
            return -1
        if buf[pos + 1] == 0x53 and buf[pos + 2] == 0x75:
            c = buf[pos + 3]
            if c == 0xA0:
                return pos + 5
            if c == 0xB0:
                return pos + 8
            return -1
        pos = skip_value(buf, pos)
    return -1


# -- frames the hot loops send ------------------------------------------------------------


def flow_frame(
    next_incoming_id: int | None, delivery_count: int | None = None, credit: int | None = None
) -> bytes:
    """A flow on channel 0: the session's windows, and with ``credit`` the link's."""
    return encode_frame(
        0,
        Flow(
            next_incoming_id=next_incoming_id,
            incoming_window=WINDOW,
            next_outgoing_id=0,
            outgoing_window=WINDOW,
            handle=0 if credit is not None else None,
            delivery_count=delivery_count,
            link_credit=credit,
        ),
    )


def disposition_frame(first: int, last: int) -> bytes:
    """A receiver's disposition: deliveries ``first..last`` accepted and settled."""
    return encode_frame(
        0,
        Disposition(
            role=RECEIVER,
            first=first,
            last=None if last == first else last,
            settled=True,
            state=Accepted(),
        ),
    )


@dataclass
class TransferTemplate:
    """Transfer frames of one message each on handle 0, settled or not: ``pack(ids)``
    builds them for consecutive delivery ids (the delivery tag is the id too).

    The delivery-id is always a 4-byte uint (0x70) and the tag a 4-byte binary, so
    every frame has the same layout: ``head + id + A0 04 + id + mid [+ ts] + rest``.
    """

    size: int
    settled: bool
    durable: bool = False
    latency: bool = False
    head: bytes = field(init=False)
    struct: struct.Struct = field(init=False)
    frame_len: int = field(init=False)

    def __post_init__(self) -> None:
        rest_len = self.size - 8 if self.latency else self.size
        rest = b"\x00" * rest_len
        # descriptor, list8 of 5 fields: handle uint0, delivery-id uint, delivery-tag vbin8 4,
        # message-format uint0, settled
        performative_head = b"\x00\x53\x14\xc0\x0f\x05\x43\x70"
        mid = b"\x43" + (b"\x41" if self.settled else b"\x42")
        if self.durable:  # a header section: durable true
            mid += b"\x00\x53\x70\xc0\x02\x01\x41"
        if self.size < 256:
            mid += b"\x00\x53\x75\xa0" + bytes((self.size,))
        else:
            mid += b"\x00\x53\x75\xb0" + _SIZE.pack(self.size)
        body_len = len(performative_head) + 4 + 2 + 4 + len(mid) + self.size
        self.frame_len = 8 + body_len
        self.head = _FRAME_HEADER.pack(self.frame_len, 2, 0, 0) + performative_head
        ts = "Q" if self.latency else ""
        self.struct = struct.Struct(f">{len(self.head)}sI2sI{len(mid)}s{ts}{rest_len}s")
        self._mid = mid
        self._rest = rest

    def pack(self, first: int, n: int, ts: int = 0) -> bytes:
        """``n`` frames for delivery ids ``first, first + 1, ...`` (modulo 2**32);
        ``ts`` goes in the first 8 bytes of each body with ``latency``."""
        pk = self.struct.pack
        head, mid, rest = self.head, self._mid, self._rest
        ids: Any = range(first, first + n)
        if first + n > MASK:
            ids = [i & MASK for i in ids]
        if self.latency:
            return b"".join([pk(head, i, b"\xa0\x04", i, mid, ts, rest) for i in ids])
        return b"".join([pk(head, i, b"\xa0\x04", i, mid, rest) for i in ids])


# -- setup ----------------------------------------------------------------------------------


@dataclass
class Link:
    """An attached link on a fresh connection: what the hot loops start from."""

    sock: socket.socket
    #: Bytes received after the broker's attach (flows, transfers), not yet handled.
    rest: bytes
    remote_open: Open
    remote_begin: Begin
    remote_attach: Attach


def read_frame(sock: socket.socket, buf: bytes) -> tuple[bytes, bytes]:
    """One whole frame (or an 8-byte protocol header) and what follows it."""
    while True:
        if len(buf) >= 8:
            if buf[:4] == b"AMQP":
                return buf[:8], buf[8:]
            size = _SIZE.unpack_from(buf, 0)[0]
            if size < 8:
                raise AMQP1Error(f"frame size {size} from the broker")
            if len(buf) >= size:
                return buf[:size], buf[size:]
        data = sock.recv(65536)
        if not data:
            raise AMQP1Error("the broker closed the connection")
        buf += data


def expect(sock: socket.socket, buf: bytes, kind: type) -> tuple[Any, bytes]:
    """The next performative, which must be a ``kind`` (heartbeats skipped); a close,
    end or detach instead is an AMQP1Error with the broker's error."""
    while True:
        frame, buf = read_frame(sock, buf)
        if frame[:4] == b"AMQP":
            raise AMQP1Error(f"unexpected protocol header {frame!r} from the broker")
        value = decode_body(frame, frame[4] * 4, len(frame))
        if value is None:
            continue
        if isinstance(value, kind):
            return value, buf
        if isinstance(value, (Close, End, Detach)):
            raise AMQP1Error(error_text(value))
        raise AMQP1Error(f"expected {kind.__name__}, got {type(value).__name__}")


def _header(sock: socket.socket, buf: bytes, expected: bytes) -> bytes:
    header, buf = read_frame(sock, buf)
    if header != expected:
        raise AMQP1Error(f"the broker answered protocol header {expected!r} with {header!r}")
    return buf


def _login(sock: socket.socket, uri: URI) -> bytes:
    sock.sendall(SASL_HEADER)
    buf = _header(sock, b"", SASL_HEADER)
    mechs, buf = expect(sock, buf, SaslMechanisms)
    offered = {str(m) for m in mechs.sasl_server_mechanisms}
    if "PLAIN" in offered:
        init = SaslInit(
            mechanism=Symbol("PLAIN"),
            initial_response=b"\x00" + uri.user.encode() + b"\x00" + uri.password.encode(),
            hostname=uri.host,
        )
    elif "ANONYMOUS" in offered:
        init = SaslInit(mechanism=Symbol("ANONYMOUS"), initial_response=b"", hostname=uri.host)
    else:
        raise AMQP1Error(f"no SASL mechanism in common: the broker offers {sorted(offered)}")
    sock.sendall(encode_frame(0, init, type=TYPE_SASL))
    outcome, buf = expect(sock, buf, SaslOutcome)
    if outcome.code != 0:
        raise AMQP1Error(f"SASL login refused (code {outcome.code})")
    return buf


def open_link(
    uri: URI,
    container_id: str,
    role: bool,
    address: str,
    settled: bool,
    credit: int = 0,
) -> Link:
    """Connect, log in, open, begin and attach one link: a sender (``role`` SENDER) to
    ``address`` or a receiver from it, with ``credit`` granted at once. ``settled``:
    the sender settles its transfers itself (snd-settle-mode settled). Returns with the
    socket blocking and without a timeout."""
    sock = socket.create_connection((uri.host, uri.port), timeout=CONNECT_TIMEOUT)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = _login(sock, uri)
        sending = role == SENDER
        attach = Attach(
            name=f"{container_id}-link",
            handle=0,
            role=role,
            snd_settle_mode=SND_SETTLED if settled else SND_UNSETTLED,
            rcv_settle_mode=RCV_FIRST,
            source=Source() if sending else Source(address=address),
            target=Target(address=address) if sending else Target(),
            initial_delivery_count=0 if sending else None,
        )
        sock.sendall(
            AMQP_HEADER
            + encode_frame(
                0,
                Open(
                    container_id=container_id,
                    hostname=f"vhost:{uri.vhost}",
                    max_frame_size=MAX_FRAME_SIZE,
                ),
            )
            + encode_frame(
                0, Begin(next_outgoing_id=0, incoming_window=WINDOW, outgoing_window=WINDOW)
            )
            + encode_frame(0, attach)
        )
        buf = _header(sock, buf, AMQP_HEADER)
        remote_open, buf = expect(sock, buf, Open)
        remote_begin, buf = expect(sock, buf, Begin)
        remote_attach, buf = expect(sock, buf, Attach)
        refused = remote_attach.target is None if sending else remote_attach.source is None
        if refused:  # a detach with the reason follows
            expect(sock, buf, Detach)
            raise AMQP1Error(f"the broker refused the link to {address!r}")
        if role == RECEIVER and credit:
            sock.sendall(
                flow_frame(
                    remote_begin.next_outgoing_id, remote_attach.initial_delivery_count, credit
                )
            )
        sock.settimeout(None)
    except BaseException:
        sock.close()
        raise
    return Link(sock, buf, remote_open, remote_begin, remote_attach)


def close_link(sock: socket.socket) -> None:
    """Close the connection (close frame, no wait for the broker's), ignoring a
    connection the broker already dropped."""
    with contextlib.suppress(OSError):
        sock.sendall(encode_frame(0, Close()))
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
