"""The format of a classic queue's ack files (``acks.<id>``), and reading them back.

An ack file is a series of batches, one per write::

    u32  0xAC000000 | n      n (1 .. 2**24 - 1) offsets follow
    n x  u32 record offset    acknowledged records of segment <id>
    u32  CRC32                zlib.crc32 of the batch's bytes before it

all big-endian. The CRC is what lets damage cost only a redelivery: a batch that
does not check out is skipped whole (its messages come back, as after a lost
ack), and a damaged entry can never point at another, unacknowledged record
and delete it. Reading resynchronises on the next batch that checks out.

Files written before this format (a bare array of u32 offsets) are read as such;
recovery rewrites them in batches.
"""

from __future__ import annotations

import struct
import sys
import zlib
from array import array

from warren.store.batch_file import MAX_BATCH, next_batch, scan_batches

__all__ = ["AckFile", "encode_acks", "read_acks"]

_BIG_ENDIAN = sys.byteorder == "big"
_U32 = struct.Struct(">I")
_MARK = 0xAC
_MAX_BATCH = MAX_BATCH


def _to_bytes(offsets: array[int]) -> bytes:
    if not _BIG_ENDIAN:
        offsets = array("I", offsets)
        offsets.byteswap()
    return offsets.tobytes()


def encode_acks(offsets: array[int]) -> bytes:
    """One batch (or several, past 2**24 - 1 offsets) for an append to an ack file."""
    n = len(offsets)
    if n > _MAX_BATCH:
        return b"".join(encode_acks(offsets[i : i + _MAX_BATCH]) for i in range(0, n, _MAX_BATCH))
    batch = _U32.pack(_MARK << 24 | n) + _to_bytes(offsets)
    return batch + _U32.pack(zlib.crc32(batch))


class AckFile:
    """What an ack file holds: the offsets of its intact batches (or of a file in
    the old bare format), the byte ranges that did not check out, and where a
    torn last batch starts (-1: none)."""

    __slots__ = ("offsets", "damaged", "torn_at", "legacy")

    def __init__(self) -> None:
        self.offsets = array("I")
        self.damaged: list[tuple[int, int]] = []
        self.torn_at = -1
        self.legacy = False


def read_acks(data: bytes) -> AckFile:
    """Parse an ack file's bytes (never raises)."""
    found = AckFile()
    size = len(data)
    if not size:
        return found
    if data[0] != _MARK and next_batch(data, 0, _MARK, 4) < 0:  # the old format: bare u32 offsets
        found.legacy = True
        arr = array("I")
        arr.frombytes(data[: size - size % 4])
        if not _BIG_ENDIAN:
            arr.byteswap()
        found.offsets = arr
        if size % 4:
            found.torn_at = size - size % 4
        return found
    scan = scan_batches(data, _MARK, 4)
    offsets = found.offsets
    for start, end in scan.payloads:
        batch = array("I")
        batch.frombytes(data[start:end])
        if not _BIG_ENDIAN:
            batch.byteswap()
        offsets.extend(batch)
    found.damaged = scan.damaged
    found.torn_at = scan.torn_at
    return found
