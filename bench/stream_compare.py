"""The stream protocol: Warren's ``[stream]`` listener against RabbitMQ 3.10's
rabbitmq_stream plugin, in one run, with two load generators (issue 31).

    .venv/bin/python bench/stream_compare.py                  # 10 s per run, 16 B and 1 KiB
    .venv/bin/python bench/stream_compare.py --seconds 5 --skip-rabbitmq --json
    .venv/bin/python bench/stream_compare.py --only-ceiling   # perf against a stand-in broker

One broker at a time, fresh (bench/amqp_brokers.py): Warren (``python -m warren
--stream-port <port> ...`` from ``--warren-src``, default this checkout: compiled
when ``make build`` has been run in it; the report says which), then a private
RabbitMQ node with the rabbitmq_stream plugin. On each, for 16-byte and 1 KiB
bodies, one producer and one consumer on one stream, at once: the producer
publishes with confirms, at most 10,000 unconfirmed, 100 messages to a Publish
frame; the consumer subscribes from ``next`` with 10 chunks of credit and
grants one back per chunk. Each cell is measured with ``warren perf stream``
(run from this checkout) and with two clients that share no code with Warren:
rstream (bench/stream_rstream.py) and rbfly (bench/stream_rbfly.py, its own
batching: 10,000 messages flushed and confirmed at a time). The number is the consumer's msg/s over the
run; the stream is created fresh for every run. The broker's CPU (utime +
stime from /proc) over each run, per published message, is reported beside it.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "src"))

import amqp_brokers as brokers  # noqa: E402
import side_by_side  # noqa: E402
import stream_rbfly  # noqa: E402
import stream_rstream  # noqa: E402
from side_by_side import arguments, medians, print_footer, ratio, size_label, warren_build  # noqa: E402

from warren.perf.stream_client import StreamURI, connect, walk_frames  # noqa: E402
from warren.stream_protocol.chunk import build_chunk, simple_entry  # noqa: E402
from warren.stream_protocol.commands import (  # noqa: E402
    CloseResponse,
    CreateResponse,
    DeclarePublisherResponse,
    DeleteResponse,
    OpenResponse,
    PeerPropertiesResponse,
    SaslAuthenticateResponse,
    SaslHandshakeResponse,
    SubscribeResponse,
    Tune,
)
from warren.stream_protocol.constants import Key  # noqa: E402
from warren.stream_protocol.frames import decode_frame  # noqa: E402
from warren.stream_protocol.publish import Deliver  # noqa: E402

STREAM = "perf-stream-compare"
#: (column key, heading)
COLUMNS = [
    ("warren-perf", "Warren, perf"),
    ("warren-rstream", "Warren, rstream"),
    ("warren-rbfly", "Warren, rbfly"),
    ("rabbitmq-perf", "RabbitMQ, perf"),
    ("rabbitmq-rstream", "RabbitMQ, rstream"),
    ("rabbitmq-rbfly", "RabbitMQ, rbfly"),
]
GENERATORS = ("perf", "rstream", "rbfly")
_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int | None) -> float:
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def perf_env() -> dict[str, str]:
    """`warren perf stream` always runs from this checkout (the broker may not)."""
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    return env


class WarrenStream(brokers.Warren):
    """Warren with its stream listener on a port of its own."""

    def __init__(self) -> None:
        super().__init__(0)
        self.stream_port = 0

    def command(self, tmp: Path) -> list[str]:
        self.stream_port = brokers.free_port()
        return [*super().command(tmp), "--stream-port", str(self.stream_port)]

    def env(self) -> dict[str, str] | None:
        return dict(brokers.perf_env(), PYTHONDONTWRITEBYTECODE="1")

    def start(self) -> None:
        super().start()
        deadline = time.monotonic() + 30
        while not brokers.port_open(self.stream_port):
            if time.monotonic() > deadline:
                raise RuntimeError("Warren's stream listener did not open")
            time.sleep(0.2)


class RabbitMQStream(brokers.RabbitMQ):
    def __init__(self) -> None:
        self.stream_port = brokers.free_port()
        super().__init__(
            plugins=["rabbitmq_stream"],
            config=f"stream.listeners.tcp.1 = 127.0.0.1:{self.stream_port}\n"
            "stream.advertised_host = 127.0.0.1\n"
            f"stream.advertised_port = {self.stream_port}\n",
        )


def uri(port: int) -> str:
    return f"rabbitmq-stream://guest:guest@127.0.0.1:{port}/%2F"


def fresh_stream(port: int) -> None:
    conn = connect(StreamURI.parse(uri(port)), "bench-setup")
    try:
        if not conn.create(STREAM):
            conn.delete(STREAM)
            conn.create(STREAM)
    finally:
        conn.close()


def drop_stream(port: int) -> None:
    with contextlib.suppress(Exception):
        conn = connect(StreamURI.parse(uri(port)), "bench-cleanup")
        try:
            conn.delete(STREAM)
        finally:
            conn.close()


def perf_json(args: list[str], seconds: float) -> dict[str, Any]:
    return side_by_side.perf_json(args, seconds, perf_env())


def perf(port: int, size: int, seconds: float) -> dict[str, Any]:
    args = ["stream", "--uri", uri(port), "--stream", STREAM, "-z", f"{seconds:g}"]
    args += ["-s", str(size), "-c", "10000", "-b", "100", "-q", "10"]
    s = perf_json(args, seconds)
    cpu = s["client_cpu"]
    return {
        "rate": s["consume_rate"],
        "published": s["publish_rate"],
        "confirmed": s["confirmed"],
        "count": s["published"],
        "client_cpu": [*cpu["publishers"], *cpu["consumers"]],
        "p50_ms": (s["latency_ms"] or {}).get("p50"),
        "records_per_chunk": s["records_per_chunk"],
    }


def rstream(port: int, size: int, seconds: float) -> dict[str, Any]:
    brokers.log(f"rstream: {STREAM}, {size} B")
    return _client(stream_rstream.run("127.0.0.1", port, STREAM, seconds, size), seconds)


def rbfly(port: int, size: int, seconds: float) -> dict[str, Any]:
    brokers.log(f"rbfly: {STREAM}, {size} B")
    return _client(stream_rbfly.run("127.0.0.1", port, STREAM, seconds, size), seconds)


def _client(r: dict[str, Any], seconds: float) -> dict[str, Any]:
    """A cell from the result of stream_rstream.run or stream_rbfly.run."""
    cpu = r["client_cpu"]
    return {
        "rate": r["consume_rate"],
        "published": r["publish_rate"],
        "confirmed": r["confirmed"],
        "count": round(r["publish_rate"] * seconds),
        "client_cpu": [cpu["producer"], cpu["consumer"]],
        "p50_ms": None,
    }


def measure(
    broker: Any, key: str, sizes: list[int], seconds: float, versions: dict[str, str]
) -> dict[tuple[int, str], dict[str, Any]]:
    """Every cell of one broker: (size, column key) -> result."""
    out: dict[tuple[int, str], dict[str, Any]] = {}
    broker.start()
    versions.update(broker.versions())
    try:
        for size in sizes:
            for column, fn in (
                (f"{key}-perf", perf),
                (f"{key}-rstream", rstream),
                (f"{key}-rbfly", rbfly),
            ):
                fresh_stream(broker.stream_port)
                cpu0 = cpu_seconds(broker.pid)
                try:
                    r = fn(broker.stream_port, size, seconds)
                except (RuntimeError, OSError) as exc:
                    brokers.log(f"{column} {size} B failed: {exc}")
                    continue
                finally:
                    drop_stream(broker.stream_port)
                cpu = cpu_seconds(broker.pid) - cpu0
                r["broker_us"] = round(cpu * 1e6 / r["count"], 2) if r["count"] else None
                r["broker_cpu"] = round(cpu / seconds, 2)
                out[(size, column)] = r
                brokers.log(f"{column} {size} B: {r}")
    finally:
        broker.stop()
    return out


# -- the client's ceiling ------------------------------------------------------------------------


class StandIn(side_by_side.StandIn):
    """A stand-in stream broker for the perf client's ceiling: the handshake and the
    commands perf sends are answered; every Publish is confirmed at once (the ids
    not read: zeros, perf counts them); a subscription gets an endless stream of
    pre-built chunks of 100 16-byte records (credit ignored). No broker is faster."""

    def __init__(self) -> None:
        super().__init__()
        records = [simple_entry(b"\x00\x53\x75\xa0\x10" + bytes(16)) for _ in range(100)]
        chunk = build_chunk(records, first_offset=0, timestamp=0).delivered()
        frame = Deliver(0, chunk).encode()
        self.block = frame * max(1, 65536 // len(frame))
        self.start()

    def _serve(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError), conn:
            buf = b""
            while True:
                data = conn.recv(1 << 20)
                if not data:
                    return
                buf += data
                out: list[bytes] = []
                used = 0
                for start, end, key in walk_frames(buf):
                    used = end
                    if key == Key.PUBLISH:
                        pid, count = buf[start + 4], int.from_bytes(buf[start + 5 : start + 9])
                        size = 9 + 8 * count
                        out.append(
                            size.to_bytes(4)
                            + b"\x00\x03\x00\x01"
                            + bytes((pid,))
                            + count.to_bytes(4)
                            + bytes(8 * count)
                        )
                        continue
                    command = decode_frame(buf[start:end])
                    out.append(self._answer(command))
                    if type(command).__name__ == "Subscribe":
                        conn.sendall(b"".join(out))
                        while True:
                            conn.sendall(self.block)
                buf = buf[used:]
                if out:
                    conn.sendall(b"".join(out))

    def _answer(self, command: Any) -> bytes:
        corr = getattr(command, "correlation_id", 0)
        name = type(command).__name__
        if name == "PeerProperties":
            return PeerPropertiesResponse(corr, 1, {}).encode()
        if name == "SaslHandshake":
            return SaslHandshakeResponse(corr, 1, ["PLAIN"]).encode()
        if name == "SaslAuthenticate":
            return SaslAuthenticateResponse(corr).encode() + Tune(1 << 20, 0).encode()
        if name == "Open":
            return OpenResponse(corr).encode()
        if name == "Create":
            return CreateResponse(corr).encode()
        if name == "Delete":
            return DeleteResponse(corr).encode()
        if name == "DeclarePublisher":
            return DeclarePublisherResponse(corr).encode()
        if name == "Subscribe":
            return SubscribeResponse(corr).encode()
        if name == "Close":
            return CloseResponse(corr).encode()
        return b""  # TuneResponse, Heartbeat, Credit


def ceiling(seconds: float) -> list[tuple[str, dict[str, Any]]]:
    """`warren perf stream` against the stand-in: producers alone, a consumer alone."""
    stand_in = StandIn()
    base = ["stream", "--uri", uri(stand_in.port), "-z", f"{seconds:g}", "-s", "16"]
    try:
        return [
            ("1 producer → stand-in", perf_json([*base, "-y", "0"], seconds)),
            ("3 producers → stand-in", perf_json([*base, "-y", "0", "-x", "3"], seconds)),
            ("1 consumer ← stand-in", perf_json([*base, "-x", "0"], seconds)),
        ]
    finally:
        stand_in.close()


def print_ceiling(seconds: float) -> None:
    print("\n| `warren perf stream`'s ceiling (16 B) | msg/s | client CPU |")
    print("|---|---:|---:|")
    for label, s in ceiling(seconds):
        rate = s["consume_rate"] if "consumer" in label else s["publish_rate"]
        cpu = s["client_cpu"]["publishers"] + s["client_cpu"]["consumers"]
        print(f"| {label} | {rate:,.0f} | {' '.join(f'{c:.0%}' for c in cpu)} |")


# -- the report ----------------------------------------------------------------------------------


def report(results: dict[tuple[int, str], dict[str, Any]], sizes: list[int]) -> str:
    shown = [(k, h) for k, h in COLUMNS if any(c == k for _, c in results)]
    head = "| Body | " + " | ".join(h for _, h in shown)
    lines = [
        head + "".join(f" | W / R ({g})" for g in GENERATORS) + " |",
        "|---|" + "---:|" * (len(shown) + len(GENERATORS)),
    ]
    for size in sizes:
        row = {k: results.get((size, k)) for k, _ in COLUMNS}
        cells = [f"{row[k]['rate']:,.0f}" if row[k] else "-" for k, _ in shown]
        cells += [ratio(row[f"warren-{g}"], row[f"rabbitmq-{g}"]) for g in GENERATORS]
        lines.append(f"| {size_label(size)} | " + " | ".join(cells) + " |")
    tables = [
        ("Published msg/s (above the consumed rate: the consumer fell behind):", "published"),
        ("Broker CPU per published message (µs; the broker's utime + stime over the run):", "us"),
        ("Broker CPU (share of one core over the run):", "cpu"),
        ("Load generators' CPU (producer / consumer, share of one core):", "client"),
        ("Records per delivered chunk (perf):", "chunk"),
    ]
    for title, what in tables:
        lines += ["", title, "", head + " |", "|---|" + "---:|" * len(shown)]
        for size in sizes:
            cells = []
            for k, _ in shown:
                r = results.get((size, k))
                cells.append(_cell(r, what) if r else "-")
            lines.append(f"| {size_label(size)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(r: dict[str, Any], what: str) -> str:
    if what == "published":
        return f"{r['published']:,.0f}"
    if what == "us":
        return f"{r['broker_us']:.2f}" if r["broker_us"] is not None else "-"
    if what == "cpu":
        return f"{r['broker_cpu']:.0%}"
    if what == "client":
        return " / ".join(f"{c:.0%}" for c in r["client_cpu"])
    value = r.get("records_per_chunk")
    return f"{value:,.1f}" if value else "-"


def main(argv: list[str] | None = None) -> int:
    args, sizes = arguments(__doc__, "stream", "run the Warren broker", argv)
    if args.only_ceiling:
        print_ceiling(args.seconds)
        return 0
    load_start = os.getloadavg()
    t0 = time.monotonic()
    rounds: list[dict[tuple[int, str], dict[str, Any]]] = []
    versions: dict[str, str] = {"Warren": warren_build()}
    for _ in range(args.runs):
        got = measure(WarrenStream(), "warren", sizes, args.seconds, versions)
        if not args.skip_rabbitmq:
            got.update(measure(RabbitMQStream(), "rabbitmq", sizes, args.seconds, versions))
        rounds.append(got)
    results = medians(rounds)
    if args.json:
        for i, got in enumerate(rounds):
            for (size, column), r in sorted(got.items()):
                print(json.dumps({"round": i + 1, "size": size, "column": column, **r}))
    print()
    print(
        f"Stream protocol, 1 producer (confirms, window 10,000, 100 per Publish) + 1 consumer "
        f"(from next, credit 10) on one stream, {args.seconds:g} s per run, median of "
        f"{args.runs}; consumed msg/s"
    )
    print()
    print(report(results, sizes))
    print()
    print_footer(versions, load_start, t0)
    if args.ceiling:
        print_ceiling(args.seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
