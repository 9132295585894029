"""Warren against RabbitMQ and LavinMQ with `warren perf`; writes docs/benchmarks.md.

    .venv/bin/python bench/compare.py                      # 15 s per scenario and broker
    .venv/bin/python bench/compare.py --duration 10 --only ack100 --only fanout10
    .venv/bin/python bench/compare.py --skip-rabbitmq --skip-lavinmq   # Warren alone
    .venv/bin/python bench/compare.py --lavinmq /path/to/lavinmq

What it does (the brokers are in bench/amqp_brokers.py):

1. RabbitMQ: installs Debian's rabbitmq-server if it is missing (apt-get) and
   starts a private node of its own (node name, ports, epmd, scratch dirs; see
   bench/amqp_brokers.py), stopped again at the end.
2. Warren: starts ``python -m warren --amqp-port 5673 -D <tmp dir>`` as a child.
3. LavinMQ, when a binary is found (``--lavinmq PATH``, else $LAVINMQ, else
   ``lavinmq`` on PATH; otherwise it is skipped and the log says why): starts
   ``lavinmq --amqp-port 5674 --data-dir <tmp dir>`` on 127.0.0.1 as a child.
4. Memory scenarios first, on freshly started brokers: 1,000 idle connections
   (``warren perf connection-count``) and 10,000 queues (``warren perf queue-count``),
   reading the broker's VmRSS/RssAnon from /proc (RabbitMQ: the beam.smp pid);
   then the queue-length test (bench/queue_memory.py).
5. Measures the perf client's own ceiling against a stand-in broker in this
   process that completes the handshake and then only discards (publisher) or
   only emits pre-built deliveries (consumer), so no real broker limits it.
6. Throughput scenarios with ``warren perf throughput --json``, each for
   ``--duration`` seconds on one broker after the other, the order rotated
   from one scenario to the next; the broker's RSS is sampled during each run.
7. Latency at an equal rate (``--only latency``, bench/equal_rate.py): the
   same fixed publish rates with confirms against every broker, p50/p99.
8. Writes the report (``--output``, default docs/benchmarks.md), with the
   ratios Warren / RabbitMQ and Warren / LavinMQ.

The scenarios are in bench/compare_scenarios.py, running perf in
bench/perf_runs.py, the report in bench/compare_report.py, the stand-in
broker of step 5 in bench/amqp_standin.py.

Issue 27's backlog scenarios run only when asked for (``--only backlog``, or a
part: backlog-drain, backlog-ahead, backlog-single, backlog-persistent,
backlog-clients): bench/backlog_bench.py runs them with two load generators
(bench/raw_amqp.py and ``warren perf``), bench/backlog_report.py replaces only
their section of the report. ``--warren-src DIR`` measures another checkout's
Warren (e.g. /work/main/src compiled, or a branch) with these same scripts.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

import backlog_bench  # noqa: E402  bench/backlog_bench.py
import backlog_report  # noqa: E402  bench/backlog_report.py
import equal_rate  # noqa: E402  bench/equal_rate.py
from amqp_brokers import (  # noqa: E402  bench/amqp_brokers.py, beside this script
    LAVINMQ_PORT,
    WARREN_PORT,
    Broker,
    LavinMQ,
    RabbitMQ,
    Warren,
    find_lavinmq,
    log,
    perf_env,
    set_warren_src,
    sh,
    warren_src,
)
from amqp_standin import StandIn  # noqa: E402  bench/amqp_standin.py
from compare_report import (  # noqa: E402
    Report,
    _and,
    keep_other_sections,
    machine_info,
    warren_versions,
)
from compare_scenarios import ALL_KEYS, CEILING, MEMORY, QUEUE_LENGTH, THROUGHPUT  # noqa: E402
from perf_runs import perf_cmd, run_perf, uri  # noqa: E402

# =====================================================================================
# Main
# =====================================================================================


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--duration", type=float, default=15.0, help="seconds per scenario and broker")
    p.add_argument(
        "--only",
        action="append",
        choices=ALL_KEYS + backlog_bench.KEYS,
        metavar="SCENARIO",
        help=f"run only this scenario (repeatable): {', '.join(ALL_KEYS)}; "
        f"and, only when named: {', '.join(backlog_bench.KEYS)}",
    )
    p.add_argument(
        "--warren-src",
        metavar="DIR",
        help="run Warren and `warren perf` from this src/ dir (default: this checkout's)",
    )
    b = p.add_argument_group("backlog scenarios (issue 27, --only backlog...)")
    b.add_argument("--backlog", type=int, default=10_000_000, help="messages per drain")
    b.add_argument(
        "--backlog-rabbitmq",
        type=int,
        default=1_000_000,
        help="RabbitMQ's drains at most this many (3.10 keeps a backlog in RAM)",
    )
    b.add_argument(
        "--ahead", type=int, default=3_000_000, help="messages in the queue before a timed run"
    )
    b.add_argument("--runs", type=int, default=3, help="runs per case, broker and generator")
    b.add_argument(
        "--generators",
        default=",".join(backlog_bench.GENERATORS),
        help="raw, perf or both (comma-separated)",
    )
    b.add_argument(
        "--client-messages", type=int, default=200_000, help="messages each real client drains"
    )
    b.add_argument("--profile", action="store_true", help="py-spy Warren in one extra run per case")
    b.add_argument("--json-out", metavar="FILE", help="write the series' results as JSON")
    b.add_argument(
        "--baseline", metavar="JSON", help="an earlier --json-out: Warren before, side by side"
    )
    b.add_argument(
        "--from-json",
        metavar="JSON",
        help="measure nothing: write the backlog section from a saved --json-out",
    )
    p.add_argument("--output", default=str(ROOT / "docs" / "benchmarks.md"), help="report file")
    p.add_argument("--skip-rabbitmq", action="store_true", help="do not measure RabbitMQ")
    p.add_argument(
        "--lavinmq",
        metavar="PATH",
        help="LavinMQ binary (default: $LAVINMQ, else lavinmq on PATH); "
        "LavinMQ is skipped when there is none",
    )
    p.add_argument("--skip-lavinmq", action="store_true", help="do not measure LavinMQ")
    p.add_argument(
        "--warren-port",
        type=int,
        help=f"0: a free port (default {WARREN_PORT}; with only backlog scenarios 0)",
    )
    p.add_argument(
        "--lavinmq-port",
        type=int,
        help=f"0: a free port (default {LAVINMQ_PORT}; with only backlog scenarios 0)",
    )
    p.add_argument("--pause", type=float, default=2.0, help="idle seconds between runs")
    p.add_argument(
        "--qlen-warren", type=int, default=10_000_000, help="messages for Warren's queue-length run"
    )
    p.add_argument(
        "--qlen-rabbitmq",
        type=int,
        default=1_000_000,
        help="messages for RabbitMQ's queue-length run (it holds them in RAM)",
    )
    p.add_argument(
        "--qlen-lavinmq",
        type=int,
        default=10_000_000,
        help="messages for LavinMQ's queue-length run",
    )
    return p.parse_args(argv)


@contextlib.contextmanager
def started(args: argparse.Namespace) -> Iterator[list[Broker]]:
    """Warren, then RabbitMQ and LavinMQ unless skipped or absent; all stopped afterwards."""
    chosen: list[Broker] = [Warren(args.warren_port)]
    if args.skip_rabbitmq:
        log("skipping RabbitMQ: --skip-rabbitmq")
    else:
        chosen.append(RabbitMQ())
    if args.skip_lavinmq:
        log("skipping LavinMQ: --skip-lavinmq")
    else:
        binary, why = find_lavinmq(args.lavinmq)
        if binary is None:
            log(f"skipping LavinMQ: {why}")
        else:
            log(f"LavinMQ: {binary} ({why})")
            chosen.append(LavinMQ(binary, args.lavinmq_port))
    up: list[Broker] = []
    try:
        for broker in chosen:
            broker.start()
            up.append(broker)
        yield up
    finally:
        for broker in reversed(up):
            broker.stop()


def rotated(names: list[str], n: int) -> list[str]:
    """The broker order for the n-th scenario: each broker goes first in turn."""
    k = n % len(names)
    return names[k:] + names[:k]


def warren_src_version() -> str:
    """The Warren under test: its version and build as it reports them, and its git commit."""
    src = warren_src()

    def git(*cmd: str) -> str:
        return sh(["git", "-C", str(src), *cmd]).stdout.strip()

    version = subprocess.run(
        [sys.executable, "-m", "warren", "--version"],
        env=perf_env(),
        capture_output=True,
        text=True,
        cwd="/",
        check=False,
    ).stdout.strip()
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return (
        f"{version or 'unknown'} from `{src}` (git {git('rev-parse', '--short', 'HEAD')} "
        f"on {git('rev-parse', '--abbrev-ref', 'HEAD')}"
        + (", with uncommitted changes" if dirty else "")
        + ")"
    )


def run_backlog(
    args: argparse.Namespace, keys: set[str], measured: list[Broker], versions: dict[str, str]
) -> str:
    """Issue 27's scenarios on fresh brokers; returns their report section."""
    for b in measured:
        if b.fresh:
            b.restart()
    settings = backlog_bench.Settings(
        backlog=args.backlog,
        backlog_rabbitmq=args.backlog_rabbitmq,
        ahead=args.ahead,
        duration=args.duration,
        runs=args.runs,
        generators=tuple(g for g in args.generators.split(",") if g),
        client_messages=args.client_messages,
        profile=args.profile,
        pause=args.pause,
    )
    meta = {
        "when": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "Machine": ", ".join(f"{k} {v}" for k, v in machine_info().items()),
        **versions,
    }
    for b in measured:
        meta[f"{b.name} as started"] = b.describe()
    if not any(b.name == "LavinMQ" for b in measured):
        meta["LavinMQ"] = (
            "not measured: no binary here (none on PyPI, Debian 12 or npm; see bench/README.md)"
        )

    def save(series: backlog_bench.Series) -> None:
        if args.json_out:
            data = series.to_json() | {"meta": meta}
            Path(args.json_out).write_text(json.dumps(data, indent=1) + "\n")

    with tempfile.TemporaryDirectory(prefix="backlog-profiles-") as tmp:
        series = backlog_bench.run_series(keys, measured, settings, Path(tmp), save)
    save(series)
    if args.json_out:
        log(f"wrote {args.json_out}")
    return render_backlog(series.to_json() | {"meta": meta}, args.baseline)


def render_backlog(data: dict[str, Any], baseline_path: str | None) -> str:
    """The backlog section from a series (as saved by --json-out)."""
    baseline = json.loads(Path(baseline_path).read_text()) if baseline_path else None
    meta = dict(data["meta"])
    loads = [x[0] for x in data["load"]]
    meta["load"] = f"{min(loads):.1f}-{max(loads):.1f} (1-minute)"
    if baseline:
        meta["Before"] = (
            f"`{baseline_path}`: {baseline.get('meta', {}).get('Warren', '?')}, "
            f"{baseline.get('meta', {}).get('when', '?')}"
        )
    return backlog_report.render(data, meta, baseline)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Started in the background by a shell, the script inherits SIGINT ignored: take it
    # back, so Ctrl-C / kill -INT stops it and its brokers cleanly.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if args.warren_src:
        set_warren_src(args.warren_src)
    selected = set(args.only or ALL_KEYS)
    backlog_keys = selected & set(backlog_bench.KEYS)
    only_backlog = bool(backlog_keys) and not selected - backlog_keys
    if args.warren_port is None:
        args.warren_port = 0 if only_backlog else WARREN_PORT
    if args.lavinmq_port is None:
        args.lavinmq_port = 0 if only_backlog else LAVINMQ_PORT
    if args.from_json:
        out = Path(args.output)
        section = render_backlog(json.loads(Path(args.from_json).read_text()), args.baseline)
        out.write_text(backlog_report.replace_section(out.read_text(), section))
        log(f"wrote the backlog section of {args.output} from {args.from_json}")
        return 0
    with contextlib.suppress(ValueError, OSError):
        _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    report = Report(
        duration=args.duration,
        machine=machine_info(),
        versions=warren_versions() | ({"Warren": warren_src_version()} if args.warren_src else {}),
        started=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    )
    timeout = args.duration + 180
    qlen = {
        "Warren": args.qlen_warren,
        "RabbitMQ": args.qlen_rabbitmq,
        "LavinMQ": args.qlen_lavinmq,
    }
    with started(args) as measured:
        by_name = {b.name: b for b in measured}
        report.names = list(by_name)
        report.cpu_notes = [b.cpu_note for b in measured]
        fresh = [b.name for b in measured if b.fresh]
        kept = [b.name for b in measured if not b.fresh]
        report.memory_notes = [
            f"{_and(fresh)} {'is' if len(fresh) == 1 else 'are'} restarted before each "
            "memory scenario"
        ]
        if kept:
            report.memory_notes.append(
                f"{_and(kept)} {'runs' if len(kept) == 1 else 'run'} throughout (the queue "
                "test follows the connection test)"
            )
        report.qlen_note = " ".join(
            "Warren runs in its own fresh process (`queue_memory.run_warren`)."
            if b.name == "Warren"
            else f"{b.name} is restarted first."
            if b.fresh
            else f"{b.name} is the instance used above."
            for b in measured
        )
        for b in measured:
            report.versions.update(b.versions())
            report.broker_commands[b.name] = b.describe()

        for key in MEMORY:
            if key not in selected:
                continue
            report.memory[key] = {}
            for b in measured:
                if b.fresh:
                    b.restart()  # a fresh process: idle footprint, not a post-benchmark heap
                    time.sleep(args.pause)
                if key == "connections1000":
                    cmd = perf_cmd(
                        "connection-count",
                        "--uri",
                        uri(b.port),
                        "--connections",
                        "1000",
                        "--channels",
                        "1",
                        "--consumers",
                        "0",
                        "--pid",
                        str(b.pid),
                        "--json",
                    )
                else:
                    cmd = perf_cmd(
                        "queue-count",
                        "--uri",
                        uri(b.port),
                        "--queues",
                        "10000",
                        "--pid",
                        str(b.pid),
                        "--json",
                    )
                run = report.memory[key][b.name] = run_perf(b.name, cmd, b.pid, timeout)
                if key == "queues10000" and run.error and b.files_per_queue:
                    limit, need = b.fd_limit(), 10_000 * b.files_per_queue
                    if limit.isdigit() and int(limit) < need + 1024:
                        report.memory_notes_after.append(
                            f"{b.name} keeps {b.files_per_queue} files open per queue: 10,000 "
                            f"queues need {need:,} descriptors besides its others, and its "
                            f"open-file limit here is {int(limit):,} (this script raises the "
                            "limit only as far as its own hard limit allows)."
                        )
                time.sleep(args.pause)
        if QUEUE_LENGTH in selected:
            import queue_memory  # bench/queue_memory.py, beside this script

            for b in measured:
                log(f"{b.name}: queue length, {qlen[b.name]:,} messages")
                if b.name == "Warren":
                    report.queue_length[b.name] = queue_memory.run_warren(qlen[b.name], 16)
                    continue
                if b.fresh:
                    b.restart()
                    time.sleep(args.pause)
                if b.pid is None:
                    log(f"{b.name}: no pid to read memory from; queue length skipped")
                    continue
                report.queue_length[b.name] = queue_memory.run_running(
                    qlen[b.name], 16, port=b.port, pid=b.pid
                )
        if CEILING in selected:
            standin = StandIn()
            try:
                d = f"{min(args.duration, 10):g}"
                u = uri(standin.port)
                report.ceiling["publisher → stand-in sink"] = run_perf(
                    "stand-in",
                    perf_cmd("throughput", "--uri", u, "-y", "0", "-z", d, "--json"),
                    None,
                    timeout,
                )
                report.ceiling["consumer ← stand-in source"] = run_perf(
                    "stand-in",
                    perf_cmd("throughput", "--uri", u, "-x", "0", "-y", "1", "-z", d, "--json"),
                    None,
                    timeout,
                )
            finally:
                standin.close()
            for b in measured:
                report.ceiling[f"publisher → {b.name}, exchange without bindings"] = run_perf(
                    b.name,
                    perf_cmd(
                        "throughput",
                        "--uri",
                        uri(b.port),
                        "-y",
                        "0",
                        "-e",
                        "perf-sink",
                        "-t",
                        "fanout",
                        "-z",
                        f"{min(args.duration, 10):g}",
                        "--json",
                    ),
                    b.pid,
                    timeout,
                )
                time.sleep(args.pause)

        if any(s.key in selected for s in THROUGHPUT):
            for b in measured:
                if b.fresh:
                    b.restart()
        n = 0
        for sc in THROUGHPUT:
            if sc.key not in selected:
                continue
            names = rotated(report.names, n)
            n += 1
            report.order[sc.key] = names
            report.throughput[sc.key] = {}
            for name in names:
                b = by_name[name]
                cmd = perf_cmd(
                    "throughput",
                    "--uri",
                    uri(b.port),
                    *sc.args,
                    "-z",
                    f"{args.duration:g}",
                    "--json",
                )
                report.throughput[sc.key][name] = run_perf(name, cmd, b.pid, timeout)
                time.sleep(args.pause)
        if equal_rate.KEY in selected:
            seconds = report.latency_seconds = min(args.duration, 8.0)
            for case in equal_rate.CASES:
                report.latency[case.key] = {}
                for name in rotated(report.names, n):
                    b = by_name[name]
                    cmd = perf_cmd(
                        "throughput",
                        "--uri",
                        uri(b.port),
                        *case.args,
                        "-z",
                        f"{seconds:g}",
                        "--json",
                    )
                    report.latency[case.key][name] = run_perf(name, cmd, b.pid, timeout)
                    time.sleep(args.pause)
                n += 1
        backlog_section = (
            run_backlog(args, backlog_keys, measured, report.versions) if backlog_keys else ""
        )
    out = Path(args.output)
    if only_backlog:
        previous = out.read_text() if out.exists() else ""
        out.write_text(backlog_report.replace_section(previous, backlog_section))
        log(f"wrote the backlog section of {args.output}")
        return 0
    text = report.render()
    if out.exists():
        text = keep_other_sections(text, out.read_text())
    if backlog_section:
        text = backlog_report.replace_section(text, backlog_section)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n")
    log(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
