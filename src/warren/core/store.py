"""The interface queues keep their messages behind, and the in-memory store.

A queue never touches message storage directly: it appends, shifts the next
ready message, and later acks or requeues it by sequence number. The segment
store (disk-backed) implements the same interface, so protocol code and queue
logic do not change when messages move to disk.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Protocol

from warren.core.message import Message


class MessageStore(Protocol):
    """Ordered message storage for one queue.

    Sequence numbers increase with every append. A requeued message returns to
    its original position: it is shifted before any message appended after it.
    """

    def append(self, msg: Message) -> int: ...

    def append_shifted(self, msg: Message) -> int:
        """Append a message that goes to a consumer at once, as if appended and then
        shifted; only valid while nothing is ready."""
        ...

    def shift(self) -> tuple[int, Message, bool] | None:
        """The next ready message as (seq, message, redelivered), now unacked."""
        ...

    def ack(self, seq: int) -> None:
        """Forget an unacked message for good."""
        ...

    def requeue(self, seq: int, msg: Message) -> None:
        """Make an unacked message ready again, at its original position."""
        ...

    def purge(self) -> int:
        """Drop every ready message; unacked ones stay. Returns the count dropped."""
        ...

    def close(self) -> None: ...

    def flush(self) -> None:
        """Hand buffered writes to the OS (survives a killed broker, not a power cut)."""
        ...

    def sync(self) -> None:
        """Make everything written so far durable (fdatasync); may run in a worker thread."""
        ...

    def delete(self) -> None:
        """Remove the store and whatever it holds (the queue is being deleted)."""
        ...

    @property
    def ready_count(self) -> int: ...

    @property
    def ready_bytes(self) -> int: ...


class MemoryStore:
    """Messages held in RAM: used for transient queues until the segment store lands."""

    __slots__ = ("_ready", "_requeued", "_next_seq", "_bytes")

    def __init__(self) -> None:
        self._ready: deque[tuple[int, Message]] = deque()
        # Requeued messages were shifted from the head, so their sequence numbers are
        # below everything still in _ready: a min-heap in front of the deque restores
        # the original order without searching.
        self._requeued: list[tuple[int, Message]] = []
        self._next_seq = 1
        self._bytes = 0

    def append(self, msg: Message) -> int:
        seq = self._next_seq
        self._next_seq = seq + 1
        self._ready.append((seq, msg))
        self._bytes += len(msg.body)
        return seq

    def append_shifted(self, msg: Message) -> int:
        if self.ready_count:
            raise ValueError("append_shifted needs an empty backlog")
        seq = self._next_seq
        self._next_seq = seq + 1
        return seq

    def shift(self) -> tuple[int, Message, bool] | None:
        if self._requeued:
            seq, msg = heapq.heappop(self._requeued)
            self._bytes -= len(msg.body)
            return seq, msg, True
        if self._ready:
            seq, msg = self._ready.popleft()
            self._bytes -= len(msg.body)
            return seq, msg, False
        return None

    def ack(self, seq: int) -> None:
        pass

    def requeue(self, seq: int, msg: Message) -> None:
        heapq.heappush(self._requeued, (seq, msg))
        self._bytes += len(msg.body)

    def purge(self) -> int:
        n = len(self._ready) + len(self._requeued)
        self._ready.clear()
        self._requeued.clear()
        self._bytes = 0
        return n

    def close(self) -> None:
        pass

    def flush(self) -> None:
        pass

    def sync(self) -> None:
        pass

    def delete(self) -> None:
        self.purge()

    @property
    def ready_count(self) -> int:
        return len(self._ready) + len(self._requeued)

    @property
    def ready_bytes(self) -> int:
        return self._bytes
