"""Publishing into a stream without Spark: the sink's messages and plain ones, confirmed.

    .venv/bin/python bench/stream_publish.py --messages 1000000 --repeat 3

Starts a Warren from this checkout (a subprocess on a scratch data dir, like
bench/spark_bench.py), then for each shape, each the best of --repeat runs
into a fresh stream:

* ``sink``: what ``df.write.format("warren")`` sends for a string ``body``
  column (spark/publish.py's Encoder: a headers table with the row's
  deduplication key, delivery-mode 2), from one connection with at most
  10,000 unconfirmed, until every message is confirmed;
* ``dedup``: the sink's messages into a stream declared with
  ``x-message-deduplication`` (cache of --messages keys): every key new;
* ``plain``: the same bodies with no properties (bench/spark_bench.py's
  "raw publisher filling the stream").

Reports messages/s and the broker's CPU per message (utime + stime from
/proc over the run). The encoding is done before the clock starts, so the
publisher is only ``sendall`` and reading confirms.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

import pyarrow as pa  # noqa: E402
from spark_bench import warren_broker  # noqa: E402

from warren.amqp import spec  # noqa: E402
from warren.amqp.frames import content_frames, method_frame  # noqa: E402
from warren.client import Client  # noqa: E402
from warren.spark.options import SinkOptions  # noqa: E402
from warren.spark.publish import Encoder, Publisher, SinkPlan  # noqa: E402

_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def broker_pid(port: int) -> int:
    """The Warren listening on ``port`` (a child of this process)."""
    me = str(os.getpid())
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if stat.rsplit(")", 1)[1].split()[1] == me and str(port).encode() in cmd:
            return int(entry.name)
    raise RuntimeError("cannot find the broker's pid")


def sink_slices(url: str, queue: str, count: int, size: int) -> list[tuple[bytes, int]]:
    options = SinkOptions.parse({"url": url, "routingKey": queue})
    plan = SinkPlan.from_schema(options, [("body", "string")])
    encoder = Encoder(plan, "bench:0:0:", 131072)
    rows = pa.record_batch([pa.array(["x" * size] * count)], names=["body"])
    return encoder.encode(rows, 0)


def plain_slices(queue: str, count: int, size: int) -> list[tuple[bytes, int]]:
    one = method_frame(1, spec.BasicPublish(exchange="", routing_key=queue)) + b"".join(
        content_frames(1, b"\x00\x00", b"x" * size, 131072)
    )
    return [(one * min(512, count - lo), min(512, count - lo)) for lo in range(0, count, 512)]


def fresh_stream(url: str, name: str, arguments: dict[str, object]) -> None:
    """Delete the stream ``name`` if it exists and declare it again, empty."""
    with Client(url) as client:
        client.channel_open(1)
        client.rpc(1, spec.QueueDelete(queue=name), spec.QueueDeleteOk)
        args = {"x-queue-type": "stream", **arguments}
        client.queue_declare(1, name, durable=True, arguments=args)


def stored(url: str, queue: str) -> int:
    with Client(url) as client:
        client.channel_open(1)
        ok = client.rpc(1, spec.QueueDeclare(queue=queue, passive=True), spec.QueueDeclareOk)
        return int(ok.message_count)


def publish(url: str, slices: list[tuple[bytes, int]]) -> float:
    options = SinkOptions.parse({"url": url, "routingKey": "unused"})
    publisher = Publisher(options).open()
    started = time.perf_counter()
    for frames, n in slices:
        publisher.send(frames, n)
    publisher.flush()
    elapsed = time.perf_counter() - started
    publisher.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--shapes", default="sink,dedup,plain")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results: dict[str, object] = {"messages": args.messages, "size": args.size}
    with warren_broker() as url:
        port = int(url.rsplit(":", 1)[1].strip("/"))
        pid = broker_pid(port)
        for shape in args.shapes.split(","):
            queue = f"bench-{shape}"
            arguments: dict[str, object] = {}
            if shape == "dedup":
                arguments = {"x-message-deduplication": True, "x-cache-size": args.messages}
            if shape in ("sink", "dedup"):
                slices = sink_slices(url, queue, args.messages, args.size)
            else:
                slices = plain_slices(queue, args.messages, args.size)
            best = None
            for _ in range(args.repeat):
                fresh_stream(url, queue, arguments)
                cpu0 = cpu_seconds(pid)
                t = publish(url, slices)
                cpu = cpu_seconds(pid) - cpu0
                got = stored(url, queue)
                assert got == args.messages, f"{queue}: {got} stored, {args.messages} confirmed"
                if best is None or t < best[0]:
                    best = (t, cpu)
            assert best is not None
            rate = args.messages / best[0]
            us = best[1] / args.messages * 1e6
            results[shape] = {"msg_s": round(rate), "broker_cpu_us": round(us, 2)}
            print(f"{shape:>6}: {rate:>10,.0f} msg/s  broker CPU {us:.2f} us/msg", file=sys.stderr)
    results["load_average"] = os.getloadavg()
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
