"""The worker processes of ``warren perf throughput``: AMQP publishers and consumers.

The workers are written so that the client is not the bottleneck:

* publishers build the frames of one message once, split around the 8-byte
  send timestamp at the start of the body; a batch of n messages is then a
  single ``bytes.join`` of pre-built pieces with the timestamp as separator,
  written with one ``sendall``. With confirms, at most ``--confirm`` messages
  are outstanding; the confirm reader only looks at frame headers and the
  delivery tag of basic.ack/nack.
* consumers scan frame headers in the received bytes; from basic.deliver they
  take only the delivery tag, from the content header the body size and from
  the first body frame the timestamp. Acks (multiple=true) go out every
  ``--ack`` messages, or (``--single-ack``) one basic.ack multiple=false per
  message; several per ``sendall`` when they fall in the same read.

Timestamps are ``time.monotonic_ns()``, which on Linux is one clock for all
processes of the machine, so latency is measured across processes.
"""

from __future__ import annotations

import contextlib
import socket
import struct
from dataclasses import dataclass
from functools import partial
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

from warren.amqp import spec
from warren.client import AMQPError, Client
from warren.client.confirms import ConfirmTracker, close_error
from warren.perf.message import message_template
from warren.perf.workers import (
    Publisher,
    Receiver,
    Worker,
    WorkerResult,
    record_latency,
    worker_entry,
)

if TYPE_CHECKING:
    from warren.perf.throughput import Plan, ThroughputParams

__all__ = ["worker_main"]

_HDR = struct.Struct(">BHI")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_TS = struct.Struct(">Q")

_DELIVER = spec.BasicDeliver.INDEX
_ACK = spec.BasicAck.INDEX
_CLOSES = (spec.ConnectionClose.INDEX, spec.ChannelClose.INDEX, spec.BasicCancel.INDEX)


@dataclass
class ThroughputResult(WorkerResult):
    """What a worker sends with "done"; ``acked`` counts confirms."""

    nacked: int = 0


def worker_main(
    role: str, index: int, params: ThroughputParams, plan: Plan, queue: str, conn: Connection
) -> None:
    """Entry point of a worker process ('pub' or 'con'; ``queue``: the one to consume from)."""

    def make() -> Worker:
        if role == "pub":
            return _Publisher(index, params, plan, conn)
        return _Consumer(index, params, queue, conn)

    worker_entry(role, index, conn, make, (AMQPError, OSError, EOFError), ThroughputResult())


class _Publisher(Publisher):
    closed_message = "server closed the connection"

    def __init__(self, index: int, params: ThroughputParams, plan: Plan, conn: Connection) -> None:
        super().__init__(index, params, conn)
        self.plan = plan
        self.client = Client(params.uri, name=f"warren-perf {self.role} {index}")
        self.tracker = ConfirmTracker()

    def acked(self) -> int:
        return self.tracker.confirmed

    def run(self) -> None:
        p = self.params
        pl = self.plan
        client = self.client.connect()
        client.channel_open(1)
        if p.confirm:
            client.confirm_select(1)
        head, tail = message_template(
            1, pl.exchange, pl.routing_key, p.size, p.persistent, client.frame_max
        )
        sock = client.sock
        assert sock is not None
        sock.settimeout(None)
        pending_in = client.unread()
        self.wait_go()
        with self.reporting():
            result = self._loop(sock, head, tail, pending_in)
        try:
            result = self.stamp(result)
        finally:
            client.close()
        self.send_done(result)

    def _loop(
        self, sock: socket.socket, head: bytes, tail: bytes, inbuf: bytes
    ) -> ThroughputResult:
        p = self.params
        timestamped = p.size >= 8
        msg_len = len(head) + len(tail) + (8 if timestamped else 0)
        tracker = self.tracker
        ts_pack = _TS.pack
        sendall = sock.sendall

        # Pre-built pieces: a batch of n is ts.join(parts[n]) = head ts tail head ts tail ...
        tail_head = tail + head
        parts_cache: dict[int, list[bytes]] = {}

        def parts(n: int) -> list[bytes]:
            lst = parts_cache.get(n)
            if lst is None:
                lst = [head, *([tail_head] * (n - 1)), tail]
                if len(parts_cache) < 256:
                    parts_cache[n] = lst
            return lst

        whole = head  # bodies < 8 bytes: the message is all in head

        def send(n: int, now: int, _sent: int) -> None:
            if timestamped:
                sendall(ts_pack(now).join(parts(n)))
            else:
                sendall(whole * n)

        read_incoming = self.reader(sock, inbuf, tracker.feed)
        sent, last_ns = self.publish(msg_len, p.pmessages, p.confirm, send, read_incoming)
        return ThroughputResult(
            count=sent, acked=tracker.confirmed, nacked=tracker.nacked, last_ns=last_ns
        )


class _Consumer(Receiver):
    role = "con"
    closed_message = "server closed the connection"

    def __init__(self, index: int, params: ThroughputParams, queue: str, conn: Connection) -> None:
        super().__init__(index, params, conn)
        self.queue = queue
        self.client = Client(params.uri, name=f"warren-perf {self.role} {index}")

    def run(self) -> None:
        p = self.params
        client = self.client.connect()
        client.channel_open(1)
        if p.prefetch:
            client.qos(1, p.prefetch)
        client.consume(1, self.queue, no_ack=not p.manual_ack)
        sock = client.sock
        assert sock is not None
        sock.settimeout(None)
        pending_in = client.unread()
        self.wait_go()
        try:
            result = self.stamp(self._loop(sock, pending_in))
        finally:
            client.close()
        self.send_done(result)

    def _loop(self, sock: socket.socket, buf: bytes) -> ThroughputResult:
        """Receive and count deliveries until the deadline or the parent's stop.

        Two paths: the general one walks frame by frame; once one delivery has
        arrived whole, its bytes become a template and every later delivery of the
        same shape (same consumer tag, flags, exchange, routing key and body size,
        one body frame) is recognised with two ``startswith`` checks and read with
        one ``unpack_from`` (delivery tag and timestamp). Publishers stamp a whole
        batch with one timestamp, so latencies are recorded per run of equal stamps.
        """
        p = self.params
        # --single-ack: every message acks itself (multiple=false), so none is ever held
        # back for the dry-socket or final multiple acks below.
        ack_every = 1 if p.single_ack else p.ack
        # -D: stop after this many; deliveries beyond it are neither counted nor acked.
        limit = p.cmessages or 1 << 62
        reached = False
        timestamps = p.size >= 8
        unpack_hdr = _HDR.unpack_from
        unpack_u32 = _U32.unpack_from
        unpack_u64 = _U64.unpack_from
        # basic.ack(delivery_tag, multiple) on channel 1: 7-byte header, 4 ids, tag, bits, end.
        ack_prefix = _HDR.pack(1, 1, 13) + _U32.pack(_ACK)
        ack_suffix = b"\x00\xce" if p.single_ack else b"\x01\xce"
        hist: dict[int, int] = {}
        record = partial(record_latency, hist)

        # Fast path, set up from the first whole delivery (fast_len == 0: not yet).
        fast_len = 0
        fast_prefix = b""  # frame header, method id, consumer tag: up to the delivery tag
        fast_mid = b""  # after the tag up to the body bytes (flags, names, header frame, ...)
        mid_off = 0
        fast_tag = 0  # offset of the delivery tag in a delivery
        tag_off = 0
        tag_ts = struct.Struct(">Q")

        count = 0
        last_tag = 0
        acked_tag = 0
        unacked = 0
        remaining = 0  # body bytes still to come for the current message (general path)
        need_ts = False
        body_frames = 0
        msg_start = -1  # offset in buf of the current delivery's method frame, if there
        header_end = 0
        run_ts = -1  # timestamp shared by run_n messages not yet recorded
        run_n = 0
        # What arrived with basic.consume-ok (a backlog's first deliveries, perhaps the
        # whole prefetch window) comes first: nothing more may arrive until it is acked.
        first, buf = buf, b""
        for data, now in self.reads(sock, hist, first):
            if not data:  # the socket ran dry: settle the acks held back
                sock.sendall(ack_prefix + _U64.pack(last_tag) + ack_suffix)
                acked_tag = last_tag
                unacked = self.unsettled = 0
                continue
            if buf:
                buf += data
            else:
                buf = data
            n = len(buf)
            pos = 0
            msg_start = -1
            acks: list[bytes] | None = None
            startswith = buf.startswith
            while n - pos >= 7:
                if (
                    fast_len
                    and n - pos >= fast_len
                    and startswith(fast_prefix, pos)
                    and startswith(fast_mid, pos + mid_off)
                ):
                    if timestamps:
                        last_tag, ts = tag_ts.unpack_from(buf, pos + fast_tag)
                        if ts == run_ts:
                            run_n += 1
                        else:
                            if run_n:
                                record(now, run_ts, run_n)
                            run_ts = ts
                            run_n = 1
                    else:
                        last_tag = unpack_u64(buf, pos + fast_tag)[0]
                    pos += fast_len
                    count += 1
                    if ack_every:
                        unacked += 1
                        if unacked >= ack_every:
                            if acks is None:
                                acks = []
                            acks.append(ack_prefix + _U64.pack(last_tag) + ack_suffix)
                            acked_tag = last_tag
                            unacked = 0
                    if count == limit:
                        reached = True
                        break
                    continue
                ftype, _ch, size = unpack_hdr(buf, pos)
                end = pos + 8 + size
                if end > n:
                    break
                complete = False
                if ftype == 3:
                    body_frames += 1
                    if need_ts:
                        need_ts = False
                        ts = unpack_u64(buf, pos + 7)[0]
                        if ts == run_ts:
                            run_n += 1
                        else:
                            if run_n:
                                record(now, run_ts, run_n)
                            run_ts = ts
                            run_n = 1
                    remaining -= size
                    complete = remaining <= 0
                elif ftype == 2:
                    # content header: class(2) weight(2) body size(8)
                    remaining = unpack_u64(buf, pos + 11)[0]
                    need_ts = timestamps and remaining >= 8
                    header_end = end
                    body_frames = 0
                    complete = remaining == 0
                elif ftype == 1:
                    idx = unpack_u32(buf, pos + 7)[0]
                    if idx == _DELIVER:
                        # consumer tag (shortstr) then the delivery tag
                        tag_off = 12 + buf[pos + 11]
                        last_tag = unpack_u64(buf, pos + tag_off)[0]
                        msg_start = pos
                    elif idx in _CLOSES:
                        raise close_error(buf[pos + 7 : end - 1])
                if complete:
                    count += 1
                    if ack_every:
                        unacked += 1
                        if unacked >= ack_every:
                            if acks is None:
                                acks = []
                            acks.append(ack_prefix + _U64.pack(last_tag) + ack_suffix)
                            acked_tag = last_tag
                            unacked = 0
                    if count == limit:
                        pos = end
                        reached = True
                        break
                    if not fast_len and msg_start >= 0 and body_frames <= 1:
                        # This delivery is whole in buf: make it the template.
                        body_at = header_end + 7 if body_frames else end
                        fast_tag = tag_off
                        fast_prefix = buf[msg_start : msg_start + tag_off]
                        mid_off = tag_off + 8
                        fast_mid = buf[msg_start + mid_off : body_at]
                        fast_len = end - msg_start
                        gap = body_at - msg_start - mid_off
                        tag_ts = struct.Struct(f">Q{gap}xQ")
                    msg_start = -1
                pos = end
            buf = buf[pos:] if pos < n else b""
            if run_n:
                record(now, run_ts, run_n)
                run_n = 0
                run_ts = -1
            if acks:
                sock.sendall(b"".join(acks))
            self.count = count
            self.unsettled = unacked
            if reached:
                self.last_ns = now  # (reads() sets it only when it gets control back)
                break
        if unacked and last_tag > acked_tag:
            with contextlib.suppress(OSError):
                sock.sendall(ack_prefix + _U64.pack(last_tag) + ack_suffix)
        return ThroughputResult(count=count, last_ns=self.last_ns, hist=hist)
