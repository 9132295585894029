"""The interface queues keep their messages behind, and the in-memory store.

A queue never touches message storage directly: it appends, shifts the next
ready message, and later acks or requeues it by sequence number. The segment
store (disk-backed) implements the same interface, so protocol code and queue
logic do not change when messages move to disk.
"""

from __future__ import annotations

import heapq
from array import array
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from warren.core.message import Message, MessageRun
from warren.core.properties import is_transient


class StoredRun:
    """Where a store put the messages of a run that it handed to a consumer at
    once (`MessageStore.append_run`): message ``i`` of them has the sequence
    number ``(segment << 32) | offsets[i]`` and a body of ``sizes[i]`` bytes;
    ``persistent`` of them have delivery-mode 2. Arrays rather than a number
    and a Message per message: a run's acknowledgement settles them in bulk."""

    __slots__ = ("segment", "offsets", "sizes", "persistent")

    def __init__(
        self, segment: int, offsets: array[int], sizes: array[int], persistent: int
    ) -> None:
        self.segment = segment
        self.offsets = offsets
        self.sizes = sizes
        self.persistent = persistent

    def __len__(self) -> int:
        return len(self.offsets)

    def seq(self, i: int) -> int:
        return (self.segment << 32) | self.offsets[i]


class StoreSpan:
    """Ready records that lie one after the other in one segment's memory map
    (`MessageStore.span`): from ``buf[pos]`` up to ``limit`` at most ``left`` of
    them, their CRCs seeded with ``seed``, record ``r`` at offset ``o`` having
    the sequence number ``(segment << 32) | o``; ``redelivered`` for all of
    them. A consumer frames as many as it takes in one pass and says where the
    next starts (``end``); the store then counts them as shifted (`take_span`).
    No record is read into a Message, and nothing is kept per record: a backlog
    goes out in runs, as publish runs do."""

    __slots__ = ("buf", "pos", "limit", "seed", "segment", "left", "redelivered", "end")

    def __init__(
        self,
        buf: Any,
        pos: int,
        limit: int,
        seed: int,
        segment: int,
        left: int,
        redelivered: bool,
    ) -> None:
        self.buf = buf
        self.pos = pos
        self.limit = limit
        self.seed = seed
        self.segment = segment
        self.left = left
        self.redelivered = redelivered
        #: Where the record after the last one taken starts (set by the consumer).
        self.end = pos


class Syncable(Protocol):
    """What the group commit (store/sync.py's GroupSync) needs of anything it
    makes durable: a queue's store that a durable publish wrote to, a
    definitions log, a key journal. The slow half of a sync (the fdatasync
    calls) runs on another thread over what ``collect_sync`` names, so the
    object itself is only touched on its owning thread."""

    def flush(self) -> None:
        """Hand buffered writes to the OS (they survive a killed broker, not a
        power cut). The vhost calls it at the end of each loop turn that wrote,
        and a publish unit before it answers, so a crash loses no answered work."""
        ...

    def collect_sync(self, fds: list[int], paths: list[Path], dirs: list[Path]) -> None:
        """A sync round's first half, on the owning thread: write buffers out and
        add the duplicate descriptors and the paths to fdatasync and the
        directories to fsync. A publisher confirm waits for the round."""
        ...


class MessageStore(Syncable, Protocol):
    """Ordered message storage for one queue: what a queue needs of it, no more.

    Sequence numbers increase with every append. A requeued message returns to
    its original position: it is shifted before any message appended after it.

    A message is *ready* from its append until it is shifted, and again from a
    requeue until the next shift; a shifted message is *unacked* until it is
    acked or requeued.

    The queue hands a store it wrote a durable message to to the group commit,
    hence ``Syncable``. What only a disk store or its recovery has (a full
    sync on the calling thread, the lazy ack sync, the clean-shutdown marks and
    close mark, write-loss queries) is not here: see ``DiskStore``, which the
    group commit and the broker reach without the queue.
    """

    # -- in: publishing -------------------------------------------------------------------
    def append(self, msg: Message) -> int:
        """Store a message behind everything ready; its sequence number. The
        publish path for a queue with a backlog, or whose consumers cannot take it."""
        ...

    def append_shifted(self, msg: Message) -> int:
        """Append a message that goes to a consumer at once, as if appended and then
        shifted; only valid while nothing is ready. It is still written (a requeue
        or a restart finds it) but never read back from the store."""
        ...

    def append_run(self, run: MessageRun, start: int, stop: int) -> StoredRun | None:
        """Messages ``start .. stop - 1`` of a run, appended and handed to a
        consumer at once (append_shifted for many, in one write); only valid
        while nothing is ready. None: this store takes them one by one. The
        publish fast path: a run of publishes to a queue whose consumer keeps up."""
        ...

    def append_ready_run(self, run: MessageRun, start: int, stop: int) -> StoredRun | None:
        """Messages ``start .. stop - 1`` of a run appended as append() would one
        by one (ready, after everything else), in one write. None: this store
        takes them one by one. The fast path for a run into a backlog."""
        ...

    # -- out: delivering ------------------------------------------------------------------
    def shift(self) -> tuple[int, Message, bool] | None:
        """The next ready message as (seq, message, redelivered), now unacked:
        delivery one message at a time (and basic.get)."""
        ...

    def peek(self) -> tuple[int, Message, bool] | None:
        """What shift() would return next, without taking it: the message stays
        ready. For what must look at the head before deciding (per-message TTL
        expiry, the delayed exchange's due time).

        redelivered is True for a requeued message, as shift() would say. A shift()
        right after a peek() returns the same message without reading it again.
        """
        ...

    def span(self) -> StoreSpan | None:
        """The next ready messages, when they are records side by side in a
        segment that a consumer can frame in one pass: shift() for many, the
        backlog's fast path. None: take them one by one (messages given back
        come first, dead records in the way, a store that keeps no records)."""
        ...

    def take_span(self, span: StoreSpan, taken: StoredRun, acked: bool) -> None:
        """The first records of ``span`` (the last of this store's spans, nothing
        changed since), ``taken`` (their offsets and body sizes), up to
        ``span.end``, were delivered: unacked now, as if shifted; ``acked``: to
        a no-ack consumer, acked (ack_run) right after."""
        ...

    def read(self, seq: int) -> Message:
        """An unacked message from append_run or span, read back: the queue holds
        no Message for those, and needs one to requeue or dead-letter it.
        KeyError when the store has no such message."""
        ...

    def read_many(self, seqs: list[int]) -> list[Message | None]:
        """read() of each message, for a run given back at once (a store may
        read it in fewer system calls). None where read() would raise: the
        caller calls read() for that one, which raises (and reports) as ever."""
        ...

    # -- settling -------------------------------------------------------------------------
    def ack(self, seq: int) -> None:
        """Forget an unacked message for good (an ack, or a reject without requeue)."""
        ...

    def ack_run(self, segment: int, offsets: array[int]) -> None:
        """ack() for the messages (segment << 32) | offset, from append_run or span:
        a multiple ack of a run settles it in bulk."""
        ...

    def requeue(self, seq: int, msg: Message) -> None:
        """Make an unacked message ready again, at its original position (a
        nack/reject with requeue, a closed channel's unacked messages)."""
        ...

    def remove_ready(self, seq: int) -> Message | None:
        """Take the ready message ``seq`` out of the queue, wherever it sits (head,
        middle, or requeued), as if shifted and acked at once; the removal is as
        durable as an ack. For what leaves without a consumer: TTL expiry out of
        order, x-max-length overflow, deduplication. Returns the message, or None
        when ``seq`` is not ready (unacked, acked, purged, removed before).
        ``seq`` must be a number this store handed out (append, append_shifted,
        shift, peek or scan_ready)."""
        ...

    def scan_ready(self, exchange: str | None = None) -> Iterator[tuple[int, int, bytes]]:
        """(seq, timestamp in ms, raw properties) of every ready message, in shift
        order, without taking any: a restarted queue rebuilds its expiry index
        and overflow state from it. The store must not change while this runs.
        ``exchange``: only the messages published to that exchange."""
        ...

    def purge(self) -> int:
        """Drop every ready message; unacked ones stay. Returns the count dropped."""
        ...

    # -- counting (queue lengths, stats, flow) --------------------------------------------
    @property
    def ready_count(self) -> int:
        """Ready messages: the queue's length, checked on every publish and delivery."""
        ...

    @property
    def ready_bytes(self) -> int:
        """Body bytes of the ready messages (x-max-length-bytes, message_bytes_ready)."""
        ...

    def transient(self) -> tuple[int, int]:
        """How many of the messages held (ready and unacked) are transient
        (delivery-mode not 2), and their body bytes: what a durable queue's
        messages_persistent leaves out. (0, 0) from a store that does not count."""
        ...

    # -- lifetime -------------------------------------------------------------------------
    def close(self) -> None:
        """Write everything out and release files (the broker stops, the vhost goes)."""
        ...

    def delete(self) -> None:
        """Remove the store and whatever it holds (the queue is being deleted)."""
        ...


class DiskStore(Protocol):
    """What a store that outlives the process has beyond MessageStore, for the
    group commit, the broker's clean stop and its next start; never for the
    queue. They are found on the store by name (``getattr``) where used, as a
    store in RAM has none of them, and none is on the publish path."""

    def sync(self) -> None:
        """Both halves of a sync on the calling thread (a close, tests)."""
        ...

    def sync_acks(self) -> None:
        """Make the acks written so far durable (off the confirm path: a lost ack
        means a redelivery after a power cut, never a lost message); GroupSync's
        lazy ack sync, about once a second."""
        ...

    def lost_between(self, first: int, last: int) -> bool:
        """Whether appends of those write generations were dropped by a failed
        write-out (store/disk_budget.py): their confirms must be nacks."""
        ...

    def seal(self) -> None:
        """A clean stop is coming: mark where the write segment's data ends."""
        ...

    def delivered_marks(self) -> dict[Path, int]:
        """For each log on disk (its directory): a seq below which every record
        still held was delivered. A clean shutdown records them, so that the next
        start reports exactly those messages as redelivered (after a crash, all)."""
        ...


class MemoryStore:
    """Messages held in RAM (tests, and a VHost created without a store factory)."""

    __slots__ = ("_msgs", "_order", "_requeued", "_next_seq", "_bytes", "_transient", "_t_bytes")

    def __init__(self) -> None:
        # Every ready message by seq. _order and _requeued say in which order they
        # go; a seq taken out by remove_ready stays in them until it reaches the
        # front, where it is dropped because _msgs no longer has it.
        self._msgs: dict[int, Message] = {}
        self._order: deque[int] = deque()  # appended, never shifted: ascending
        # Requeued messages were shifted from the front, so their sequence numbers
        # are below everything still in _order: a min-heap in front of the deque
        # restores the original order without searching.
        self._requeued: list[int] = []
        self._next_seq = 1
        self._bytes = 0
        # The transient messages held, ready or unacked: seq -> body size.
        self._transient: dict[int, int] = {}
        self._t_bytes = 0

    def _took(self, seq: int, msg: Message) -> None:
        if is_transient(msg.properties):
            self._transient[seq] = len(msg.body)
            self._t_bytes += len(msg.body)

    def _gone(self, seq: int) -> None:
        if self._transient:
            self._t_bytes -= self._transient.pop(seq, 0)

    def append(self, msg: Message) -> int:
        seq = self._next_seq
        self._next_seq = seq + 1
        self._msgs[seq] = msg
        self._order.append(seq)
        self._bytes += len(msg.body)
        self._took(seq, msg)
        return seq

    def append_shifted(self, msg: Message) -> int:
        if self._msgs:
            raise ValueError("append_shifted needs an empty backlog")
        seq = self._next_seq
        self._next_seq = seq + 1
        self._took(seq, msg)
        return seq

    def append_run(self, run: MessageRun, start: int, stop: int) -> StoredRun | None:
        return None  # one by one: RAM holds no record a run could share

    def append_ready_run(self, run: MessageRun, start: int, stop: int) -> StoredRun | None:
        return None

    def ack_run(self, segment: int, offsets: array[int]) -> None:
        for offset in offsets:
            self.ack((segment << 32) | offset)

    def span(self) -> StoreSpan | None:
        return None  # no records: one by one

    def take_span(self, span: StoreSpan, taken: StoredRun, acked: bool) -> None:
        raise ValueError("a MemoryStore hands out no spans")

    def read_many(self, seqs: list[int]) -> list[Message | None]:
        return [None] * len(seqs)  # read() says why for each

    def read(self, seq: int) -> Message:
        # Shifted messages are not kept here (the consumer's delivery holds them),
        # and append_run hands out none, so no caller can name one.
        raise KeyError(seq)

    def shift(self) -> tuple[int, Message, bool] | None:
        msgs = self._msgs
        requeued = self._requeued
        while requeued:
            seq = heapq.heappop(requeued)
            msg = msgs.pop(seq, None)
            if msg is not None:
                self._bytes -= len(msg.body)
                return seq, msg, True
        order = self._order
        while order:
            seq = order.popleft()
            msg = msgs.pop(seq, None)
            if msg is not None:
                self._bytes -= len(msg.body)
                return seq, msg, False
        return None

    def peek(self) -> tuple[int, Message, bool] | None:
        msgs = self._msgs
        requeued = self._requeued
        while requeued:
            msg = msgs.get(requeued[0])
            if msg is not None:
                return requeued[0], msg, True
            heapq.heappop(requeued)
        order = self._order
        while order:
            msg = msgs.get(order[0])
            if msg is not None:
                return order[0], msg, False
            order.popleft()
        return None

    def remove_ready(self, seq: int) -> Message | None:
        msg = self._msgs.pop(seq, None)
        if msg is not None:
            self._bytes -= len(msg.body)
            self._gone(seq)
            if not self._msgs:
                self._order.clear()
                self._requeued.clear()
        return msg

    def scan_ready(self, exchange: str | None = None) -> Iterator[tuple[int, int, bytes]]:
        msgs = self._msgs
        for seq in (*sorted(self._requeued), *self._order):
            msg = msgs.get(seq)
            if msg is not None and (exchange is None or msg.exchange == exchange):
                yield seq, msg.timestamp, msg.properties

    def ack(self, seq: int) -> None:
        self._gone(seq)

    def requeue(self, seq: int, msg: Message) -> None:
        self._msgs[seq] = msg
        heapq.heappush(self._requeued, seq)
        self._bytes += len(msg.body)

    def purge(self) -> int:
        n = len(self._msgs)
        if self._transient:
            for seq in self._msgs:
                self._gone(seq)
        self._msgs.clear()
        self._order.clear()
        self._requeued.clear()
        self._bytes = 0
        return n

    def close(self) -> None:
        pass

    def flush(self) -> None:
        pass

    def sync(self) -> None:
        pass

    def sync_acks(self) -> None:
        pass

    def collect_sync(self, fds: list[int], paths: list[Path], dirs: list[Path]) -> None:
        pass

    def delete(self) -> None:
        self.purge()

    def delivered_marks(self) -> dict[Path, int]:
        return {}  # nothing outlives the process

    def transient(self) -> tuple[int, int]:
        return len(self._transient), self._t_bytes

    @property
    def ready_count(self) -> int:
        return len(self._msgs)

    @property
    def ready_bytes(self) -> int:
        return self._bytes


#: How many messages a settlement reads back at once (read_ahead): enough to
#: share the reads of a span's records, few enough that RAM holds a bounded
#: number of them whatever the span's length.
READ_AHEAD = 256


def read_ahead(
    store: MessageStore, seqs: list[int], msgs: list[Message | None], start: int
) -> list[Message | None]:
    """store.read_many of the next READ_AHEAD messages from ``seqs[start]`` on
    that are still to be read back (``msgs`` None), in order."""
    want: list[int] = []
    n = len(seqs)
    i = start
    while i < n and len(want) < READ_AHEAD:
        if msgs[i] is None:
            want.append(seqs[i])
        i += 1
    return store.read_many(want)
