"""A classic queue's backlog drained by raw-socket AMQP clients that share no code with Warren.

    .venv/bin/python bench/queue_backlog.py                        # a Warren from this checkout
    .venv/bin/python bench/queue_backlog.py --src /other/checkout/src --only noack
    .venv/bin/python bench/queue_backlog.py --url amqp://guest:guest@127.0.0.1:5672/

Scenarios (issue 27), each on a fresh durable queue of --size-byte messages:

- ``noack``, ``single``, ``multi``: --messages are published first (confirms),
  then one consumer drains them: no-ack, one basic.ack per delivery, or a
  multiple ack every 100, with prefetch --prefetch;
- ``ahead``, ``ahead1``: one publisher (no confirms) and one consumer (prefetch
  --prefetch; a multiple ack every 100, or single acks) at once, in processes of
  their own; the publisher runs ahead, so the consumer drains a backlog.
  Reported: messages over the time from the first publish to the last
  delivery.

The clients speak AMQP 0-9-1 with socket and struct only (bench/raw_amqp.py's
encoder and connection): a consumer counts deliveries by their method frames'
bytes (every delivery has the same size here) and acks by tag, which the broker
numbers from 1 on the fresh channel, so a pattern of Warren's own client cannot
flatter the numbers, nor can the client's own parsing limit them. Per run:
msg/s, the broker's CPU per message and its anonymous RAM after the fill and
after the drain (from /proc, for a broker started here).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import statistics
import struct
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from raw_amqp import (  # noqa: E402  bench/raw_amqp.py: the shared raw-socket client
    FRAME,
    Conn,
    ack_frame,
    method,
    publish_bytes,
    publish_confirmed,
    shortstr,
    single_acks,
    table,
)
from stream_backlog import broker, cpu_seconds  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
QUEUE = "backlog"
SCENARIOS = ("noack", "single", "multi", "ahead", "ahead1")
def fresh_queue(raw: Conn) -> None:
    raw.delete(QUEUE)
    raw.declare(QUEUE, durable=True)


def consume(host: str, port: int, count: int, prefetch: int, mode: str) -> tuple[float, float]:
    """Consume ``count`` deliveries (mode: noack, single or multi); returns the
    times of the consume-ok and of the last delivery (perf_counter)."""
    raw = Conn.open(port, host)
    raw.sock.sendall(method(1, 60, 10, struct.pack(">IHB", 0, prefetch, 0)))
    raw.expect(60, 11)
    no_ack = 2 if mode == "noack" else 0
    raw.sock.sendall(
        method(1, 60, 20, b"\x00\x00" + shortstr(QUEUE) + shortstr("") + bytes((no_ack,)) + table({}))
    )  # fmt: skip
    ctag = raw.expect(60, 21)[1:]
    started = time.perf_counter()
    size = 4 + 1 + len(ctag) + 8 + 1 + 1 + 1 + len(QUEUE)  # basic.deliver's payload
    marker = FRAME.pack(1, 1, size) + b"\x00\x3c\x00\x3c"
    sock = raw.sock
    acked = 0
    tail = raw.buf[-10:]
    got = raw.buf.count(marker)  # deliveries read with the consume-ok
    while True:
        if mode == "single":
            if got > acked:
                sock.sendall(single_acks(acked + 1, got))
                acked = got
        elif mode == "multi" and got - acked >= 100:
            acked = got - got % 100
            sock.sendall(ack_frame(acked, True))
        if got >= count:
            break
        data = sock.recv(1 << 22)
        if not data:
            raise EOFError("the broker closed the connection")
        got += data.count(marker) + (tail + data[:10]).count(marker)
        tail = data[-10:]
    ended = time.perf_counter()
    if got != count:
        raise RuntimeError(f"{got} deliveries, expected {count}")
    if mode != "noack" and acked < got:
        sock.sendall(ack_frame(got, True))
    sock.close()  # the consumer and its channel go with the connection
    return started, ended


def _consumer_proc(host: str, port: int, count: int, prefetch: int, mode: str, out: object) -> None:
    started, ended = consume(host, port, count, prefetch, mode)
    out.send((started, ended))  # type: ignore[attr-defined]


def ahead(host: str, port: int, count: int, size: int, prefetch: int, mode: str) -> float:
    """A publisher and a consumer at once; msg/s from the first publish to the last delivery."""
    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(False)
    consumer = ctx.Process(target=_consumer_proc, args=(host, port, count, prefetch, mode, send))
    consumer.start()
    # The consumer is subscribed once the queue has a consumer: poll with passive declares.
    raw = Conn.open(port, host)
    while True:
        raw.sock.sendall(method(1, 50, 10, b"\x00\x00" + shortstr(QUEUE) + b"\x01" + table({})))
        args = raw.expect(50, 11)
        name_len = args[0]
        consumers = struct.unpack_from(">II", args, 1 + name_len)[1]
        if consumers:
            break
        time.sleep(0.01)
    one = publish_bytes(QUEUE, size, False)
    batch = one * 1000
    started = time.perf_counter()
    for _ in range(count // 1000):
        raw.sock.sendall(batch)
    raw.sock.sendall(one * (count % 1000))
    _first, ended = recv.recv()
    consumer.join()
    raw.sock.close()
    return count / (ended - started)


def drain(host: str, port: int, count: int, prefetch: int, mode: str) -> float:
    started, ended = consume(host, port, count, prefetch, mode)
    return count / (ended - started)


def rss_anon_kb(pid: int) -> int:
    """The broker's anonymous resident memory (mapped segment files do not count)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    return 0


def run(host: str, port: int, pid: int | None, args: argparse.Namespace) -> dict[str, object]:
    results: dict[str, object] = {}
    for key in args.only or SCENARIOS:
        rates, cpus, fills, rss = [], [], [], []
        for _ in range(args.repeat):
            raw = Conn.open(port, host)
            fresh_queue(raw)
            if key in ("ahead", "ahead1"):
                before = cpu_seconds(pid) if pid else 0.0
                mode = "multi" if key == "ahead" else "single"
                rate = ahead(host, port, args.messages, args.size, args.prefetch, mode)
            else:
                fills.append(publish_confirmed(raw, QUEUE, args.messages, args.size))
                if pid:
                    rss.append(rss_anon_kb(pid))
                before = cpu_seconds(pid) if pid else 0.0
                rate = drain(host, port, args.messages, args.prefetch, key)
            if pid:
                cpus.append((cpu_seconds(pid) - before) / args.messages * 1e6)
                rss.append(rss_anon_kb(pid))
            rates.append(rate)
            raw.sock.close()
        results[key] = {
            "msg_per_s": [round(r) for r in rates],
            "median": round(statistics.median(rates)),
            "broker_cpu_us_per_msg": [round(c, 3) for c in cpus],
            **({"fill_msg_per_s": [round(f) for f in fills]} if fills else {}),
            "rss_anon_kb": rss,  # (after the fill and) after the drain, per run
        }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running broker (default: start a Warren)")
    parser.add_argument("--src", type=Path, default=ROOT / "src", help="the Warren started: its src")
    parser.add_argument("--pure", action="store_true", help="the Warren started: pure Python")
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=16)
    parser.add_argument("--prefetch", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--only", action="append", choices=SCENARIOS)
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        host, port, pid = broker(stack, args.url, args.pure, args.src)
        results = run(host, port, pid, args)
    print(json.dumps({"src": str(args.src), "load_average": os.getloadavg(), **results}, indent=1))


if __name__ == "__main__":
    main()
