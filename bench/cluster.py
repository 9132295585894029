"""Clustering's cost and failover time, for docs/clustering.md and docs/scaling.md.

    .venv/bin/python bench/cluster.py [--duration 8]

Starts a real etcd (Debian's etcd-server) and real `warren` nodes
(tests/cluster's launchers) on this machine and measures, against the
leader, with `warren perf throughput`:

- persistent messages with confirms (window 1,000) and acks, 16-byte and
  4 KiB bodies, on a single unclustered node and on a cluster with 0, 1 and 2
  followers in the in-sync set: msg/s and MB/s;
- confirm latency p50/p99 at a fixed 5,000 msg/s, the same setups;
- failover: kill -9 of the leader of three nodes until a client's passive
  queue.declare through a follower's port succeeds again;
- failover under load (``--failover-only`` runs just this and the above): two
  publishers with confirms and two consumers with acks (tests/cluster's
  FailoverLoad) run through every node's port while the leader is killed:
  how long publishers saw no confirm, what they had to publish again, what
  was delivered twice, and that every confirmed message was delivered.

Every node, etcd and the perf clients share this machine's CPUs.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "cluster"))

from etcd_proc import EtcdProcess, free_port  # noqa: E402
from failover_load import FailoverLoad  # noqa: E402
from nodes import Node, marks, start_cluster, wait_any  # noqa: E402

PERF = [sys.executable, "-m", "warren", "perf", "throughput"]


def perf(port: int, args: list[str], duration: int) -> dict[str, Any]:
    out = subprocess.run(
        [*PERF, "--uri", f"amqp://guest:guest@127.0.0.1:{port}/", *args, "-z", str(duration), "--json"],
        capture_output=True, text=True, check=False, cwd=ROOT,
        env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"warren perf {' '.join(args)}: {out.stderr.strip()[-2000:]}")
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def single_node(base: Path) -> tuple[subprocess.Popen[str], int]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "warren", "-D", str(base / "single"), "--amqp-port", str(port),
         "--http-port", "-1", "--mqtt-port", "-1", "--stream-port", "-1", "--prometheus-port", "-1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
        env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert proc.stdout is not None
    for line in proc.stdout:
        if "listening on AMQP" in line:
            break
    return proc, port


def cluster(base: Path, etcd: EtcdProcess, followers: int, prefix: str) -> list[Node]:
    nodes = [Node(base, f"{prefix}{i}", etcd.url, prefix=prefix) for i in range(1 + followers)]
    start_cluster(nodes)
    return nodes


SCENARIOS = {
    "16 B": ["-x", "1", "-y", "1", "-p", "--durable", "-c", "1000", "-a", "100", "-q", "1000"],
    "4 KiB": ["-x", "1", "-y", "1", "-p", "--durable", "-c", "1000", "-a", "100", "-q", "1000",
              "-s", "4096"],
    "latency at 5,000 msg/s": ["-x", "1", "-y", "1", "-p", "--durable", "-c", "1000", "-a", "100",
                               "-q", "1000", "-r", "5000"],
}  # fmt: skip


def measure(port: int, duration: int) -> dict[str, dict[str, Any]]:
    return {name: perf(port, args, duration) for name, args in SCENARIOS.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=int, default=8)
    parser.add_argument("--failover-only", action="store_true", help="skip the throughput runs")
    args = parser.parse_args()
    if shutil.which("etcd") is None:
        print("bench/cluster.py: etcd is not installed (make etcd)", file=sys.stderr)
        return 1
    results: dict[str, dict[str, dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="warren-cluster-bench-") as tmp:
        base = Path(tmp)
        if not args.failover_only:
            proc, port = single_node(base)
            try:
                results["single node (no clustering)"] = measure(port, args.duration)
            finally:
                proc.terminate()
                proc.wait(30)
        etcd = EtcdProcess(base / "etcd")
        try:
            for followers in () if args.failover_only else (0, 1, 2):
                nodes = cluster(base, etcd, followers, f"f{followers}n")
                try:
                    label = f"cluster, {followers} follower{'s' if followers != 1 else ''}"
                    results[label] = measure(nodes[0].amqp_port, args.duration)
                finally:
                    for node in nodes:
                        node.stop()
            nodes = cluster(base, etcd, 2, "fo")
            try:
                failover = kill_leader(nodes)
            finally:
                for node in nodes:
                    node.stop()
            nodes = cluster(base, etcd, 2, "fl")
            try:
                under_load = kill_leader_under_load(nodes, args.duration)
            finally:
                for node in nodes:
                    node.stop()
        finally:
            etcd.stop()
    report(results, failover)
    report_load(under_load)
    return 0


def kill_leader_under_load(nodes: list[Node], duration: int) -> dict[str, Any]:
    """FailoverLoad for ``duration`` seconds, kill -9 of the leader, as long again."""
    load = FailoverLoad([n.address for n in nodes]).start()
    try:
        time.sleep(duration)  # traffic for the run's length (a measurement, not a wait)
        before = marks(nodes[1:])
        killed_at = time.monotonic()
        nodes[0].kill()
        wait_any(nodes[1:], "elected leader", timeout=60, since=before)
        elected = time.monotonic() - killed_at
        time.sleep(duration)
        load.stop_publishing()
        load.wait_until(lambda: not load.stats.missing(), 120, "every confirmed message delivered")
    finally:
        load.stop()
    stats = load.stats
    with stats.lock:
        times = sorted(stats.confirmed.values())
    after = [t for t in times if t > killed_at]
    # The publishers' outage: the longest stretch without a confirm; the new
    # leader's first confirm ends it.
    gap, resumed = max(((b - a, b) for a, b in pairwise(times)), default=(0.0, killed_at))
    result = load.summary()
    result.update(
        elected_after_s=elected,
        first_confirm_after_s=resumed - killed_at,
        no_confirms_s=gap,
        confirmed_before=len(times) - len(after),
        confirmed_after=len(after),
        lost=len(stats.missing()),
        duration_s=duration,
    )
    return result


def kill_leader(nodes: list[Node]) -> float:
    import pika

    with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", nodes[0].amqp_port)) as c:
        c.channel().queue_declare("probe", durable=True)
    before = marks(nodes[1:])
    start = time.monotonic()
    nodes[0].kill()
    wait_any(nodes[1:], "listening on AMQP", timeout=60, since=before)
    while True:
        try:
            with pika.BlockingConnection(
                pika.ConnectionParameters("127.0.0.1", nodes[1].amqp_port)
            ) as c:
                c.channel().queue_declare("probe", passive=True)
            return time.monotonic() - start
        except Exception:
            time.sleep(0.05)


def report(results: dict[str, dict[str, dict[str, Any]]], failover: float) -> None:
    print("| Setup | 16 B msg/s | 4 KiB msg/s (MB/s) | p50 / p99 ms at 5,000 msg/s |")
    print("|---|---:|---:|---:|")
    for label, r in results.items():
        small = r["16 B"]["consume_rate"]
        big = r["4 KiB"]["consume_rate"]
        lat = r["latency at 5,000 msg/s"]["latency_ms"]
        print(
            f"| {label} | {small:,.0f} | {big:,.0f} ({big * 4096 / 1e6:,.0f}) "
            f"| {lat['p50']:.3f} / {lat['p99']:.3f} |"
        )
    print(f"\nFailover (kill -9 of the leader of three, lease_ttl 2 s): {failover:.2f} s")


def report_load(r: dict[str, Any]) -> None:
    print(
        f"\nFailover under load ({r['duration_s']} s of traffic either side of the kill; "
        "2 publishers with confirms, 2 consumers with acks, through every node's port):"
    )
    print("| | |\n|---|---:|")
    rows = [
        ("confirmed before the kill / after", f"{r['confirmed_before']:,} / {r['confirmed_after']:,}"),
        ("new leader elected after", f"{r['elected_after_s']:.2f} s"),
        ("the new leader's first confirm after the kill", f"{r['first_confirm_after_s']:.2f} s"),
        ("longest time without a confirm", f"{r['no_confirms_s']:.2f} s"),
        ("client reconnects", f"{r['reconnects']}"),
        ("publishes in doubt (connection lost before the confirm), sent again", f"{r['in_doubt']}"),
        ("messages delivered twice", f"{r['duplicates']}"),
        ("confirmed but not delivered", f"{r['lost']}"),
    ]  # fmt: skip
    for name, value in rows:
        print(f"| {name} | {value} |")


if __name__ == "__main__":
    raise SystemExit(main())
