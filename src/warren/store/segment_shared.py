"""The parts of a classic queue store (store/segment_store.py) that its off-path
parts, SegmentFaults (failed write-outs, damage) and SegmentRemovals (out of
order removals, purge), work on: given to both as one object when the store
makes them. Its own module, not compiled: segment_parts.py is imported by the
reader, which this names (a native class's attribute types must be imported
when its module is, and that would be a cycle there).
"""

from __future__ import annotations

from dataclasses import dataclass

from warren.store.requeued import RequeuedMessages
from warren.store.segment_files import SegmentFiles, SegmentState
from warren.store.segment_parts import ReadyCounts, SegmentOwner
from warren.store.segment_reader import SegmentReader
from warren.store.transient_counts import TransientCounts

__all__ = ["SegmentParts"]


@dataclass(frozen=True)
class SegmentParts:
    """The store's parts that its off-path parts work on, the same objects the
    store holds, given once."""

    files: SegmentFiles
    #: The segment table (segment id -> state).
    segs: dict[int, SegmentState]
    reader: SegmentReader
    ready: ReadyCounts
    transient: TransientCounts
    requeued: RequeuedMessages
    #: Whether live transient records are counted (the store's count_transient).
    count_transient: bool
    owner: SegmentOwner
