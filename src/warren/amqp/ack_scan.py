"""Runs of single basic.acks (or rejects, or nacks) in one socket read, settled together.

A consumer that acknowledges every delivery on its own (aio-pika's
``message.ack()``, Celery's late acks, most applications) sends basic.ack after
basic.ack, each with multiple=false and the next delivery tag; one that gives
every delivery back sends basic.reject (or basic.nack, multiple=false) after
basic.reject the same way. The read loop (AMQPConnection.feed) asks
``scan_acks`` for the run that starts at such a frame: the frames that are
exactly the first one's method with the first one's flags, on its channel,
tags counting up by one; the channel then settles the tags ``first .. first +
n - 1`` at once (Settlement.ack_range and reject_range, amqp/settlement.py),
which is what the frames would have done one by one. C's (warren._fastpath)
when built, else ``scan_acks_python``, its reference (tests/core/test_backlog_acks.py
holds them to the same answers).
"""

from __future__ import annotations

import struct
from collections.abc import Callable

import warren

__all__ = [
    "ACK_FRAME_SIZE",
    "ACK_IDS",
    "NACK_IDS",
    "REJECT_IDS",
    "ScanAcks",
    "scan_acks",
    "scan_acks_python",
]

# type 1, a channel, size 13; then class 60, a method, the tag, the bits, the end octet.
ACK_FRAME_SIZE = 21
_FRAME_SIZE = b"\x00\x00\x00\x0d"
#: The class and method ids a run may be made of, and the flags octets each
#: may carry: basic.ack (multiple clear), basic.reject (requeue or not),
#: basic.nack (multiple clear, requeue or not). Reserved bits set: never a run.
ACK_IDS = b"\x00\x3c\x00\x50"
REJECT_IDS = b"\x00\x3c\x00\x5a"
NACK_IDS = b"\x00\x3c\x00\x78"
_RUN_BITS = {ACK_IDS: (0,), REJECT_IDS: (0, 1), NACK_IDS: (0, 2)}
_U16 = struct.Struct(">H")
_U64 = struct.Struct(">Q")

#: (data, pos, max_n) -> (n, first tag, end)
ScanAcks = Callable[[bytes, int, int], tuple[int, int, int]]


def scan_acks_python(data: bytes, pos: int, max_n: int) -> tuple[int, int, int]:
    """The run of frames from ``data[pos]`` on that are the first one's method
    (basic.ack with multiple clear, basic.reject, or basic.nack with multiple
    clear) with the first one's flags octet: one channel, the first frame's;
    tags ``first``, ``first + 1``, ...; at most ``max_n``; each frame complete.
    Returns (n, first tag, where the frame after the run starts); (0, 0, pos)
    when the frame at ``pos`` is not one."""
    n = 0
    first = 0
    channel = 0
    ids = b""
    bits = 0
    at = pos
    size = len(data)
    while n < max_n and size - at >= ACK_FRAME_SIZE:
        if data[at] != 1 or data[at + 3 : at + 7] != _FRAME_SIZE or data[at + 20] != 0xCE:
            break
        tag = _U64.unpack_from(data, at + 11)[0]
        ch = _U16.unpack_from(data, at + 1)[0]
        if n == 0:
            ids = bytes(data[at + 7 : at + 11])
            bits = data[at + 19]
            if bits not in _RUN_BITS.get(ids, ()):
                break
            channel = ch
            first = tag
        elif (
            ch != channel
            or tag != first + n
            or data[at + 7 : at + 11] != ids
            or data[at + 19] != bits
        ):
            break
        n += 1
        at += ACK_FRAME_SIZE
    if n == 0:
        return 0, 0, pos
    return n, first, at


_native = warren.native_module("_fastpath")
#: The scanner the read loop uses: C's when built, else the reference.
scan_acks: ScanAcks = scan_acks_python if _native is None else _native.scan_acks
