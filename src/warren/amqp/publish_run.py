"""Runs of identical basic.publish messages, found in a socket read's bytes.

A publisher mostly sends message after message to the same exchange with the
same routing key. ``scan_publishes`` walks the frames of one socket read from a
basic.publish method frame and returns, as one `PublishRun`, every complete
message that follows on the same channel with the very same method payload
(exchange, routing key, mandatory) and a simple property list (see
`simple_delivery_mode`: content-type, message-id and the like, a flat headers
table without CC/BCC, nothing a check could refuse): the connection
then checks, routes and counts them once per run instead of once per message
(amqp/publishing.py, ``Publishing.publish_run``). Anything else ends the run and is
handled frame by frame as before: another channel or method, a content header
that is not a simple class-60 header of weight 0, a body over the limit, a
message not complete in the buffer, a malformed frame (so that the slow path
reports it exactly as it always has).

A *keyed* scan (``keyed=True``, for a channel outside a transaction) also
takes messages to the same exchange with other routing keys (same mandatory
bit; not with mandatory set, whose returns must come back in publish order):
a publisher spreading messages over many queues. Such a run is not
``uniform``; ``groups()`` cuts it into uniform runs, one per routing key, each
with its messages' indexes in the run.

This module is the reference and the fallback; ``warren._fastpath`` (C, built
by setup.py when a compiler is there) implements the same `scan_publishes` and
`PublishRun` without a Python object per message, and is used when present.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

import warren

__all__ = ["PLAIN_PROPERTIES", "PublishRun", "scan", "scan_publishes", "simple_delivery_mode"]

#: The commonest property lists a run carries (none, or only delivery-mode 1 or
#: 2): the C run hands out shared objects for them.
PLAIN_PROPERTIES = frozenset((b"\x00\x00", b"\x10\x00\x01", b"\x10\x00\x02"))

_FRAME = struct.Struct(">BHI")
_CONTENT_HEADER = struct.Struct(">HHQ")
_PUBLISH_IDS = b"\x00\x3c\x00\x28"
_MANDATORY = 1  # basic.publish's bits
_IMMEDIATE = 2


class PublishRun:
    """Messages ``0 .. len(run) - 1`` of one run: byte ranges into ``data``.

    ``method`` is the publish payload they share; ``end`` is the offset just past
    the run's last frame."""

    __slots__ = ("data", "channel", "method", "end", "_spans", "_methods")

    def __init__(
        self,
        data: bytes,
        channel: int,
        method: bytes,
        end: int,
        spans: list[int],
        methods: list[bytes] | None = None,
    ) -> None:
        self.data = data
        self.channel = channel
        self.method = method
        self.end = end
        self._spans = spans  # per message: properties start, end, body start, end
        # A keyed run's publish payload per message; None when all are `method`.
        self._methods = methods

    @property
    def uniform(self) -> bool:
        """Whether every message has the run's method payload (routing key)."""
        return self._methods is None

    def groups(self, ordered: bool) -> list[tuple[PublishRun, list[int]]]:
        """The run as uniform runs, one per method payload, with each message's
        index here: in order of first appearance, all of a payload's messages
        together; ``ordered``: only consecutive ones (a new group at every
        change of routing key)."""
        methods = self._methods
        if methods is None:
            return [(self, list(range(len(self))))]
        found: dict[bytes, list[int]] = {}
        order: list[tuple[bytes, list[int]]] = []
        for i, m in enumerate(methods):
            indexes = None
            if ordered:
                if order and order[-1][0] == m:
                    indexes = order[-1][1]
            else:
                indexes = found.get(m)
            if indexes is None:
                indexes = []
                order.append((m, indexes))
                found[m] = indexes
            indexes.append(i)
        s = self._spans
        out = []
        for m, indexes in order:
            spans = [v for i in indexes for v in s[4 * i : 4 * i + 4]]
            out.append((PublishRun(self.data, self.channel, m, self.end, spans), indexes))
        return out

    def __len__(self) -> int:
        return len(self._spans) >> 2

    def properties(self, i: int) -> bytes:
        s = self._spans
        return self.data[s[4 * i] : s[4 * i + 1]]

    def body(self, i: int) -> bytes:
        s = self._spans
        return self.data[s[4 * i + 2] : s[4 * i + 3]]

    def body_size(self, i: int) -> int:
        s = self._spans
        return s[4 * i + 3] - s[4 * i + 2]


def scan_publishes(
    data: bytes, pos: int, frame_max: int, max_body: int, limit: int, keyed: bool = False
) -> PublishRun | None:
    """The run that starts with the basic.publish method frame at ``data[pos]``,
    at most ``limit`` messages; None when not even its first message is a
    complete, plain one (the caller then takes the frame the slow way).
    ``keyed``: other routing keys to the same exchange may follow (not with
    mandatory set)."""
    n = len(data)
    if n - pos < 7:
        return None
    ftype, channel, size = _FRAME.unpack_from(data, pos)
    if ftype != 1 or not channel or size < 7 or (frame_max and size > frame_max):
        return None
    method = data[pos + 7 : pos + 7 + size]
    if method[:4] != _PUBLISH_IDS or method[-1] & _IMMEDIATE or not _method_ok(method):
        return None
    if method[-1] & _MANDATORY:
        keyed = False
    spans: list[int] = []
    methods: list[bytes] = []
    uniform = True
    end = pos
    while len(spans) < 4 * limit:
        this = _method_at(data, end, channel, method, frame_max) if keyed else method
        if this is None:
            break
        msg = _message(data, end, channel, this, frame_max, max_body)
        if msg is None:
            break
        props_start, props_end, body_start, body_end, end = msg
        spans += (props_start, props_end, body_start, body_end)
        methods.append(this)
        uniform = uniform and this == method
    if not spans:
        return None
    return PublishRun(data, channel, method, end, spans, None if uniform else methods)


def _method_at(data: bytes, pos: int, channel: int, method: bytes, frame_max: int) -> bytes | None:
    """The publish payload at ``pos`` when it goes to ``method``'s exchange with
    its bits (any routing key), else None."""
    if len(data) - pos < 7:
        return None
    ftype, ch, size = _FRAME.unpack_from(data, pos)
    if ftype != 1 or ch != channel or (frame_max and size > frame_max):
        return None
    payload = data[pos + 7 : pos + 7 + size]
    ex_end = 7 + method[6]
    if len(payload) != size or not _method_ok(payload) or payload[:ex_end] != method[:ex_end]:
        return None
    if payload[-1] != method[-1]:
        return None
    return payload


#: Property flags a run may carry beyond delivery-mode: content-type,
#: content-encoding, headers (a simple table, see `_simple_table`), priority,
#: correlation-id, message-id, timestamp, type, app-id. Not reply-to (direct
#: reply-to's rewrite), expiration (TTL), user-id (checked against the login),
#: cluster-id, a continued flag word.
_SIMPLE_FLAGS = (
    0x8000 | 0x4000 | 0x2000 | 0x1000 | 0x0800 | 0x0400 | 0x0080 | 0x0040 | 0x0020 | 0x0008
)
_OCTETS = 0x1000 | 0x0800  # delivery-mode, priority
_HEADERS = 0x2000
_TIMESTAMP = 0x0040
_MAX_TIMESTAMP = 253_402_300_799  # the year 9999, as core/table.py
#: Field types a run's headers may hold, by tag: the fixed sizes (not floats:
#: a NaN is refused, core/table.py), -1 for a u32-sized string, -2 for a
#: timestamp (checked against the year 10000). Not nested tables or arrays.
_FIELD_SIZES: dict[int, int] = {
    **{ord(t): 1 for t in "tbB"},
    **{ord(t): 2 for t in "su"},
    **{ord(t): 4 for t in "Ii"},
    **{ord(t): 8 for t in "lL"},
    ord("D"): 5,
    ord("V"): 0,
    ord("S"): -1,
    ord("x"): -1,
    ord("T"): -2,
}


def simple_delivery_mode(props: bytes) -> int | None:
    """For a property list a run may carry (see _SIMPLE_FLAGS), well formed and
    passing amqp/publishing.py's checks without a word (ASCII short strings,
    delivery-mode 1 or 2, a timestamp before the year 10000, a headers table
    that `_simple_table` takes): its delivery-mode (0: none). None for any
    other list, which goes the slow way."""
    n = len(props)
    if n < 2:
        return None
    flags = props[0] << 8 | props[1]
    if flags & ~_SIMPLE_FLAGS:
        return None
    if flags & _HEADERS and b"CC" in props:
        # check_message and Router.publish look for CC/BCC wherever these bytes
        # are: the slow way decides.
        return None
    at = 2
    mode = 0
    for bit in range(15, 0, -1):
        flag = 1 << bit
        if not flags & flag:
            continue
        if flag & _OCTETS:
            if at >= n:
                return None
            if flag == 0x1000:
                mode = props[at]
                if mode not in (1, 2):
                    return None
            at += 1
        elif flag == _TIMESTAMP:
            if n - at < 8 or int.from_bytes(props[at : at + 8], "big") > _MAX_TIMESTAMP:
                return None
            at += 8
        elif flag == _HEADERS:
            end = _simple_table(props, at, n)
            if end is None:
                return None
            at = end
        else:
            if at >= n:
                return None
            end = at + 1 + props[at]
            if end > n or not props[at + 1 : end].isascii():
                return None
            at = end
    return mode if at == n else None


def _simple_table(props: bytes, at: int, n: int) -> int | None:
    """The end of the headers table at ``props[at]`` when it is flat and plain:
    ASCII keys, values of the types of `_FIELD_SIZES`, lengths that add up
    (core/table.py's validation passes it without a word). None otherwise:
    nested tables and arrays, floats, anything malformed go the slow way,
    which says what is wrong."""
    if n - at < 4:
        return None
    end = at + 4 + int.from_bytes(props[at : at + 4], "big")
    if end > n:
        return None
    at += 4
    sizes = _FIELD_SIZES
    while at < end:
        key_end = at + 1 + props[at]
        if key_end >= end or not props[at + 1 : key_end].isascii():
            return None
        size = sizes.get(props[key_end])
        at = key_end + 1
        if size is None:
            return None
        if size >= 0:
            at += size
        elif end - at < (4 if size == -1 else 8):
            return None
        elif size == -1:
            at += 4 + int.from_bytes(props[at : at + 4], "big")
        else:
            if int.from_bytes(props[at : at + 8], "big") > _MAX_TIMESTAMP:
                return None
            at += 8
    return end if at == end else None


def _method_ok(method: bytes) -> bool:
    """basic.publish's reserved short, two shortstrs and the bits octet, exactly."""
    if len(method) < 9:
        return False
    ex_len = method[6]
    at = 7 + ex_len
    if at >= len(method):
        return False
    rk_len = method[at]
    return at + 1 + rk_len + 1 == len(method)


def _message(
    data: bytes, pos: int, channel: int, method: bytes, frame_max: int, max_body: int
) -> tuple[int, int, int, int, int] | None:
    """One complete message at ``pos`` with publish payload ``method``:
    (properties start, end, body start, end, offset after it), or None."""
    n = len(data)
    # The method frame.
    size = len(method)
    end = pos + 7 + size
    if end >= n or data[pos] != 1 or data[end] != 0xCE:
        return None
    if _FRAME.unpack_from(data, pos)[1:] != (channel, size) or data[pos + 7 : end] != method:
        return None
    pos = end + 1
    # The content header frame.
    if n - pos < 7:
        return None
    ftype, ch, size = _FRAME.unpack_from(data, pos)
    end = pos + 7 + size
    if ftype != 2 or ch != channel or size < 14 or end >= n or data[end] != 0xCE:
        return None
    if frame_max and size > frame_max:
        return None
    class_id, weight, body_size = _CONTENT_HEADER.unpack_from(data, pos + 7)
    if class_id != 60 or weight or body_size > max_body:
        return None
    props_start, props_end = pos + 19, end
    props = data[props_start:props_end]
    if props not in PLAIN_PROPERTIES and simple_delivery_mode(props) is None:
        return None
    pos = end + 1
    if not body_size:
        return props_start, props_end, pos, pos, pos
    # One body frame carrying the whole body (a body in several frames goes the slow way).
    if n - pos < 7:
        return None
    ftype, ch, size = _FRAME.unpack_from(data, pos)
    end = pos + 7 + size
    if ftype != 3 or ch != channel or size != body_size or end >= n or data[end] != 0xCE:
        return None
    if frame_max and size > frame_max:
        return None
    return props_start, props_end, pos + 7, end, end + 1


ScanPublishes = Callable[[bytes, int, int, int, int, bool], "PublishRun | None"]


def _scanner() -> ScanPublishes:
    native = warren.native_module("_fastpath")
    return scan_publishes if native is None else native.scan_publishes


#: The scanner the connection uses: the C one when built (and not
#: WARREN_PURE_PYTHON), else `scan_publishes` above. Both return objects with
#: PublishRun's interface.
scan: ScanPublishes = _scanner()
