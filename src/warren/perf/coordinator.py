"""The parent side of ``perf throughput``, ``perf mqtt`` and ``perf amqp1``: start the
worker processes, wait until all are connected, send the common start time, collect
the counts they report, print a live line a second, decide when the run is over; then
the summary (`summarize`, `finish_summary`, `print_summary`; `run_reported` for the
tools whose ``run`` is measure-then-print).

The pipe protocol is described in :mod:`warren.perf.workers`. What differs between
the protocols (the words in the output, the JSON keys, when a run has stalled) is
given as :class:`Terms` and :class:`Run`.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any, TextIO

from warren.perf.report import format_count, format_rate, merge_into, percentiles_ms, print_json
from warren.perf.workers import NS

__all__ = [
    "Interrupts",
    "Outcome",
    "Run",
    "Slot",
    "Terms",
    "coordinate",
    "finish_summary",
    "print_summary",
    "run_reported",
    "summarize",
]

#: Live line k is printed this long after second k (the workers report at second k).
LINE_LAG_NS = 200_000_000
#: How long the parent waits for workers to connect, and to finish after "stop".
READY_TIMEOUT = 60.0
FINISH_TIMEOUT = 30.0


@dataclass(frozen=True)
class Terms:
    """The words of one protocol's tool, in its messages, live lines and summary."""

    #: Prefix of error messages, e.g. "warren perf throughput".
    command: str
    #: Role of the receiving workers ("con", "sub").
    receiver_role: str
    #: What they do to messages: live line, summary line and JSON key ("consumed").
    received: str
    #: JSON key of their rate ("consume_rate").
    receive_rate: str
    #: Who they are, in the summary's CPU line and the stall message ("consumers").
    receivers: str
    #: What the broker does to published messages ("confirmed").
    acked: str


@dataclass(frozen=True)
class Run:
    """One run: the worker processes and when to end."""

    #: Entry point of the worker processes, called as ``target(role, index, *args, conn)``.
    target: Callable[..., None]
    #: (role, index, extra args) of each worker, receivers first.
    workers: list[tuple[str, int, tuple[Any, ...]]]
    #: Process names are ``<process_name>-<role>-<index>``.
    process_name: str
    #: First line printed once all workers are connected.
    banner: str
    #: Print the acked rate in the live lines.
    show_acked: bool
    #: Messages per publisher (0: run until the time is up or Ctrl-C, unless
    #: ``until_expected`` or ``receiver_count``).
    count: int
    #: Seconds to run (0: no limit); the workers stop themselves, this is a safety net.
    seconds: float
    #: Messages the receivers should get in all, in count mode.
    expected: int
    #: In count mode: give up this long after the last progress.
    stall_ns: int
    #: ... reporting it as an error.
    stall_is_error: bool = True
    #: ... counting the progress of publishers too (their last publish).
    stall_counts_publishers: bool = False
    #: End once the receivers have ``expected`` messages also without a ``count``
    #: (and without publishers: draining a backlog).
    until_expected: bool = False
    #: Messages per receiver: each stops by itself after this many, and the run ends
    #: once all have (0: no limit).
    receiver_count: int = 0


@dataclass
class Slot:
    """The parent's view of one worker process."""

    role: str
    index: int
    process: multiprocessing.process.BaseProcess
    conn: Connection
    count: int = 0
    acked: int = 0
    ready: bool = False
    done: bool = False
    result: dict[str, Any] | None = None


@dataclass
class Outcome:
    slots: list[Slot]
    #: Latency histogram of the whole run.
    hist: dict[int, int]
    t0: int
    errors: list[str] = field(default_factory=list)
    interrupted: bool = False

    def role(self, role: str) -> list[Slot]:
        return [s for s in self.slots if s.role == role]

    def status(self, short: bool) -> int:
        """Exit status: 1 on errors or when ``short`` (fewer messages than expected),
        130 after Ctrl-C, else 0."""
        status = 1 if self.errors or short else 0
        if self.interrupted:
            status = 130 if status == 0 else status
        return status


class Interrupts:
    """SIGINT counted rather than raised while a run and its summary are under way.

    A KeyboardInterrupt can surface at any bytecode, e.g. just after a live line was
    written, and then unwinds past the code that would stop the workers and print the
    summary. Here the handler only counts, and a wakeup socket (``signal.set_wakeup_fd``)
    ends the coordinator's current wait at once. Outside the main thread (where no
    signal handler can be installed) it stays inactive and ``count`` stays 0.
    """

    def __init__(self) -> None:
        self.count = 0
        self.sock: socket.socket | None = None
        self._wake: socket.socket | None = None
        self._old_handler: Any = None
        self._old_fd = -1

    def __enter__(self) -> Interrupts:
        if threading.current_thread() is not threading.main_thread():
            return self
        self.sock, self._wake = socket.socketpair()
        self.sock.setblocking(False)
        self._wake.setblocking(False)
        self._old_handler = signal.signal(signal.SIGINT, self._handle)
        self._old_fd = signal.set_wakeup_fd(self._wake.fileno(), warn_on_full_buffer=False)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.sock is None or self._wake is None:
            return
        signal.set_wakeup_fd(self._old_fd)
        signal.signal(signal.SIGINT, self._old_handler)
        self.sock.close()
        self._wake.close()
        self.sock = self._wake = None

    def _handle(self, _signum: int, _frame: object) -> None:
        self.count += 1

    def clear(self) -> None:
        """Empty the wakeup socket (its bytes only say that a signal came)."""
        if self.sock is not None:
            with contextlib.suppress(BlockingIOError):
                while self.sock.recv(256):
                    pass


def last_ns(slots: list[Slot], t0: int) -> int:
    """When the last of ``slots`` published or received its last message."""
    return max((s.result["last_ns"] for s in slots if s.result), default=t0)


def coordinate(
    run: Run, terms: Terms, live: TextIO | None, interrupts: Interrupts | None = None
) -> Outcome:
    """Start the workers, run them to the end (see :class:`Run`), join them. Ctrl-C
    stops the workers (a second one stops waiting for them); ``interrupts``: the
    caller's, when it holds SIGINT back for longer (through its summary)."""
    if interrupts is None:
        with Interrupts() as own:
            return coordinate(run, terms, live, own)
    ctx = multiprocessing.get_context("spawn")
    slots: list[Slot] = []
    for role, index, args in run.workers:
        parent_end, child_end = ctx.Pipe(duplex=True)
        proc = ctx.Process(
            target=run.target,
            args=(role, index, *args, child_end),
            name=f"{run.process_name}-{role}-{index}",
            daemon=True,
        )
        proc.start()
        child_end.close()
        slots.append(Slot(role, index, proc, parent_end))
    errors: list[str] = []
    hist: dict[int, int] = {}
    second_hist: dict[int, int] = {}
    pubs = [s for s in slots if s.role == "pub"]
    subs = [s for s in slots if s.role == terms.receiver_role]
    expected = run.expected

    def handle(slot: Slot) -> None:
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
            slot.count, slot.acked = msg[3], msg[4]
            if msg[5]:
                merge_into(second_hist, msg[5])
        elif kind == "done":
            slot.done = True
            slot.result = msg[3]
            slot.count, slot.acked = msg[3]["count"], msg[3]["acked"]
            merge_into(second_hist, msg[3]["hist"])
        elif kind == "error":
            slot.done = True
            errors.append(f"{slot.role} {slot.index}: {msg[3]}")

    def pump(timeout: float) -> None:
        by_conn = {id(s.conn): s for s in slots}
        waits: list[Any] = [s.conn for s in slots if not s.done]
        if interrupts.sock is not None:
            waits.append(interrupts.sock)
        for c in wait(waits, timeout):
            if c is interrupts.sock:
                interrupts.clear()
            else:
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
        while not errors and not all(s.ready or s.done for s in slots):
            if interrupts.count:
                interrupted = True
                errors.append("interrupted before the start")
                break
            if time.monotonic() > deadline:
                errors.append("workers did not connect in time")
                break
            pump(0.5)
        if errors:
            send_all(("stop",))
            stop_sent_ns = time.monotonic_ns()
        else:
            t0 = time.monotonic_ns()
            send_all(("go", t0))
            if live is not None:
                print(run.banner, file=live, flush=True)
        # Line k is printed a little after second k, once the workers' reports for it are in.
        second = 1
        next_line = t0 + NS + LINE_LAG_NS
        prev_pub = prev_sub = prev_ack = 0
        last_progress_ns = t0
        last_received = 0
        while not all(s.done for s in slots):
            now = time.monotonic_ns()
            pump(max(0.0, min(0.2, (next_line - now) / NS)))
            if interrupts.count > 1 and interrupted:
                break
            if interrupts.count and not interrupted:
                interrupted = True
                send_all(("stop",))
                stop_sent_ns = time.monotonic_ns()
                continue
            now = time.monotonic_ns()
            published = sum(s.count for s in pubs)
            received = sum(s.count for s in subs)
            if received != last_received:
                last_received = received
                last_progress_ns = now
            if now >= next_line and not stop_sent_ns:
                lat = percentiles_ms(second_hist, (50, 99))
                merge_into(hist, second_hist)
                second_hist.clear()
                acked = sum(s.acked for s in pubs)
                if live is not None:
                    line = (
                        f"{second:>5}s  published {format_rate(published - prev_pub):>10} msg/s"
                        f"  {terms.received} {format_rate(received - prev_sub):>10} msg/s"
                    )
                    if run.show_acked:
                        line += f"  {terms.acked} {format_rate(acked - prev_ack):>10} msg/s"
                    if lat:
                        line += f"  latency p50 {lat['p50']:.2f} ms p99 {lat['p99']:.2f} ms"
                    print(line, file=live, flush=True)
                prev_pub, prev_sub, prev_ack = published, received, acked
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
            if run.receiver_count and subs and all(s.done for s in subs):
                send_all(("stop",))
                stop_sent_ns = now
            elif (run.count or run.until_expected) and all(s.done for s in pubs):
                progress_ns = last_progress_ns
                if run.stall_counts_publishers:
                    progress_ns = max(progress_ns, last_ns(pubs, t0))
                if received >= expected or not subs:
                    send_all(("stop",))
                    stop_sent_ns = now
                elif now - progress_ns > run.stall_ns:
                    if run.stall_is_error:
                        errors.append(
                            f"{terms.receivers} stalled at {received} of {expected} messages;"
                            " giving up"
                        )
                    send_all(("stop",))
                    stop_sent_ns = now
            elif run.seconds and now >= t0 + int(run.seconds * NS) + 2 * NS:
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
    if live is not None:
        for e in errors:
            print(f"{terms.command}: error: {e}", file=sys.stderr)
    return Outcome(slots, hist, t0, errors, interrupted)


def client_cpu(slots: list[Slot]) -> list[float]:
    """Each worker's CPU time as a share of its wall time."""
    return [
        round(s.result["cpu_s"] / s.result["wall_s"], 3)
        for s in slots
        if s.result and s.result["wall_s"] > 0
    ]


def summarize(outcome: Outcome, terms: Terms) -> dict[str, Any]:
    """The summary's counts, rates, latency percentiles and duration."""
    pubs = outcome.role("pub")
    subs = outcome.role(terms.receiver_role)
    t0 = outcome.t0
    published = sum(s.count for s in pubs)
    received = sum(s.count for s in subs)
    pub_s = (last_ns(pubs, t0) - t0) / NS
    sub_s = (last_ns(subs, t0) - t0) / NS
    results = [s.result for s in outcome.slots if s.result]
    return {
        "published": published,
        terms.received: received,
        "publish_rate": round(published / pub_s, 1) if pub_s > 0 else 0.0,
        terms.receive_rate: round(received / sub_s, 1) if sub_s > 0 else 0.0,
        "latency_ms": percentiles_ms(outcome.hist),
        "duration_s": round(max((r["wall_s"] for r in results), default=0.0), 3),
    }


def cpu_summary(outcome: Outcome, terms: Terms) -> dict[str, list[float]]:
    return {
        "publishers": client_cpu(outcome.role("pub")),
        terms.receivers: client_cpu(outcome.role(terms.receiver_role)),
    }


def finish_summary(
    summary: dict[str, Any],
    outcome: Outcome,
    terms: Terms,
    params: dict[str, Any],
    **fields: Any,
) -> dict[str, Any]:
    """The summary's tail, after the tool's own counts: the client CPU, ``fields``
    (the queues, ...), the parameters and the errors, in that order."""
    summary["client_cpu"] = cpu_summary(outcome, terms)
    summary.update(fields)
    summary["params"] = params
    if outcome.errors:
        summary["errors"] = outcome.errors
    return summary


def run_reported(
    measure: Callable[[TextIO, Interrupts], tuple[dict[str, Any], int]],
    show: Callable[[dict[str, Any], TextIO], None],
    out: TextIO | None,
    as_json: bool,
) -> int:
    """A tool's ``run``: ``measure`` with its live lines on ``out`` (stderr with
    ``as_json``, stdout by default), then the summary as JSON on stdout or as text
    (``show``). Ctrl-C stops the run; the summary still follows. The exit status."""
    with Interrupts() as interrupts:
        summary, status = measure(
            out if out is not None else (sys.stderr if as_json else sys.stdout), interrupts
        )
        if as_json:
            print_json(summary)
        else:
            show(summary, out if out is not None else sys.stdout)
    return status


def print_summary(
    s: dict[str, Any], out: TextIO, terms: Terms, acked_line: str | None, no_latency: str
) -> None:
    """The summary as text; ``acked_line`` goes after the published line. A run
    that never started (no ``published``): its errors."""
    if "published" not in s:
        for e in s.get("errors", []):
            print(f"{terms.command}: {e}", file=out)
        return

    def w(label: str, rest: str) -> None:
        print(f"  {label:<11}{rest}" if label else rest, file=out)

    w("", "")
    w("", f"Summary ({s['duration_s']:.1f} s)")
    w(
        "published",
        f"{format_count(s['published']):>14}   {format_rate(s['publish_rate']):>12} msg/s",
    )
    if acked_line is not None:
        w(terms.acked, acked_line)
    w(
        terms.received,
        f"{format_count(s[terms.received]):>14}   {format_rate(s[terms.receive_rate]):>12} msg/s",
    )
    if s.get("backlog"):
        w("backlog", f"{format_count(s['backlog']):>14}   in the queues at the start")
    if "expected" in s:
        w("expected", f"{format_count(s['expected']):>14}")
    lat = s["latency_ms"]
    if lat:
        w(
            "latency",
            f"p50 {lat['p50']:.3f} ms  p95 {lat['p95']:.3f} ms  p99 {lat['p99']:.3f} ms"
            f"  max {lat['max']:.3f} ms  ({format_count(lat['samples'])} samples)",
        )
    else:
        w("latency", no_latency)
    cpu = s["client_cpu"]
    w(
        "",
        "  client CPU publishers "
        + (" ".join(f"{c:.0%}" for c in cpu["publishers"]) or "-")
        + f", {terms.receivers} "
        + (" ".join(f"{c:.0%}" for c in cpu[terms.receivers]) or "-"),
    )
    out.flush()
