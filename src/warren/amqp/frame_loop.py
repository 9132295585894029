"""The server side's AMQP 0-9-1 frame loop, shared by every AMQP listener.

:class:`FrameLoop` holds a connection's unread input and turns it into
frames: the protocol header, frame headers, frame_max and the end octet, the
per-read frame budget, and the errors RabbitMQ sends for each, with the
method named. The common frames on an open channel take the fast path inline
(bodies, whole runs of publishes and of acks: amqp/publish_run.py,
amqp/ack_scan.py); every other frame goes to the connection through
:class:`FrameHandler`. Two connections hold one: AMQPConnection (the broker's)
and ReplicaConnection (a follower's read-only stream service), which have
their own channels and rules but the same framing and the same handshake
(amqp/handshake.py).

The loop is written out in one function on purpose: a call per frame would
cost measurably on the hot path. FrameHandler is a mypyc trait so that the
connection's attributes and methods are reached natively when compiled.
"""

from __future__ import annotations

import logging
import struct

from mypy_extensions import trait

from warren.amqp import spec
from warren.amqp.ack_scan import ACK_FRAME_SIZE, ACK_IDS, NACK_IDS, REJECT_IDS, scan_acks
from warren.amqp.channel import Channel
from warren.amqp.frames import (
    FRAME_BODY,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    PROTOCOL_HEADER,
    unpack_frame_header,
)
from warren.amqp.handshake import State
from warren.amqp.publish_run import scan as scan_publishes
from warren.core.codec_errors import DecodeError, UnknownMethod
from warren.core.erlang_format import binary_w, frame_octets, last_column, tagged_tuple_p
from warren.core.errors import (
    BrokerError,
    FrameError,
    InternalError,
    NotImplemented_,
    UnexpectedFrame,
)
from warren.core.names import MALFORMED_SHORTSTR, is_valid_utf8

__all__ = [
    "FRAME_BUDGET",
    "PROTOCOL_HEADER_0_9",
    "FrameHandler",
    "FrameLoop",
    "decode_method",
    "UnexpectedFrameLevel",
    "UnknownFrame",
    "unexpected_frame",
    "unknown_frame",
]

log = logging.getLogger("warren.amqp")

# Frames handled per feed() call. A 256 KiB read holds ~3,000 small publishes:
# handling them all in one go holds the loop for tens of milliseconds while
# consumers' acks and the delivery passes wait. Leftover bytes are handled on
# the next loop turn (the protocol stops reading meanwhile), like an Erlang
# process giving up the scheduler after its reductions.
FRAME_BUDGET = 512
_unpack_method_ids = struct.Struct(">HH").unpack_from

# The pre-0-9-1 header of AMQP 0-9 ('AMQP' 1 1 0 9): RabbitMQ treats it as 0-9-1.
PROTOCOL_HEADER_0_9 = b"AMQP\x01\x01\x00\x09"

# Module globals: an identity test against them is cheaper than State.X per frame.
_OPEN = State.OPEN
_CLOSED = State.CLOSED
_PUBLISH_IDS = b"\x00\x3c\x00\x28"  # basic.publish: class 60, method 40
# Single acks (rejects, nacks) a run (amqp/ack_scan.py) may take per frame of the
# budget, and how many of them count as one frame against it: settling them is
# one call.
_ACKS_PER_FRAME = 8
_SINGLE_SETTLE_IDS = (ACK_IDS, REJECT_IDS, NACK_IDS)


class UnknownFrame(FrameError):
    """A frame-level 501: the close names no method, even for a method frame."""


class UnexpectedFrameLevel(UnexpectedFrame):
    """A frame-level 505: the close names no method, even for a method frame."""


def unknown_frame(ftype: int, payload: bytes) -> FrameError:
    """RabbitMQ's 501 for a frame it cannot make sense of (its type, its size)."""
    return UnknownFrame(f"{frame_octets(ftype, bytes(payload))}: unknown_frame")


def unexpected_frame(ftype: int, payload: bytes) -> UnexpectedFrame:
    """RabbitMQ's 505 for a well-formed frame where none of its kind may come."""
    return UnexpectedFrameLevel(frame_octets(ftype, bytes(payload)))


#: The short string fields of each method but basic.publish (whose exchange and
#: routing key RabbitMQ takes as bytes): the ones checked to be UTF-8.
_SHORTSTRS: dict[type[spec.Method], tuple[str, ...]] = {
    cls: names
    for cls in spec.METHODS.values()
    if cls is not spec.BasicPublish
    and (names := tuple(name for name, kind in cls.FIELDS if kind == "shortstr"))
}


def decode_method(name: str, payload: bytes) -> spec.Method:
    """A method frame's payload decoded and checked as RabbitMQ does (the errors it sends)."""
    if len(payload) < 4:
        raise unknown_frame(FRAME_METHOD, payload)
    try:
        method = spec.decode_method(payload)
    except UnknownMethod as exc:
        # RabbitMQ's connection crashes here and drops the socket without a word.
        raise NotImplemented_(
            f"unknown method class {exc.class_id} method {exc.method_id}"
        ) from None
    except DecodeError as exc:
        # RabbitMQ answers undecodable method arguments with 501 "cannot decode"
        # and the arguments' octets; the reason goes to the log.
        log.info("%s: cannot decode a method frame: %s", name, exc)
        raise FrameError(f"cannot decode {binary_w(bytes(payload[4:]))}") from None
    fields = _SHORTSTRS.get(type(method))
    if fields is not None:
        for field in fields:
            value: str = getattr(method, field)
            if not value.isascii() and not is_valid_utf8(value):
                # As RabbitMQ: every short string but basic.publish's must be UTF-8
                # (names, routing keys, tags), or the connection is closed.
                raise UnknownFrame(MALFORMED_SHORTSTR)
    return method


@trait
class FrameHandler:
    """What the frame loop needs of its connection.

    ``channels`` holds the channels whose frames take the fast path (the
    broker's); a connection with channels of another kind leaves it empty and
    gets their methods through ``method_on_unopened_channel``."""

    name: str
    state: State
    frame_max: int
    channels: dict[int, Channel]
    #: Set at every read (the heartbeat check).
    _received: bool

    def send(self, data: bytes) -> None:
        raise NotImplementedError

    def send_start(self) -> None:
        """connection.start, after a good protocol header."""
        raise NotImplementedError

    def close_transport(self) -> None:
        raise NotImplementedError

    def holding(self) -> bool:
        """Whether input must wait (replies held until replicated)."""
        raise NotImplementedError

    def channel0(self, payload: bytes) -> None:
        """A method frame on channel 0."""
        raise NotImplementedError

    def method_on_unopened_channel(self, ch: int, payload: bytes) -> None:
        """A method frame on a channel not in ``channels``."""
        raise NotImplementedError

    def content_frame(self, ch: int, ftype: int, payload: bytes) -> None:
        """A content header or body frame the fast path did not take."""
        raise NotImplementedError

    def connection_error(self, exc: BrokerError, class_id: int = 0, method_id: int = 0) -> None:
        raise NotImplementedError


class FrameLoop:
    """One connection's input: ``feed(bytes)`` handles every complete frame."""

    def __init__(self, conn: FrameHandler, max_message_size: int) -> None:
        self.conn = conn
        self.max_message_size = max_message_size
        # Input not handled yet: _buf from _buf_at on (a read is kept whole while
        # FRAME_BUDGET splits it over loop turns, not copied again at each turn).
        self._buf = b""
        self._buf_at = 0
        # True when feed() stopped at FRAME_BUDGET with complete frames left over.
        self.backlog = False

    def has_input(self) -> bool:
        """Whether input is kept for later (a hold, or the frame budget)."""
        return bool(self._buf)

    def feed(self, data: bytes) -> None:
        conn = self.conn
        if conn.state >= State.CLOSED:
            return
        conn._received = True
        pos = 0
        if self._buf:
            if not data:  # the rest of an earlier read (drain_backlog): no copy
                data, pos = self._buf, self._buf_at
            elif self._buf_at:
                data = self._buf[self._buf_at :] + data
            else:
                data = self._buf + data
            self._buf = b""
            self._buf_at = 0
        if conn.holding():
            self._buf, self._buf_at = data, pos  # processed once the held replies are out
            return
        if conn.state == State.HEADER:
            if len(data) < 8 and (
                PROTOCOL_HEADER.startswith(data) or PROTOCOL_HEADER_0_9.startswith(data)
            ):
                self._buf = data
                return
            if data[:8] != PROTOCOL_HEADER and data[:8] != PROTOCOL_HEADER_0_9:
                log.warning("%s: bad protocol header %r, closing", conn.name, bytes(data[:8]))
                conn.send(PROTOCOL_HEADER)
                conn.close_transport()
                return
            data = data[8:]
            conn.send_start()
        n = len(data)
        ftype, payload = 0, b""
        budget = FRAME_BUDGET
        self.backlog = False
        channels = conn.channels
        try:
            while n - pos >= 7:
                if not budget:
                    # The rest waits for the next loop turn (see FRAME_BUDGET).
                    self.backlog = True
                    break
                budget -= 1
                start = pos
                ftype, ch, size = unpack_frame_header(data, pos)
                end = pos + 7 + size
                # RabbitMQ lets a payload reach frame_max itself (8 octets over the
                # limit: a frequent client mistake) and reports the limit as
                # frame_max - 8.
                if size > conn.frame_max and conn.frame_max:
                    text = frame_octets(ftype, b"") + ": "
                    ftype = 0  # a frame-level error: no method ids in the close
                    limits = (str(size), str(conn.frame_max - 8))
                    tail = tagged_tuple_p("frame_too_large", *limits, column=last_column(text))
                    raise FrameError(text + tail)
                if end >= n:
                    break
                if data[end] != 0xCE:
                    text = frame_octets(ftype, bytes(data[pos + 7 : end])) + ": "
                    ftype = 0
                    marker = tagged_tuple_p(
                        "invalid_frame_end_marker", str(data[end]), column=last_column(text)
                    )
                    raise FrameError(text + marker)
                payload = data[pos + 7 : end]
                pos = end + 1
                if conn.state is _OPEN and ch:
                    # The common case first: content and methods on an open channel.
                    channel = channels.get(ch)
                    if channel is not None:
                        if ftype == FRAME_BODY:
                            channel.publishing.on_body_frame(payload)
                            continue
                        if ftype == FRAME_METHOD:
                            if payload[:4] == _PUBLISH_IDS and channel.publishing.takes_publish_run():
                                # Whole messages to one exchange at once (one routing
                                # key, or several outside a transaction:
                                # amqp/publish_run.py); None: one by one.
                                run = scan_publishes(
                                    data,
                                    start,
                                    conn.frame_max,
                                    self.max_message_size,
                                    budget // 3 + 1,
                                    not channel.tx,
                                )
                                if run is not None:
                                    channel.publishing.publish_run(run)
                                    pos = run.end
                                    budget = max(0, budget - 3 * len(run) + 1)
                                    if conn.state is _CLOSED:
                                        pos = n
                                        break
                                    continue
                            method_ids = payload[:4]
                            if (
                                size == ACK_FRAME_SIZE - 8
                                and method_ids in _SINGLE_SETTLE_IDS
                                and channel.takes_ack_run()
                            ):
                                # Single acks (or rejects, or nacks) with consecutive
                                # tags and the same flags, settled at once.
                                count, first, run_end = scan_acks(
                                    data, start, budget * _ACKS_PER_FRAME + 1
                                )
                                if count > 1:
                                    if method_ids == ACK_IDS:
                                        channel.settlement.ack_range(first, count)
                                    else:
                                        channel.settlement.reject_range(
                                            first, count, bytes(method_ids), payload[12]
                                        )
                                    pos = run_end
                                    budget = max(0, budget - count // _ACKS_PER_FRAME)
                                    if conn.state is _CLOSED:
                                        pos = n
                                        break
                                    continue
                            channel.on_method_frame(payload)
                            if conn.state is _CLOSED:
                                pos = n
                                break
                            if conn.holding():
                                break
                            continue
                        if ftype == FRAME_HEADER and len(payload) >= 12:
                            channel.publishing.on_header_frame(payload)
                            continue
                if conn.state == State.CLOSING:
                    # Only connection.close-ok (or close) matters once we have closed.
                    if ftype == FRAME_METHOD and ch == 0:
                        conn.channel0(payload)
                    continue
                if ch and conn.state != State.OPEN:
                    # RabbitMQ: nothing but channel 0 before connection.open-ok.
                    raise unexpected_frame(ftype, payload)
                if ftype == FRAME_METHOD:
                    if ch:
                        channel = channels.get(ch)
                        if channel is not None:
                            channel.on_method_frame(payload)
                        else:
                            conn.method_on_unopened_channel(ch, payload)
                    else:
                        conn.channel0(payload)
                elif ftype == FRAME_HEADER:
                    if len(payload) < 12:  # not even class, weight and body size
                        raise unknown_frame(ftype, payload)
                    conn.content_frame(ch, ftype, payload)
                elif ftype == FRAME_BODY:
                    conn.content_frame(ch, ftype, payload)
                elif ftype == FRAME_HEARTBEAT:
                    if payload:
                        raise unknown_frame(ftype, payload)
                    if ch:
                        raise unexpected_frame(ftype, payload)
                else:
                    raise unknown_frame(ftype, payload)
                if conn.state == State.CLOSED:
                    pos = n
                    break
                if conn.holding():
                    break
        except BrokerError as exc:
            # Like RabbitMQ, name the method being handled when the error came from one.
            ids = (0, 0)
            frame_level = isinstance(exc, UnknownFrame | UnexpectedFrameLevel)
            if ftype == FRAME_METHOD and len(payload) >= 4 and not frame_level:
                ids = _unpack_method_ids(payload)
            conn.connection_error(exc, *ids)
            pos = n
        except Exception:
            log.exception("%s: internal error while handling a frame", conn.name)
            conn.connection_error(InternalError("internal error"))
            pos = n
        if pos < n:
            self._buf, self._buf_at = data, pos
