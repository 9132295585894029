"""Publish: a connection's publishers storing into their streams, and their confirms.

Each record of a Publish becomes a core message (the connection's
StreamMessageCodec: AMQP 1.0's mapping, the bare message kept as published)
appended to the publisher's stream queue through the vhost, as an AMQP
publish to the default exchange would be; a Publish v2 filter value goes
with it as the ``x-stream-filter-value`` header the core's stream filters
read. A sub-entry batch is one publishing id for all its records, and is
stored closed, whatever its compression, in the chunk record of the fast
path (as osiris does: one offset per record, the batch delivered to
stream consumers as it came; store/stream_cursor.py opens none and gzip
for AMQP readers). On the per-message path (a stream deduplicating by
header, StreamQueue.takes_chunks) gzip and uncompressed batches are opened
and the other compressions refused.

The fast path (``_publish_chunk``): plain Publish frames go into one chunk
record per stream for all of a read's (``flush``: when the read is done,
before any other command, or at CHUNK_ENTRIES), whatever their publisher,
the trailer holding each one's last id: subscribers pay per chunk, and get
chunks of thousands of small messages, as RabbitMQ's writer makes them.

PublishConfirm waits for the client session's Settlements: the group sync
and the in-sync followers, as an AMQP publisher confirm. Confirms go out
one PublishConfirm per publisher and settled batch, not one per message.

Deduplication (RabbitMQ: osiris's writer tracking): a publisher declared
with a reference drops a record whose publishing id is not above the last
one stored for that reference on the stream (and confirms it, as RabbitMQ
does). The last id is kept in the stream's tracking file under a name of
its own (`sequence_name`), written with the records' flush and synced with
them, so it survives reconnects and restarts, and QueryPublisherSequence
answers it.
"""

from __future__ import annotations

import hashlib
import logging
from typing import TYPE_CHECKING, Any, Final

from warren.core.errors import BrokerError
from warren.core.message import Message
from warren.core.properties import set_header
from warren.core.stream import FILTER_VALUE_HEADER
from warren.core.vhost_routing import REJECTED_BY_QUEUE
from warren.stream_protocol import commands as c
from warren.stream_protocol.chunk import entry_at, read_records
from warren.stream_protocol.constants import ResponseCode
from warren.stream_protocol.wire import PublishingError, StreamProtocolError

if TYPE_CHECKING:
    from warren.core.stream_queue import StreamQueue
    from warren.stream_protocol.connection import StreamConnection
    from warren.stream_protocol.control import Publisher
    from warren.stream_protocol.publish import Publish, PublishEntries

__all__ = ["SEQUENCE_PREFIX", "Publishing", "last_sequence", "sequence_name"]

log = logging.getLogger("warren.stream")

#: The most entries one chunk record holds: merging Publish frames stops here,
#: and a Publish of more is stored as several. A subscription from LAST gets
#: the last chunk, and RabbitMQ's writer cuts its chunks about this small
#: (1,500-4,500 records of 16 B in bench/stream_compare.py; rstream's suite
#: checks that LAST of a 5,000-message batch is not all of it).
CHUNK_ENTRIES: Final = 4096
#: The most entry bytes Publish frames are merged into (one frame may be more).
CHUNK_BYTES: Final = 1 << 20

#: Tracking names of publisher sequences start with this; StoreOffset and
#: QueryOffset leave such references alone.
SEQUENCE_PREFIX: Final = "\x00pub\x00"
_MAX_NAME: Final = 255
#: What waits for a settlement: a publisher id and one publishing id, or all
#: of a Publish's that one chunk record holds (the fast path).
_Token = tuple[int, int | list[int]]


class _Pending:
    """A stream's chunk being gathered from a read's Publish frames: their
    entries (and the messages they hold), each piece's publisher with the ids it stores and the duplicates
    confirmed with them, and each reference's last id (the trailer's)."""

    __slots__ = ("queue", "ts", "parts", "count", "records", "size", "pieces", "sequences")

    def __init__(self, queue: StreamQueue, ts: int) -> None:
        self.queue = queue
        self.ts = ts
        self.parts: list[bytes] = []
        self.count = 0  # entries
        self.records = 0  # messages (a sub-entry batch holds several)
        self.size = 0
        self.pieces: list[tuple[Publisher, list[int], list[int]]] = []
        self.sequences: dict[str, int] = {}


def sequence_name(reference: str) -> str:
    """The tracking name a publisher reference's last publishing id is kept
    under; a hash for a reference too long for the tracking file's names."""
    name = SEQUENCE_PREFIX + reference
    if len(name.encode("utf-8", "surrogateescape")) <= _MAX_NAME:
        return name
    digest = hashlib.sha256(reference.encode("utf-8", "surrogateescape")).hexdigest()
    return SEQUENCE_PREFIX + "sha256:" + digest


def last_sequence(queue: StreamQueue, reference: str) -> int:
    """The last publishing id stored on ``queue`` for ``reference`` (0: none):
    the tracking file's, or a chunk record's trailer's when that is later (the
    file's last write may be lost in a crash; the records' are synced first)."""
    stored = queue.stream.tracked(sequence_name(reference)) or 0
    return max(stored, queue.stream.publisher_sequence(reference))


class Publishing:
    """One connection's publishing: stores records, answers with confirms and errors."""

    def __init__(self, conn: StreamConnection) -> None:
        self.conn = conn
        self.settlements = conn.client_session.settlements(self._settled, self._wake, ordered=False)
        self._write_out_due = False
        #: Confirms to send at the end of the turn: publisher id -> publishing ids.
        self._confirms: dict[int, list[int]] = {}
        #: Chunks being gathered from this read's Publish frames, per stream (flush).
        self._pending: dict[StreamQueue, _Pending] = {}

    # -- storing ------------------------------------------------------------------------
    def publish(self, command: Publish, pub: Publisher | None) -> None:
        """Store ``command``'s records for ``pub`` (None: unknown publisher)."""
        entries = command.scan()
        if pub is None:
            unknown = [
                PublishingError(pid, ResponseCode.PUBLISHER_DOES_NOT_EXIST)
                for pid in entries.publishing_ids
            ]
            if unknown:
                self.conn.reply(c.PublishError(command.publisher_id, unknown))
            return
        q = pub.queue
        if entries.filter_values is None and not entries.empty and q.takes_chunks():
            self._publish_chunk(command, entries, pub)
            return
        if self._pending:
            self.flush()  # stored in order
        conn = self.conn
        vhost = q.vhost
        router = vhost.router
        exchange = vhost.default_exchange
        to_core = conn.messages.to_core
        buf = command.messages
        filters = entries.filter_values
        reference = pub.reference
        last = last_sequence(q, reference) if reference else 0
        top = last
        now = conn.now_ms or conn.node.clock.now_ms()
        stored: list[int] = []
        duplicates: list[int] = []
        errors: list[PublishingError] = []
        durable: list[Any] = []
        stats = conn.stats
        for i, pid in enumerate(entries.publishing_ids):
            if reference and pid <= top:
                duplicates.append(pid)
                continue
            start, end = entries.starts[i], entries.ends[i]
            try:
                records = read_records(buf, entry_at(buf, start, end))
            except StreamProtocolError as exc:
                log.warning("%s: a record refused: %s", conn.name, exc)
                errors.append(PublishingError(pid, ResponseCode.PRECONDITION_FAILED))
                continue
            filter_value = filters[i] if filters is not None else None
            refused = False
            for record in records:
                properties, body, native = to_core(record)
                if filter_value is not None:
                    properties = set_header(properties, FILTER_VALUE_HEADER, filter_value)
                msg = Message("", q.name, properties, body, now, native)
                stats.publish += 1
                try:
                    taken = router.enqueue(exchange, [q], msg, durable)
                except BrokerError as exc:
                    log.warning("%s: a record refused: %s", conn.name, exc.text)
                    refused = True
                    break
                if taken == REJECTED_BY_QUEUE or taken <= 0:
                    refused = True
                    break
            if refused:
                errors.append(PublishingError(pid, ResponseCode.INTERNAL_ERROR))
                continue
            stored.append(pid)
            if pid > top:
                top = pid
        if top > last:
            # Written with this turn's flush, synced with the records.
            q.stream.track(sequence_name(reference), top, at_once=True)
            vhost.store_written(q.store)
        # One entry for the stream however many records took it (Settlements'
        # batches are keyed by their store set).
        stores = [q.store] if durable or top > last else []
        pub.published += len(entries.publishing_ids)
        if errors:
            pub.errored += len(errors)
            conn.reply(c.PublishError(pub.publisher_id, errors))
        answered = stored + duplicates
        if not answered:
            return
        tokens: list[_Token] = [(pub.publisher_id, pid) for pid in answered]
        if not self.settlements.add_many(tokens, stores):
            self._confirm_now(tokens)

    def _publish_chunk(self, command: Publish, entries: PublishEntries, pub: Publisher) -> None:
        """The fast path: no filter values, a stream that reads no message
        (StreamQueue.takes_chunks): the entries not yet stored (publishing
        ids above the publisher's last, with a reference) join the stream's
        pending chunk (``_add``), sub-entry batches closed (one offset per
        record in them), stored by ``flush`` with those of the connection's
        other Publish frames of this read, and confirmed as the per-message
        path confirms: after the stream's sync."""
        q = pub.queue
        ids = entries.publishing_ids
        starts, ends = entries.starts, entries.ends
        view = memoryview(command.messages)
        reference = pub.reference
        duplicates: list[int] = []
        if reference:
            pending = self._pending.get(q)
            top = last_sequence(q, reference)
            if pending is not None:
                top = max(top, pending.sequences.get(reference, 0))
            stored: list[int] = []
            parts: list[memoryview] = []
            for i, pid in enumerate(ids):
                if pid <= top:
                    duplicates.append(pid)
                    continue
                stored.append(pid)
                parts.append(view[starts[i] : ends[i]])
                top = pid
        else:
            stored = ids
            parts = [view[s:e] for s, e in zip(starts, ends, strict=True)]
        # Messages per entry, when some are batches (their u16 record count).
        held = None
        if entries.batches:
            held = [(p[1] << 8 | p[2]) if p[0] & 0x80 else 1 for p in parts]
        pub.published += len(ids)
        if parts:
            self._add(pub, parts, stored, duplicates, held)
        elif duplicates:
            tokens: list[_Token] = [(pub.publisher_id, duplicates)]
            if not self.settlements.add_many(tokens, []):
                self._confirm_now(tokens)

    def _add(
        self,
        pub: Publisher,
        parts: list[memoryview],
        stored: list[int],
        duplicates: list[int],
        held: list[int] | None = None,
    ) -> None:
        """``parts`` (entries with publishing ids ``stored``; ``held``: the
        messages in each, when some are sub-entry batches) joined to the
        pending chunk of ``pub``'s stream; a chunk of CHUNK_ENTRIES entries or
        CHUNK_BYTES bytes is stored at once, and a new one begun. The entries
        are copied here, not held as views until the flush: thousands of live
        views cost more (allocation, the GC's young generation) than a copy."""
        q = pub.queue
        n = len(parts)
        data = b"".join(parts) if n <= CHUNK_ENTRIES else b""
        pending = self._pending.get(q)
        if pending is not None and (
            pending.count + n > CHUNK_ENTRIES or pending.size + len(data) > CHUNK_BYTES
        ):
            self._store(self._pending.pop(q))
            pending = None
        reference = pub.reference
        done = 0
        while done < n:
            if pending is None:
                now = self.conn.now_ms or self.conn.node.clock.now_ms()
                pending = self._pending[q] = _Pending(q, now)
            take = min(n - done, CHUNK_ENTRIES - pending.count)
            ids = stored[done : done + take]
            if take < n:  # a Publish larger than a chunk, cut
                data = b"".join(parts[done : done + take])
            pending.parts.append(data)
            pending.count += take
            pending.records += take if held is None else sum(held[done : done + take])
            pending.size += len(data)
            pending.pieces.append((pub, ids, duplicates if not done else []))
            if reference:
                pending.sequences[reference] = ids[-1]
            done += take
            if pending.count >= CHUNK_ENTRIES:
                self._store(self._pending.pop(q))
                pending = None

    def flush(self) -> None:
        """Store the pending chunks (the end of a read, or a command other than
        Publish: what it does or answers comes after them)."""
        while self._pending:
            self._store(self._pending.pop(next(iter(self._pending))))

    def _store(self, pending: _Pending) -> None:
        """One pending chunk as one chunk record, its pieces waiting for the
        stream's sync (or refused, all of them, when it cannot be stored)."""
        conn = self.conn
        q = pending.queue
        n = pending.count
        pieces = pending.pieces
        try:
            if q.deleted:
                raise BrokerError(f"stream '{q.name}' deleted")  # between _add and here
            parts = pending.parts
            data = parts[0] if len(parts) == 1 else b"".join(parts)
            records = pending.records
            q.publish_chunk(
                data, n, pending.ts, records=-1 if records == n else records,
                sequences=pending.sequences,
            )  # fmt: skip
        except (BrokerError, OSError, ValueError) as exc:
            log.warning("%s: a Publish refused: %s", conn.name, exc)
            refused: list[_Token] = []
            for pub, ids, duplicates in pieces:
                pub.errored += len(ids)
                errors = [PublishingError(pid, ResponseCode.INTERNAL_ERROR) for pid in ids]
                conn.reply(c.PublishError(pub.publisher_id, errors))
                if duplicates:
                    refused.append((pub.publisher_id, duplicates))
            if refused:
                self._confirm_now(refused)
            return
        q.vhost.default_exchange.stats.count_publish(pending.records)
        conn.stats.publish += pending.records
        for reference, top in pending.sequences.items():
            # The tracking file too (QueryPublisherSequence, older readers).
            q.stream.track(sequence_name(reference), top, at_once=True)
        # One token per piece: its ids are confirmed (or refused) together.
        tokens: list[_Token] = [
            (pub.publisher_id, ids + duplicates if duplicates else ids)
            for pub, ids, duplicates in pieces
        ]
        if not self.settlements.add_many(tokens, [q.store]):
            self._confirm_now(tokens)

    # -- confirming ---------------------------------------------------------------------
    def _confirm_now(self, tokens: list[_Token]) -> None:
        if not self._confirms:
            self.conn.on_output()
        confirms = self._confirms
        for publisher_id, pid in tokens:
            if isinstance(pid, list):
                confirms.setdefault(publisher_id, []).extend(pid)
            else:
                confirms.setdefault(publisher_id, []).append(pid)

    def _wake(self) -> None:
        self._write_out_due = True
        self.conn.on_output()

    def _settled(self, batch: list[_Token], ok: bool) -> None:
        """Records the core settled (synced, held by the followers): confirmed,
        or refused when their store lost them (a full disk)."""
        conn = self.conn
        if conn.closed:
            return
        if ok:
            self._confirm_now(batch)
            return
        by_publisher: dict[int, list[PublishingError]] = {}
        for publisher_id, pids in batch:
            errors = by_publisher.setdefault(publisher_id, [])
            for pid in pids if isinstance(pids, list) else [pids]:
                errors.append(PublishingError(pid, ResponseCode.INTERNAL_ERROR))
        for publisher_id, errors in by_publisher.items():
            pub = conn.control.publishers.get(publisher_id)
            if pub is not None:
                pub.errored += len(errors)
            conn.reply(c.PublishError(publisher_id, errors))

    def before_output(self) -> None:
        """End of the turn: write out what waits for it (``sync = false``),
        then the confirms gathered, one PublishConfirm per publisher."""
        if self._pending:
            self.flush()
        if self._write_out_due:
            self._write_out_due = False
            vhost = self.conn.vhost
            if vhost is not None:
                vhost.flush_written()
            self.settlements.written()
        if self._confirms:
            confirms, self._confirms = self._confirms, {}
            publishers = self.conn.control.publishers
            stats = self.conn.stats
            for publisher_id, ids in confirms.items():
                stats.confirm += len(ids)
                pub = publishers.get(publisher_id)
                if pub is not None:
                    pub.confirmed += len(ids)
                self.conn.reply(c.PublishConfirm(publisher_id, ids))
