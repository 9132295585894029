"""Reading a stream from a cluster's followers instead of its leader (docs/clustering.md).

    .venv/bin/python bench/stream_reads.py [--messages 1000000] [--size 100]

Starts a real etcd and three `warren` nodes (tests/cluster's launchers),
fills a stream queue on the leader with confirms, then times Spark's task
reader (warren.spark.stream.read_range, one process per reader) reading the
whole stream:

- one reader on the leader, one on a follower's stream read service;
- two readers at once, both on the leader, or one on each follower;

and, for each, the CPU seconds the leader's process spent while they read:
what a read from followers takes off the leader. Every node, etcd and the
readers share this machine's CPUs.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "cluster"))
sys.path.insert(0, str(ROOT / "src"))

from etcd_proc import EtcdProcess  # noqa: E402
from nodes import Node  # noqa: E402

from warren.amqp import spec  # noqa: E402
from warren.amqp.frames import content_frames, method_frame  # noqa: E402
from warren.client import Client  # noqa: E402

QUEUE = "bench-stream"
READER = """
import json, sys, time
from warren.spark.stream import read_range
url, queue, end = sys.argv[1], sys.argv[2], int(sys.argv[3])
start = time.monotonic()
rows = sum(len(r) for r in read_range(url, queue, 0, end, prefetch=2000,
                                      poll_timeout_ms=60000, fail_on_data_loss=True))
print(json.dumps({"rows": rows, "seconds": time.monotonic() - start}))
"""


def fill(port: int, messages: int, size: int) -> None:
    """Declare the stream and publish ``messages`` bodies of ``size`` bytes, confirmed."""
    client = Client(f"amqp://guest:guest@127.0.0.1:{port}/", timeout=60).connect()
    try:
        client.channel_open(1)
        client.queue_declare(1, QUEUE, durable=True, arguments={"x-queue-type": "stream"})
        client.confirm_select(1)
        one = method_frame(1, spec.BasicPublish(exchange="", routing_key=QUEUE)) + b"".join(
            content_frames(1, b"\x00\x00", b"x" * size, client.frame_max)
        )
        batch = 10_000
        sent = 0
        while sent < messages:
            n = min(batch, messages - sent)
            client.send(one * n)
            sent += n
            while True:
                reply = client.wait_method(1, spec.Method)
                if isinstance(reply, spec.BasicAck) and (
                    reply.delivery_tag == sent or (reply.multiple and reply.delivery_tag >= sent)
                ):
                    break
    finally:
        client.close()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100  # utime + stime, in clock ticks


def read(ports: list[int], messages: int, leader: Node) -> tuple[float, float]:
    """Readers on ``ports`` at once: total msg/s, and the leader's CPU seconds."""
    assert leader.proc is not None
    cpu = cpu_seconds(leader.proc.pid)
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                READER,
                f"amqp://guest:guest@127.0.0.1:{port}/",
                QUEUE,
                str(messages),
            ],
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"},
        )  # fmt: skip
        for port in ports
    ]
    start = time.monotonic()
    for proc in procs:
        out, _ = proc.communicate(timeout=600)
        result = json.loads(out)
        if result["rows"] != messages:
            raise RuntimeError(f"a reader got {result['rows']} of {messages} messages")
    elapsed = time.monotonic() - start
    return len(ports) * messages / elapsed, cpu_seconds(leader.proc.pid) - cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100)
    args = parser.parse_args()
    if shutil.which("etcd") is None:
        print("bench/stream_reads.py: etcd is not installed (make etcd)", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="warren-stream-reads-") as tmp:
        base = Path(tmp)
        etcd = EtcdProcess(base / "etcd")
        nodes = [Node(base, f"r{i}", etcd.url, prefix="reads") for i in range(3)]
        try:
            leader = nodes[0].start()
            leader.wait_for("elected leader")
            leader.wait_for("listening on AMQP")
            for node in nodes[1:]:
                node.start()
            for node in nodes[1:]:
                node.wait_for("synced with the leader")
            leader.wait_for(r"in-sync replicas: \w+, \w+$")
            fill(leader.amqp_port, args.messages, args.size)
            followers = [node.stream_read_port for node in nodes[1:]]
            rows = [
                ("1 reader, on the leader", [leader.amqp_port]),
                ("1 reader, on a follower", followers[:1]),
                ("2 readers, both on the leader", [leader.amqp_port] * 2),
                ("2 readers, one on each follower", followers),
            ]
            print(f"{args.messages:,} messages of {args.size} B, each reader reads them all\n")
            print("| Readers | msg/s (all readers) | leader CPU s while reading |")
            print("|---|---:|---:|")
            for label, ports in rows:
                rate, cpu = read(ports, args.messages, leader)
                print(f"| {label} | {rate:,.0f} | {cpu:.2f} |", flush=True)
        finally:
            for node in nodes:
                node.stop()
            etcd.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
