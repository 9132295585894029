"""The worker processes of ``warren perf stream``: producers and consumers of
RabbitMQ's stream protocol.

The workers keep the client from being the bottleneck:

* a producer's connection declares ``--publishers-per-connection`` publishers
  and sends them batches in turn. Publish frames are built as bytes
  (:class:`~warren.perf.stream_client.PublishTemplate`): ``--batch`` messages
  to a frame, one pre-encoded AMQP 1.0 message (a data section) for all, the
  publishing ids packed with one ``struct.pack`` per frame; a batch of frames
  goes out in one ``sendall``. PublishConfirm and PublishError frames are
  counted from their headers (the ids are not read); at most ``--confirm``
  messages wait for their confirm.
* a consumer counts a Deliver's records from its chunk header (``num_records``)
  and takes the send timestamp of the chunk's first record for all its records,
  without decoding the messages (``--decode``: every record is located and its
  own timestamp taken). It grants one credit back for each chunk, in one Credit
  frame per read.

A side with nothing to send (a consumer of an idle stream, a producer waiting
for confirms) sends heartbeats at half the interval agreed in Tune.
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass
from functools import partial
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

from warren.perf.stream_client import (
    CREDIT,
    DELIVER,
    HEARTBEAT,
    PUBLISH_CONFIRM,
    PUBLISH_ERROR,
    PublishTemplate,
    StreamConnection,
    StreamError,
    StreamURI,
    chunk_info,
    chunk_timestamps,
    connect,
    credit_frame,
    metadata_update_text,
    walk_frames,
)
from warren.perf.workers import (
    FINISH_TIMEOUT,
    NS,
    Heartbeat,
    Publisher,
    Receiver,
    Worker,
    WorkerResult,
    record_latency,
    worker_entry,
)
from warren.stream_protocol.constants import RESPONSE_BIT, Key

if TYPE_CHECKING:
    from warren.perf.stream import StreamParams

__all__ = ["StreamResult", "worker_main"]

_COUNT = struct.Struct(">I")
#: Frames that end a worker's run: the broker's Close, a MetadataUpdate (the stream is gone).
_FATAL = (int(Key.CLOSE), int(Key.METADATA_UPDATE))
_CREDIT_REFUSED = CREDIT | RESPONSE_BIT
#: Credit is a u16 per frame.
_MAX_CREDIT = 0xFFFF


@dataclass
class StreamResult(WorkerResult):
    """What a worker sends with "done"; ``acked`` counts confirmed messages."""

    #: Producers: publishing ids the broker answered with a PublishError.
    errors: int = 0
    #: Consumers: the Deliver frames (chunks) received.
    chunks: int = 0


def worker_main(role: str, index: int, params: StreamParams, conn: Connection) -> None:
    """Entry point of a worker process ('pub' or 'con')."""

    def make() -> Worker:
        if role == "pub":
            return _Producer(index, params, conn)
        return _Consumer(index, params, conn)

    worker_entry(role, index, conn, make, (StreamError, OSError, EOFError), StreamResult())


def _heartbeat(conn: StreamConnection) -> Heartbeat:
    """Heartbeat frames at half the interval agreed in Tune."""
    return Heartbeat(conn.sock, HEARTBEAT, conn.heartbeat * NS // 2)


def _fatal(buf: bytes, start: int, end: int) -> StreamError:
    return StreamError(metadata_update_text(buf[start:end]))


class _Producer(Publisher):
    role = "pub"

    def __init__(self, index: int, params: StreamParams, conn: Connection) -> None:
        super().__init__(index, params, conn)
        self.confirmed = 0
        self.errors = 0

    def acked(self) -> int:
        return self.confirmed

    def feed(self, buf: bytes) -> int:
        """Count the confirms and errors in the whole frames of ``buf``; returns the
        offset of the first incomplete one."""
        used = 0
        unpack = _COUNT.unpack_from
        for start, end, key in walk_frames(buf):
            used = end
            if key == PUBLISH_CONFIRM:
                self.confirmed += unpack(buf, start + 5)[0]
            elif key == PUBLISH_ERROR:
                n = unpack(buf, start + 5)[0]
                self.errors += n
                self.confirmed += n  # answered: no longer waited for
            elif key in _FATAL:
                raise _fatal(buf, start, end)
        return used

    def run(self) -> None:
        p = self.params
        conn = connect(StreamURI.parse(p.uri), f"{p.name}-pub-{self.index}")
        publishers = p.publishers_per_connection
        for k in range(publishers):
            conn.declare_publisher(k, p.stream)
        template = PublishTemplate(p.size, p.batch, latency=p.size >= 8)
        heartbeat = _heartbeat(conn)
        sendall = conn.sock.sendall
        pack = template.pack
        next_ids = [1] * publishers
        turn = 0

        def send(n: int, now: int, sent: int) -> None:
            nonlocal turn
            k = turn
            turn = k + 1 if k + 1 < publishers else 0
            first = next_ids[k]
            next_ids[k] = first + n
            sendall(pack(k, first, n, now))
            heartbeat.sent(now)

        self.wait_go()
        with self.reporting():
            read_broker = self.reader(conn.sock, conn.rest, self.feed)

            def read_incoming(block_ms: int) -> None:
                read_broker(block_ms)
                if block_ms:  # waiting for confirms
                    heartbeat.idle(time.monotonic_ns())

            # Without a window the confirms are still read after every batch.
            sent, last_ns = self.publish(
                template.message_len,
                p.count,
                p.confirm,
                send,
                read_incoming,
                None if p.confirm else (lambda: 1 << 62),
            )
            if not p.confirm:
                deadline = time.monotonic_ns() + int(FINISH_TIMEOUT * NS)
                while self.confirmed < sent and time.monotonic_ns() < deadline:
                    read_incoming(100)
                    if self.stop_requested():
                        break
        result = StreamResult(count=sent, acked=self.confirmed, errors=self.errors, last_ns=last_ns)
        self.stamp(result)
        conn.close()
        self.send_done(result)


class _Consumer(Receiver):
    role = "con"

    def run(self) -> None:
        p = self.params
        conn = connect(StreamURI.parse(p.uri), f"{p.name}-con-{self.index}")
        conn.subscribe(0, p.stream, p.offset, p.credit)
        self.wait_go()
        result = self._loop(conn)
        self.stamp(result)
        conn.close()
        self.send_done(result)

    def _loop(self, conn: StreamConnection) -> StreamResult:
        """Count records until the deadline or the parent's stop."""
        p = self.params
        sock = conn.sock
        sendall = sock.sendall
        latency = p.size >= 8
        decode = p.decode
        hist: dict[int, int] = {}
        record = partial(record_latency, hist)
        heartbeat = _heartbeat(conn)
        unpack_size = _COUNT.unpack_from
        count = 0
        chunks = 0
        buf = b""
        for data, now in self.reads(sock, hist, conn.rest, heartbeat.idle):
            if data:
                buf = buf + data if buf else data
            n = len(buf)
            pos = 0
            got = 0
            while n - pos >= 4:
                end = pos + 4 + unpack_size(buf, pos)[0]
                if end > n:
                    break
                start = pos + 4
                if end - start < 4:
                    raise StreamError(f"frame of {end - start} bytes from the broker")
                key = buf[start] << 8 | buf[start + 1]
                if key == DELIVER:
                    got += 1
                    if decode:
                        stamps = chunk_timestamps(buf, start, end)
                        count += len(stamps)
                        for ts in stamps:
                            if ts >= 0:
                                record(now, ts, 1)
                    else:
                        records, ts = chunk_info(buf, start, end, latency)
                        count += records
                        if ts >= 0:
                            record(now, ts, records)
                elif key in _FATAL:
                    raise _fatal(buf, start, end)
                elif key == _CREDIT_REFUSED:
                    raise StreamError("the broker refused a Credit")
                pos = end
            buf = buf[pos:] if pos < n else b""
            if got:
                chunks += got
                while got > 0:
                    sendall(credit_frame(0, min(got, _MAX_CREDIT)))
                    got -= _MAX_CREDIT
                heartbeat.sent(now)
            self.count = count
        return StreamResult(count=count, last_ns=self.last_ns, hist=hist, chunks=chunks)
