"""``warren perf mqtt``: MQTT publishers and subscribers in their own processes.

A load generator for any MQTT 3.1.1 / 5 broker (Warren, mosquitto, ...), built
like ``warren perf throughput``: the parent starts one OS process per publisher
and per subscriber (multiprocessing, 'spawn'), waits until all are connected
(subscribers: SUBACK received), sends them the common start time and then only
collects the counts each worker reports once a second over its pipe
(:mod:`warren.perf.coordinator`). The workers are in
:mod:`warren.perf.mqtt_workers`, connection setup in :mod:`warren.perf.mqtt_client`.
"""

from __future__ import annotations

import os
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
from warren.perf.mqtt_client import (
    MAX_INFLIGHT,
    MQTTError,
    MQTTTarget,
    connect,
    parse_uri,
)
from warren.perf.mqtt_workers import worker_main
from warren.perf.report import format_count
from warren.perf.workers import NS

__all__ = [
    "DEFAULT_INFLIGHT",
    "MQTTError",
    "MQTTParams",
    "connect",
    "measure",
    "parse_uri",
    "print_summary",
    "run",
    "worker_main",
]

#: Default QoS 1/2 window of a publisher (like ``perf throughput -c 1000``); MQTT 5
#: brokers may announce a lower Receive Maximum in CONNACK, which then wins.
DEFAULT_INFLIGHT = 1024
#: In --count mode: give up waiting for missing messages after this long without progress.
STALL_NS = 5 * NS

TERMS = Terms(
    command="warren perf mqtt",
    receiver_role="sub",
    received="received",
    receive_rate="receive_rate",
    receivers="subscribers",
    acked="acked",
)


@dataclass(frozen=True)
class MQTTParams(MQTTTarget):
    """Everything a run needs; also what ``--json`` prints as ``params`` (password masked)."""

    qos: int = 0
    publishers: int = 1
    subscribers: int = 1
    size: int = 16
    topic: str = "perf/test"
    time: float = 0.0
    count: int = 0
    rate: int = 0
    inflight: int = DEFAULT_INFLIGHT
    clean_session: bool = True
    latency: bool = False
    keepalive: int = 0
    #: Prefix of the client ids; the parent adds its pid so concurrent runs do not collide.
    client_id: str = "warren-perf"

    def check(self) -> str | None:
        """Why these parameters cannot run, or None."""
        if self.protocol not in (4, 5):
            return "--protocol must be 4 (MQTT 3.1.1) or 5"
        if self.qos not in (0, 1, 2):
            return "--qos must be 0, 1 or 2"
        if self.latency and self.size < 8:
            return "--latency needs --size of at least 8 (the timestamp)"
        if not self.topic or "+" in self.topic or "#" in self.topic:
            return "--topic must be a non-empty topic name without wildcards"
        if self.publishers == 0 and self.subscribers == 0:
            return "nothing to do with --publishers 0 --subscribers 0"
        if self.qos and not 0 < self.inflight <= MAX_INFLIGHT:
            return f"--inflight must be 1..{MAX_INFLIGHT}"
        return None


def run(p: MQTTParams, out: TextIO | None = None, as_json: bool = False) -> int:
    """Run the load; prints live lines to ``out`` and the summary. Returns the exit status."""
    return run_reported(lambda live, ints: measure(p, live, ints), print_summary, out, as_json)


def measure(
    p: MQTTParams, live: TextIO | None = None, interrupts: Interrupts | None = None
) -> tuple[dict[str, Any], int]:
    """Run the load (the in-process API); returns the summary and the exit status."""
    problem = p.check()
    if problem:
        return {"errors": [problem], "params": _public(p)}, 2
    if p.client_id == MQTTParams.client_id:
        p = replace(p, client_id=f"warren-perf-{os.getpid()}")
    expected = p.count * p.publishers * p.subscribers
    outcome = coordinate(
        Run(
            target=worker_main,
            workers=[("sub", i, (p,)) for i in range(p.subscribers)]
            + [("pub", i, (p,)) for i in range(p.publishers)],
            process_name="warren-perf-mqtt",
            banner=f"warren perf mqtt: {p.host}:{p.port} MQTT {'5' if p.protocol == 5 else '3.1.1'}"
            f", QoS {p.qos}, {p.publishers} publisher(s), {p.subscribers} subscriber(s)"
            f", {p.size} B payloads, topic {p.topic}",
            show_acked=bool(p.qos),
            count=p.count,
            seconds=p.time,
            expected=expected,
            stall_ns=STALL_NS,
            stall_is_error=bool(p.qos),
            stall_counts_publishers=True,
        ),
        TERMS,
        live,
        interrupts,
    )
    summary = _summary(p, outcome, expected)
    short = bool(p.qos and p.count and p.subscribers and summary["received"] < expected)
    return summary, outcome.status(short)


def _public(p: MQTTParams) -> dict[str, Any]:
    params = asdict(p)
    if params["password"] is not None:
        params["password"] = "***"
    return params


def _summary(p: MQTTParams, outcome: Outcome, expected: int) -> dict[str, Any]:
    summary = summarize(outcome, TERMS)
    pubs = outcome.role("pub")
    if p.qos:
        summary["acked"] = sum(s.acked for s in pubs)
        summary["rejected"] = sum(s.result["rejected"] for s in pubs if s.result)
        windows = [s.result["window"] for s in pubs if s.result]
        summary["inflight"] = min(windows) if windows else None
        rms = [s.result["receive_maximum"] for s in pubs if s.result]
        summary["receive_maximum"] = rms[0] if rms else None
    if p.count:
        summary["expected"] = expected * (1 if p.subscribers else 0)
    return finish_summary(summary, outcome, TERMS, _public(p))


def print_summary(s: dict[str, Any], out: TextIO) -> None:
    acked = None
    if "acked" in s:
        acked = (
            f"{format_count(s['acked']):>14}   rejected {format_count(s['rejected'])}"
            f", in flight at most {s['inflight']}"
            + (
                f" (broker's Receive Maximum {s['receive_maximum']})"
                if s["receive_maximum"] is not None
                else ""
            )
        )
    _print_summary(s, out, TERMS, acked, "n/a (run with --latency)")
