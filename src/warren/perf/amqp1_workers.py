"""The worker processes of ``warren perf amqp1``: AMQP 1.0 senders and receivers.

The workers keep the client from being the bottleneck:

* senders pre-encode their transfer frames (:class:`TransferTemplate`): a batch
  is one ``struct.pack`` per message and one ``bytes.join``, written with one
  ``sendall``. They send while the broker's link credit and session window
  allow, and with ``--confirm N`` (unsettled transfers) keep at most N
  deliveries unsettled, counting the broker's dispositions (ranges).
* receivers never decode a transfer into objects: they walk the frame
  headers, read the delivery-id and ``more`` of each transfer in place, and
  (bodies of 8 bytes or more) the send timestamp at the start of the first
  data section. Credit is topped up to ``--credit`` once half of it is used,
  and with ``--ack N`` deliveries are accepted as one range every N messages
  (or whenever the socket runs dry), all in one ``sendall`` per read.

Other frames (flow, disposition, detach, end, close) are rare: they are
decoded with warren.amqp1's codec. A side with nothing to send (a receiver
with nothing to receive, a sender without credit) sends empty frames at half
the idle-time-out the broker announced, so that it is not closed as dead.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

from warren.amqp1.frames import HEARTBEAT, transfer_frames
from warren.amqp1.performatives import (
    RECEIVER,
    SENDER,
    Accepted,
    Close,
    Detach,
    Disposition,
    End,
    Flow,
    Modified,
    Rejected,
    Released,
    Transfer,
)
from warren.client.uri import URI
from warren.perf.amqp1_client import (
    DISPOSITION,
    FLOW,
    MASK,
    TRANSFER,
    AMQP1Error,
    Link,
    TransferTemplate,
    close_link,
    data_offset,
    decode_body,
    disposition_frame,
    error_text,
    flow_frame,
    open_link,
    split_frames,
    transfer_fields,
)
from warren.perf.workers import (
    Heartbeat,
    Publisher,
    Receiver,
    Worker,
    WorkerResult,
    record_latency,
    worker_entry,
)

if TYPE_CHECKING:
    from warren.perf.amqp1 import AMQP1Params

__all__ = ["AMQP1Result", "worker_main"]

#: The terminal delivery states (3.4): the broker has decided a message's fate.
OUTCOMES = (Accepted, Rejected, Released, Modified)
_TS = struct.Struct(">Q")
_SIZE = struct.Struct(">I")


@dataclass
class AMQP1Result(WorkerResult):
    """What a worker sends with "done"; ``acked`` counts deliveries the broker settled."""

    rejected: int = 0
    #: Senders: the most link credit the broker granted at once.
    max_credit: int = 0


def worker_main(role: str, index: int, params: AMQP1Params, conn: Connection) -> None:
    """Entry point of a worker process ('pub' or 'con')."""

    def make() -> Worker:
        if role == "pub":
            return _Sender(index, params, conn)
        return _Receiver(index, params, conn)

    worker_entry(role, index, conn, make, (AMQP1Error, OSError, EOFError), AMQP1Result())


def _heartbeat(link: Link) -> Heartbeat:
    """Empty frames at half the idle-time-out the broker announced in its open."""
    return Heartbeat(link.sock, HEARTBEAT, (link.remote_open.idle_time_out or 0) * 1_000_000 // 2)


class _Sender(Publisher):
    role = "pub"

    def __init__(self, index: int, params: AMQP1Params, conn: Connection) -> None:
        super().__init__(index, params, conn)
        self.container_id = f"{params.container_id}-pub-{index}"
        #: Absolute limits from the broker's flows: deliveries (link credit) and
        #: transfer ids (session window) up to which this sender may go.
        self.credit_limit = 0
        self.session_limit = 0
        self.delivered = 0
        self.frames_sent = 0
        self.frames_per_message = 1
        self.settled = 0
        self.rejected = 0
        self.max_credit = 0

    def acked(self) -> int:
        return self.settled

    def credit(self) -> int:
        by_session = (self.session_limit - self.frames_sent) // self.frames_per_message
        return min(self.credit_limit - self.delivered, by_session)

    def feed(self, buf: bytes) -> int:
        """Handle the whole frames in ``buf`` (flows, dispositions); returns the offset
        of the first incomplete one."""
        used = 0
        for start, end, code in split_frames(buf):
            used = end
            if start >= end:
                continue  # a heartbeat
            value = decode_body(buf, start, end)
            if code == FLOW and isinstance(value, Flow):
                if value.next_incoming_id is not None:
                    self.session_limit = value.next_incoming_id + value.incoming_window
                if value.handle is not None and value.link_credit is not None:
                    count = value.delivery_count if value.delivery_count is not None else 0
                    self.credit_limit = count + value.link_credit
                    self.max_credit = max(self.max_credit, value.link_credit)
            elif code == DISPOSITION and isinstance(value, Disposition):
                if not value.settled and not isinstance(value.state, OUTCOMES):
                    continue  # a non-terminal state (received): not settled yet
                last = value.first if value.last is None else value.last
                n = ((last - value.first) & MASK) + 1
                self.settled += n
                if not isinstance(value.state, Accepted):
                    self.rejected += n
            elif isinstance(value, (Detach, End, Close)):
                raise AMQP1Error(error_text(value))
        return used

    def run(self) -> None:
        p = self.params
        link = open_link(
            URI.parse(p.uri),
            self.container_id,
            SENDER,
            p.target_address(),
            settled=not p.confirm,
        )
        self.session_limit = link.remote_begin.incoming_window
        template = TransferTemplate(
            p.size, settled=not p.confirm, durable=p.persistent, latency=p.size >= 8
        )
        max_frame = link.remote_open.max_frame_size
        send_batch = self._sender(link.sock, template, max_frame)
        heartbeat = _heartbeat(link)

        def send(n: int, now: int, sent: int) -> None:
            send_batch(n, now, sent)
            heartbeat.sent(now)

        self.wait_go()
        with self.reporting():
            read_broker = self.reader(link.sock, link.rest, self.feed)

            def read_incoming(block_ms: int) -> None:
                read_broker(block_ms)
                if block_ms:  # waiting for credit or dispositions
                    heartbeat.idle(time.monotonic_ns())

            sent, last_ns = self.publish(
                template.frame_len, p.count, p.confirm, send, read_incoming, self.credit
            )
        result = AMQP1Result(
            count=sent,
            acked=self.settled,
            rejected=self.rejected,
            last_ns=last_ns,
            max_credit=self.max_credit,
        )
        self.stamp(result)
        close_link(link.sock)
        self.send_done(result)

    def _sender(
        self, sock: socket.socket, template: TransferTemplate, max_frame: int
    ) -> Callable[[int, int, int], None]:
        """``send(n, now, sent)`` for :meth:`publish`."""
        sendall = sock.sendall
        pack = template.pack
        if template.frame_len <= max_frame:

            def send(n: int, now: int, sent: int) -> None:
                sendall(pack(sent, n, now))
                self.delivered += n
                self.frames_sent += n

            return send
        # Larger than the broker's frames: each message in several transfer frames
        # (correct, not fast: the payload is cut per message).
        p = self.params
        body = b"\x00" * p.size
        frames0 = transfer_frames(
            0,
            Transfer(handle=0, delivery_id=0, delivery_tag=b"\0\0\0\0", settled=not p.confirm),
            b"\x00\x53\x75\xb0" + _SIZE.pack(p.size) + body,
            max_frame,
        )
        self.frames_per_message = len(frames0)

        def send_split(n: int, now: int, sent: int) -> None:
            out: list[bytes] = []
            for i in range(sent, sent + n):
                did = i & MASK
                payload = b"\x00\x53\x75\xb0" + _SIZE.pack(p.size) + _TS.pack(now) + body[8:]
                transfer = Transfer(
                    handle=0,
                    delivery_id=did,
                    delivery_tag=_SIZE.pack(did),
                    message_format=0,
                    settled=not p.confirm,
                )
                out += transfer_frames(0, transfer, payload, max_frame)
            sendall(b"".join(out))
            self.delivered += n
            self.frames_sent += n * self.frames_per_message

        return send_split


class _Receiver(Receiver):
    role = "con"

    def __init__(self, index: int, params: AMQP1Params, conn: Connection) -> None:
        super().__init__(index, params, conn)
        self.container_id = f"{params.container_id}-con-{index}"

    def run(self) -> None:
        p = self.params
        link = open_link(
            URI.parse(p.uri),
            self.container_id,
            RECEIVER,
            p.source_address(),
            settled=not p.ack,
            credit=p.credit,
        )
        self.wait_go()
        result = self._loop(link)
        self.stamp(result)
        close_link(link.sock)
        self.send_done(result)

    def _loop(self, link: Link) -> AMQP1Result:
        """Count deliveries until the deadline, the parent's stop or --cmessages."""
        p = self.params
        sock = link.sock
        sendall = sock.sendall
        latency = p.size >= 8
        ack_every = p.ack
        credit = p.credit
        half = credit // 2
        next_incoming0 = link.remote_begin.next_outgoing_id
        delivery_count0 = link.remote_attach.initial_delivery_count or 0
        unpack_size = _SIZE.unpack_from
        unpack_ts = _TS.unpack_from
        hist: dict[int, int] = {}
        record = partial(record_latency, hist)
        heartbeat = _heartbeat(link)

        count = 0
        frames = 0
        granted_at = 0
        in_progress = False
        first_unacked = -1
        last_id = 0
        pending = 0
        buf = b""
        for data, now in self.reads(sock, hist, link.rest, heartbeat.idle):
            if data:
                buf = buf + data if buf else data
            n = len(buf)
            pos = 0
            run_ts = -1
            run_n = 0
            while n - pos >= 8:
                end = pos + unpack_size(buf, pos)[0]
                if end > n:
                    break
                start = pos + buf[pos + 4] * 4
                if start + 3 <= end and buf[start + 2] == TRANSFER and buf[start + 1] == 0x53:
                    frames += 1
                    did, more, after = transfer_fields(buf, start)
                    if not in_progress and did is not None:
                        last_id = did
                        if first_unacked < 0:
                            first_unacked = did
                    if more:
                        in_progress = True
                    else:
                        if latency and not in_progress:
                            at = data_offset(buf, after, end)
                            if at >= 0 and at + 8 <= end:
                                ts = unpack_ts(buf, at)[0]
                                if ts == run_ts:
                                    run_n += 1
                                else:
                                    if run_n:
                                        record(now, run_ts, run_n)
                                    run_ts = ts
                                    run_n = 1
                        in_progress = False
                        count += 1
                        pending += 1
                elif start < end:
                    value = decode_body(buf, start, end)
                    if isinstance(value, (Detach, End, Close)):
                        raise AMQP1Error(error_text(value))
                pos = end
            buf = buf[pos:] if pos < n else b""
            if run_n:
                record(now, run_ts, run_n)
            out: list[bytes] = []
            if ack_every and pending and (pending >= ack_every or not data):
                out.append(disposition_frame(first_unacked, last_id))
                first_unacked = -1
                pending = 0
            if credit - (count - granted_at) <= half:
                granted_at = count
                out.append(
                    flow_frame(
                        (next_incoming0 + frames) & MASK,
                        (delivery_count0 + count + in_progress) & MASK,
                        credit,
                    )
                )
            if out:
                sendall(b"".join(out))
                heartbeat.sent(now)
            self.unsettled = pending if ack_every else 0
            self.count = count
        return AMQP1Result(count=count, last_ns=self.last_ns, hist=hist)
