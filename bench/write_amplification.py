"""Write amplification (issue 25): bytes a broker writes to its disk per byte its
clients send it, for Warren and, in the same run, RabbitMQ and LavinMQ.

Each broker's data directory is on an ext4 file system of its own, in a loop
device (root only: ``truncate``, ``mkfs.ext4``, ``mount -o loop``). A scenario's
*disk* figure is the loop device's sectors written (``/sys/block/loopN/stat``)
from just before its clients connect to just after they close and a
``syncfs`` of that file system, so the file system's journal, its metadata and
whatever the kernel would write back later are all in it. The broker process's
own ``write_bytes`` (``/proc/<pid>/io``: pages it dirtied) and the journal's
transactions (``/proc/fs/jbd2/loopN-8/info``) say where the bytes came from.
*Received* is what the clients wrote to their sockets, counted by the load
generator (bench/wa_load.py: plain sockets, no Warren code), or for `warren
perf` runs (Warren only) the broker's socket reads (``rchar``).

Run as root from the repository root::

    .venv/bin/python bench/write_amplification.py                 # every scenario, 6 s each
    .venv/bin/python bench/write_amplification.py --only sync --seconds 3 --skip-rabbitmq
    .venv/bin/python bench/write_amplification.py --lavinmq /path/to/lavinmq

It prints a markdown report (``--output FILE`` writes it to a file);
docs/benchmarks.md, "Write amplification", quotes one with its analysis.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import wa_load  # noqa: E402  (bench/wa_load.py)
from amqp_brokers import find_lavinmq, log, perf_env  # noqa: E402
from wa_disk import (  # noqa: E402  (bench/wa_disk.py)
    FS_MODEL,
    RABBITMQ_BIN,
    DiskBroker,
    LavinMQDisk,
    LoopFS,
    RabbitMQDisk,
    WarrenDisk,
    diff,
    fmt_ratio,
    fmt_size,
    fs_model_report,
    fs_round,
    proc_io,
)

# =====================================================================================
# Scenarios
# =====================================================================================


@dataclass(frozen=True)
class Scenario:
    key: str
    group: str
    publishers: int
    window: int  # unconfirmed messages per publisher; 1: synchronous, 0: no confirms
    size: int
    queues: int = 1
    ack: int = 0  # 0: no consumer; 1: basic.ack per delivery; N: multiple=true every N
    stream: bool = False
    #: Seconds of uncounted load first (window 100, the consumer acking): segments
    #: filled and acknowledged, so the queue holds spare files when counting starts.
    warmup: float = 0.0

    @property
    def label(self) -> str:
        if self.window == 0:
            conf = f"{self.publishers} publisher{'s' * (self.publishers > 1)}, no confirms"
        elif self.window == 1:
            conf = (
                "1 synchronous publisher (a confirm per message)"
                if self.publishers == 1
                else f"{self.publishers} synchronous publishers"
            )
        else:
            conf = f"{self.publishers} publisher{'s' * (self.publishers > 1)}, window {self.window}"
        what = f"{fmt_size(self.size)}, " + (
            "a stream" if self.stream else f"{self.queues} durable queue{'s' * (self.queues > 1)}"
        )
        if self.ack == 1:
            what += ", consumer acks each"
        elif self.ack:
            what += f", consumer acks multiple every {self.ack}"
        if self.warmup:
            what += f", after {self.warmup:g} s of warm-up"
        return f"{conf}; {what}"


#: (key part, publishers, window)
MODES = [("sync", 1, 1), ("w100", 1, 100), ("8x100", 8, 100), ("noconf", 1, 0)]


def scenarios() -> list[Scenario]:
    out: list[Scenario] = []
    for size in (16, 1024, 16384):
        for key, pubs, window in MODES:
            out.append(Scenario(f"confirms-{key}-{size}", "confirms", pubs, window, size))
    for queues in (10, 100):
        for key, pubs, window in MODES[:3]:
            out.append(Scenario(f"queues{queues}-{key}", "queues", pubs, window, 1024, queues))
    for ack in (1, 100):
        for key, pubs, window in MODES[:3]:
            name = "single" if ack == 1 else "multi"
            out.append(Scenario(f"ack{name}-{key}", "consumers", pubs, window, 1024, ack=ack))
    for size in (16, 1024):
        for key, pubs, window in MODES[:3]:
            out.append(Scenario(f"stream-{key}-{size}", "stream", pubs, window, size, stream=True))
    for size in (1024, 16384):
        for key, pubs, window in MODES[:2]:
            out.append(Scenario(f"ack{size}-{key}", "reuse", pubs, window, size, ack=1))
            out.append(
                Scenario(f"reuse{size}-{key}", "reuse", pubs, window, size, ack=1, warmup=3.0)
            )
    return out


GROUPS = {
    "confirms": "Confirm rate and message size (one durable queue, no consumer)",
    "queues": "Many durable queues (1 KiB, the publishers round-robin over the queues)",
    "consumers": "With a consumer acknowledging (1 KiB, one durable queue, prefetch 1,000)",
    "stream": "A stream queue (no consumer)",
    "reuse": "A consumer acknowledging each message, from a fresh queue and after a warm-up "
    "(segments retired as spares and reused)",
}


# =====================================================================================
# One measurement
# =====================================================================================


def _child(target: Any, args: tuple[Any, ...], results: Any) -> None:
    try:
        results.put(target(*args))
    except Exception as e:  # reported, the run goes on
        results.put({"error": f"{type(e).__name__}: {e}"})


@dataclass
class Result:
    scenario: Scenario
    broker: str
    seconds: float
    published: int = 0
    confirmed: int = 0
    consumed: int = 0
    received: int = 0  # bytes the clients wrote (or the broker read: perf runs)
    body: int = 0
    disk: dict[str, int] = field(default_factory=dict)
    io: dict[str, int] = field(default_factory=dict)
    error: str = ""
    label: str = ""  # perf runs: what the command does

    @property
    def ratio(self) -> float | None:
        return self.disk["write_bytes"] / self.received if self.received and self.disk else None


def measure(broker: DiskBroker, sc: Scenario, seconds: float) -> Result:
    names = [f"wa-{sc.key}-{i:03d}" for i in range(sc.queues)]
    res = Result(sc, broker.name, seconds)
    try:
        wa_load.declare(broker.port, names, sc.stream)
    except (OSError, wa_load.Closed) as e:
        res.error = f"declare: {e}"
        return res
    ctx = mp.get_context("fork")
    if sc.warmup:
        try:
            _warm_up(ctx, broker.port, names, sc)
        except Exception as e:  # noqa: BLE001 (reported; the scenario is not measured)
            res.error = f"warm-up: {e}"
            return res
    time.sleep(0.5)
    broker.fs.syncfs()
    dev0, io0 = broker.fs.counters(), proc_io(broker.pid)
    results = ctx.Queue()
    expected = ctx.Value("q", -1)
    procs = []
    if sc.ack:
        args = (broker.port, names, sc.ack, 1000, sc.stream, expected, seconds)
        procs.append(ctx.Process(target=_child, args=(wa_load.consumer, args, results)))
    for i in range(sc.publishers):
        mine = names[i % len(names) :] + names[: i % len(names)]
        args2 = (broker.port, mine, sc.size, sc.window, seconds)
        procs.append(ctx.Process(target=_child, args=(wa_load.publisher, args2, results)))
    for p in procs:
        p.start()
        if sc.ack and p is procs[0]:
            time.sleep(0.3)  # the consumer subscribes before anything is published
    outs: list[dict[str, Any]] = []
    pubs_done = 0
    while len(outs) < len(procs):
        r = results.get(timeout=seconds + 180)
        outs.append(r)
        if "published" in r or "error" in r:
            pubs_done += 1
            if pubs_done == sc.publishers:
                expected.value = sum(o.get("published", 0) for o in outs)
    for p in procs:
        p.join(30)
    broker.fs.syncfs()
    res.disk = diff(dev0, broker.fs.counters())
    res.io = diff(io0, proc_io(broker.pid))
    for o in outs:
        if "error" in o:
            res.error = o["error"]
        res.published += o.get("published", 0)
        res.confirmed += o.get("confirmed", 0)
        res.consumed += o.get("consumed", 0)
        res.received += o.get("sent", 0)
        res.body += o.get("body_bytes", 0)
    with contextlib.suppress(OSError, wa_load.Closed):
        wa_load.delete(broker.port, names)
    return res


def _warm_up(ctx: Any, port: int, names: list[str], sc: Scenario) -> None:
    """Uncounted load before a scenario: a publisher with window 100 and a consumer
    acking each message, until the queue is empty again."""
    results = ctx.Queue()
    expected = ctx.Value("q", -1)
    consumer = ctx.Process(
        target=_child,
        args=(wa_load.consumer, (port, names, 1, 1000, False, expected, sc.warmup), results),
    )
    consumer.start()
    time.sleep(0.3)
    publisher = ctx.Process(
        target=_child, args=(wa_load.publisher, (port, names, sc.size, 100, sc.warmup), results)
    )
    publisher.start()
    outs: list[dict[str, Any]] = []
    while len(outs) < 2:
        r = results.get(timeout=sc.warmup + 180)
        outs.append(r)
        if "published" in r:
            expected.value = r["published"]  # the consumer stops once it has them all
    for p in (consumer, publisher):
        p.join(30)
    errors = [o["error"] for o in outs if "error" in o]
    if errors:
        raise RuntimeError(errors[0])


def measure_idle(broker: DiskBroker, seconds: float) -> Result:
    """What the broker writes with nobody connected (after the scenarios' deletes)."""
    res = Result(Scenario("idle", "idle", 0, 0, 0), broker.name, seconds)
    broker.fs.syncfs()
    dev0, io0 = broker.fs.counters(), proc_io(broker.pid)
    time.sleep(seconds)
    broker.fs.syncfs()
    res.disk = diff(dev0, broker.fs.counters())
    res.io = diff(io0, proc_io(broker.pid))
    return res


#: `warren perf throughput` runs (Warren only: received is the broker's socket reads).
PERF = [
    ("perf-w1000-1k", "1 publisher, window 1,000, 1 KiB, no consumer", "-x 1 -y 0 -c 1000 -s 1024"),
    (
        "perf-persistent",
        "compare.py's persistent scenario: 16 B, window 1,000, ack every 100",
        "-x 1 -y 1 -c 1000 -a 100 -q 1000 -s 16",
    ),
    ("perf-sync-1k", "1 synchronous publisher, 1 KiB, no consumer", "-x 1 -y 0 -c 1 -s 1024"),
]


def measure_perf(broker: DiskBroker, key: str, label: str, args: str, seconds: float) -> Result:
    sc = Scenario(key, "perf", 0, 0, 0)
    res = Result(sc, broker.name, seconds)
    cmd = [sys.executable, "-m", "warren", "perf", "throughput",
           "--uri", f"amqp://guest:guest@127.0.0.1:{broker.port}/", "-p", "--durable",
           "--queue", f"wa-{key}", *args.split(), "-z", str(seconds), "--json"]  # fmt: skip
    broker.fs.syncfs()
    dev0, io0 = broker.fs.counters(), proc_io(broker.pid)
    r = subprocess.run(cmd, capture_output=True, text=True, env=perf_env(), timeout=seconds + 120)
    broker.fs.syncfs()
    res.disk = diff(dev0, broker.fs.counters())
    res.io = diff(io0, proc_io(broker.pid))
    res.received = res.io.get("rchar", 0)
    if r.returncode != 0:
        res.error = (r.stderr.strip().splitlines() or ["failed"])[-1]
        return res
    out = json.loads(r.stdout.strip().splitlines()[-1])
    res.published = int(out.get("published", 0) or 0)
    res.consumed = int(out.get("consumed", 0) or 0)
    res.label = label
    return res


# =====================================================================================
# Report
# =====================================================================================


def mib(n: int) -> str:
    return f"{n / 1048576:,.2f}"


def report(
    results: list[Result], brokers: dict[str, str], skipped: list[str], seconds: float
) -> str:
    lines: list[str] = []
    w = lines.append
    names = [n for n in ("Warren", "RabbitMQ", "LavinMQ") if n in brokers]
    w(f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {seconds:g} s of load per "
      "scenario and broker, on this machine (2 CPUs shared with other work):")  # fmt: skip
    w("")
    for n in names:
        w(f"- {n}: {brokers[n]}")
    for s in skipped:
        w(f"- {s}")
    w("")
    by: dict[tuple[str, str], Result] = {(r.scenario.key, r.broker): r for r in results}
    keys = list(dict.fromkeys(r.scenario.key for r in results if r.scenario.group != "idle"))
    scen = {r.scenario.key: r.scenario for r in results}
    for group, title in GROUPS.items():
        rows = [k for k in keys if scen[k].group == group]
        if not rows:
            continue
        w(f"#### {title}")
        w("")
        head = "| Scenario | " + " | ".join(f"{n} written / received" for n in names)
        head += " | " + " | ".join(f"{n} msg/s" for n in names) + " |"
        w(head)
        w("|---|" + "---:|" * (2 * len(names)))
        for k in rows:
            cells = []
            rates = []
            for n in names:
                r = by.get((k, n))
                if r is None:
                    cells.append("")
                    rates.append("")
                elif r.error and not r.received:
                    cells.append(f"error: {r.error}")
                    rates.append("")
                else:
                    cells.append(f"**{fmt_ratio(r.ratio)}**" + (" (error)" if r.error else ""))
                    done = r.confirmed if r.scenario.window else r.published
                    rates.append(f"{done / r.seconds:,.0f}")
            w(f"| {scen[k].label} | " + " | ".join(cells) + " | " + " | ".join(rates) + " |")
        w("")
    perf = [r for r in results if r.scenario.group == "perf"]
    if perf:
        w(
            "#### `warren perf throughput -p --durable` (Warren; received = the broker's socket reads)"
        )
        w("")
        w("| Run | written / received | msg/s published |")
        w("|---|---:|---:|")
        for r in perf:
            label = r.label or r.scenario.key
            cell = f"error: {r.error}" if r.error else f"**{fmt_ratio(r.ratio)}**"
            w(f"| {label} | {cell} | {r.published / r.seconds:,.0f} |")
        w("")
    w("#### Details")
    w("")
    w("*received*: bytes the clients wrote to their sockets; *body*: message bodies alone; "
      "*written*: the loop device's sectors written, file system journal and metadata "
      "included; *journal*: blocks the ext4 journal logged (from the kernel's average per "
      "transaction, so approximate); *dirtied*: the broker process's `write_bytes` "
      "(pages it dirtied; the journal and RabbitMQ's writes from other OS threads count "
      "too where they belong to the process); *flushes*: cache flushes the device received.")  # fmt: skip
    w("")
    w("| Scenario | Broker | msgs | received MiB | body MiB | written MiB | journal MiB | "
      "journal tx | dirtied MiB | write requests | flushes | written / body |")  # fmt: skip
    w("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        d = r.disk
        wb = d.get("write_bytes", 0)
        w(f"| {r.scenario.key} | {r.broker} | {r.published:,} | {mib(r.received)} | {mib(r.body)} | "
          f"{mib(wb)} | {mib(max(0, d.get('journal_blocks', 0)) * 4096)} | {d.get('journal_tx', 0):,} | "
          f"{mib(r.io.get('write_bytes', 0))} | {d.get('write_ios', 0):,} | {d.get('flushes', 0):,} | "
          f"{fmt_ratio(wb / r.body) if r.body else 'n/a'} |")  # fmt: skip
    return "\n".join(lines) + "\n"


# =====================================================================================
# Main
# =====================================================================================


@contextlib.contextmanager
def running(broker: DiskBroker) -> Iterator[DiskBroker]:
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=6.0, help="load per scenario and broker")
    p.add_argument("--only", action="append", default=[],
                   help="scenario keys or groups (confirms, queues, consumers, stream, reuse, perf, idle, "
                   "fsmodel), "
                   "or a prefix of a key; repeatable")  # fmt: skip
    p.add_argument("--skip-rabbitmq", action="store_true")
    p.add_argument("--skip-warren", action="store_true")
    p.add_argument("--warren-src", help="run Warren from this src directory (a prototype)")
    p.add_argument("--lavinmq", help="a lavinmq binary (else $LAVINMQ, else lavinmq on PATH)")
    p.add_argument("--skip-lavinmq", action="store_true")
    p.add_argument("--image-size", default="2G", help="each loop file system's size")
    p.add_argument("--workdir", default="/tmp", help="where the images and mount points go")
    p.add_argument("--output", help="write the report here instead of stdout")
    return p.parse_args(argv)


def wanted(key: str, group: str, only: list[str]) -> bool:
    return not only or any(o in (key, group) or key.startswith(o) for o in only)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if os.geteuid() != 0:
        print("write_amplification.py needs root (mkfs, mount -o loop)", file=sys.stderr)
        return 2
    todo = [s for s in scenarios() if wanted(s.key, s.group, args.only)]
    perf = [p for p in PERF if wanted(p[0], "perf", args.only)]
    idle = wanted("idle", "idle", args.only)
    makers: list[tuple[str, Any]] = []
    skipped: list[str] = []
    if args.warren_src:
        WarrenDisk.src = Path(args.warren_src).resolve()
    if not args.skip_warren:
        makers.append(("Warren", WarrenDisk))
    if not args.skip_rabbitmq:
        if (RABBITMQ_BIN / "rabbitmq-server").exists():
            makers.append(("RabbitMQ", RabbitMQDisk))
        else:
            skipped.append("RabbitMQ skipped: not installed (`apt-get install -y rabbitmq-server`)")
    if not args.skip_lavinmq:
        binary, why = find_lavinmq(args.lavinmq)
        if binary is None:
            skipped.append(f"LavinMQ skipped: {why} (see bench/README.md for how it is built)")
            log(f"skipping LavinMQ: {why}")
        else:
            makers.append(("LavinMQ", lambda fs, b=binary: LavinMQDisk(fs, b)))
    root = Path(tempfile.mkdtemp(prefix="write-amp-", dir=args.workdir))
    results: list[Result] = []
    versions: dict[str, str] = {}
    model: list[dict[str, Any]] = []
    if wanted("fsmodel", "fsmodel", args.only):
        with LoopFS(root, "model", args.image_size) as fs:
            for key, make, sync, files, size in FS_MODEL:
                model.append(fs_round(fs, key, make, sync, files, size))
                log(f"fs model {key}: {model[-1]['per_round'] / 1024:,.1f} KiB per round")
    with contextlib.ExitStack() as stack:
        live: list[DiskBroker] = []
        for name, make in makers:
            fs = stack.enter_context(LoopFS(root, name.lower(), args.image_size))
            broker = make(fs)
            stack.enter_context(running(broker))
            versions[name] = broker.version() + f"; data dir on ext4 in /dev/{fs.device}"
            live.append(broker)
        for i, sc in enumerate(todo):
            order = live[i % len(live) :] + live[: i % len(live)] if live else []
            for broker in order:
                log(f"{broker.name}: {sc.key}")
                r = measure(broker, sc, args.seconds)
                log(f"  {fmt_ratio(r.ratio)} ({mib(r.disk.get('write_bytes', 0))} MiB written, "
                    f"{mib(r.received)} MiB received){' ' + r.error if r.error else ''}")  # fmt: skip
                results.append(r)
        for key, label, perf_args in perf:
            for broker in live:
                if broker.name == "Warren":
                    log(f"Warren: warren perf {perf_args}")
                    results.append(measure_perf(broker, key, label, perf_args, args.seconds))
        if idle:
            for broker in live:
                results.append(measure_idle(broker, args.seconds))
    shutil.rmtree(root, ignore_errors=True)
    text = report(results, versions, skipped, args.seconds) if results else ""
    if model:  # before the details when there are broker results, else alone
        marker = "#### Details"
        at = text.find(marker)
        table = fs_model_report(model)
        text = text[:at] + table + text[at:] if at >= 0 else table + text
    if args.output:
        Path(args.output).write_text(text)
        log(f"wrote {args.output}")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
