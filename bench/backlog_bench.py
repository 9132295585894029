"""Issue 27's scenarios: consuming from a backlog, with and without acks.

Run through bench/compare.py (``--only backlog`` or one of its parts, see
:data:`GROUPS`), which starts the brokers and writes the section "Backlog and
acks (issue 27)" of docs/benchmarks.md with bench/backlog_report.py.

Every case runs on every broker with two load generators that share no code:

- ``raw``: bench/raw_amqp.py, plain sockets and a hand-written encoder;
- ``perf``: ``warren perf throughput`` from the Warren sources under test.

Cases (:data:`CASES`):

- backlog drain: a queue filled with N 16-byte messages (no consumer), then
  one consumer takes them all: no-ack, a basic.ack (multiple=false) for every
  message, or a multiple ack every 100; prefetch 1,000. The rate is N over the
  time from basic.consume to the last delivery; the broker's RSS is read when
  the queue is empty, full (the drain's start), at the drain's end and at its
  peak in between.
- publisher ahead: the queue starts with ``--ahead`` messages, then one
  publisher (no confirms, as fast as the broker takes them) and one consumer
  (acks, prefetch 1,000) run for ``--duration`` s; the rate is what the
  consumer got after a warm-up, end to end. Multiple acks every 100, and the
  same with a single ack per message.
- persistent: the same with a durable queue, persistent messages and
  publisher confirms (at most 1,000 unconfirmed): each broker syncs before it
  confirms (Warren's and RabbitMQ's defaults; LavinMQ 1.0.1 does not sync).

The broker's CPU per message is its CPU time (/proc/PID/stat, utime + stime;
RabbitMQ: beam.smp) over the measured window divided by the messages consumed
in it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import raw_amqp as raw  # bench/raw_amqp.py
from amqp_brokers import Broker, display, log, perf_env
from perf_runs import perf_cmd, read_status, uri

QUEUE = "backlog-bench"
BODY = 16
PREFETCH = 1000


@dataclass(frozen=True)
class Case:
    key: str
    group: str
    title: str
    #: "drain" (a backlog, then one consumer) or "pair" (publisher and consumer, timed).
    kind: str
    mode: str
    every: int = 100
    persistent: bool = False
    #: Publisher confirms window (pair cases), 0 = none.
    confirm: int = 0

    def perf_consumer_args(self) -> list[str]:
        """`warren perf throughput` options for the consumer's side of this case."""
        if self.mode == raw.NOACK:
            return []
        if self.mode == raw.SINGLE:
            return ["--single-ack", "-q", str(PREFETCH)]
        return ["-a", str(self.every), "-q", str(PREFETCH)]

    def perf_publisher_args(self) -> list[str]:
        out = ["--durable", "-p"] if self.persistent else []
        return out + (["-c", str(self.confirm)] if self.confirm else [])


CASES: tuple[Case, ...] = (
    Case("drain-noack", "backlog-drain", "backlog drain, no-ack", "drain", raw.NOACK),
    Case(
        "drain-single",
        "backlog-drain",
        "backlog drain, a single ack per message (prefetch 1,000)",
        "drain",
        raw.SINGLE,
    ),
    Case(
        "drain-multi100",
        "backlog-drain",
        "backlog drain, multiple ack every 100 (prefetch 1,000)",
        "drain",
        raw.MULTIPLE,
    ),
    Case(
        "ahead-multi100",
        "backlog-ahead",
        "1 publisher ahead + 1 consumer, multiple ack every 100 (prefetch 1,000)",
        "pair",
        raw.MULTIPLE,
    ),
    Case(
        "ahead-single",
        "backlog-single",
        "1 publisher ahead + 1 consumer, a single ack per message (prefetch 1,000)",
        "pair",
        raw.SINGLE,
    ),
    Case(
        "persistent",
        "backlog-persistent",
        "persistent, durable queue with a backlog, confirms (window 1,000) + "
        "multiple ack every 100 (prefetch 1,000)",
        "pair",
        raw.MULTIPLE,
        persistent=True,
        confirm=1000,
    ),
)
CLIENTS_GROUP = "backlog-clients"
GROUPS = ("backlog-drain", "backlog-ahead", "backlog-single", "backlog-persistent", CLIENTS_GROUP)
ALL = "backlog"
KEYS = (ALL, *GROUPS)
GENERATORS = ("raw", "perf")


@dataclass
class Settings:
    backlog: int = 10_000_000
    #: RabbitMQ 3.10's classic queue keeps a backlog in RAM (about 3 KiB per 16-byte message).
    backlog_rabbitmq: int = 1_000_000
    ahead: int = 3_000_000
    duration: float = 10.0
    warmup: float = 2.0
    runs: int = 3
    generators: tuple[str, ...] = GENERATORS
    client_messages: int = 200_000
    profile: bool = False
    pause: float = 1.0

    def backlog_for(self, broker: str) -> int:
        return min(self.backlog, self.backlog_rabbitmq) if broker == "RabbitMQ" else self.backlog

    def ahead_for(self, broker: str) -> int:
        return min(self.ahead, self.backlog_for(broker))


@dataclass
class Result:
    case: str
    broker: str
    generator: str
    run: int
    messages: int = 0
    rate: float | None = None
    cpu_us: float | None = None
    published_rate: float | None = None
    backlog_end: int | None = None
    fill_rate: float | None = None
    rss_kib: dict[str, int] = field(default_factory=dict)
    rss_anon_kib: dict[str, int] = field(default_factory=dict)
    command: str = ""
    error: str | None = None


def cpu_seconds(pid: int | None) -> float:
    if pid is None:
        return float("nan")
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Sampler:
    """The broker's peak VmRSS and RssAnon while a drain runs."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        self.peak: dict[str, int] = {"VmRSS": 0, "RssAnon": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            self._take()

    def _take(self) -> None:
        if self.pid is None:
            return
        status = read_status(self.pid)
        for k in self.peak:
            self.peak[k] = max(self.peak[k], status.get(k, 0))

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._take()


def note_rss(res: Result, pid: int | None, label: str) -> None:
    if pid is None:
        return
    status = read_status(pid)
    res.rss_kib[label] = status.get("VmRSS", 0)
    res.rss_anon_kib[label] = status.get("RssAnon", 0)


# =====================================================================================
# One case on one broker with one generator
# =====================================================================================


def run_case(case: Case, broker: Broker, generator: str, run: int, s: Settings) -> Result:
    res = Result(case.key, broker.name, generator, run)
    log(f"{broker.name}: {case.key} ({generator}, run {run + 1})")
    try:
        if case.kind == "drain":
            _drain(case, broker, generator, s, res)
        else:
            _pair(case, broker, generator, s, res)
    except (
        OSError,
        raw.Closed,
        TimeoutError,
        RuntimeError,
        ValueError,
        KeyError,
        subprocess.TimeoutExpired,
    ) as exc:
        res.error = f"{type(exc).__name__}: {exc}"
    with contextlib.suppress(OSError, raw.Closed):
        c = raw.Conn.open(broker.port)
        c.delete(QUEUE)
        c.close()
    if res.error:
        log(f"{broker.name}: {case.key}: error: {res.error}")
    else:
        cpu = f"{res.cpu_us:.2f} us/msg" if res.cpu_us is not None else "n/a"
        log(f"{broker.name}: {case.key} ({generator}): {res.rate:,.0f} msg/s, broker CPU {cpu}")
    return res


def _drain(case: Case, broker: Broker, generator: str, s: Settings, res: Result) -> None:
    n = res.messages = s.backlog_for(broker.name)
    pid = broker.pid
    raw.fresh_queue(broker.port, QUEUE, durable=False)
    note_rss(res, pid, "empty")
    res.fill_rate = raw.fill(broker.port, QUEUE, n, BODY, persistent=False)
    note_rss(res, pid, "start")
    cpu0 = cpu_seconds(pid)
    with Sampler(pid) as sampler:
        if generator == "raw":
            got = raw.drain(broker.port, QUEUE, n, case.mode, case.every, PREFETCH)
            res.rate = got["rate"]
            res.command = (
                f"raw_amqp.drain(mode={case.mode!r}, every={case.every}, prefetch={PREFETCH})"
            )
        else:
            res.rate = _perf_drain(case, broker, n, res)
    cpu = cpu_seconds(pid) - cpu0
    note_rss(res, pid, "end")
    res.rss_kib["peak"] = sampler.peak["VmRSS"]
    res.rss_anon_kib["peak"] = sampler.peak["RssAnon"]
    res.cpu_us = cpu / n * 1e6 if pid else None


def _perf_drain(case: Case, broker: Broker, n: int, res: Result) -> float:
    """`warren perf throughput --drain`: one consumer takes the backlog the queue
    holds and stops; its consume_rate is counted up to its last delivery."""
    cmd = perf_cmd(
        "throughput",
        "--uri",
        uri(broker.port),
        "-x",
        "0",
        "-y",
        "1",
        "--queue",
        QUEUE,
        *case.perf_consumer_args(),
        "--drain",
        "--json",
    )
    res.command = display(cmd)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=perf_env(), timeout=3600)
    summary = _perf_json(proc.stdout, proc.stderr[-2000:])
    if summary["consumed"] < n:
        raise RuntimeError(f"warren perf consumed {summary['consumed']:,} of {n:,}")
    return float(summary["consume_rate"])


def _perf_json(out: str, err: str) -> dict[str, Any]:
    lines = out.strip().splitlines()
    try:
        return dict(json.loads(lines[-1]))
    except (IndexError, json.JSONDecodeError):
        tail = " | ".join(err.strip().splitlines()[-3:])
        raise RuntimeError(f"warren perf printed no summary: {tail}") from None


def _pair(case: Case, broker: Broker, generator: str, s: Settings, res: Result) -> None:
    ahead = s.ahead_for(broker.name)
    pid = broker.pid
    raw.fresh_queue(broker.port, QUEUE, durable=case.persistent)
    res.fill_rate = raw.fill(broker.port, QUEUE, ahead, BODY, persistent=case.persistent)
    note_rss(res, pid, "start")
    if generator == "raw":
        _pair_raw(case, broker, s, res)
    else:
        _pair_perf(case, broker, s, res)
    note_rss(res, pid, "end")
    with contextlib.suppress(OSError, raw.Closed):
        c = raw.Conn.open(broker.port)
        res.backlog_end = c.depth(QUEUE)
        c.close()


def _pair_raw(case: Case, broker: Broker, s: Settings, res: Result) -> None:
    win = raw.Window(time.monotonic() + 1.0, s.duration, s.warmup)
    cpu: list[float] = []

    def during(w: raw.Window) -> None:
        for t in (w.measure_from, w.end):
            delay = t - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            cpu.append(cpu_seconds(broker.pid))

    out = raw.run_pair(
        {
            "port": broker.port,
            "queue": QUEUE,
            "size": BODY,
            "persistent": case.persistent,
            "window": case.confirm,
        },
        {
            "port": broker.port,
            "queue": QUEUE,
            "mode": case.mode,
            "every": case.every,
            "prefetch": PREFETCH,
        },
        win,
        during,
    )
    res.command = (
        f"raw_amqp.run_pair(persistent={case.persistent}, confirm window={case.confirm}, "
        f"ack={case.mode!r}, every={case.every}, prefetch={PREFETCH})"
    )
    if out.errors:
        raise RuntimeError("; ".join(out.errors))
    consumed = out.consumed["measured"]
    res.messages = consumed
    res.rate = consumed / s.duration
    res.published_rate = out.published["measured"] / s.duration
    if consumed and len(cpu) == 2 and broker.pid:
        res.cpu_us = (cpu[1] - cpu[0]) / consumed * 1e6


def _pair_perf(case: Case, broker: Broker, s: Settings, res: Result) -> None:
    cmd = perf_cmd(
        "throughput",
        "--uri",
        uri(broker.port),
        "-x",
        "1",
        "-y",
        "1",
        "--queue",
        QUEUE,
        *case.perf_publisher_args(),
        *case.perf_consumer_args(),
        "-z",
        f"{s.duration + s.warmup:g}",
        "--keep",
        "--json",
    )
    res.command = display(cmd)
    cpu0 = cpu_seconds(broker.pid)
    r = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        env=perf_env(),
        timeout=s.duration + 300,
        check=False,
    )
    cpu = cpu_seconds(broker.pid) - cpu0
    summary = _perf_json(r.stdout, r.stderr)
    if r.returncode != 0:
        raise RuntimeError(f"warren perf exit status {r.returncode}: {summary.get('errors')}")
    res.messages = int(summary["consumed"])
    res.rate = float(summary["consume_rate"])
    res.published_rate = float(summary["publish_rate"])
    if res.messages and broker.pid:
        res.cpu_us = cpu / res.messages * 1e6


# =====================================================================================
# Real clients draining a backlog (bench/client_drain.py)
# =====================================================================================

CLIENTS = ("pika", "aio-pika", "kombu")


def run_client(client: str, broker: Broker, run: int, s: Settings) -> Result:
    res = Result(f"client-{client}", broker.name, client, run)
    n = res.messages = min(s.client_messages, s.backlog_for(broker.name))
    log(f"{broker.name}: {client} drains {n:,} (run {run + 1})")
    try:
        raw.fresh_queue(broker.port, QUEUE, durable=False)
        res.fill_rate = raw.fill(broker.port, QUEUE, n, BODY, persistent=False)
        cmd = [
            sys.executable,
            str(Path(__file__).with_name("client_drain.py")),
            "--client",
            client,
            "--port",
            str(broker.port),
            "--queue",
            QUEUE,
            "--count",
            str(n),
            "--prefetch",
            str(PREFETCH),
        ]
        res.command = " ".join(["python", "bench/client_drain.py", *cmd[2:]])
        cpu0 = cpu_seconds(broker.pid)
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
        cpu = cpu_seconds(broker.pid) - cpu0
        if r.returncode != 0:
            raise RuntimeError(" | ".join(r.stderr.strip().splitlines()[-3:]))
        got = json.loads(r.stdout.strip().splitlines()[-1])
        res.rate = float(got["rate"])
        res.published_rate = float(got["client_cpu"])  # the client's CPU share, see the report
        if broker.pid:
            res.cpu_us = cpu / n * 1e6
    except (
        OSError,
        raw.Closed,
        TimeoutError,
        RuntimeError,
        ValueError,
        KeyError,
        subprocess.TimeoutExpired,
    ) as exc:
        res.error = f"{type(exc).__name__}: {exc}"
        log(f"{broker.name}: {client}: error: {res.error}")
    with contextlib.suppress(OSError, raw.Closed):
        c = raw.Conn.open(broker.port)
        c.delete(QUEUE)
        c.close()
    return res


# =====================================================================================
# Profiles (py-spy, Warren only)
# =====================================================================================


@contextlib.contextmanager
def py_spy(pid: int | None, out: Path) -> Iterator[None]:
    """py-spy record --native on ``pid`` while the block runs (raw output)."""
    exe = Path(sys.executable).parent / "py-spy"
    if pid is None or not exe.exists():
        log("no profile: py-spy not found (pip install py-spy) or no pid")
        yield
        return
    proc = subprocess.Popen(
        [str(exe), "record", "--native", "-p", str(pid), "-r", "200", "-f", "raw", "-o", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1.0)  # attached
    try:
        yield
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def profile_case(case: Case, broker: Broker, s: Settings, tmp: Path) -> dict[str, Any]:
    """One extra raw run of ``case`` on Warren under py-spy: the share of samples per
    stage of the hot path (bench/profile_hot_path.py's stages)."""
    import profile_hot_path  # bench/profile_hot_path.py

    out = tmp / f"{case.key}.txt"
    res = Result(case.key, broker.name, "raw", -1)
    with py_spy(broker.pid, out):
        if case.kind == "drain":
            _drain(case, broker, "raw", s, res)
        else:
            _pair(case, broker, "raw", s, res)
    with contextlib.suppress(OSError, raw.Closed):
        c = raw.Conn.open(broker.port)
        c.delete(QUEUE)
        c.close()
    if not out.exists():
        return {}
    per_stage, total = profile_hot_path.charge(out)
    return {
        "case": case.key,
        "rate": res.rate,
        "cpu_us": res.cpu_us,
        "samples": total,
        "stages": {k: v / total for k, v in per_stage.most_common()} if total else {},
    }


# =====================================================================================
# The whole series
# =====================================================================================


@dataclass
class Series:
    settings: Settings
    results: list[Result] = field(default_factory=list)
    profiles: list[dict[str, Any]] = field(default_factory=list)
    load: list[tuple[float, float, float]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "settings": asdict(self.settings),
            "results": [asdict(r) for r in self.results],
            "profiles": self.profiles,
            "load": self.load,
        }


def selected_cases(selected: set[str]) -> list[Case]:
    return [c for c in CASES if ALL in selected or c.group in selected]


def run_series(
    selected: set[str],
    brokers: list[Broker],
    s: Settings,
    tmp: Path,
    progress: Callable[[Series], None] = lambda _series: None,
) -> Series:
    """Every selected case, ``s.runs`` times, on every broker with every generator; the
    broker order rotates from one run to the next. ``progress`` is called after each
    result (compare.py saves the series so far)."""
    series = Series(s)
    series.load.append(os.getloadavg())
    names = [b.name for b in brokers]
    by_name = {b.name: b for b in brokers}
    clients = ALL in selected or CLIENTS_GROUP in selected
    n = 0

    def order() -> list[Broker]:
        nonlocal n
        n += 1
        k = (n - 1) % len(names)
        return [by_name[x] for x in names[k:] + names[:k]]

    # Runs outermost: a series cut short still has every case.
    for run in range(s.runs):
        for case in selected_cases(selected):
            for generator in s.generators:
                for broker in order():
                    series.results.append(run_case(case, broker, generator, run, s))
                    series.load.append(os.getloadavg())
                    progress(series)
                    time.sleep(s.pause)
        for client in CLIENTS if clients else ():
            for broker in order():
                series.results.append(run_client(client, broker, run, s))
                series.load.append(os.getloadavg())
                progress(series)
    if s.profile and "Warren" in by_name:
        for case in selected_cases(selected):
            try:
                series.profiles.append(profile_case(case, by_name["Warren"], s, tmp))
            except (OSError, raw.Closed, TimeoutError, RuntimeError, ValueError) as exc:
                log(f"Warren: profile of {case.key} failed: {type(exc).__name__}: {exc}")
            progress(series)
    return series
