"""Broker RAM per idle MQTT connection: Warren against mosquitto.

    .venv/bin/python bench/mqtt_idle.py                         # 100,000 connections
    .venv/bin/python bench/mqtt_idle.py --connections 20000 --brokers mosquitto

For each broker (started fresh, see bench/mqtt_brokers.py, with the open-file
limit raised to /proc/sys/fs/nr_open): read its VmRSS, run ``warren perf
mqtt-idle --connections K --ready`` (MQTT 3.1.1, keep-alive 0; spread over
source addresses 127.0.0.x beyond 25,000), wait for its READY line, wait
``--settle`` seconds, read VmRSS again (/proc/<pid>/status), stop the holder and
print MiB and KiB per connection. Run as root for 100,000 connections: the
holder and the brokers each need more file descriptors than the usual hard
limit. ``--runs`` repeats and takes the median; ``--seconds`` is the settle time.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import mqtt_brokers as brokers  # noqa: E402

from warren.perf.report import read_rss  # noqa: E402


def open_file_limit(pid: int) -> int | None:
    """The broker's soft RLIMIT_NOFILE, from /proc/<pid>/limits."""
    try:
        for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
            if line.startswith("Max open files"):
                return int(line.split()[3])
    except (OSError, ValueError, IndexError):
        pass
    return None


def measure(pid: int, port: int, connections: int, settle: float) -> tuple[int, int, int]:
    """Returns (VmRSS KiB before, VmRSS KiB with the connections, connections held)."""
    limit = open_file_limit(pid)
    if limit is not None and limit < connections + 16:
        print(
            f"note: the broker's open-file limit is {limit:,} (the hard limit could not be "
            f"raised: no CAP_SYS_RESOURCE?), so it can hold fewer than {connections:,} "
            "connections; the rest fail",
            file=sys.stderr,
        )
    before = (read_rss(pid) or {}).get("VmRSS", 0)
    holder = subprocess.Popen(
        brokers.perf_command(
            "mqtt-idle",
            "--port",
            str(port),
            "--connections",
            str(connections),
            "--ready",
            "--settle",
            "0",
            "--json",
        ),
        stdout=subprocess.PIPE,
        text=True,
        env=brokers.perf_env(),
    )
    assert holder.stdout is not None
    try:
        held = -1
        for line in holder.stdout:
            if line.startswith("READY"):
                held = int(line.split()[1])
                break
        if held < 0:
            raise RuntimeError(f"mqtt-idle ended without READY (status {holder.wait()})")
        time.sleep(settle)  # let the broker's allocations settle before reading RSS
        with_them = (read_rss(pid) or {}).get("VmRSS", 0)
        return before, with_them, held
    finally:
        holder.send_signal(signal.SIGTERM)
        holder.communicate(timeout=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    brokers.add_common_arguments(ap)
    ap.add_argument("--connections", type=int, default=100_000, help="default 100000")
    ap.add_argument("--seconds", type=float, default=2.0, help="settle time before reading RSS")
    ap.add_argument("--runs", type=int, default=1, help="runs per broker (median), default 1")
    args = ap.parse_args(argv)
    rows: list[str] = []
    skipped: dict[str, str] = {}
    for name in brokers.parse_brokers(args.brokers):
        samples: list[tuple[int, int, int]] = []
        for _ in range(args.runs):
            sample = brokers.on_broker(
                name,
                args.warren_src,
                skipped,
                lambda pid, port: measure(pid, port, args.connections, args.seconds),
            )
            if sample is None:
                break
            samples.append(sample)
            b, w, h = sample
            print(
                f"{name}: VmRSS {b / 1024:,.1f} MiB idle, {w / 1024:,.1f} MiB with {h:,} "
                "connections",
                file=sys.stderr,
                flush=True,
            )
        if not samples:
            continue
        before = statistics.median(s[0] for s in samples)
        with_them = statistics.median(s[1] for s in samples)
        held = min(s[2] for s in samples)
        per = (with_them - before) / held if held else 0.0
        rows.append(
            f"| {name} {brokers.version(name, args.warren_src)} | {held:,} | {before / 1024:,.1f} MiB "
            f"| {with_them / 1024:,.1f} MiB | {per:,.2f} KiB |"
        )
    print()
    print(f"Idle MQTT 3.1.1 connections (keep-alive 0), broker VmRSS, median of {args.runs}")
    print()
    print("| Broker | connections | VmRSS idle | VmRSS with them | per connection |")
    print("|---|---:|---:|---:|---:|")
    for row in rows:
        print(row)
    brokers.print_skipped(skipped)
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
