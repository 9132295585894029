"""Running `warren perf` from the bench scripts (compare.py, scale.py): one command,
its JSON result and the broker's RSS sampled meanwhile, as a Run.

Imported by scripts that put bench/ and src/ on sys.path first.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from amqp_brokers import display, log, perf_env  # bench/amqp_brokers.py


def read_status(pid: int) -> dict[str, int]:
    out: dict[str, int] = {}
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "VmHWM"):
                out[key] = int(value.split()[0])
    return out


def uri(port: int) -> str:
    return f"amqp://guest:guest@127.0.0.1:{port}/"


def perf_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "warren", "perf", *args]


@dataclass
class Run:
    broker: str
    command: list[str]
    result: dict[str, Any] | None = None
    error: str | None = None
    rss_peak_kib: int | None = None
    rss_end_kib: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def run_perf(broker_name: str, cmd: list[str], pid: int | None, timeout: float) -> Run:
    """Run one perf command (which prints JSON); sample the broker's RSS meanwhile."""
    log(f"{broker_name}: {display(cmd)}")
    run = Run(broker_name, cmd)
    peak = 0
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=perf_env()
    )
    out_chunks: list[str] = []
    err_chunks: list[str] = []

    def drain(stream: Any, into: list[str]) -> None:
        for line in stream:
            into.append(line)

    threads = [
        threading.Thread(target=drain, args=(proc.stdout, out_chunks), daemon=True),
        threading.Thread(target=drain, args=(proc.stderr, err_chunks), daemon=True),
    ]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        if pid is not None:
            peak = max(peak, read_status(pid).get("VmRSS", 0))
        if time.monotonic() > deadline:
            proc.kill()
            run.error = "timed out"
            break
        time.sleep(0.25)
    proc.wait()
    for t in threads:
        t.join(5)
    if pid is not None:
        run.rss_end_kib = read_status(pid).get("VmRSS")
        run.rss_peak_kib = max(peak, run.rss_end_kib or 0) or None
    out = "".join(out_chunks).strip()
    try:
        run.result = json.loads(out.splitlines()[-1]) if out else None
    except json.JSONDecodeError:
        run.result = None
    if run.result is None or proc.returncode not in (0,):
        tail = "".join(err_chunks).strip().splitlines()[-3:]
        run.error = run.error or f"exit status {proc.returncode}: {' | '.join(tail)}"
    if run.error:
        log(f"{broker_name}: error: {run.error}")
    else:
        assert run.result is not None
        r = run.result
        if "publish_rate" in r:
            lat = r.get("latency_ms") or {}
            log(
                f"{broker_name}: published {r['publish_rate']:,.0f}/s consumed "
                f"{r['consume_rate']:,.0f}/s p50 {lat.get('p50')} ms p99 {lat.get('p99')} ms"
            )
    return run
