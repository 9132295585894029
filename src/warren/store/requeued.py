"""Messages a classic queue's consumers gave back, ready again ahead of the log.

A requeued message goes back where it was: ahead of everything appended after
it, so shift() hands out the lowest sequence number first. SegmentStore keeps
them here, in memory (bounded by the consumers' prefetch), rather than
re-reading them from the segment files.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from warren.core.message import Message

__all__ = ["RequeuedMessages"]


class RequeuedMessages:
    """Requeued messages by sequence number, taken lowest first.

    ``by_seq`` holds them; a heap of their sequence numbers gives the order. One
    taken out of the middle (take()) stays in the heap until it reaches the top,
    where pop() and first() drop it.
    """

    def __init__(self) -> None:
        self.by_seq: dict[int, Message] = {}
        self._heap: list[int] = []

    def add(self, seq: int, msg: Message) -> None:
        self.by_seq[seq] = msg
        heapq.heappush(self._heap, seq)

    def first(self) -> tuple[int, Message]:
        """The message pop() returns next, left in place (there must be one)."""
        heap, by_seq = self._heap, self.by_seq
        while heap[0] not in by_seq:  # taken out of the middle
            heapq.heappop(heap)
        return heap[0], by_seq[heap[0]]

    def pop(self) -> tuple[int, Message]:
        """Take the message with the lowest sequence number (there must be one)."""
        heap, by_seq = self._heap, self.by_seq
        seq = heapq.heappop(heap)
        while seq not in by_seq:  # taken out of the middle
            seq = heapq.heappop(heap)
        return seq, by_seq.pop(seq)

    def take(self, seq: int) -> Message | None:
        """Take the message ``seq`` out wherever it is; None when it is not here."""
        by_seq = self.by_seq
        msg = by_seq.pop(seq, None)
        if msg is not None and not by_seq:
            self._heap.clear()
        return msg

    def clear(self) -> dict[int, Message]:
        """Forget every message; returns them by sequence number."""
        by_seq = self.by_seq
        self.by_seq = {}
        self._heap = []
        return by_seq

    def in_order(self) -> Iterator[tuple[int, Message]]:
        """(seq, message) of each, lowest first. Do not change them while iterating."""
        by_seq = self.by_seq
        for seq in sorted(by_seq):
            yield seq, by_seq[seq]

    def body_bytes(self) -> int:
        """The body bytes of every message here."""
        return sum(len(msg.body) for msg in self.by_seq.values())
