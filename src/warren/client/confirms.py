"""Publisher confirms counted in bulk, for the hot publishers (perf's, Spark's sink).

:class:`ConfirmTracker` scans the bytes a confirm-mode publisher reads: it
looks only at frame headers and, in basic.ack and basic.nack, at the delivery
tag and the multiple bit; connection.blocked and unblocked set a flag; the
methods that end the publishing (a close, a cancel, a basic.return) go to a
hook that raises. Sans-IO: the caller reads the socket and keeps the tail.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from warren.amqp import spec
from warren.client.protocol import AMQPError

__all__ = ["ConfirmTracker", "close_error"]

_HDR = struct.Struct(">BHI")
_U32 = struct.Struct(">I")
_ACK_ARGS = struct.Struct(">QB")

_ACK = spec.BasicAck.INDEX
_NACK = spec.BasicNack.INDEX
_BLOCKED = spec.ConnectionBlocked.INDEX
_UNBLOCKED = spec.ConnectionUnblocked.INDEX
#: Methods a publisher cannot go on after (or, for a return, must be told of).
STOPS = (
    spec.ConnectionClose.INDEX,
    spec.ChannelClose.INDEX,
    spec.BasicCancel.INDEX,
    spec.BasicReturn.INDEX,
)


def close_error(payload: bytes) -> AMQPError:
    """The error for a close, a cancel or a return (a method frame's payload)."""
    method = spec.decode_method(payload)
    if isinstance(method, spec.BasicCancel):
        return AMQPError(f"consumer cancelled by the server ({method.consumer_tag})")
    code = getattr(method, "reply_code", 0)
    text = getattr(method, "reply_text", "")
    return AMQPError(f"{method.NAME} from server: {code} {text}", code)


def _raise(_index: int, payload: bytes) -> None:
    raise close_error(payload)


class ConfirmTracker:
    """Publisher-side: counts basic.ack/nack (multiple or single) on the confirm channel.

    ``on_stop(method index, payload)`` is called for the methods of STOPS; by
    default it raises :func:`close_error`'s AMQPError."""

    def __init__(self, on_stop: Callable[[int, bytes], None] = _raise) -> None:
        self.acked_upto = 0  # every tag <= this is confirmed
        self.singles: set[int] = set()  # confirmed tags above acked_upto
        self.nacked = 0
        #: The delivery tag of the last basic.nack (0: none yet).
        self.last_nacked = 0
        self.blocked = False
        self.on_stop = on_stop

    @property
    def confirmed(self) -> int:
        return self.acked_upto + len(self.singles)

    def feed(self, buf: bytes) -> int:
        """Handle the complete frames in ``buf``; returns the offset of the first incomplete."""
        pos = 0
        n = len(buf)
        unpack_hdr = _HDR.unpack_from
        while n - pos >= 7:
            ftype, _ch, size = unpack_hdr(buf, pos)
            end = pos + 8 + size
            if end > n:
                break
            if ftype == 1:
                (idx,) = _U32.unpack_from(buf, pos + 7)
                if idx in (_ACK, _NACK):
                    tag, bits = _ACK_ARGS.unpack_from(buf, pos + 11)
                    if idx == _NACK:
                        before = self.confirmed
                        self._confirm(tag, bits & 1)
                        self.nacked += self.confirmed - before
                        self.last_nacked = tag
                    else:
                        self._confirm(tag, bits & 1)
                elif idx == _BLOCKED:
                    self.blocked = True
                elif idx == _UNBLOCKED:
                    self.blocked = False
                elif idx in STOPS:
                    self.on_stop(idx, buf[pos + 7 : end - 1])
            pos = end
        return pos

    def _confirm(self, tag: int, multiple: int) -> None:
        if multiple:
            if tag > self.acked_upto:
                self.acked_upto = tag
                if self.singles:
                    self.singles = {t for t in self.singles if t > tag}
        elif tag == self.acked_upto + 1:
            self.acked_upto = tag
            singles = self.singles
            while self.acked_upto + 1 in singles:
                self.acked_upto += 1
                singles.discard(self.acked_upto)
        elif tag > self.acked_upto:
            self.singles.add(tag)
