"""What a stream store knows of one of its segments: a few ints, nothing per message.

Its own module so that the store, its recovery (store/stream_recovery.py),
its cursors and a replica share the one compiled class (the cursor reads its
fields on every step).
"""

from __future__ import annotations

__all__ = ["StreamSegment"]


class StreamSegment:
    """One segment of a stream: where its offsets begin, how many it holds, its
    bytes and first and last publish times, and its damaged ranges if it has any."""

    __slots__ = ("id", "first_offset", "count", "bytes", "first_ts", "last_ts", "gaps")

    def __init__(self, segment_id: int, first_offset: int, first_ts: int) -> None:
        self.id = segment_id
        self.first_offset = first_offset
        self.count = 0  # offsets, those of damaged records included
        self.bytes = 0
        self.first_ts = first_ts
        self.last_ts = first_ts
        # Damaged bytes (kept aside, never served): start -> (end, offsets they held).
        self.gaps: dict[int, tuple[int, int]] | None = None
