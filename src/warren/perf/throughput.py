"""``warren perf throughput``: publishers and consumers in their own processes.

The parent declares the exchange and queues on a control connection, starts
one OS process (multiprocessing, 'spawn') per publisher and per consumer,
waits until all are connected, sends them the common start time, and then
only collects the counts each worker reports once a second over its pipe
(:mod:`warren.perf.coordinator`). The workers, written so that the client is
not the bottleneck, are in :mod:`warren.perf.throughput_workers`.
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass
from typing import Any, TextIO

from warren.client import AMQPError, Client
from warren.perf.coordinator import (
    Interrupts,
    Outcome,
    Run,
    Terms,
    coordinate,
    finish_summary,
    print_summary,
    summarize,
)
from warren.perf.report import format_count, print_json
from warren.perf.throughput_workers import worker_main
from warren.perf.workers import NS

__all__ = ["ThroughputParams", "Plan", "plan", "run", "worker_main"]

#: In -C mode: give up waiting for missing messages after this long without progress.
STALL_NS = 10 * NS

TERMS = Terms(
    command="warren perf throughput",
    receiver_role="con",
    received="consumed",
    receive_rate="consume_rate",
    receivers="consumers",
    acked="confirmed",
)


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
    single_ack: bool = False
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
    cmessages: int = 0
    drain: bool = False
    keep: bool = False

    @property
    def manual_ack(self) -> bool:
        """Consumers ack (otherwise they consume with no_ack)."""
        return bool(self.ack or self.single_ack)


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
# Parent: setup, orchestration, report
# =====================================================================================


def setup(client: Client, p: ThroughputParams, pl: Plan) -> list[int]:
    """Declare the exchange and the queues; returns the messages each queue held."""
    client.channel_open(1)
    if pl.declare_exchange:
        client.exchange_declare(1, pl.exchange, pl.exchange_type, durable=p.durable)
    backlog = []
    for name in pl.queue_names:
        ok = client.queue_declare_ok(1, name, durable=p.durable, arguments=p.queue_args)
        backlog.append(ok.message_count)
        if pl.bind:
            client.queue_bind(1, name, pl.exchange, pl.routing_key)
    return backlog


def expected_total(p: ThroughputParams, pl: Plan, backlog: list[int]) -> int:
    """What the consumers should get in all (0: no end in sight). Per queue the least
    of what the publishers send it (-C), what its consumers may take (-D) and, with
    --drain, what it held at the start."""
    if not pl.consumer_queues or not (p.pmessages or p.cmessages or p.drain):
        return 0
    total = 0
    for held in backlog:
        limits = []
        if p.pmessages:
            limits.append(p.pmessages * p.publishers)
        if p.cmessages:
            limits.append(p.cmessages * p.consumers)
        if p.drain:
            limits.append(held)
        total += min(limits)
    return total


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
        backlog = setup(control, p, pl)
    except (OSError, AMQPError, EOFError) as exc:
        print(f"warren perf throughput: setup failed: {exc}", file=sys.stderr)
        return 1
    # From here on Ctrl-C stops the run; the cleanup and the summary still follow.
    with Interrupts() as interrupts:
        try:
            summary, status = _orchestrate(p, pl, backlog, live, interrupts)
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
            print_summary(
                summary,
                live,
                TERMS,
                (
                    f"{format_count(summary['confirmed']):>14}"
                    f"   nacked {format_count(summary['nacked'])}"
                    if "confirmed" in summary
                    else None
                ),
                "n/a (bodies under 8 bytes carry no timestamp, or nothing consumed)",
            )
    return status


def _orchestrate(
    p: ThroughputParams, pl: Plan, backlog: list[int], live: TextIO, interrupts: Interrupts
) -> tuple[dict[str, Any], int]:
    expected = expected_total(p, pl, backlog)
    outcome = coordinate(
        Run(
            target=worker_main,
            workers=[("con", i, (p, pl, q)) for i, q in enumerate(pl.consumer_queues)]
            + [("pub", i, (p, pl, "")) for i in range(p.publishers)],
            process_name="warren-perf",
            banner=f"warren perf throughput: {p.publishers} publisher(s), "
            f"{len(pl.consumer_queues)} consumer(s), {p.size} B bodies"
            + (f", {pl.fanout} queues" if pl.fanout > 1 else "")
            + (f", backlog {format_count(sum(backlog))}" if any(backlog) else ""),
            show_acked=bool(p.confirm),
            count=p.pmessages,
            seconds=p.time,
            expected=expected,
            stall_ns=STALL_NS,
            until_expected=p.drain,
            receiver_count=p.cmessages,
        ),
        TERMS,
        live,
        interrupts,
    )
    summary = _summary(p, pl, outcome, expected)
    summary["backlog"] = sum(backlog)
    short = bool(expected and summary["consumed"] < expected)
    return summary, outcome.status(short)


def _summary(p: ThroughputParams, pl: Plan, outcome: Outcome, expected: int) -> dict[str, Any]:
    summary = summarize(outcome, TERMS)
    pubs = outcome.role("pub")
    if p.confirm:
        summary["confirmed"] = sum(s.acked for s in pubs)
        summary["nacked"] = sum(s.result["nacked"] for s in pubs if s.result)
    if expected:
        summary["expected"] = expected
    return finish_summary(summary, outcome, TERMS, asdict(p), queues=list(pl.queue_names))
