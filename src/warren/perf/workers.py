"""The worker side of ``perf throughput``, ``perf amqp1`` and ``perf mqtt``: one OS
process per publisher or consumer/subscriber, talking to the parent over a pipe.

The pipe protocol (the parent's side is :mod:`warren.perf.coordinator`):

* worker -> parent: ``("ready", role, index)`` once connected; ``("stats", role,
  index, count, acked, hist or None)`` about once a second; ``("done", role,
  index, result dict)`` or ``("error", role, index, text)`` at the end;
* parent -> worker: ``("go", t0)`` (the common start, ``time.monotonic_ns()``),
  ``("stop",)``.

Shared here: the entry point's error handling, the start/stop handshake, the
publishers' pacing loop (batches, ``--rate``, the window of unacknowledged
messages) with its reporter thread and its reader of the broker's replies, the
receivers' read loop (polling, reports, the deadline and the parent's stop), and
latency recording into a histogram, heartbeats of a quiet side. The protocol parsing stays in the protocols'
worker modules, inline in their hot loops.
"""

from __future__ import annotations

import contextlib
import select
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from typing import Any, TypeVar

from warren.perf.report import SUB_BITS

__all__ = [
    "NS",
    "Heartbeat",
    "Publisher",
    "Receiver",
    "Stop",
    "Worker",
    "WorkerResult",
    "record_latency",
    "worker_entry",
]

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
#: How long a publisher waits for its outstanding acks after the end.
FINISH_TIMEOUT = 30.0


@dataclass
class WorkerResult:
    """What a worker sends with "done" (protocols add their own fields)."""

    count: int = 0
    #: Publishers: messages the broker acknowledged (AMQP confirms, MQTT PUBACK/PUBCOMP).
    acked: int = 0
    last_ns: int = 0  # time of the last publish / last message received
    cpu_s: float = 0.0
    wall_s: float = 0.0
    hist: dict[int, int] = field(default_factory=dict)


R = TypeVar("R", bound=WorkerResult)


class Stop(Exception):
    """The parent asked the worker to stop before the start (or went away)."""


def worker_entry(
    role: str,
    index: int,
    conn: Connection,
    make: Callable[[], Worker],
    expected_errors: tuple[type[BaseException], ...],
    empty: WorkerResult,
) -> None:
    """Run the worker ``make()`` builds; report its failure (or an early stop) to the parent."""
    # Ctrl-C reaches the whole process group: the parent coordinates the stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        make().run()
    except Stop:  # stopped before the start: nothing to report
        with contextlib.suppress(OSError):
            conn.send(("done", role, index, asdict(empty)))
    except expected_errors as exc:
        with contextlib.suppress(OSError):
            conn.send(("error", role, index, f"{type(exc).__name__}: {exc}"))
    except BaseException as exc:  # report, then let the traceback show on stderr
        with contextlib.suppress(OSError):
            conn.send(("error", role, index, f"{type(exc).__name__}: {exc}"))
        raise
    finally:
        conn.close()


class Worker:
    """A worker process: ``params`` needs a ``time`` attribute (seconds, 0 = no limit)."""

    role = ""
    #: The EOFError's text when the broker closes the connection.
    closed_message = "the broker closed the connection"

    def __init__(self, index: int, params: Any, conn: Connection) -> None:
        self.index = index
        self.params = params
        self.conn = conn
        self.t0 = 0
        self.stop_at = 1 << 62
        self.cpu0 = 0.0

    def run(self) -> None:
        raise NotImplementedError

    def wait_go(self) -> None:
        self.conn.send(("ready", self.role, self.index))
        msg = self.conn.recv()
        if msg[0] != "go":
            raise Stop
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

    def stamp(self, result: R) -> R:
        """Record the CPU and wall time spent since the start, and report the final
        count at once (closing the connection can take a while behind a backlog)."""
        result.cpu_s = time.process_time() - self.cpu0
        result.wall_s = (time.monotonic_ns() - self.t0) / NS
        self.conn.send(("stats", self.role, self.index, result.count, result.acked, None))
        return result

    def send_done(self, result: WorkerResult) -> None:
        self.conn.send(("done", self.role, self.index, asdict(result)))


class Publisher(Worker):
    """Publishes batches as fast as allowed: by ``--rate``, by the window of
    unacknowledged messages and by the message limit."""

    role = "pub"
    sent = 0

    def acked(self) -> int:
        """Messages the broker has acknowledged so far."""
        return 0

    @contextlib.contextmanager
    def reporting(self) -> Iterator[None]:
        """Report the counts once a second from a thread while the block runs: sendall
        can block for long stretches under the broker's flow control, and the live
        rates should not stall with it."""
        self.sent = 0
        done = threading.Event()
        reporter = threading.Thread(target=self._report_loop, args=(done,), daemon=True)
        reporter.start()
        try:
            yield
        finally:
            done.set()
            reporter.join()

    def _report_loop(self, done: threading.Event) -> None:
        next_report = self.t0 + REPORT_NS
        while not done.wait(max(0, next_report - time.monotonic_ns()) / NS):
            next_report += REPORT_NS
            self.conn.send(("stats", self.role, self.index, self.sent, self.acked(), None))

    def reader(
        self, sock: socket.socket, inbuf: bytes, feed: Callable[[bytes], int]
    ) -> Callable[[int], None]:
        """``read_incoming(block_ms)`` for :meth:`publish`: wait up to ``block_ms`` for
        bytes from the broker, then hand all not yet used to ``feed``, which returns how
        many it used (whole frames or packets). ``inbuf``: bytes already received."""
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        poll = poller.poll
        recv = sock.recv
        closed = self.closed_message
        buf = inbuf[feed(inbuf) :] if inbuf else b""

        def read_incoming(block_ms: int) -> None:
            nonlocal buf
            if not poll(block_ms):  # (no non-blocking read: an exception costs more)
                return
            data = recv(RECV_SIZE)
            if not data:
                raise EOFError(closed)
            buf = buf + data if buf else data
            buf = buf[feed(buf) :]

        return read_incoming

    def publish(
        self,
        msg_len: int,
        limit: int,
        window: int,
        send: Callable[[int, int, int], None],
        read_incoming: Callable[[int], None],
        credit: Callable[[], int] | None = None,
    ) -> tuple[int, int]:
        """Call ``send(n, now, sent)`` for batches of ``n`` messages of about ``msg_len``
        bytes until ``limit`` (0: no limit), the deadline or the parent's stop; with a
        ``window``, at most that many unacknowledged, waiting for the rest at the end.
        ``read_incoming(block_ms)`` handles what the broker sends. ``credit()``: how
        many more the protocol's flow control lets through now (AMQP 1.0's link credit
        and session window). Returns the number sent and the time the last batch went
        out."""
        batch = max(1, min(MAX_BATCH_MESSAGES, BATCH_BYTES // msg_len))
        limit = limit or (1 << 62)
        rate = self.params.rate
        quantum = max(1, min(batch, rate // 1000))
        acked = self.acked
        monotonic_ns = time.monotonic_ns
        sent = 0
        t0 = self.t0
        stop_at = self.stop_at
        next_poll = monotonic_ns() + POLL_NS
        while True:
            now = monotonic_ns()
            if now >= stop_at:
                break
            if now >= next_poll:
                next_poll = now + POLL_NS
                if self.stop_requested():
                    break
                if not window and credit is None:
                    read_incoming(0)  # a close from the broker would show here
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
                room = window - (sent - acked())
                if room <= 0:
                    read_incoming(max(1, (next_poll - now) // 1_000_000))
                    continue
                if n > room:
                    n = room
            if credit is not None:
                room = credit()
                if room <= 0:
                    read_incoming(max(1, (next_poll - now) // 1_000_000))
                    continue
                if n > room:
                    n = room
            send(n, now, sent)
            sent += n
            self.sent = sent
            if window or credit is not None:
                read_incoming(0)
        last_ns = monotonic_ns()  # the last sendall has returned
        if window:
            # Wait for the outstanding acks (not if the parent is tearing down).
            deadline = monotonic_ns() + int(FINISH_TIMEOUT * NS)
            while acked() < sent and monotonic_ns() < deadline:
                read_incoming(100)
                if self.stop_requested():
                    break
        return sent, last_ns


class Receiver(Worker):
    """Receives and counts messages; drives its reads with :meth:`reads`."""

    #: Kept up to date by the caller of :meth:`reads`: messages counted so far, and
    #: whether it holds acks back that should go out before the socket is waited on.
    count = 0
    unsettled = 0
    #: Set by :meth:`reads`: when the count last changed.
    last_ns = 0

    def reads(
        self,
        sock: socket.socket,
        hist: dict[int, int],
        first: bytes = b"",
        idle: Callable[[int], None] | None = None,
    ) -> Iterator[tuple[bytes, int]]:
        """Yield ``(data, now)`` for ``first`` (bytes already read from ``sock``), then for
        every read from ``sock`` until the deadline or the parent's stop, and ``(b"", now)``
        when the socket has run dry while ``self.unsettled``: the caller then sends its
        acks (and clears ``unsettled``).

        Reports ``self.count`` and the latencies recorded in ``hist`` (which is then
        cleared) to the parent once a second, and at once (at most ten times a second)
        when the socket runs dry, so that a count-limited run ends sooner.
        ``idle(now)`` is called whenever a poll interval passed without data (to
        send a heartbeat).
        """
        self.last_ns = self.t0
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        poll = poller.poll
        poll_ms = POLL_NS // 1_000_000
        recv = sock.recv
        monotonic_ns = time.monotonic_ns
        stop_at = self.stop_at
        next_poll = monotonic_ns() + POLL_NS
        next_report = self.t0 + REPORT_NS
        next_idle_report = 0
        reported = counted = 0

        def report() -> None:
            nonlocal reported
            reported = self.count
            self.conn.send(("stats", self.role, self.index, reported, 0, hist))  # (pickled here)
            hist.clear()

        if first:
            now = monotonic_ns()
            yield first, now
            if self.count != counted:
                counted = self.count
                self.last_ns = now
        full = False  # the last read filled the buffer: read again without asking
        while True:
            if not full:
                # Before blocking: settle acks and give the parent early news, but only
                # when the socket really is dry. Waiting in poll rather than trying a
                # non-blocking read first saves a syscall and an exception per wakeup.
                if (self.unsettled or self.count != reported) and not poll(0):
                    if self.unsettled:
                        yield b"", monotonic_ns()
                    now = monotonic_ns()
                    if self.count != reported and now >= next_idle_report:
                        next_idle_report = now + IDLE_REPORT_NS
                        report()
                if not poll(poll_ms):
                    now = monotonic_ns()
                    if now >= stop_at or self.stop_requested():
                        return
                    next_poll = now + POLL_NS
                    if self.count != reported and now >= next_report:
                        next_report += REPORT_NS
                        report()
                    if idle is not None:
                        idle(now)
                    continue
            data = recv(RECV_SIZE)
            if not data:
                raise EOFError(self.closed_message)
            full = len(data) == RECV_SIZE
            now = monotonic_ns()
            yield data, now
            if self.count != counted:
                counted = self.count
                self.last_ns = now
            if now >= stop_at:
                return
            if now >= next_poll:
                next_poll = now + POLL_NS
                if self.stop_requested():
                    return
                if now >= next_report:
                    next_report += REPORT_NS
                    report()


class Heartbeat:
    """``frame`` (the protocol's heartbeat) every ``every_ns`` (0: never) while this
    side has sent nothing else, so that the broker does not close a quiet client as
    dead: a receiver with nothing to receive, a publisher waiting for credit or
    acks. The hot loops call :meth:`sent` after each write."""

    def __init__(self, sock: socket.socket, frame: bytes, every_ns: int) -> None:
        self.sock = sock
        self.frame = frame
        self.every_ns = every_ns
        self.last_ns = time.monotonic_ns()

    def sent(self, now: int) -> None:
        self.last_ns = now

    def idle(self, now: int) -> None:
        if self.every_ns and now - self.last_ns >= self.every_ns:
            self.sock.sendall(self.frame)
            self.last_ns = now


def record_latency(hist: dict[int, int], now: int, ts: int, n: int) -> None:
    """Count ``n`` messages sent at ``ts`` and received at ``now`` (monotonic ns) in
    ``hist`` (the bucketing of :func:`warren.perf.report.bucket`, inlined)."""
    us = (now - ts) // 1000
    if us < 0:
        us = 0
    b = us.bit_length()
    if b > SUB_BITS:
        b -= SUB_BITS
        us = (b << SUB_BITS) | (us >> b)
    hist[us] = hist.get(us, 0) + n
