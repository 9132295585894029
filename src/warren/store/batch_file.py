"""Reading files of checksummed batches: ack files (store/ack_files.py) and
delivery counts (store/delivery_counts.py) share the framing::

    u32  MARK << 24 | n      n (1 .. 2**24 - 1) fixed-size entries follow
    n x  entry
    u32  CRC32               zlib.crc32 of the batch's bytes before it

all big-endian. A batch that does not check out is skipped whole and reading
resynchronises on the next one that does; a batch cut short at the end of the
file is a torn write, told apart from damage.
"""

from __future__ import annotations

import struct
import zlib

__all__ = ["MAX_BATCH", "BatchScan", "scan_batches"]

_U32 = struct.Struct(">I")
#: The most entries one batch holds (its count's 24 bits).
MAX_BATCH = (1 << 24) - 1


class BatchScan:
    """What a scan found: each intact batch's entries as a (start, end) byte span,
    the byte ranges that did not check out, and where a torn last batch starts
    (-1: none)."""

    __slots__ = ("payloads", "damaged", "torn_at")

    def __init__(self) -> None:
        self.payloads: list[tuple[int, int]] = []
        self.damaged: list[tuple[int, int]] = []
        self.torn_at = -1


def _batch_at(data: bytes, pos: int, mark: int, entry_size: int) -> int:
    """The end of the batch at ``pos`` when it checks out, else -1."""
    if pos + 8 > len(data):
        return -1
    head = _U32.unpack_from(data, pos)[0]
    n = head & MAX_BATCH
    if head >> 24 != mark or not n:
        return -1
    end = pos + 4 + entry_size * n
    if end + 4 > len(data) or zlib.crc32(data[pos:end]) != _U32.unpack_from(data, end)[0]:
        return -1
    return end + 4


def next_batch(data: bytes, start: int, mark: int, entry_size: int) -> int:
    """The first offset from ``start`` where a batch checks out, or -1."""
    byte = bytes((mark,))
    q = data.find(byte, start)
    while q >= 0:
        if _batch_at(data, q, mark, entry_size) >= 0:
            return q
        q = data.find(byte, q + 1)
    return -1


def _torn(data: bytes, pos: int, mark: int, entry_size: int) -> bool:
    """Whether the bytes from ``pos`` on are the start of one batch cut short."""
    rest = len(data) - pos
    if rest < 4:
        return True
    head = _U32.unpack_from(data, pos)[0]
    n = head & MAX_BATCH
    return head >> 24 == mark and n > 0 and entry_size * n + 8 > rest


def scan_batches(data: bytes, mark: int, entry_size: int) -> BatchScan:
    """Every batch of ``data`` (never raises)."""
    found = BatchScan()
    pos, size = 0, len(data)
    while pos < size:
        end = _batch_at(data, pos, mark, entry_size)
        if end >= 0:
            found.payloads.append((pos + 4, end - 4))
            pos = end
            continue
        nxt = next_batch(data, pos + 1, mark, entry_size)
        if nxt < 0:
            if _torn(data, pos, mark, entry_size):
                found.torn_at = pos
            else:
                found.damaged.append((pos, size))
            break
        found.damaged.append((pos, nxt))
        pos = nxt
    return found
