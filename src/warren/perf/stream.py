"""``warren perf stream``: producers and consumers of RabbitMQ's stream protocol
in their own processes.

A load generator for stream protocol brokers (Warren's ``[stream] port``,
RabbitMQ's rabbitmq_stream plugin on 5552), built like ``warren perf amqp1``:
the parent creates the stream (over the stream protocol), starts one OS process
per producer connection and per consumer, waits until all are connected (the
consumers subscribed), sends them the common start time and then only collects
the counts each reports once a second (:mod:`warren.perf.coordinator`). The
workers are in :mod:`warren.perf.stream_workers`, the client in
:mod:`warren.perf.stream_client`.

Every consumer reads the whole stream (a stream's subscriptions do not share
its messages), so a run of ``-C N`` ends once each consumer has the messages of
all producers.
"""

from __future__ import annotations

import os
import sys
from dataclasses import asdict, dataclass, replace
from typing import Any, TextIO

from warren.perf.coordinator import (
    Interrupts,
    Outcome,
    Run,
    Terms,
    coordinate,
    finish_summary,
    run_reported,
    summarize,
)
from warren.perf.coordinator import (
    print_summary as _print_summary,
)
from warren.perf.report import format_count
from warren.perf.stream_client import StreamError, StreamURI, connect
from warren.perf.stream_workers import worker_main
from warren.perf.workers import NS

__all__ = ["DEFAULT_URI", "StreamParams", "measure", "print_summary", "run", "worker_main"]

DEFAULT_URI = "rabbitmq-stream://guest:guest@127.0.0.1:5552/%2F"
OFFSETS = ("first", "last", "next")
#: In --count mode: give up waiting for missing messages after this long without progress.
STALL_NS = 10 * NS

TERMS = Terms(
    command="warren perf stream",
    receiver_role="con",
    received="consumed",
    receive_rate="consume_rate",
    receivers="consumers",
    acked="confirmed",
)


@dataclass(frozen=True)
class StreamParams:
    """Everything a run needs; also what ``--json`` prints as ``params`` (password masked)."""

    uri: str = DEFAULT_URI
    #: Producer connections, each in its own process.
    producers: int = 1
    #: Publishers declared on each producer connection, sent batches in turn.
    publishers_per_connection: int = 1
    consumers: int = 1
    size: int = 16
    #: Messages per Publish frame.
    batch: int = 100
    #: At most this many messages of a connection wait for their confirm (0: no limit).
    confirm: int = 10_000
    #: Chunks each consumer's subscription is granted at the start (one more per chunk).
    credit: int = 10
    offset: str = "next"
    #: Consumers locate every record of a chunk (exact latency) instead of reading
    #: the chunk header alone.
    decode: bool = False
    stream: str = "perf-stream"
    #: Create's max-length-bytes (0: not given, the broker's default).
    max_length_bytes: int = 0
    #: Keep a stream this run created (one that existed is never deleted).
    keep: bool = False
    time: float = 0.0
    count: int = 0
    rate: int = 0
    #: Prefix of the connection names; the parent adds its pid.
    name: str = "warren-perf"

    def check(self) -> str | None:
        """Why these parameters cannot run, or None."""
        if self.producers == 0 and self.consumers == 0:
            return "nothing to do with -x 0 -y 0"
        if not 1 <= self.publishers_per_connection <= 256:
            return "--publishers-per-connection must be 1..256"
        if self.batch <= 0:
            return "--batch must be > 0"
        if not 1 <= self.credit <= 0xFFFF:
            return "--credit must be 1..65535"
        if self.offset not in OFFSETS:
            return f"--offset must be one of {', '.join(OFFSETS)}"
        if not self.stream:
            return "--stream must not be empty"
        try:
            StreamURI.parse(self.uri)
        except ValueError as exc:
            return str(exc)
        return None


def run(p: StreamParams, out: TextIO | None = None, as_json: bool = False) -> int:
    """Run the load; prints live lines to ``out`` and the summary. Returns the exit status."""
    return run_reported(lambda live, ints: measure(p, live, ints), print_summary, out, as_json)


def measure(
    p: StreamParams, live: TextIO | None = None, interrupts: Interrupts | None = None
) -> tuple[dict[str, Any], int]:
    """Run the load (the in-process API); returns the summary and the exit status."""
    problem = p.check()
    if problem:
        return {"errors": [problem], "params": _public(p)}, 2
    if p.name == StreamParams.name:
        p = replace(p, name=f"warren-perf-{os.getpid()}")
    uri = StreamURI.parse(p.uri)
    arguments = {"max-length-bytes": str(p.max_length_bytes)} if p.max_length_bytes else {}
    try:
        control = connect(uri, f"{p.name}-control")
        try:
            created = control.create(p.stream, arguments)
        finally:
            control.close()
    except (OSError, StreamError) as exc:
        return {"errors": [f"setup failed: {exc}"], "params": _public(p)}, 1
    try:
        expected = p.count * p.producers * p.consumers
        outcome = coordinate(
            Run(
                target=worker_main,
                workers=[("con", i, (p,)) for i in range(p.consumers)]
                + [("pub", i, (p,)) for i in range(p.producers)],
                process_name="warren-perf-stream",
                banner=f"warren perf stream: {p.producers} producer connection(s) "
                f"x {p.publishers_per_connection} publisher(s) to {p.stream!r} ({p.batch} per "
                f"Publish, {'window ' + str(p.confirm) if p.confirm else 'no confirm window'}), "
                f"{p.consumers} consumer(s) from {p.offset} (credit {p.credit}), "
                f"{p.size} B bodies",
                show_acked=True,
                count=p.count,
                seconds=p.time,
                expected=expected,
                stall_ns=STALL_NS,
            ),
            TERMS,
            live,
            interrupts,
        )
    finally:
        if created and not p.keep:
            try:
                control = connect(uri, f"{p.name}-control")
                try:
                    control.delete(p.stream)
                finally:
                    control.close()
            except (OSError, StreamError) as exc:
                print(f"warren perf stream: cleanup failed: {exc}", file=sys.stderr)
    summary = _summary(p, outcome, expected)
    short = bool(expected and summary["consumed"] < expected)
    return summary, outcome.status(short)


def _public(p: StreamParams) -> dict[str, Any]:
    params = asdict(p)
    params["uri"] = StreamURI().masked(p.uri)
    return params


def _summary(p: StreamParams, outcome: Outcome, expected: int) -> dict[str, Any]:
    summary = summarize(outcome, TERMS)
    pubs = outcome.role("pub")
    cons = outcome.role("con")
    summary["confirmed"] = sum(s.acked for s in pubs)
    summary["publish_errors"] = sum(s.result["errors"] for s in pubs if s.result)
    chunks = sum(s.result["chunks"] for s in cons if s.result)
    summary["chunks"] = chunks
    summary["records_per_chunk"] = round(summary["consumed"] / chunks, 1) if chunks else None
    if expected:
        summary["expected"] = expected
    return finish_summary(summary, outcome, TERMS, _public(p), stream=p.stream)


def print_summary(s: dict[str, Any], out: TextIO) -> None:
    acked = None
    if "confirmed" in s:
        acked = f"{format_count(s['confirmed']):>14}   publish errors {s['publish_errors']}"
        if s["records_per_chunk"]:
            acked += f", {s['records_per_chunk']} records per delivered chunk"
    params = s.get("params", {})
    no_latency = (
        "n/a (no consumers)"
        if not params.get("consumers")
        else "n/a (bodies under 8 bytes carry no timestamp)"
        if params.get("size", 0) < 8
        else "n/a (no messages consumed)"
    )
    _print_summary(s, out, TERMS, acked, no_latency)
