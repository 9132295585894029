"""``warren perf throughput``: publishers and consumers in their own processes.

The parent declares the exchange and queues on a control connection, starts
one OS process (multiprocessing, 'spawn') per publisher and per consumer,
waits until all are connected, sends them the common start time, and then
only collects the counts each worker reports once a second over its pipe.

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
  ``--ack`` messages, several per ``sendall`` when they fall in the same read.

Timestamps are ``time.monotonic_ns()``, which on Linux is one clock for all
processes of the machine, so latency is measured across processes.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import select
import signal
import socket
import struct
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any, TextIO

from warren.amqp import spec
from warren.perf.client import AMQPError, Client, message_template
from warren.perf.report import (
    SUB_BITS,
    format_count,
    format_rate,
    percentiles_ms,
    print_json,
)

__all__ = ["ThroughputParams", "Plan", "plan", "run", "worker_main"]

NS = 1_000_000_000
#: Publishers write about this many bytes per sendall (at least one message).
BATCH_BYTES = 64 * 1024
#: ... and never more than this many messages.
MAX_BATCH_MESSAGES = 1024
#: How often a worker looks at its control pipe and the wall clock.
POLL_NS = 50_000_000
#: How often a worker reports its counts.
REPORT_NS = NS
#: A consumer that runs dry reports at once, but not more often than this.
IDLE_REPORT_NS = 100_000_000
RECV_SIZE = 256 * 1024
#: In -C mode: give up waiting for missing messages after this long without progress.
STALL_NS = 10 * NS
#: Live line k is printed this long after second k (the workers report at second k).
LINE_LAG_NS = 200_000_000
#: How long the parent waits for workers to connect, and to finish after "stop".
READY_TIMEOUT = 60.0
FINISH_TIMEOUT = 30.0

_HDR = struct.Struct(">BHI")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_ACK_ARGS = struct.Struct(">QB")
_TS = struct.Struct(">Q")

_DELIVER = spec.BasicDeliver.INDEX
_ACK = spec.BasicAck.INDEX
_NACK = spec.BasicNack.INDEX
_BLOCKED = spec.ConnectionBlocked.INDEX
_UNBLOCKED = spec.ConnectionUnblocked.INDEX
_CLOSES = (spec.ConnectionClose.INDEX, spec.ChannelClose.INDEX, spec.BasicCancel.INDEX)


@dataclass(frozen=True)
class ThroughputParams:
    """Everything a run needs; also what ``--json`` prints as ``params``."""

    uri: str = "amqp://guest:guest@127.0.0.1:5672/"
    publishers: int = 1
    consumers: int = 1
    size: int = 16
    confirm: int = 0
    persistent: bool = False
    prefetch: int = 0
    ack: int = 0
    queue: str | None = None
    queue_args: dict[str, Any] | None = None
    durable: bool = False
    exchange: str = ""
    exchange_type: str | None = None
    routing_key: str | None = None
    queues: int = 0
    rate: int = 0
    time: float = 0.0
    pmessages: int = 0
    keep: bool = False


@dataclass(frozen=True)
class Plan:
    """What the parameters mean on the broker: exchange, queues, routing."""

    exchange: str
    exchange_type: str
    declare_exchange: bool
    routing_key: str
    queue_names: tuple[str, ...]
    bind: bool
    #: One entry per consumer process: the queue it consumes from.
    consumer_queues: tuple[str, ...]

    @property
    def fanout(self) -> int:
        return len(self.queue_names)


DEFAULT_QUEUE = "perf-test"
DEFAULT_FANOUT_EXCHANGE = "perf-fanout"


def plan(p: ThroughputParams) -> Plan:
    """Resolve defaults. Raises ValueError for contradictory parameters.

    * ``--queues N``: N queues ``<queue>-1`` .. ``<queue>-N`` bound to the exchange
      (default: a fanout exchange ``perf-fanout``), ``-y`` consumers on each.
    * otherwise one queue (default ``perf-test``) with ``-y`` consumers; with the
      default exchange the routing key is the queue name, with another exchange
      the queue is bound with the routing key.
    * ``-y 0`` without ``--queue``/``--queues`` declares no queue at all: messages
      go to a routing key nothing is bound to and the broker drops them, which
      measures the publishers alone.
    """
    base = p.queue if p.queue is not None else DEFAULT_QUEUE
    if p.queues:
        exchange = p.exchange or DEFAULT_FANOUT_EXCHANGE
        ex_type = p.exchange_type or ("fanout" if not p.exchange else "direct")
        names = tuple(f"{base}-{i}" for i in range(1, p.queues + 1))
        rk = p.routing_key or ""
        bind = True
    else:
        exchange = p.exchange
        ex_type = p.exchange_type or "direct"
        declare_queue = p.consumers > 0 or p.queue is not None
        names = (base,) if declare_queue else ()
        rk = p.routing_key if p.routing_key is not None else base if exchange == "" else ""
        bind = exchange != "" and declare_queue
    if p.consumers and not names:
        raise ValueError("consumers need a queue")
    consumer_queues = tuple(q for q in names for _ in range(p.consumers))
    return Plan(
        exchange=exchange,
        exchange_type=ex_type,
        declare_exchange=exchange != "" and not exchange.startswith("amq."),
        routing_key=rk,
        queue_names=names,
        bind=bind,
        consumer_queues=consumer_queues,
    )


# =====================================================================================
# Worker processes
# =====================================================================================


@dataclass
class WorkerResult:
    """What a worker sends with "done"."""

    count: int = 0
    confirmed: int = 0
    nacked: int = 0
    last_ns: int = 0  # time of the last publish / last message consumed
    cpu_s: float = 0.0
    wall_s: float = 0.0
    hist: dict[int, int] = field(default_factory=dict)


def worker_main(
    role: str, index: int, params: ThroughputParams, queue: str, conn: Connection
) -> None:
    """Entry point of a worker process ('pub' or 'con')."""
    # Ctrl-C reaches the whole process group: the parent coordinates the stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        if role == "pub":
            _Publisher(index, params, conn).run()
        else:
            _Consumer(index, params, queue, conn).run()
    except _Stop:  # stopped before the start: nothing to report
        with contextlib.suppress(OSError):
            conn.send(("done", role, index, asdict(WorkerResult())))
    except (AMQPError, OSError, EOFError) as exc:
        with contextlib.suppress(OSError):
            conn.send(("error", role, index, f"{type(exc).__name__}: {exc}"))
    except BaseException as exc:  # report, then let the traceback show on stderr
        with contextlib.suppress(OSError):
            conn.send(("error", role, index, f"{type(exc).__name__}: {exc}"))
        raise
    finally:
        conn.close()


class _Stop(Exception):
    """The parent asked the worker to stop (or went away)."""


class _Worker:
    role = ""

    def __init__(self, index: int, params: ThroughputParams, conn: Connection) -> None:
        self.index = index
        self.params = params
        self.conn = conn
        self.client = Client(params.uri, name=f"warren-perf {self.role} {index}")
        self.t0 = 0
        self.stop_at = 1 << 62
        self.cpu0 = 0.0

    def wait_go(self) -> None:
        self.conn.send(("ready", self.role, self.index))
        msg = self.conn.recv()
        if msg[0] != "go":
            raise _Stop
        self.t0 = msg[1]
        if self.params.time:
            self.stop_at = self.t0 + int(self.params.time * NS)
        self.cpu0 = time.process_time()

    def stop_requested(self) -> bool:
        """Non-blocking look at the control pipe."""
        try:
            if self.conn.poll():
                return bool(self.conn.recv()[0] == "stop")
        except (EOFError, OSError):
            return True  # parent is gone
        return False

    def stamp(self, result: WorkerResult) -> WorkerResult:
        """Record the CPU and wall time spent since the start, and report the final
        count at once (closing the connection can take a while behind a backlog)."""
        result.cpu_s = time.process_time() - self.cpu0
        result.wall_s = (time.monotonic_ns() - self.t0) / NS
        self.conn.send(("stats", self.role, self.index, result.count, result.confirmed, None))
        return result

    def finish(self, result: WorkerResult) -> None:
        self.conn.send(("done", self.role, self.index, asdict(result)))


class _ConfirmTracker:
    """Publisher-side: counts basic.ack/nack (multiple or single) on the confirm channel."""

    def __init__(self) -> None:
        self.acked_upto = 0  # every tag <= this is confirmed
        self.singles: set[int] = set()  # confirmed tags above acked_upto
        self.nacked = 0
        self.blocked = False

    @property
    def confirmed(self) -> int:
        return self.acked_upto + len(self.singles)

    def feed(self, buf: bytes) -> int:
        """Handle the complete frames in ``buf``; returns the offset of the first incomplete."""
        pos = 0
        n = len(buf)
        unpack_hdr = _HDR.unpack_from
        while n - pos >= 7:
            ftype, _ch, size = unpack_hdr(buf, pos)
            end = pos + 8 + size
            if end > n:
                break
            if ftype == 1:
                (idx,) = _U32.unpack_from(buf, pos + 7)
                if idx in (_ACK, _NACK):
                    tag, bits = _ACK_ARGS.unpack_from(buf, pos + 11)
                    if idx == _NACK:
                        before = self.confirmed
                        self._confirm(tag, bits & 1)
                        self.nacked += self.confirmed - before
                    else:
                        self._confirm(tag, bits & 1)
                elif idx == _BLOCKED:
                    self.blocked = True
                elif idx == _UNBLOCKED:
                    self.blocked = False
                elif idx in _CLOSES:
                    _raise_close(buf[pos + 7 : end - 1])
            pos = end
        return pos

    def _confirm(self, tag: int, multiple: int) -> None:
        if multiple:
            if tag > self.acked_upto:
                self.acked_upto = tag
                if self.singles:
                    self.singles = {t for t in self.singles if t > tag}
        elif tag == self.acked_upto + 1:
            self.acked_upto = tag
            singles = self.singles
            while self.acked_upto + 1 in singles:
                self.acked_upto += 1
                singles.discard(self.acked_upto)
        elif tag > self.acked_upto:
            self.singles.add(tag)


def _raise_close(payload: bytes) -> None:
    method = spec.decode_method(payload)
    if isinstance(method, spec.BasicCancel):
        raise AMQPError(f"consumer cancelled by the server ({method.consumer_tag})")
    code = getattr(method, "reply_code", 0)
    text = getattr(method, "reply_text", "")
    raise AMQPError(f"{method.NAME} from server: {code} {text}", code)


class _Publisher(_Worker):
    role = "pub"

    def run(self) -> None:
        p = self.params
        pl = plan(p)
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
        # Counts go to the parent from a thread: sendall can block for long stretches
        # under the broker's flow control, and the live rates should not stall with it.
        self.sent = 0
        self.tracker = _ConfirmTracker()
        done = threading.Event()
        reporter = threading.Thread(target=self._report_loop, args=(done,), daemon=True)
        reporter.start()
        try:
            result = self._loop(sock, head, tail, pending_in)
        finally:
            done.set()
            reporter.join()
        try:
            result = self.stamp(result)
        finally:
            client.close()
        self.finish(result)

    def _report_loop(self, done: threading.Event) -> None:
        next_report = self.t0 + REPORT_NS
        while not done.wait(max(0, next_report - time.monotonic_ns()) / NS):
            next_report += REPORT_NS
            self.conn.send(("stats", "pub", self.index, self.sent, self.tracker.confirmed, None))

    def _loop(self, sock: socket.socket, head: bytes, tail: bytes, inbuf: bytes) -> WorkerResult:
        p = self.params
        timestamped = p.size >= 8
        msg_len = len(head) + len(tail) + (8 if timestamped else 0)
        batch = max(1, min(MAX_BATCH_MESSAGES, BATCH_BYTES // msg_len))
        limit = p.pmessages or (1 << 62)
        rate = p.rate
        quantum = max(1, min(batch, rate // 1000))
        window = p.confirm
        tracker = self.tracker
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        monotonic_ns = time.monotonic_ns
        ts_pack = _TS.pack
        recv = sock.recv
        sendall = sock.sendall
        poll = poller.poll

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

        def read_incoming(block_ms: int) -> None:
            nonlocal inbuf
            if not poll(block_ms):  # (no non-blocking read: an exception costs more)
                return
            data = recv(RECV_SIZE)
            if not data:
                raise EOFError("server closed the connection")
            inbuf = inbuf + data if inbuf else data
            used = tracker.feed(inbuf)
            inbuf = inbuf[used:]

        if inbuf:
            inbuf = inbuf[tracker.feed(inbuf) :]
        sent = 0
        last_ns = self.t0
        stop_at = self.stop_at
        t0 = self.t0
        now = monotonic_ns()
        next_poll = now + POLL_NS
        while True:
            now = monotonic_ns()
            if now >= stop_at:
                break
            if now >= next_poll:
                next_poll = now + POLL_NS
                if self.stop_requested():
                    break
                if not window:
                    read_incoming(0)  # a close or connection.blocked would show here
            n = limit - sent
            if n <= 0:
                break
            if n > batch:
                n = batch
            if rate:
                due = (now - t0) * rate // NS - sent
                if due < quantum and sent + due < limit:
                    # Wait until a quantum (1 ms worth of messages) is due: batches, not
                    # one message per wakeup.
                    wait_ns = (sent + quantum) * NS // rate + t0 - now
                    time.sleep(min(max(wait_ns, 0), POLL_NS) / NS)
                    continue
                if n > due:
                    n = due
            if window:
                room = window - (sent - tracker.confirmed)
                if room <= 0:
                    read_incoming(max(1, (next_poll - now) // 1_000_000))
                    continue
                if n > room:
                    n = room
            if timestamped:
                sendall(ts_pack(now).join(parts(n)))
            else:
                sendall(whole * n)
            sent += n
            self.sent = sent
            if window:
                read_incoming(0)
        last_ns = monotonic_ns()  # the last sendall has returned
        if window:
            # Wait for the outstanding confirms (not if the parent is tearing down).
            deadline = monotonic_ns() + int(FINISH_TIMEOUT * NS)
            while tracker.confirmed < sent and monotonic_ns() < deadline:
                read_incoming(100)
                if self.stop_requested():
                    break
        return WorkerResult(
            count=sent, confirmed=tracker.confirmed, nacked=tracker.nacked, last_ns=last_ns
        )


class _Consumer(_Worker):
    role = "con"

    def __init__(self, index: int, params: ThroughputParams, queue: str, conn: Connection) -> None:
        super().__init__(index, params, conn)
        self.queue = queue

    def run(self) -> None:
        p = self.params
        client = self.client.connect()
        client.channel_open(1)
        if p.prefetch:
            client.qos(1, p.prefetch)
        client.consume(1, self.queue, no_ack=not p.ack)
        sock = client.sock
        assert sock is not None
        sock.settimeout(None)
        pending_in = client.unread()
        self.wait_go()
        try:
            result = self.stamp(self._loop(sock, pending_in))
        finally:
            client.close()
        self.finish(result)

    def _loop(self, sock: socket.socket, buf: bytes) -> WorkerResult:
        """Receive and count deliveries until the deadline or the parent's stop.

        Two paths: the general one walks frame by frame; once one delivery has
        arrived whole, its bytes become a template and every later delivery of the
        same shape (same consumer tag, flags, exchange, routing key and body size,
        one body frame) is recognised with two ``startswith`` checks and read with
        one ``unpack_from`` (delivery tag and timestamp). Publishers stamp a whole
        batch with one timestamp, so latencies are recorded per run of equal stamps.
        """
        p = self.params
        ack_every = p.ack
        timestamps = p.size >= 8
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        monotonic_ns = time.monotonic_ns
        unpack_hdr = _HDR.unpack_from
        unpack_u32 = _U32.unpack_from
        unpack_u64 = _U64.unpack_from
        recv = sock.recv
        # basic.ack(delivery_tag, multiple=true) on channel 1: 7-byte header, 4 ids, tag, bits, end.
        ack_prefix = _HDR.pack(1, 1, 13) + _U32.pack(_ACK)
        ack_suffix = b"\x01\xce"
        hist: dict[int, int] = {}

        def record(now: int, ts: int, n: int) -> None:
            us = (now - ts) // 1000
            if us < 0:
                us = 0
            b = us.bit_length()
            if b > SUB_BITS:
                b -= SUB_BITS
                us = (b << SUB_BITS) | (us >> b)
            hist[us] = hist.get(us, 0) + n

        # Fast path, set up from the first whole delivery (fast_len == 0: not yet).
        fast_len = 0
        fast_prefix = b""  # frame header, method id, consumer tag: up to the delivery tag
        fast_mid = b""  # after the tag up to the body bytes (flags, names, header frame, ...)
        mid_off = 0
        fast_tag = 0  # offset of the delivery tag in a delivery
        tag_off = 0
        tag_ts = struct.Struct(">Q")

        count = 0
        counted = 0  # count at the end of the previous read
        reported = 0
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
        last_ns = self.t0
        stop_at = self.stop_at
        next_poll = monotonic_ns() + POLL_NS
        next_report = self.t0 + REPORT_NS
        next_idle_report = 0
        now = 0

        def report() -> None:
            nonlocal reported, hist
            self.conn.send(("stats", "con", self.index, count, 0, hist))
            reported = count
            hist = {}

        poll = poller.poll
        poll_ms = POLL_NS // 1_000_000
        full = False  # the last read filled the buffer: read again without asking
        while True:
            if not full:
                # Before blocking: settle acks and give the parent early news (a -C run
                # ends sooner), but only when the socket really is dry. Waiting in poll
                # rather than trying a non-blocking read first saves a syscall and an
                # exception per wakeup.
                if (unacked or count != reported) and not poll(0):
                    if unacked:
                        sock.sendall(ack_prefix + _U64.pack(last_tag) + ack_suffix)
                        acked_tag = last_tag
                        unacked = 0
                    now = monotonic_ns()
                    if count != reported and now >= next_idle_report:
                        next_idle_report = now + IDLE_REPORT_NS  # at most 10 times a second
                        report()
                if not poll(poll_ms):
                    now = monotonic_ns()
                    if now >= stop_at or self.stop_requested():
                        break
                    next_poll = now + POLL_NS
                    if count != reported and now >= next_report:
                        next_report += REPORT_NS
                        report()
                    continue
            data = recv(RECV_SIZE)
            full = len(data) == RECV_SIZE
            if not data:
                raise EOFError("server closed the connection")
            now = monotonic_ns()
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
                        _raise_close(buf[pos + 7 : end - 1])
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
            if count != counted:
                counted = count
                last_ns = now
            if now >= next_poll:
                next_poll = now + POLL_NS
                if now >= stop_at or self.stop_requested():
                    break
                if now >= next_report:
                    next_report += REPORT_NS
                    report()
        if unacked and last_tag > acked_tag:
            with contextlib.suppress(OSError):
                sock.sendall(ack_prefix + _U64.pack(last_tag) + ack_suffix)
        return WorkerResult(count=count, last_ns=last_ns, hist=hist)


# =====================================================================================
# Parent: setup, orchestration, report
# =====================================================================================


@dataclass
class _Slot:
    role: str
    index: int
    process: multiprocessing.process.BaseProcess
    conn: Connection
    count: int = 0
    confirmed: int = 0
    ready: bool = False
    done: bool = False
    result: dict[str, Any] | None = None


def setup(client: Client, p: ThroughputParams, pl: Plan) -> None:
    client.channel_open(1)
    if pl.declare_exchange:
        client.exchange_declare(1, pl.exchange, pl.exchange_type, durable=p.durable)
    for name in pl.queue_names:
        client.queue_declare(1, name, durable=p.durable, arguments=p.queue_args)
        if pl.bind:
            client.queue_bind(1, name, pl.exchange, pl.routing_key)


def cleanup(client: Client, pl: Plan) -> None:
    for name in pl.queue_names:
        client.queue_delete(1, name)
    if pl.declare_exchange:
        client.exchange_delete(1, pl.exchange)


def run(p: ThroughputParams, out: TextIO | None = None, as_json: bool = False) -> int:
    """Run a throughput test; prints live lines to ``out`` and the summary. Returns the exit status."""
    live = out if out is not None else (sys.stderr if as_json else sys.stdout)
    try:
        pl = plan(p)
    except ValueError as exc:
        print(f"warren perf throughput: {exc}", file=sys.stderr)
        return 2
    try:
        control = Client(p.uri, name="warren-perf control").connect()
        setup(control, p, pl)
    except (OSError, AMQPError, EOFError) as exc:
        print(f"warren perf throughput: setup failed: {exc}", file=sys.stderr)
        return 1
    try:
        summary, status = _orchestrate(p, pl, live)
    finally:
        if not p.keep:
            try:
                cleanup(control, pl)
            except (OSError, AMQPError, EOFError) as exc:
                print(f"warren perf throughput: cleanup failed: {exc}", file=sys.stderr)
        control.close()
    if as_json:
        print_json(summary)
    else:
        _print_summary(summary, live)
    return status


def _orchestrate(p: ThroughputParams, pl: Plan, live: TextIO) -> tuple[dict[str, Any], int]:
    ctx = multiprocessing.get_context("spawn")
    slots: list[_Slot] = []
    roles = [("con", i, q) for i, q in enumerate(pl.consumer_queues)] + [
        ("pub", i, "") for i in range(p.publishers)
    ]
    for role, index, queue in roles:
        parent_end, child_end = ctx.Pipe(duplex=True)
        proc = ctx.Process(
            target=worker_main,
            args=(role, index, p, queue, child_end),
            name=f"warren-perf-{role}-{index}",
            daemon=True,
        )
        proc.start()
        child_end.close()
        slots.append(_Slot(role, index, proc, parent_end))
    errors: list[str] = []
    hist: dict[int, int] = {}
    second_hist: dict[int, int] = {}
    pubs = [s for s in slots if s.role == "pub"]
    cons = [s for s in slots if s.role == "con"]
    expected = p.pmessages * p.publishers * pl.fanout if cons else 0

    def handle(slot: _Slot) -> None:
        try:
            msg = slot.conn.recv()
        except (EOFError, OSError):
            if not slot.done:
                slot.done = True
                errors.append(f"{slot.role} {slot.index}: process exited unexpectedly")
            return
        kind = msg[0]
        if kind == "ready":
            slot.ready = True
        elif kind == "stats":
            slot.count, slot.confirmed = msg[3], msg[4]
            if msg[5]:
                for k, v in msg[5].items():
                    second_hist[k] = second_hist.get(k, 0) + v
        elif kind == "done":
            slot.done = True
            slot.result = msg[3]
            slot.count = msg[3]["count"]
            slot.confirmed = msg[3]["confirmed"]
            for k, v in msg[3]["hist"].items():
                second_hist[k] = second_hist.get(k, 0) + v
        elif kind == "error":
            slot.done = True
            errors.append(f"{slot.role} {slot.index}: {msg[3]}")

    def pump(timeout: float) -> None:
        conns = [s.conn for s in slots if not s.done]
        by_conn = {id(s.conn): s for s in slots}
        for c in wait(conns, timeout):
            handle(by_conn[id(c)])

    def send_all(msg: tuple[Any, ...]) -> None:
        for s in slots:
            if not s.done:
                with contextlib.suppress(OSError):
                    s.conn.send(msg)

    interrupted = False
    t0 = time.monotonic_ns()
    stop_sent_ns = 0
    try:
        deadline = time.monotonic() + READY_TIMEOUT
        try:
            while not errors and not all(s.ready or s.done for s in slots):
                if time.monotonic() > deadline:
                    errors.append("workers did not connect in time")
                    break
                pump(0.5)
        except KeyboardInterrupt:
            interrupted = True
            errors.append("interrupted before the start")
        if errors:
            send_all(("stop",))
            stop_sent_ns = time.monotonic_ns()
        else:
            t0 = time.monotonic_ns()
            send_all(("go", t0))
            print(
                f"warren perf throughput: {p.publishers} publisher(s), {len(cons)} consumer(s), "
                f"{p.size} B bodies" + (f", {pl.fanout} queues" if pl.fanout > 1 else ""),
                file=live,
                flush=True,
            )
        # Line k is printed a little after second k, once the workers' reports for it are in.
        second = 1
        next_line = t0 + NS + LINE_LAG_NS
        prev_pub = prev_con = prev_conf = 0
        last_progress_ns = t0
        last_consumed = 0
        while not all(s.done for s in slots):
            now = time.monotonic_ns()
            try:
                pump(max(0.0, min(0.2, (next_line - now) / NS)))
            except KeyboardInterrupt:
                if interrupted:
                    break
                interrupted = True
                send_all(("stop",))
                stop_sent_ns = time.monotonic_ns()
                continue
            now = time.monotonic_ns()
            published = sum(s.count for s in pubs)
            consumed = sum(s.count for s in cons)
            if consumed != last_consumed:
                last_consumed = consumed
                last_progress_ns = now
            if now >= next_line and not stop_sent_ns:
                lat = percentiles_ms(second_hist, (50, 99))
                merge_into(hist, second_hist)
                second_hist.clear()
                confirmed = sum(s.confirmed for s in pubs)
                line = (
                    f"{second:>5}s  published {format_rate(published - prev_pub):>10} msg/s"
                    f"  consumed {format_rate(consumed - prev_con):>10} msg/s"
                )
                if p.confirm:
                    line += f"  confirmed {format_rate(confirmed - prev_conf):>10} msg/s"
                if lat:
                    line += f"  latency p50 {lat['p50']:.2f} ms p99 {lat['p99']:.2f} ms"
                print(line, file=live, flush=True)
                prev_pub, prev_con, prev_conf = published, consumed, confirmed
                second += 1
                next_line += NS
                while next_line <= now:
                    second += 1
                    next_line += NS
            if stop_sent_ns:
                if now - stop_sent_ns > FINISH_TIMEOUT * NS:
                    errors.append("workers did not finish in time")
                    break
                continue
            if errors:
                send_all(("stop",))
                stop_sent_ns = now
                continue
            pubs_done = all(s.done for s in pubs)
            if p.pmessages and pubs_done:
                if consumed >= expected:
                    send_all(("stop",))
                    stop_sent_ns = now
                elif now - last_progress_ns > STALL_NS:
                    errors.append(
                        f"consumers stalled at {consumed} of {expected} messages; giving up"
                    )
                    send_all(("stop",))
                    stop_sent_ns = now
            elif p.time and now >= t0 + int(p.time * NS) + 2 * NS:
                # Workers stop themselves at the deadline; this is the safety net.
                send_all(("stop",))
                stop_sent_ns = now
    finally:
        for s in slots:
            s.process.join(1 if s.done else 0.1)
            if s.process.is_alive():
                s.process.terminate()
                s.process.join(2)
            s.conn.close()
    merge_into(hist, second_hist)
    summary = _summary(p, pl, slots, hist, t0, expected, errors)
    status = 0
    if errors:
        for e in errors:
            print(f"warren perf throughput: error: {e}", file=sys.stderr)
        status = 1
    elif p.pmessages and cons and summary["consumed"] < expected:
        status = 1
    if interrupted:
        status = 130 if status == 0 else status
    return summary, status


def merge_into(target: dict[int, int], source: dict[int, int]) -> None:
    for k, v in source.items():
        target[k] = target.get(k, 0) + v


def _summary(
    p: ThroughputParams,
    pl: Plan,
    slots: list[_Slot],
    hist: dict[int, int],
    t0: int,
    expected: int,
    errors: list[str],
) -> dict[str, Any]:
    pubs = [s for s in slots if s.role == "pub"]
    cons = [s for s in slots if s.role == "con"]
    published = sum(s.count for s in pubs)
    consumed = sum(s.count for s in cons)
    results = [s.result for s in slots if s.result]

    def last(role_slots: list[_Slot]) -> int:
        return max((s.result["last_ns"] for s in role_slots if s.result), default=t0)

    pub_s = (last(pubs) - t0) / NS
    con_s = (last(cons) - t0) / NS
    end_s = max((r["wall_s"] for r in results), default=0.0)

    def cpu(role_slots: list[_Slot]) -> list[float]:
        return [
            round(s.result["cpu_s"] / s.result["wall_s"], 3)
            for s in role_slots
            if s.result and s.result["wall_s"] > 0
        ]

    summary: dict[str, Any] = {
        "published": published,
        "consumed": consumed,
        "publish_rate": round(published / pub_s, 1) if pub_s > 0 else 0.0,
        "consume_rate": round(consumed / con_s, 1) if con_s > 0 else 0.0,
        "latency_ms": percentiles_ms(hist),
        "duration_s": round(end_s, 3),
    }
    if p.confirm:
        summary["confirmed"] = sum(s.confirmed for s in pubs)
        summary["nacked"] = sum(s.result["nacked"] for s in pubs if s.result)
    if expected:
        summary["expected"] = expected
    summary["client_cpu"] = {"publishers": cpu(pubs), "consumers": cpu(cons)}
    summary["queues"] = list(pl.queue_names)
    summary["params"] = asdict(p)
    if errors:
        summary["errors"] = errors
    return summary


def _print_summary(s: dict[str, Any], out: TextIO) -> None:
    def w(line: str) -> None:
        print(line, file=out)

    w("")
    w(f"Summary ({s['duration_s']:.1f} s)")
    w(
        f"  published  {format_count(s['published']):>14}   {format_rate(s['publish_rate']):>12} msg/s"
    )
    if "confirmed" in s:
        w(f"  confirmed  {format_count(s['confirmed']):>14}   nacked {format_count(s['nacked'])}")
    w(
        f"  consumed   {format_count(s['consumed']):>14}   {format_rate(s['consume_rate']):>12} msg/s"
    )
    if "expected" in s:
        w(f"  expected   {format_count(s['expected']):>14}")
    lat = s["latency_ms"]
    if lat:
        w(
            f"  latency    p50 {lat['p50']:.3f} ms  p95 {lat['p95']:.3f} ms  p99 {lat['p99']:.3f} ms"
            f"  max {lat['max']:.3f} ms  ({format_count(lat['samples'])} samples)"
        )
    else:
        w("  latency    n/a (bodies under 8 bytes carry no timestamp, or nothing consumed)")
    cpu = s["client_cpu"]
    w(
        "  client CPU publishers "
        + (" ".join(f"{c:.0%}" for c in cpu["publishers"]) or "-")
        + ", consumers "
        + (" ".join(f"{c:.0%}" for c in cpu["consumers"]) or "-")
    )
    out.flush()
