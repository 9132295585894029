"""``warren perf amqp1``: AMQP 1.0 senders and receivers in their own processes.

A load generator for AMQP 1.0 brokers (Warren, RabbitMQ 4, RabbitMQ 3.x with
the rabbitmq_amqp1_0 plugin), built like ``warren perf throughput``: the
parent declares the queue (over AMQP 0-9-1 on the same port, as AMQP 1.0 has
no declare of its own but RabbitMQ's management node), starts one OS process
per sender and per receiver, waits until all are attached, sends them the
common start time and then only collects the counts each reports once a
second (:mod:`warren.perf.coordinator`). The workers are in
:mod:`warren.perf.amqp1_workers`, the client in :mod:`warren.perf.amqp1_client`.

Addresses are RabbitMQ 4's v2 forms (``/queues/Q``, ``/exchanges/X/RK``) unless
``--addresses v1`` (RabbitMQ 3.x's plugin: ``/amq/queue/Q``, ``/exchange/X/RK``).
"""

from __future__ import annotations

import os
import sys
from dataclasses import asdict, dataclass, replace
from typing import Any, TextIO
from urllib.parse import quote

from warren.client import AMQPError, Client
from warren.client.uri import URI
from warren.perf.amqp1_workers import worker_main
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
from warren.perf.workers import NS

__all__ = ["AMQP1Params", "measure", "print_summary", "run", "worker_main"]

#: In --count mode: give up waiting for missing messages after this long without progress.
STALL_NS = 10 * NS

TERMS = Terms(
    command="warren perf amqp1",
    receiver_role="con",
    received="consumed",
    receive_rate="consume_rate",
    receivers="receivers",
    acked="accepted",
)


@dataclass(frozen=True)
class AMQP1Params:
    """Everything a run needs; also what ``--json`` prints as ``params`` (password masked)."""

    uri: str = "amqp://guest:guest@127.0.0.1:5672/"
    publishers: int = 1
    consumers: int = 1
    size: int = 16
    #: Unsettled transfers with at most this many awaiting the broker's disposition
    #: (0: pre-settled transfers, fire and forget).
    confirm: int = 0
    #: Link credit each receiver keeps granting (topped up once half is used).
    credit: int = 1000
    #: Receivers accept every N deliveries as one range (0: the broker pre-settles).
    ack: int = 0
    persistent: bool = False
    queue: str = "perf-test"
    durable: bool = False
    #: Send to this exchange (with --routing-key, default the queue name) instead of
    #: to the queue; the queue is bound to it with that key.
    exchange: str = ""
    routing_key: str | None = None
    addresses: str = "v2"
    #: Declare (and at the end delete) the queue over AMQP 0-9-1.
    declare: bool = True
    keep: bool = False
    time: float = 0.0
    count: int = 0
    rate: int = 0
    #: Prefix of the container ids; the parent adds its pid so concurrent runs do not collide.
    container_id: str = "warren-perf"

    def check(self) -> str | None:
        """Why these parameters cannot run, or None."""
        if self.addresses not in ("v1", "v2"):
            return "--addresses must be v1 or v2"
        if self.publishers == 0 and self.consumers == 0:
            return "nothing to do with -x 0 -y 0"
        if self.consumers and self.credit <= 0:
            return "--credit must be > 0"
        if not self.queue:
            return "--queue must not be empty"
        try:
            uri = URI.parse(self.uri)
        except ValueError as exc:
            return str(exc)
        if uri.tls is not None:
            return "amqps:// is not supported yet (plain TCP only)"
        return None

    def key(self) -> str:
        return self.queue if self.routing_key is None else self.routing_key

    def target_address(self) -> str:
        if self.addresses == "v1":
            if self.exchange:
                return f"/exchange/{self.exchange}/{self.key()}"
            return f"/amq/queue/{self.queue}"
        if self.exchange:
            return f"/exchanges/{quote(self.exchange, safe='')}/{quote(self.key(), safe='')}"
        return f"/queues/{quote(self.queue, safe='')}"

    def source_address(self) -> str:
        if self.addresses == "v1":
            return f"/amq/queue/{self.queue}"
        return f"/queues/{quote(self.queue, safe='')}"


def run(p: AMQP1Params, out: TextIO | None = None, as_json: bool = False) -> int:
    """Run the load; prints live lines to ``out`` and the summary. Returns the exit status."""
    return run_reported(lambda live, ints: measure(p, live, ints), print_summary, out, as_json)


def measure(
    p: AMQP1Params, live: TextIO | None = None, interrupts: Interrupts | None = None
) -> tuple[dict[str, Any], int]:
    """Run the load (the in-process API); returns the summary and the exit status."""
    problem = p.check()
    if problem:
        return {"errors": [problem], "params": _public(p)}, 2
    if p.container_id == AMQP1Params.container_id:
        p = replace(p, container_id=f"warren-perf-{os.getpid()}")
    control = None
    if p.declare:
        try:
            control = Client(p.uri, name="warren-perf amqp1 control").connect()
            control.channel_open(1)
            control.queue_declare_ok(1, p.queue, durable=p.durable)
            if p.exchange:
                control.queue_bind(1, p.queue, p.exchange, p.key())
        except (OSError, AMQPError, EOFError) as exc:
            return {"errors": [f"setup failed: {exc}"], "params": _public(p)}, 1
    try:
        expected = p.count * p.publishers if p.consumers else 0
        outcome = coordinate(
            Run(
                target=worker_main,
                workers=[("con", i, (p,)) for i in range(p.consumers)]
                + [("pub", i, (p,)) for i in range(p.publishers)],
                process_name="warren-perf-amqp1",
                banner=f"warren perf amqp1: {p.publishers} sender(s) to {p.target_address()}"
                f" ({'unsettled, window ' + str(p.confirm) if p.confirm else 'pre-settled'}), "
                f"{p.consumers} receiver(s) from {p.source_address()} (credit {p.credit}, "
                f"{'accept every ' + str(p.ack) if p.ack else 'pre-settled'}), {p.size} B bodies",
                show_acked=bool(p.confirm),
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
        if control is not None:
            if not p.keep:
                try:
                    control.queue_delete(1, p.queue)
                except (OSError, AMQPError, EOFError) as exc:
                    print(f"warren perf amqp1: cleanup failed: {exc}", file=sys.stderr)
            control.close()
    summary = _summary(p, outcome, expected)
    short = bool(expected and summary["consumed"] < expected)
    return summary, outcome.status(short)


def _public(p: AMQP1Params) -> dict[str, Any]:
    params = asdict(p)
    try:
        uri = URI.parse(p.uri)
    except ValueError:
        return params
    params["uri"] = p.uri.replace(f":{quote(uri.password, safe='')}@", ":***@")
    return params


def _summary(p: AMQP1Params, outcome: Outcome, expected: int) -> dict[str, Any]:
    summary = summarize(outcome, TERMS)
    pubs = outcome.role("pub")
    if p.confirm:
        summary["accepted"] = sum(s.acked for s in pubs)
        summary["rejected"] = sum(s.result["rejected"] for s in pubs if s.result)
    credits = [s.result["max_credit"] for s in pubs if s.result]
    summary["link_credit"] = max(credits) if credits else None
    if expected:
        summary["expected"] = expected
    return finish_summary(summary, outcome, TERMS, _public(p), queue=p.queue)


def print_summary(s: dict[str, Any], out: TextIO) -> None:
    acked = None
    if "accepted" in s:
        acked = (
            f"{format_count(s['accepted'] - s['rejected']):>14}   not accepted "
            f"{format_count(s['rejected'])}"
            + (f", broker's link credit {s['link_credit']}" if s["link_credit"] else "")
        )
    _print_summary(s, out, TERMS, acked, "n/a (bodies under 8 bytes carry no timestamp)")
