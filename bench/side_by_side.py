"""What the one-run comparisons of a protocol (amqp1_compare.py, stream_compare.py,
and mqtt_compare.py's stand-in) share: a ``warren perf ... --json`` run, the Warren
build the report names, the options, the medians over rounds, a ratio and a body size as
the tables show them, the lines under them, and the accept loop of the stand-in
brokers that measure the load generator's own ceiling.

Imported by scripts that put bench/ on sys.path first.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from typing import Any, TypeVar

import amqp_brokers as brokers  # bench/amqp_brokers.py

K = TypeVar("K")


def perf_json(args: list[str], seconds: float, env: dict[str, str] | None = None) -> dict[str, Any]:
    """The summary of ``warren perf ARGS --json`` (``env``: default Warren's, see
    amqp_brokers.perf_env); a failed run is a RuntimeError."""
    cmd = [sys.executable, "-m", "warren", "perf", *args, "--json"]
    brokers.log(brokers.display(cmd))
    r = subprocess.run(
        cmd, capture_output=True, text=True, env=env or brokers.perf_env(), timeout=seconds + 120
    )
    if r.returncode != 0 or not r.stdout.strip():
        raise RuntimeError(f"{brokers.display(cmd)} failed ({r.returncode}): {r.stderr[-1500:]}")
    result: dict[str, Any] = json.loads(r.stdout)
    return result


def warren_build() -> str:
    """Warren's version and build (compiled or pure Python) as the broker runs it."""
    code = "import warren; print(f'{warren.__version__} ({warren.build_description()})')"
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=brokers.perf_env()
    )
    return r.stdout.strip() or "?"


def medians(
    rounds: list[dict[K, dict[str, Any]]], keys: tuple[str, ...] = ("rate",)
) -> dict[K, dict[str, Any]]:
    """Each cell's run of the median rate over the rounds (its other figures), with
    the medians of ``keys``."""
    results: dict[K, dict[str, Any]] = {}
    for cell in {c for r in rounds for c in r}:
        runs = [r[cell] for r in rounds if cell in r]
        best = sorted(runs, key=lambda r: r["rate"])[len(runs) // 2]  # its CPU figures
        results[cell] = dict(best, **{k: statistics.median(r[k] for r in runs) for k in keys})
    return results


def ratio(a: dict[str, Any] | None, b: dict[str, Any] | None) -> str:
    """``a``'s rate over ``b``'s, or "-"."""
    if not a or not b or not b["rate"]:
        return "-"
    return f"{a['rate'] / b['rate']:.2f}×"


def size_label(size: int) -> str:
    return f"{size // 1024} KiB" if size >= 1024 and size % 1024 == 0 else f"{size} B"


def arguments(
    doc: str | None, command: str, warren_src: str, argv: list[str] | None
) -> tuple[argparse.Namespace, list[int]]:
    """The options of a comparison of ``warren perf COMMAND`` (``warren_src``: what
    --warren-src runs from DIR, which it sets), parsed; and the body sizes."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0] if doc else None)
    ap.add_argument("--seconds", type=float, default=10.0, help="per run (default 10)")
    ap.add_argument("--runs", type=int, default=1, help="rounds over both brokers (median)")
    ap.add_argument("--sizes", default="16,1024", help="body sizes (default 16,1024)")
    ap.add_argument("--skip-rabbitmq", action="store_true")
    ap.add_argument(
        "--ceiling",
        action="store_true",
        help=f"also measure warren perf {command} against a stand-in broker that does no work",
    )
    ap.add_argument("--only-ceiling", action="store_true", help="the ceiling alone")
    ap.add_argument("--warren-src", metavar="DIR", help=f"{warren_src} from DIR (a src/)")
    ap.add_argument(
        "--json", action="store_true", help="also print every run of every cell as a JSON line"
    )
    args = ap.parse_args(argv)
    if args.warren_src:
        brokers.set_warren_src(args.warren_src)
    return args, [int(x) for x in args.sizes.split(",")]


def print_footer(
    versions: dict[str, str], load_start: tuple[float, float, float], t0: float
) -> None:
    """The lines under the tables: the versions; CPUs, the load average at the start
    and the end, the time the whole run took (from ``t0``, monotonic)."""
    for name, v in versions.items():
        print(f"- {name}: {v}")
    print(
        f"- {os.cpu_count()} CPUs; load average at the start "
        + " ".join(f"{x:.2f}" for x in load_start)
        + ", at the end "
        + " ".join(f"{x:.2f}" for x in os.getloadavg())
        + f"; {time.monotonic() - t0:.0f} s in all"
    )


class StandIn:
    """A stand-in broker on a free loopback port: every connection served by
    :meth:`_serve` on a thread of its own. A subclass builds what it sends, then
    calls :meth:`start`."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]

    def start(self) -> None:
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.listener.close()
