"""Reading stream queues over AMQP 0-9-1: bounds for planning, bulk reads for tasks.

Planning (:class:`Planner`, on the driver) asks a stream for its first and
last offsets with short-lived consumers, as the stream contract describes:
the first delivery of a consumer started at ``first`` carries the first
retained offset, one started at ``last`` the last (on RabbitMQ: the start of
the last chunk, so the planner reads on to the end of that chunk).

Tasks (:func:`read_range`, in the executors) consume ``[start, end)`` with a
large prefetch and scan the received bytes themselves, as ``warren perf``'s
consumers do: a delivery is three frames (basic.deliver, content header,
body) and the loop takes only what the columns need from them, the offset
header first. pika or aio-pika would spend ten times as long per message
building objects nobody asked for.

Setup goes through :class:`warren.client.Client` (handshake, declare,
consume), which decodes replies with Warren's codec; the hot loop does not.
"""

from __future__ import annotations

import contextlib
import datetime
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from warren.amqp import spec
from warren.client import AMQPError, Client
from warren.core.properties import decode_properties
from warren.spark.connection import SourceError, connect, queue_error
from warren.spark.endpoint import Endpoint
from warren.spark.option_values import OptionError
from warren.spark.scan import OFFSET_HEADER, TIMESTAMP_HEADER, Rows, Scanner

__all__ = ["Bounds", "Planner", "read_range"]

_FRAME = struct.Struct(">BHI")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_RECV = 1 << 20
#: How long planning waits for more of RabbitMQ's last chunk, or for a first
#: delivery when a passive declare's (lagging) message count says 0.
_CHUNK_IDLE_S = 0.2
_EMPTY_GRACE_S = 0.5


@dataclass(frozen=True)
class Bounds:
    """What a stream holds now: offsets ``[first, end)``; both None when it is empty."""

    queue: str
    first: int | None
    end: int | None
    #: The last message's x-stream-timestamp (Warren), to tell a start time past the end.
    last_timestamp_ms: int | None = None

    @property
    def empty(self) -> bool:
        return self.first is None


def _offset_and_stamp(raw: bytes) -> tuple[int | None, int | None]:
    """x-stream-offset and the publish time in ms from a content header's properties."""
    props = decode_properties(raw)
    headers = props.headers or {}
    offset = headers.get(OFFSET_HEADER)
    stamp = headers.get(TIMESTAMP_HEADER)
    if isinstance(stamp, datetime.datetime):
        stamp = int(stamp.timestamp() * 1000)
    elif not isinstance(stamp, int):
        stamp = props.timestamp * 1000 if props.timestamp is not None else None
    return (int(offset) if isinstance(offset, int) else None), stamp


class Planner:
    """One connection for the planning of a batch or micro-batch: bounds, times."""

    def __init__(self, endpoint: Endpoint | str, timeout_ms: int) -> None:
        self.timeout_s = timeout_ms / 1000
        self.client = connect(endpoint, self.timeout_s, name="warren-spark planner")
        #: Warren keeps the stream contract exactly; RabbitMQ's "last" is a chunk.
        self.exact = "warren_version" in self.client.server_properties
        self._next_channel = 1

    def close(self) -> None:
        self.client.close()

    def replicas(self) -> list[str]:
        """host:port of the cluster followers that serve stream reads, as the leader
        announces them in connection.start (none from a single node or RabbitMQ)."""
        announced = self.client.server_properties.get("warren_stream_replicas") or []
        out = []
        for item in announced if isinstance(announced, list) else []:
            text = item.decode() if isinstance(item, bytes) else item
            if isinstance(text, str) and text:
                out.append(text)
        return out

    def __enter__(self) -> Planner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _channel(self) -> int:
        ch = self._next_channel
        self._next_channel += 1
        self.client.channel_open(ch)
        return ch

    def _close_channel(self, ch: int) -> None:
        # close-ok comes after whatever was in flight; wait_method skips it.
        self.client.rpc(
            ch, spec.ChannelClose(reply_code=200, reply_text="done"), spec.ChannelCloseOk
        )

    def bounds(self, queue: str) -> Bounds:
        """The first and last offsets of ``queue``; raises OptionError for a missing or
        non-stream queue."""
        try:
            return self._bounds(queue)
        except AMQPError as exc:
            raise queue_error(exc, queue, self.client.uri.vhost) from None

    def first(self, queue: str) -> int | None:
        """The first offset ``queue`` still has; None when it is empty."""
        try:
            ch = self._channel()
            ok = self.client.rpc(
                ch, spec.QueueDeclare(queue=queue, passive=True), spec.QueueDeclareOk
            )
            first = self._first_delivery(ch, queue, "first", ok.message_count)
        except AMQPError as exc:
            raise queue_error(exc, queue, self.client.uri.vhost) from None
        self._close_channel(ch)
        return None if first is None else first[0]

    def _bounds(self, queue: str) -> Bounds:
        client = self.client
        ch = self._channel()
        ok = client.rpc(ch, spec.QueueDeclare(queue=queue, passive=True), spec.QueueDeclareOk)
        first = self._first_delivery(ch, queue, "first", ok.message_count)
        self._close_channel(ch)
        if first is None:
            return Bounds(queue, None, None)
        ch = self._channel()
        last = self._first_delivery(ch, queue, "last", 1)
        if last is None:  # emptied by retention between the two probes
            return Bounds(queue, None, None)
        last_offset, last_stamp = last
        if not self.exact:
            last_offset = max(last_offset, self._drain(ch))
        self._close_channel(ch)
        return Bounds(queue, first[0], last_offset + 1, last_stamp)

    def _first_delivery(
        self, ch: int, queue: str, at: Any, count: int
    ) -> tuple[int, int | None] | None:
        """Consume from ``at`` and return the first delivery's (offset, ms), or None when the
        stream is empty: at once when ``count`` is 0 and exact, else after a grace period."""
        client = self.client
        client.qos(ch, 1)
        client.rpc(
            ch,
            spec.BasicConsume(queue=queue, no_ack=False, arguments={"x-stream-offset": at}),
            spec.BasicConsumeOk,
        )
        if count == 0 and self.exact:
            return None
        wait = self.timeout_s if count else _EMPTY_GRACE_S
        raw = self._next_properties(ch, wait)
        if raw is None:
            if count:
                raise SourceError(
                    f"queue {queue!r} has {count} messages but none was delivered "
                    f"within {self.timeout_s:g} s"
                )
            return None
        offset, stamp = _offset_and_stamp(raw)
        if offset is None:
            raise OptionError(
                "queue", f"queue {queue!r} is not a stream queue (no x-stream-offset)"
            )
        return offset, stamp

    def _next_properties(self, ch: int, wait_s: float) -> bytes | None:
        """The raw properties of the next delivery on ``ch`` (acked), or None after wait_s."""
        client = self.client
        sock = client.sock
        assert sock is not None
        deadline = time.monotonic() + wait_s
        tag = 0
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                sock.settimeout(remaining)
                ftype, fch, payload = client.read_frame()
                if fch != ch:
                    continue
                if ftype == 1:
                    method = spec.decode_method(payload)
                    if isinstance(method, spec.BasicDeliver):
                        tag = method.delivery_tag
                    elif isinstance(method, spec.ChannelClose):
                        client.send_method(ch, spec.ChannelCloseOk())
                        raise AMQPError(method.reply_text, method.reply_code)
                    elif isinstance(method, spec.ConnectionClose):
                        client.abort()
                        raise AMQPError(method.reply_text, method.reply_code)
                    elif isinstance(method, spec.BasicCancel):
                        raise SourceError("the server cancelled the planning consumer")
                elif ftype == 2:
                    client.send_method(ch, spec.BasicAck(delivery_tag=tag))
                    return bytes(payload[12:])
        except TimeoutError:
            return None
        finally:
            sock.settimeout(self.timeout_s)

    def _drain(self, ch: int) -> int:
        """The highest offset of the deliveries that follow at once (RabbitMQ sends a whole
        chunk however small the prefetch); -1 if none does."""
        highest = -1
        while True:
            raw = self._next_properties(ch, _CHUNK_IDLE_S)
            if raw is None:
                return highest
            offset, _ = _offset_and_stamp(raw)
            if offset is not None:
                highest = max(highest, offset)

    def offset_at(self, queue: str, ms: int, bounds: Bounds) -> int | None:
        """The first offset published at or after ``ms``; the stream's end when every
        message is older; None for an empty stream.

        The broker filters by whole seconds (an AMQP timestamp); on Warren the
        x-stream-timestamp header makes it exact to the millisecond.
        """
        if bounds.empty:
            return None
        assert bounds.end is not None
        if bounds.last_timestamp_ms is not None and bounds.last_timestamp_ms < ms:
            return bounds.end
        ch = self._channel()
        try:
            offset = self._offset_at(ch, queue, ms, bounds.end)
        except AMQPError as exc:
            raise queue_error(exc, queue, self.client.uri.vhost) from None
        self._close_channel(ch)
        return offset

    def _offset_at(self, ch: int, queue: str, ms: int, end: int) -> int:
        at = datetime.datetime.fromtimestamp(ms // 1000, tz=datetime.UTC)
        self.client.qos(ch, 100)
        self.client.rpc(
            ch,
            spec.BasicConsume(queue=queue, no_ack=False, arguments={"x-stream-offset": at}),
            spec.BasicConsumeOk,
        )
        while True:
            raw = self._next_properties(ch, self.timeout_s if self.exact else _EMPTY_GRACE_S)
            if raw is None:
                return end
            offset, stamp = _offset_and_stamp(raw)
            if offset is None:
                return end
            if not self.exact or stamp is None or stamp >= ms:
                return offset
            if offset >= end - 1:
                return end


def read_range(
    endpoint: Endpoint | str,
    queue: str,
    start: int,
    end: int,
    *,
    prefetch: int,
    poll_timeout_ms: int,
    fail_on_data_loss: bool,
    batch_rows: int = 16384,
    batch_bytes: int = 16 << 20,
    raw_headers: bool = False,
) -> Iterator[Rows]:
    """Offsets ``[start, end)`` of ``queue``, in batches; the connection is closed when the
    range is read or the caller stops iterating."""
    if start >= end:
        return
    timeout_s = poll_timeout_ms / 1000
    client = connect(endpoint, timeout_s, name=f"warren-spark {queue}[{start}:{end}]")
    try:
        client.channel_open(1)
        client.qos(1, prefetch)
        try:
            client.rpc(
                1,
                spec.BasicConsume(queue=queue, no_ack=False, arguments={"x-stream-offset": start}),
                spec.BasicConsumeOk,
            )
        except AMQPError as exc:
            raise queue_error(exc, queue, client.uri.vhost) from None

        def first_retained() -> int | None:
            with Planner(endpoint, poll_timeout_ms) as planner:
                return planner.first(queue)

        scanner = Scanner(
            queue,
            start,
            end,
            fail_on_data_loss=fail_on_data_loss,
            batch_rows=batch_rows,
            batch_bytes=batch_bytes,
            first_retained=first_retained,
            raw_headers=raw_headers,
        )
        yield from _receive(client, scanner, prefetch, timeout_s, (start, end))
    finally:
        client.close_begin()
        with contextlib.suppress(Exception):
            client.unread()  # what is in flight is not read
            client.close_end(timeout=2.0)


def _receive(
    client: Client, scanner: Scanner, prefetch: int, timeout_s: float, span: tuple[int, int]
) -> Iterator[Rows]:
    """Read until the scanner is done, acking (multiple) every half prefetch."""
    sock = client.sock
    assert sock is not None
    sock.settimeout(timeout_s)
    recv = sock.recv
    ack_prefix = _FRAME.pack(1, 1, 13) + _U32.pack(spec.BasicAck.INDEX)
    ack_every = max(1, prefetch // 2)
    buf = client.unread()
    need = 7
    chunks: list[bytes] = []
    have = len(buf)
    while not scanner.done:
        while have < need:
            try:
                data = recv(_RECV)
            except TimeoutError:
                raise SourceError(
                    f"no message from queue {scanner.queue!r} for {timeout_s:g} s while reading "
                    f"offsets [{span[0]}, {span[1]}) (option 'pollTimeoutMs')"
                ) from None
            if not data:
                raise SourceError(
                    f"the broker closed the connection while reading {scanner.queue!r}"
                )
            chunks.append(data)
            have += len(data)
        if chunks:
            buf = buf + b"".join(chunks) if buf else b"".join(chunks)
            chunks = []
        used, need = scanner.feed(buf)
        buf = buf[used:] if used < len(buf) else b""
        have = len(buf)
        if need <= have:  # more complete frames are there (the scanner stopped at a batch)
            need = have + 1
        yield from scanner.take()
        if scanner.unacked >= ack_every and not scanner.done:
            sock.sendall(ack_prefix + _U64.pack(scanner.tag) + b"\x01\xce")
            scanner.unacked = 0
