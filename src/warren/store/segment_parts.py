"""What a classic queue store (store/segment_store.py) shares with its parts that
change its counts (store/segment_reader.py, store/segment_faults.py,
store/segment_settle.py): its ready counts, and the few things only the store
itself does, which they ask of it.

The parts are given these, and the store's other parts they work on (its
files, segment table, reader, transient counts, requeued messages), when the
store makes them, the off-path ones as one SegmentParts
(store/segment_shared.py); they hold no reference to the store's private state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from warren.core.message import Message
from warren.store.segment_files import SegmentState

__all__ = ["ReadyCounts", "SegmentOwner"]


class ReadyCounts:
    """A store's ready messages and their body bytes: the store's, shared with
    the parts that take messages out other than through its cursor."""

    def __init__(self) -> None:
        self.count = 0
        self.bytes = 0

    def take(self, count: int, size: int) -> None:
        """``count`` ready messages of ``size`` body bytes left."""
        self.count -= count
        self.bytes -= size

    def reset(self) -> None:
        """Nothing is ready any more."""
        self.count = self.bytes = 0


class SegmentOwner(Protocol):
    """What the parts ask of their store (SegmentStore implements it)."""

    #: Told (count, bytes) when ready messages are dropped by a failed write-out.
    on_ready_lost: Callable[[int, int], None] | None
    #: Told the messages whose records a failed write-out dropped.
    on_dropped: Callable[[list[Message]], None] | None

    def ack(self, seq: int) -> None:
        """Acknowledge a message (durable like any ack)."""

    def write_segment(self) -> SegmentState | None:
        """The segment appends go to, or None before the next append."""

    def forget_write_segment(self) -> None:
        """The log closed the write segment itself (a failed write-out)."""

    def retire_write_segment(self) -> None:
        """Close the write segment; the next append starts a new one."""

    def drop_segment(self, seg: SegmentState) -> None:
        """Delete a segment whose records are all dead."""

