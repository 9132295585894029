"""Where a message's broker CPU goes: py-spy samples of Warren under `warren perf`.

    .venv/bin/python bench/profile_hot_path.py                   # every throughput scenario
    .venv/bin/python bench/profile_hot_path.py --only noack --seconds 10
    .venv/bin/python bench/profile_hot_path.py --pure            # WARREN_PURE_PYTHON=1

For each scenario of bench/compare.py it starts a fresh Warren (compiled unless
``--pure``) on a free port, runs ``warren perf throughput`` with the scenario's
arguments, and after a warm-up samples the broker with ``py-spy record --native``
(mypyc's compiled functions are C functions: only native frames show them).
Each sample is charged to the innermost frame that belongs to a *stage* of the
hot path (STAGES below; the first pattern that matches a frame's function name
wins), so the shares add up to 100 %. The broker's CPU time over the sampled
window (from /proc) divided by the messages the consumers received in it gives
the broker CPU per message; a stage's microseconds per message are its share of
that. The table goes to stdout as Markdown (docs/benchmarks.md quotes it).

py-spy comes from PyPI (``pip install py-spy``); sampling slows the broker by a
few per cent, which is the same for every stage.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from compare_scenarios import THROUGHPUT, Scenario  # noqa: E402

#: (stage, patterns): a frame belongs to the first stage with a pattern found in
#: its function name. Innermost matching frame wins, so "deliver" inside
#: "route" is charged to "deliver".
STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("write (transport, syscalls)", ("UVStream", "flush", "uv__write", "writev", "write (")),
    ("read (event loop, syscalls)", ("uv__read", "uv__stream_io", "data_received", "stream_on_read")),
    ("store (segment append, read back, sync)", ("segment", "Segment", "store", "Store", "GroupSync", "fsync", "fdatasync")),
    ("ack settlement", ("basic_ack", "_ack", "settle", "Unacked", "unacked")),
    ("confirms", ("_confirm", "after_sync", "PublisherConfirms")),
    ("deliver (consumer pick, basic.deliver encode)", ("deliver", "Consumer", "consumer", "message_frames", "_run_delivery")),
    ("queue", ("Queue", "queue___")),
    ("route (exchange, bindings)", ("Router.publish", "Router.route", "Router___", "_route", "exchange", "Exchange")),
    ("publish checks, Message object", ("_publish_message", "_handle_publish", "Publishing___publish_run", "Publishing.publish_run", "_check", "Channel.check", "Message", "message___")),
    ("frame parse (split, decode)", ("scan_publishes", "publish_run___", "PublishRun", "feed", "on_method_frame", "on_header_frame", "on_body_frame", "split_header_payload", "BasicPublish", "decode")),
)  # fmt: skip
OTHER = "event loop, other"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"broker did not listen on {port}")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stage_of(frame: str) -> str | None:
    for stage, patterns in STAGES:
        if any(p in frame for p in patterns):
            return stage
    return None


def charge(raw: Path) -> tuple[collections.Counter[str], int]:
    """Samples per stage from py-spy's raw (collapsed) output."""
    per_stage: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        total += n
        frames = [re.sub(r" \([^()]*\)$", "", f) for f in stack.split(";")]
        stage = next((s for f in reversed(frames) if (s := stage_of(f)) is not None), OTHER)
        per_stage[stage] += n
    return per_stage, total


def profile(scenario: Scenario, seconds: float, pure: bool, py_spy: str) -> dict[str, object]:
    port = free_port()
    env = dict(os.environ)
    if pure:
        env["WARREN_PURE_PYTHON"] = "1"
    with tempfile.TemporaryDirectory() as data:
        broker = subprocess.Popen(
            [sys.executable, "-m", "warren", "-D", data, "--amqp-port", str(port),
             "--http-port", "-1", "--mqtt-port", "-1", "--stream-port", "-1", "--prometheus-port", "-1", "--log-level", "warning"],
            env=env,
        )  # fmt: skip
        try:
            wait_port(port)
            warmup = 3.0
            perf = subprocess.Popen(
                [sys.executable, "-m", "warren", "perf", "throughput", "--uri",
                 f"amqp://guest:guest@127.0.0.1:{port}/", *scenario.args,
                 "-z", str(int(warmup + seconds + 2)), "--json"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
            )  # fmt: skip
            time.sleep(warmup)  # the load reaches its steady state
            raw = Path(data) / "profile.txt"
            cpu0, t0 = cpu_seconds(broker.pid), time.monotonic()
            spy = threading.Thread(
                target=subprocess.run,
                args=([py_spy, "record", "--native", "-p", str(broker.pid), "-d",
                       str(int(seconds)), "-r", "200", "-f", "raw", "-o", str(raw)],),
                kwargs={"capture_output": True},
            )  # fmt: skip
            spy.start()
            spy.join()
            cpu = cpu_seconds(broker.pid) - cpu0
            window = time.monotonic() - t0
            out, _ = perf.communicate(timeout=120)
            summary = json.loads(out.strip().splitlines()[-1])
            per_stage, total = charge(raw)
        finally:
            broker.terminate()
            broker.wait(30)
    rate = float(summary["consume_rate"])  # over the whole run: the steady state
    us_per_msg = cpu / (rate * window) * 1e6 if rate else float("nan")
    return {
        "scenario": scenario,
        "rate": rate,
        "cpu_share": cpu / window,
        "us_per_msg": us_per_msg,
        "stages": {s: n / total for s, n in per_stage.items()} if total else {},
        "samples": total,
    }


def table(results: list[dict[str, object]]) -> str:
    stages = [s for s, _ in STAGES[::-1]] + [OTHER]
    head = "| Stage | " + " | ".join(f"`{r['scenario'].key}`" for r in results) + " |"  # type: ignore[attr-defined]
    lines = [head, "|---|" + "---:|" * len(results)]
    for stage in stages:
        cells = []
        for r in results:
            share = r["stages"].get(stage, 0.0)  # type: ignore[attr-defined]
            cells.append(f"{share * r['us_per_msg']:.2f} ({share:.0%})")
        lines.append(f"| {stage} | " + " | ".join(cells) + " |")
    lines.append("| **broker CPU per message, us** | " + " | ".join(f"**{r['us_per_msg']:.2f}**" for r in results) + " |")  # fmt: skip
    lines.append("| consumed msg/s while sampled | " + " | ".join(f"{r['rate']:,.0f}" for r in results) + " |")  # fmt: skip
    lines.append("| broker CPU (cores) | " + " | ".join(f"{r['cpu_share']:.2f}" for r in results) + " |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", action="append", help="scenario key (repeatable)")
    p.add_argument("--seconds", type=float, default=8.0, help="sampling time per scenario")
    p.add_argument("--pure", action="store_true", help="profile the pure-Python build")
    args = p.parse_args(argv)
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(py_spy).exists():
        print("py-spy not found: pip install py-spy", file=sys.stderr)
        return 2
    chosen = [s for s in THROUGHPUT if not args.only or s.key in args.only]
    results = []
    for scenario in chosen:
        print(f"profiling {scenario.key} ...", file=sys.stderr, flush=True)
        results.append(profile(scenario, args.seconds, args.pure, py_spy))
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
