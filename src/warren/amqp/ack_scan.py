"""Runs of single basic.acks in one socket read, settled together.

A consumer that acknowledges every delivery on its own (aio-pika's
``message.ack()``, Celery's late acks, most applications) sends basic.ack after
basic.ack, each with multiple=false and the next delivery tag. The read loop
(AMQPConnection.feed) asks ``scan_acks`` for the run that starts at such a
frame: the frames that are exactly that, on one channel, tags counting up by
one; the channel then settles the tags ``first .. first + n - 1`` at once
(Settlement.ack_range, amqp/settlement.py), which is what the frames would
have done one by one. C's (warren._fastpath) when built, else ``scan_acks_python``, its reference
(tests/test_backlog_acks.py holds them to the same answers).
"""

from __future__ import annotations

import struct
from collections.abc import Callable

import warren

__all__ = ["ACK_FRAME_SIZE", "ScanAcks", "scan_acks", "scan_acks_python"]

# type 1, a channel, size 13; then class 60, method 80, the tag, the bits, the end octet.
ACK_FRAME_SIZE = 21
_SIZE_AND_IDS = b"\x00\x00\x00\x0d\x00\x3c\x00\x50"
_U16 = struct.Struct(">H")
_U64 = struct.Struct(">Q")

#: (data, pos, max_n) -> (n, first tag, end)
ScanAcks = Callable[[bytes, int, int], tuple[int, int, int]]


def scan_acks_python(data: bytes, pos: int, max_n: int) -> tuple[int, int, int]:
    """The run of basic.ack frames (multiple and the reserved bits clear) from
    ``data[pos]`` on: one channel, the first frame's; tags ``first``,
    ``first + 1``, ...; at most ``max_n``; each frame complete. Returns (n,
    first tag, where the frame after the run starts); (0, 0, pos) when the
    frame at ``pos`` is not one."""
    n = 0
    first = 0
    channel = 0
    at = pos
    size = len(data)
    while n < max_n and size - at >= ACK_FRAME_SIZE:
        if (
            data[at] != 1
            or data[at + 3 : at + 11] != _SIZE_AND_IDS
            or data[at + 19] != 0
            or data[at + 20] != 0xCE
        ):
            break
        tag = _U64.unpack_from(data, at + 11)[0]
        ch = _U16.unpack_from(data, at + 1)[0]
        if n == 0:
            channel = ch
            first = tag
        elif ch != channel or tag != first + n:
            break
        n += 1
        at += ACK_FRAME_SIZE
    if n == 0:
        return 0, 0, pos
    return n, first, at


_native = warren.native_module("_fastpath")
#: The scanner the read loop uses: C's when built, else the reference.
scan_acks: ScanAcks = scan_acks_python if _native is None else _native.scan_acks
