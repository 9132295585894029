"""basic.nack and basic.reject from a backlog: how fast a consumer that gives
every message back drains a queue.

    .venv/bin/python bench/nack_bench.py                    # a Warren from this checkout
    .venv/bin/python bench/nack_bench.py --only dlx --messages 200000 --runs 3
    .venv/bin/python bench/nack_bench.py --port 5672        # a broker already running

Scenarios, each on a fresh queue of --messages 16-byte messages (published
first), one consumer with prefetch --prefetch:

- ``dlx``: basic.nack multiple=true requeue=false every 100 deliveries, the
  queue dead-lettering to a second queue; the rate is messages over the time
  from basic.consume until the dead-letter queue holds them all;
- ``drop``: the same without a dead-letter exchange (the messages are dropped);
- ``reject``: basic.reject requeue=false for every delivery, frames in a row;
- ``requeue``: basic.nack multiple=true requeue=true of the whole prefetch
  window each time it is full: the same messages go round again; the rate is
  deliveries (--messages of them) over the time they took;
- ``close``: a consumer without a prefetch limit takes the whole backlog
  unacked and closes its connection: every message goes back to the queue
  (read back from the store); the rate and the CPU are the messages over the
  close alone (connection.close until close-ok).

The client is bench/raw_amqp.py (plain sockets), which counts deliveries by
their frames' bytes. Prints one JSON line per run: msg/s and the broker's CPU
per message (for a broker started here, from /proc).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import sys
import time
from pathlib import Path
from typing import Any

import raw_amqp as raw  # bench/raw_amqp.py
from amqp_brokers import Warren

QUEUE = "nack-bench"
DLQ = "nack-bench-dlq"
BODY = 16
SCENARIOS = ("dlx", "drop", "reject", "requeue", "close")
_TAG = struct.Struct(">QB")


def nack_frame(tag: int, multiple: bool, requeue: bool) -> bytes:
    return raw.method(1, 60, 120, _TAG.pack(tag, (1 if multiple else 0) | (2 if requeue else 0)))


def rejects(first: int, last: int) -> bytes:
    """basic.reject requeue=false of every tag in first..last, as one buffer."""
    return b"".join(raw.method(1, 60, 90, _TAG.pack(t, 0)) for t in range(first, last + 1))


def _cpu_ticks(pid: int | None) -> int:
    if pid is None:
        return 0
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def _prepare(port: int, scenario: str) -> None:
    c = raw.Conn.open(port)
    c.delete(QUEUE)
    c.delete(DLQ)
    args: dict[str, str | int] = {}
    if scenario == "dlx":
        c.declare(DLQ)
        args = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": DLQ}
    c.declare(QUEUE, False, args)
    c.close()


def _consume(port: int, scenario: str, n: int, prefetch: int) -> float:
    """Give ``n`` deliveries back as the scenario says; seconds it took (for
    dlx: until the dead-letter queue holds them)."""
    c = raw.Conn.open(port)
    c.sock.settimeout(120)
    started = time.perf_counter()
    raw.start_consume(c, QUEUE, raw.MULTIPLE, prefetch)
    counter = raw.Counter(raw.deliver_marker("c1", QUEUE), c.buf)
    c.buf = b""
    settled = 0
    recv = c.sock.recv
    while True:
        got = counter.got
        if scenario == "requeue":
            if got - settled >= prefetch or got >= n > settled:
                c.send(nack_frame(got, True, True))
                settled = got
        elif scenario == "reject":
            if got > settled:
                c.send(rejects(settled + 1, got))
                settled = got
        else:
            upto = got if got >= n else got - got % 100
            if upto > settled:
                c.send(
                    b"".join(nack_frame(t, True, False) for t in range(settled + 100, upto, 100))
                    + nack_frame(upto, True, False)
                )
                settled = upto
        if got >= n:
            break
        data = recv(1 << 20)
        if not data:
            raise raw.Closed("the broker closed the connection")
        counter.feed(data)
    if scenario == "dlx":
        raw.wait_depth(port, DLQ, n)
    else:
        # A round trip: every nack sent before it has been handled.
        c.depth(QUEUE)
    seconds = time.perf_counter() - started
    c.close()
    return seconds


def _close(port: int, pid: int | None, n: int) -> tuple[float, int]:
    """Take all ``n`` messages unacked, then close the connection: the seconds
    the close took and the broker's CPU ticks over it."""
    c = raw.Conn.open(port)
    c.sock.settimeout(120)
    raw.start_consume(c, QUEUE, raw.MULTIPLE, 0)
    counter = raw.Counter(raw.deliver_marker("c1", QUEUE), c.buf)
    c.buf = b""
    while counter.got < n:
        data = c.sock.recv(1 << 20)
        if not data:
            raise raw.Closed("the broker closed the connection")
        counter.feed(data)
    cpu0 = _cpu_ticks(pid)
    started = time.perf_counter()
    c.close()  # close-ok comes once every delivery is back in the queue
    seconds = time.perf_counter() - started
    ticks = _cpu_ticks(pid) - cpu0
    raw.wait_depth(port, QUEUE, n)
    return seconds, ticks


def run(port: int, pid: int | None, scenario: str, n: int, prefetch: int) -> dict[str, Any]:
    _prepare(port, scenario)
    raw.fill(port, QUEUE, prefetch if scenario == "requeue" else n, BODY, False)
    if scenario == "close":
        seconds, ticks = _close(port, pid, n)
    else:
        cpu0 = _cpu_ticks(pid)
        seconds = _consume(port, scenario, n, prefetch)
        ticks = _cpu_ticks(pid) - cpu0
    cpu = ticks / os.sysconf("SC_CLK_TCK")
    return {
        "scenario": scenario,
        "messages": n,
        "seconds": round(seconds, 3),
        "rate": round(n / seconds),
        "broker_us_per_msg": round(cpu / n * 1e6, 2) if pid is not None else None,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", choices=SCENARIOS, action="append")
    p.add_argument("--messages", type=int, default=200_000)
    p.add_argument("--prefetch", type=int, default=1000)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--port", type=int, help="a broker already running (else one is started)")
    args = p.parse_args(argv)
    broker = None
    port, pid = args.port, None
    if port is None:
        broker = Warren(0)
        broker.start()
        port, pid = broker.port, broker.pid
    try:
        for scenario in args.only or SCENARIOS:
            rates = []
            for _ in range(args.runs):
                result = run(port, pid, scenario, args.messages, args.prefetch)
                rates.append(result["rate"])
                print(json.dumps(result), flush=True)
            print(
                json.dumps({"scenario": scenario, "median_rate": round(statistics.median(rates))}),
                flush=True,
            )
    finally:
        if broker is not None:
            broker.stop()
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
