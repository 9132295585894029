"""AMQP 1.0: Warren's, against its own AMQP 0-9-1 and RabbitMQ 3.10's rabbitmq_amqp1_0
plugin, in one run, with two load generators (issue 30).

    .venv/bin/python bench/amqp1_compare.py                   # 10 s per run, 16 B and 1 KiB
    .venv/bin/python bench/amqp1_compare.py --seconds 5 --skip-rabbitmq --json

One broker at a time, fresh (bench/amqp_brokers.py): Warren from this checkout
(``python -m warren --amqp-port <port> ...``: compiled when ``make build`` has
been run in it, pure Python with WARREN_PURE_PYTHON=1; the report says which),
then a private RabbitMQ node with the rabbitmq_amqp1_0 plugin (v1 addresses
``/amq/queue/Q``; Warren takes v2's ``/queues/Q``). On each, for 16-byte and
1 KiB bodies, one sender and one receiver on one queue, at once:

* **pre-settled**: the sender's transfers are settled (fire and forget), the
  broker pre-settles its deliveries (0-9-1: no confirms, no-ack consumer);
* **unsettled**: at most 1,000 transfers await the broker's disposition, the
  receiver accepts every 100 deliveries as one range (0-9-1: confirms with
  ``-c 1000``, ``basic.ack multiple`` every 100, prefetch 1,000);

receivers grant 1,000 credit. Each AMQP 1.0 cell is measured with ``warren perf
amqp1`` and with a Qpid Proton load generator that shares no code with Warren
(bench/amqp1_proton.py, which accepts each delivery on its own in the unsettled
case); the 0-9-1 cells with ``warren perf throughput``. The number is the
receiver's msg/s over the run; the queue is declared fresh for every run.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import amqp1_proton  # noqa: E402
import amqp_brokers as brokers  # noqa: E402
import side_by_side  # noqa: E402
from side_by_side import (  # noqa: E402
    arguments,
    medians,
    perf_json,
    print_footer,
    ratio,
    size_label,
    warren_build,
)

from warren.amqp1.frames import AMQP_HEADER, SASL_HEADER, TYPE_SASL, encode_frame  # noqa: E402
from warren.amqp1.performatives import (  # noqa: E402
    Attach,
    Begin,
    Flow,
    Open,
    SaslInit,
    SaslMechanisms,
    SaslOutcome,
)
from warren.amqp1.types import Symbol  # noqa: E402
from warren.client import Client  # noqa: E402
from warren.perf.amqp1_client import (  # noqa: E402
    AMQP1Error,
    TransferTemplate,
    expect,
    read_frame,
)

QUEUE = "perf-amqp1"
SCENARIOS = ("pre-settled", "unsettled")
#: (column key, heading)
COLUMNS = [
    ("warren-1.0-perf", "Warren 1.0, perf"),
    ("warren-1.0-proton", "Warren 1.0, Proton"),
    ("warren-0-9-1-perf", "Warren 0-9-1, perf"),
    ("rabbitmq-1.0-perf", "RabbitMQ 1.0, perf"),
    ("rabbitmq-1.0-proton", "RabbitMQ 1.0, Proton"),
]


def fresh_queue(port: int) -> None:
    with Client(f"amqp://guest:guest@127.0.0.1:{port}/").connect() as c:
        c.channel_open(1)
        c.queue_delete(1, QUEUE)
        c.queue_declare(1, QUEUE)


def amqp1_perf(port: int, v1: bool, scenario: str, size: int, seconds: float) -> dict[str, Any]:
    args = ["amqp1", "--uri", f"amqp://guest:guest@127.0.0.1:{port}/", "--queue", QUEUE]
    args += ["-z", f"{seconds:g}", "-s", str(size), "-q", "1000"]
    args += ["--addresses", "v1" if v1 else "v2"]
    if scenario == "unsettled":
        args += ["-c", "1000", "-a", "100"]
    s = perf_json(args, seconds)
    cpu = s["client_cpu"]
    return {
        "rate": s["consume_rate"],
        "published": s["publish_rate"],
        "client_cpu": [*cpu["publishers"], *cpu["receivers"]],
        "p50_ms": (s["latency_ms"] or {}).get("p50"),
    }


def amqp091_perf(port: int, scenario: str, size: int, seconds: float) -> dict[str, Any]:
    args = ["throughput", "--uri", f"amqp://guest:guest@127.0.0.1:{port}/", "--queue", QUEUE]
    args += ["-z", f"{seconds:g}", "-s", str(size), "-q", "1000"]
    if scenario == "unsettled":
        args += ["-c", "1000", "-a", "100"]
    s = perf_json(args, seconds)
    cpu = s["client_cpu"]
    return {
        "rate": s["consume_rate"],
        "published": s["publish_rate"],
        "client_cpu": [*cpu["publishers"], *cpu["consumers"]],
        "p50_ms": (s["latency_ms"] or {}).get("p50"),
    }


def proton(port: int, v1: bool, scenario: str, size: int, seconds: float) -> dict[str, Any]:
    address = f"/amq/queue/{QUEUE}" if v1 else f"/queues/{QUEUE}"
    fresh_queue(port)
    brokers.log(f"proton: {address}, {scenario}, {size} B")
    r = amqp1_proton.run(
        f"amqp://guest:guest@127.0.0.1:{port}",
        address,
        address,
        seconds,
        size,
        unsettled=scenario == "unsettled",
    )
    cpu = r["client_cpu"]
    return {
        "rate": r["consume_rate"],
        "published": r["publish_rate"],
        "client_cpu": [round(cpu["sender"] or 0, 3), round(cpu["receiver"], 3)],
        "p50_ms": None,
    }


def measure(
    broker: brokers.Broker,
    key: str,
    v1: bool,
    sizes: list[int],
    seconds: float,
    versions: dict[str, str],
) -> dict[tuple[str, int, str], dict[str, Any]]:
    """Every cell of one broker: (scenario, size, column key) -> result."""
    out: dict[tuple[str, int, str], dict[str, Any]] = {}
    broker.start()
    versions.update(broker.versions())
    try:
        for size in sizes:
            for scenario in SCENARIOS:
                port = broker.port
                cells = [
                    (f"{key}-1.0-perf", amqp1_perf, (port, v1, scenario, size, seconds)),
                    (f"{key}-1.0-proton", proton, (port, v1, scenario, size, seconds)),
                ]
                if key == "warren":
                    cells.append(
                        ("warren-0-9-1-perf", amqp091_perf, (port, scenario, size, seconds))
                    )
                for column, fn, fn_args in cells:
                    fresh_queue(broker.port)
                    try:
                        out[(scenario, size, column)] = fn(*fn_args)  # type: ignore[operator]
                    except (RuntimeError, OSError) as exc:
                        brokers.log(f"{column} {scenario} {size} B failed: {exc}")
                    brokers.log(
                        f"{column} {scenario} {size} B: {out.get((scenario, size, column))}"
                    )
    finally:
        broker.stop()
    return out


class StandIn(side_by_side.StandIn):
    """A stand-in AMQP 1.0 broker for the perf client's ceiling: SASL, open, begin and
    attach answered; a sender gets 2**31 credit and everything it sends is discarded
    unread; a receiver gets an endless stream of pre-built settled 16-byte transfers
    (credit ignored). No broker is faster."""

    def __init__(self) -> None:
        super().__init__()
        self.block = TransferTemplate(16, settled=True).pack(0, 65536 // 40)
        self.start()

    def _serve(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError, AMQP1Error), conn:
            _, buf = read_frame(conn, b"")  # the SASL header
            mechs = SaslMechanisms(sasl_server_mechanisms=(Symbol("PLAIN"), Symbol("ANONYMOUS")))
            conn.sendall(SASL_HEADER + encode_frame(0, mechs, type=TYPE_SASL))
            _, buf = expect(conn, buf, SaslInit)
            conn.sendall(encode_frame(0, SaslOutcome(code=0), type=TYPE_SASL))
            _, buf = read_frame(conn, buf)  # the AMQP header
            _, buf = expect(conn, buf, Open)
            _, buf = expect(conn, buf, Begin)
            attach, buf = expect(conn, buf, Attach)
            reply = Attach(
                name=attach.name,
                handle=0,
                role=not attach.role,
                source=attach.source,
                target=attach.target,
                initial_delivery_count=0,
            )
            window = 1 << 31
            conn.sendall(
                AMQP_HEADER
                + encode_frame(0, Open(container_id="stand-in"))
                + encode_frame(
                    0,
                    Begin(
                        remote_channel=0,
                        next_outgoing_id=0,
                        incoming_window=window,
                        outgoing_window=window,
                    ),
                )
                + encode_frame(0, reply)
            )
            if attach.role:  # a receiver: stream
                while True:
                    conn.sendall(self.block)
            conn.sendall(
                encode_frame(
                    0,
                    Flow(
                        next_incoming_id=0,
                        incoming_window=window,
                        next_outgoing_id=0,
                        outgoing_window=window,
                        handle=0,
                        delivery_count=0,
                        link_credit=window,
                    ),
                )
            )
            while conn.recv(1 << 20):  # a sender: discard
                pass


def ceiling(seconds: float) -> list[tuple[str, dict[str, Any]]]:
    """`warren perf amqp1` against the stand-in: a sender alone, a receiver alone."""
    stand_in = StandIn()
    uri = f"amqp://guest:guest@127.0.0.1:{stand_in.port}/"
    base = ["amqp1", "--uri", uri, "--no-declare", "-z", f"{seconds:g}", "-s", "16"]
    try:
        return [
            ("sender → stand-in sink", perf_json([*base, "-y", "0"], seconds)),
            ("receiver ← stand-in source", perf_json([*base, "-x", "0"], seconds)),
        ]
    finally:
        stand_in.close()


def report(results: dict[tuple[str, int, str], dict[str, Any]], sizes: list[int]) -> str:
    shown = [(k, h) for k, h in COLUMNS if any(c == k for _, _, c in results)]
    lines = [
        "| Scenario | "
        + " | ".join(h for _, h in shown)
        + " | W 1.0 / W 0-9-1 | W 1.0 / R 1.0 (perf) | W 1.0 / R 1.0 (Proton) |",
        "|---|" + "---:|" * (len(shown) + 3),
    ]
    for size in sizes:
        for scenario in SCENARIOS:
            row = {k: results.get((scenario, size, k)) for k, _ in COLUMNS}
            cells = [f"{row[k]['rate']:,.0f}" if row[k] else "-" for k, _ in shown]
            cells += [
                ratio(row["warren-1.0-perf"], row["warren-0-9-1-perf"]),
                ratio(row["warren-1.0-perf"], row["rabbitmq-1.0-perf"]),
                ratio(row["warren-1.0-proton"], row["rabbitmq-1.0-proton"]),
            ]
            lines.append(f"| {scenario}, {size_label(size)} | " + " | ".join(cells) + " |")
    lines += _table(
        "Published msg/s (above the received rate: a backlog grew in the queue):",
        results,
        sizes,
        shown,
        lambda r: f"{r['published']:,.0f}",
    )
    lines += _table(
        "Load generators' CPU (sender / receiver, share of one core over the run):",
        results,
        sizes,
        shown,
        lambda r: " / ".join(f"{c:.0%}" for c in r["client_cpu"]),
    )
    return "\n".join(lines)


def _table(
    title: str,
    results: dict[tuple[str, int, str], dict[str, Any]],
    sizes: list[int],
    shown: list[tuple[str, str]],
    cell: Callable[[dict[str, Any]], str],
) -> list[str]:
    lines = ["", title, "", "| Scenario | " + " | ".join(h for _, h in shown) + " |"]
    lines.append("|---|" + "---:|" * len(shown))
    for size in sizes:
        for scenario in SCENARIOS:
            cells = []
            for k, _ in shown:
                r = results.get((scenario, size, k))
                cells.append(cell(r) if r else "-")
            lines.append(f"| {scenario}, {size_label(size)} | " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    args, sizes = arguments(__doc__, "amqp1", "run Warren and perf", argv)
    if args.only_ceiling:
        print_ceiling(args.seconds)
        return 0
    load_start = os.getloadavg()
    t0 = time.monotonic()
    rounds: list[dict[tuple[str, int, str], dict[str, Any]]] = []
    rabbit = None if args.skip_rabbitmq else brokers.RabbitMQ(plugins=["rabbitmq_amqp1_0"])
    versions: dict[str, str] = {"Warren": warren_build()}
    for _ in range(args.runs):
        got = measure(brokers.Warren(0), "warren", False, sizes, args.seconds, versions)
        if rabbit is not None:
            got.update(measure(rabbit, "rabbitmq", True, sizes, args.seconds, versions))
        rounds.append(got)
    results = medians(rounds, ("rate", "published"))
    if args.json:
        for i, got in enumerate(rounds):
            for (scenario, size, column), r in sorted(got.items()):
                cell = {"round": i + 1, "scenario": scenario, "size": size, "column": column}
                print(json.dumps({**cell, **r}))
    print()
    print(
        f"AMQP 1.0 and 0-9-1, 1 sender + 1 receiver on one queue, {args.seconds:g} s per run, "
        f"median of {args.runs}; received msg/s"
    )
    print()
    print(report(results, sizes))
    print()
    print_footer(versions, load_start, t0)
    if args.ceiling:
        print_ceiling(args.seconds)
    return 0


def print_ceiling(seconds: float) -> None:
    print("\n| `warren perf amqp1`'s ceiling (pre-settled, 16 B) | msg/s | client CPU |")
    print("|---|---:|---:|")
    for label, s in ceiling(seconds):
        rate = s["publish_rate"] if "sender" in label else s["consume_rate"]
        cpu = s["client_cpu"]["publishers"] + s["client_cpu"]["receivers"]
        print(f"| {label} | {rate:,.0f} | {cpu[0]:.0%} |")


if __name__ == "__main__":
    sys.exit(main())
