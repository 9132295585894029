"""Warren against RabbitMQ and LavinMQ with `warren perf`; writes docs/benchmarks.md.

    .venv/bin/python bench/compare.py                      # 15 s per scenario and broker
    .venv/bin/python bench/compare.py --duration 10 --only ack100 --only fanout10
    .venv/bin/python bench/compare.py --skip-rabbitmq --skip-lavinmq   # Warren alone
    .venv/bin/python bench/compare.py --lavinmq /path/to/lavinmq

What it does (the brokers are in bench/amqp_brokers.py):

1. RabbitMQ: installs Debian's rabbitmq-server if it is missing (apt-get), starts
   it on its default port 5672 with ``rabbitmq-server -detached`` unless it is
   already running, and stops it again at the end if it started it.
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
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import resource
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

import equal_rate  # noqa: E402  bench/equal_rate.py
from amqp_brokers import (  # noqa: E402  bench/amqp_brokers.py, beside this script
    LAVINMQ_PORT,
    WARREN_PORT,
    Broker,
    LavinMQ,
    RabbitMQ,
    Warren,
    display,
    find_lavinmq,
    log,
    perf_env,
    sh,
)

from warren import __version__ as WARREN_VERSION  # noqa: E402
from warren.amqp import spec  # noqa: E402
from warren.amqp.frames import PROTOCOL_HEADER, method_frame  # noqa: E402
from warren.perf.client import message_template  # noqa: E402


@dataclass(frozen=True)
class Scenario:
    key: str
    title: str
    args: tuple[str, ...]


THROUGHPUT: tuple[Scenario, ...] = (
    Scenario("noack", "1 publisher, 1 consumer, no-ack, 16-byte bodies", ("-x", "1", "-y", "1")),
    Scenario(
        "ack100",
        "manual ack every 100 messages, prefetch 1,000",
        ("-x", "1", "-y", "1", "-a", "100", "-q", "1000"),
    ),
    Scenario(
        "confirm1000",
        "publisher confirms, at most 1,000 unconfirmed",
        ("-x", "1", "-y", "1", "-c", "1000"),
    ),
    Scenario(
        "persistent",
        "persistent messages to a durable queue, confirms (window 1,000), "
        "manual ack every 100 (prefetch 1,000)",
        ("-x", "1", "-y", "1", "-p", "--durable", "-c", "1000", "-a", "100", "-q", "1000"),
    ),
    Scenario("body4k", "4 KiB bodies, no-ack", ("-x", "1", "-y", "1", "-s", "4096")),
    Scenario("4p4c", "4 publishers, 4 consumers on one queue, no-ack", ("-x", "4", "-y", "4")),
    Scenario(
        "fanout10",
        "fanout exchange to 10 queues, one consumer each, no-ack",
        ("-x", "1", "-y", "1", "--queues", "10"),
    ),
)
MEMORY = ("connections1000", "queues10000")
CEILING = "ceiling"
QUEUE_LENGTH = "queuelength"
ALL_KEYS = (CEILING, *MEMORY, QUEUE_LENGTH, *(s.key for s in THROUGHPUT), equal_rate.KEY)


# =====================================================================================
# Small helpers
# =====================================================================================


def read_status(pid: int) -> dict[str, int]:
    out: dict[str, int] = {}
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "VmHWM"):
                out[key] = int(value.split()[0])
    return out


def mib(kib: int | None) -> str:
    return "n/a" if kib is None else f"{kib / 1024:,.1f} MiB"


def uri(port: int) -> str:
    return f"amqp://guest:guest@127.0.0.1:{port}/"


def _sections(text: str, marker: str = "## ") -> list[tuple[str, str]]:
    """(``marker`` heading, the text up to the next one); the first has heading ""."""
    parts: list[tuple[str, str]] = []
    heading, lines = "", []
    for line in text.splitlines(keepends=True):
        if line.startswith(marker):
            parts.append((heading, "".join(lines)))
            heading, lines = line.strip(), []
        lines.append(line)
    parts.append((heading, "".join(lines)))
    return parts


def keep_other_sections(generated: str, previous: str) -> str:
    """The generated report plus the sections of the previous file it does not
    write itself (MQTT, streams, Spark, the hot-path profile: other scripts' or
    hand-written), inserted before "## Observations" in their old order."""
    ours = {h for h, _ in _sections(generated)}
    kept = [body for h, body in _sections(previous) if h and h not in ours]
    if not kept:
        return generated
    extra = "".join(body if body.endswith("\n\n") else body.rstrip("\n") + "\n\n" for body in kept)
    at = generated.find("\n## Observations")
    if at < 0:
        return generated.rstrip("\n") + "\n\n" + extra.rstrip("\n")
    return generated[: at + 1] + extra + generated[at + 1 :]


def perf_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "warren", "perf", *args]


# =====================================================================================
# A stand-in broker for the client's ceiling
# =====================================================================================


class StandIn:
    """Speaks just enough AMQP for `warren perf throughput`: handshake, declarations,
    consume. After that it discards everything a publisher sends (without parsing it;
    it only looks for connection.close) or, for a consumer, writes pre-built
    basic.deliver frames as fast as the socket takes them. Measures the client alone."""

    def __init__(self, body_size: int = 16) -> None:
        self.body_size = body_size
        self.sock = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.port = self.sock.getsockname()[1]
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._stop = True
        self.sock.close()

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError, EOFError), conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            reader = _FrameReader(conn)
            if reader.read_exact(8) != PROTOCOL_HEADER:
                return
            conn.sendall(
                method_frame(0, spec.ConnectionStart(server_properties={"product": "stand-in"}))
            )
            while True:
                ch, method = reader.method()
                reply: spec.Method | None = None
                if isinstance(method, spec.ConnectionStartOk):
                    reply = spec.ConnectionTune(channel_max=2047, frame_max=131072, heartbeat=0)
                    ch = 0
                elif isinstance(method, spec.ConnectionTuneOk):
                    continue
                elif isinstance(method, spec.ConnectionOpen):
                    reply = spec.ConnectionOpenOk()
                elif isinstance(method, spec.ChannelOpen):
                    reply = spec.ChannelOpenOk()
                    conn.sendall(method_frame(ch, reply))
                    # A publisher's channel: from here on only discard.
                    self._discard(conn, reader.take_rest())
                    return
                if reply is not None:
                    conn.sendall(method_frame(ch, reply))

    def _discard(self, conn: socket.socket, pending: bytes) -> None:
        """Throw bytes away; answer what a perf client may still ask (declares, consume, close).

        Every request a perf client makes after the handshake is a synchronous one
        (it waits for the reply before sending anything else), so it is always at the
        very end of what has arrived: only the last bytes of each read are searched.
        """
        data = pending
        tail = b""
        while True:
            if data:
                if len(data) >= _TAIL:
                    window, seen = data[-_TAIL:], 0
                else:  # contiguous with the previous read's tail
                    window, seen = tail + data, len(tail)
                if self._answer(conn, window, seen):
                    return
                tail = window[-_TAIL:]
            data = conn.recv(1 << 20)
            if not data:
                return

    def _answer(self, conn: socket.socket, window: bytes, seen: int) -> bool:
        """Reply to requests found in ``window``; True once the connection is closed.

        The first ``seen`` bytes were searched before (the previous read's tail,
        kept for markers split across reads): matches that lie wholly inside
        them were answered already.
        """
        for index, reply in _REPLIES.items():
            marker = struct.pack(">I", index)
            at = window.find(marker, max(0, seen - 3))
            while at >= 7:
                ftype, ch, _size = struct.unpack_from(">BHI", window, at - 7)
                if ftype == 1 and ch <= 1:
                    if index == spec.ConnectionClose.INDEX:
                        conn.sendall(method_frame(0, spec.ConnectionCloseOk()))
                        return True
                    if index == spec.BasicConsume.INDEX:
                        conn.sendall(method_frame(ch, spec.BasicConsumeOk(consumer_tag="ctag")))
                        self._flood(conn, ch)
                        return True
                    assert reply is not None
                    conn.sendall(method_frame(ch, reply))
                at = window.find(marker, at + 1)
        return False

    def _flood(self, conn: socket.socket, ch: int) -> None:
        """Deliveries as fast as the consumer reads them, stamped per batch, until it closes."""
        closed = threading.Event()

        def watch() -> None:
            with contextlib.suppress(OSError):
                while True:
                    data = conn.recv(1 << 16)
                    if not data or struct.pack(">I", spec.ConnectionClose.INDEX) in data:
                        break
            closed.set()

        threading.Thread(target=watch, daemon=True).start()
        deliver = method_frame(
            ch,
            spec.BasicDeliver(
                consumer_tag="ctag", delivery_tag=1, exchange="", routing_key="perf-test"
            ),
        )
        head, tail = message_template(ch, "", "perf-test", self.body_size, False, 131072)
        # message_template builds a basic.publish; swap its method frame for the deliver.
        publish_len = len(method_frame(ch, spec.BasicPublish(routing_key="perf-test")))
        head = deliver + head[publish_len:]
        batch = 1024
        parts = [head, *([tail + head] * (batch - 1)), tail]
        with contextlib.suppress(OSError):
            while not closed.is_set():
                conn.sendall(struct.pack(">Q", time.monotonic_ns()).join(parts))
        with contextlib.suppress(OSError):
            conn.sendall(method_frame(0, spec.ConnectionCloseOk()))


#: How many trailing bytes of each read the stand-in searches for requests.
_TAIL = 512

_REPLIES: dict[int, spec.Method | None] = {
    spec.ConnectionClose.INDEX: None,
    spec.BasicConsume.INDEX: None,
    spec.QueueDeclare.INDEX: spec.QueueDeclareOk(queue="perf-test"),
    spec.QueueDelete.INDEX: spec.QueueDeleteOk(),
    spec.QueueBind.INDEX: spec.QueueBindOk(),
    spec.ExchangeDeclare.INDEX: spec.ExchangeDeclareOk(),
    spec.ExchangeDelete.INDEX: spec.ExchangeDeleteOk(),
    spec.BasicQos.INDEX: spec.BasicQosOk(),
}


class _FrameReader:
    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.buf = b""

    def read_exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            data = self.conn.recv(65536)
            if not data:
                raise EOFError
            self.buf += data
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def method(self) -> tuple[int, spec.Method]:
        while True:
            ftype, ch, size = struct.unpack(">BHI", self.read_exact(7))
            payload = self.read_exact(size + 1)[:-1]
            if ftype == 1:
                return ch, spec.decode_method(payload)

    def take_rest(self) -> bytes:
        rest, self.buf = self.buf, b""
        return rest


# =====================================================================================
# Running perf
# =====================================================================================


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


# =====================================================================================
# The report
# =====================================================================================


def machine_info() -> dict[str, str]:
    cpu = "unknown"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = "unknown"
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal"):
                mem = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
                break
    return {
        "CPUs (nproc)": str(os.cpu_count()),
        "CPU model": cpu,
        "Memory": mem,
        "Kernel": platform.release(),
        "OS": _os_name(),
    }


def _os_name() -> str:
    with contextlib.suppress(OSError), open("/etc/os-release") as f:
        for line in f:
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip().strip('"')
    return platform.platform()


def _build() -> str:
    """Whether the broker runs compiled (mypyc) or pure Python, as it reports itself."""
    out = sh([sys.executable, "-m", "warren", "--version"]).stdout.strip()
    return out[out.find("(") + 1 : out.rfind(")")] if "(" in out else "build unknown"


def warren_versions() -> dict[str, str]:
    commit = sh(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"]).stdout.strip()
    dirty = sh(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"]).stdout
    try:
        import uvloop

        loop = f"uvloop {uvloop.__version__}"
    except ImportError:
        loop = "asyncio default loop"
    return {
        "Python": platform.python_version() + f" ({platform.python_implementation()})",
        "Warren": f"{WARREN_VERSION} (git {commit or 'unknown'}"
        + (", with uncommitted changes" if dirty.strip() else "")
        + f"), {_build()}, event loop: {loop}",
    }


def fmt_rate(x: float | None) -> str:
    return "n/a" if x is None else f"{x:,.0f}"


def fmt_ms(x: float | None) -> str:
    if x is None:
        return "n/a"
    return f"{x:,.2f}" if x < 100 else f"{x:,.0f}"


def _and(names: list[str]) -> str:
    """'A', 'A and B', 'A, B and C'."""
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def ratio(a: float | None, b: float | None) -> str:
    if not a or not b:
        return "n/a"
    r = a / b
    return f"{r:.3f}×" if r < 0.1 else f"{r:.2f}×"


def _rate(run: Run | None, key: str) -> float | None:
    if run is None or run.result is None:
        return None
    value = run.result.get(key)
    return float(value) if value is not None else None


def _lat(run: Run | None, key: str) -> float | None:
    if run is None or run.result is None or not run.result.get("latency_ms"):
        return None
    return float(run.result["latency_ms"][key])


@dataclass
class Report:
    duration: float
    machine: dict[str, str]
    versions: dict[str, str]
    started: str
    #: The brokers measured, Warren first; ratios are Warren / each of the others.
    names: list[str] = field(default_factory=lambda: ["Warren"])
    cpu_notes: list[str] = field(default_factory=list)
    #: How each broker other than Warren was treated before the memory scenarios.
    memory_notes: list[str] = field(default_factory=list)
    qlen_note: str = ""
    #: Facts found while measuring memory (e.g. a limit that made a run fail).
    memory_notes_after: list[str] = field(default_factory=list)
    broker_commands: dict[str, str] = field(default_factory=dict)
    ceiling: dict[str, Run] = field(default_factory=dict)
    memory: dict[str, dict[str, Run]] = field(default_factory=dict)
    idle_rss: dict[str, dict[str, int]] = field(default_factory=dict)
    throughput: dict[str, dict[str, Run]] = field(default_factory=dict)
    queue_length: dict[str, dict[str, float]] = field(default_factory=dict)
    order: dict[str, list[str]] = field(default_factory=dict)
    #: equal_rate.CASES key -> broker -> run (`--only latency`).
    latency: dict[str, dict[str, Run]] = field(default_factory=dict)
    latency_seconds: float = 8.0

    def brokers(self) -> list[str]:
        return self.names

    @property
    def others(self) -> list[str]:
        """The brokers Warren is compared with."""
        return self.names[1:]

    def render(self) -> str:
        out: list[str] = []
        w = out.append
        where = "on the same machine" if self.others else "on this machine"
        w(f"# Benchmarks: {_and(self.names)} {where}")
        w("")
        w(
            f"Generated by `bench/compare.py` on {self.started} ({self.duration:g} s per "
            "throughput scenario and broker). Every number below comes from `warren perf`, "
            "run against each broker one after the other on the same machine; the broker "
            "order rotates from one scenario to the next. These are the starting point "
            "for optimisation, not a verdict: where Warren is behind, the tables say so."
        )
        w("")
        w("Regenerate with:")
        w("")
        w("```sh")
        w(f".venv/bin/python bench/compare.py --duration {self.duration:g}")
        w("```")
        w("")
        w(
            "LavinMQ is measured when the script finds a binary (`--lavinmq PATH`, "
            "`$LAVINMQ`, or `lavinmq` on `PATH`); see bench/README.md."
        )
        w("")
        w("## Machine and versions")
        w("")
        w("| | |")
        w("|---|---|")
        for k, v in {**self.machine, **self.versions}.items():
            w(f"| {k} | {v} |")
        w("")
        w(
            "Brokers, perf publishers and perf consumers all share these CPUs: each perf "
            f"publisher and consumer is its own process, {', '.join(self.cpu_notes)}. With "
            "few CPUs the client processes take CPU time that a broker could otherwise use; "
            "every broker runs under the same conditions."
        )
        w("")
        w("Brokers as started for the runs:")
        w("")
        for name, cmd in self.broker_commands.items():
            w(f"- {name}: {cmd}")
        w("")
        self._render_summary(w)
        self._render_ceiling(w)
        self._render_memory(w)
        self._render_queue_length(w)
        equal_rate.render(w, self.latency, self.names, self.latency_seconds)
        self._render_observations(w)
        self._render_throughput(w)
        w("## How to read the numbers")
        w("")
        w(
            "- *published* is the rate at which the perf publishers got their messages "
            "into the broker's socket; *consumed* is the rate at which the perf consumers "
            "received them. In a fixed-duration run without confirms a broker may accept "
            "messages faster than it delivers them: the difference becomes a queue backlog, "
            "and latency then measures that backlog."
        )
        w(
            "- Latency is from the timestamp the publisher writes into the first 8 bytes "
            "of each body (one clock, `CLOCK_MONOTONIC`, for all processes) to the "
            "consumer's read of the message; percentiles come from a log-linear histogram "
            "(about 1.6 % resolution)."
        )
        if self.others:
            w(
                "- A ratio is Warren / the other broker ("
                + ", ".join(f"Warren / {b}" for b in self.others)
                + "). For the consume rate (end-to-end throughput) above 1 means Warren is "
                "faster; for latency above 1 means Warren's latency is higher."
            )
        w(
            "- Each figure is one run. Runs in which a backlog builds (see Observations) "
            "depend on timing, the split of the CPUs between broker and clients included, "
            "and vary noticeably from one run to the next; rerun a scenario "
            "(`--only KEY`) before drawing conclusions from a small difference."
        )
        w(
            "- Memory: VmRSS is the resident set; RssAnon its anonymous part (heap), "
            "both from `/proc/<pid>/status` (RabbitMQ: the `beam.smp` process)."
        )
        w("")
        return "\n".join(out)

    def _render_summary(self, w: Callable[[str], None]) -> None:
        if not self.throughput:
            return
        w("## Summary")
        w("")
        if not self.others:
            w("| Scenario | Warren consumed msg/s | p50 ms | p99 ms |")
            w("|---|---:|---:|---:|")
        else:
            w(
                "| Scenario | "
                + " | ".join(f"{b} msg/s" for b in self.names)
                + " | "
                + " | ".join(f"Warren / {b}" for b in self.others)
                + " |"
            )
            w("|---|" + "---:|" * (len(self.names) + len(self.others)))
        for sc in THROUGHPUT:
            runs = self.throughput.get(sc.key)
            if not runs:
                continue
            wr = runs.get("Warren")
            if not self.others:
                w(
                    f"| {sc.title} | {fmt_rate(_rate(wr, 'consume_rate'))} | "
                    f"{fmt_ms(_lat(wr, 'p50'))} | {fmt_ms(_lat(wr, 'p99'))} |"
                )
            else:
                rates = {b: _rate(runs.get(b), "consume_rate") for b in self.names}
                cells = [fmt_rate(rates[b]) for b in self.names]
                cells += [ratio(rates["Warren"], rates[b]) for b in self.others]
                w(f"| {sc.title} | " + " | ".join(cells) + " |")
        w("")
        if not self.memory:
            return
        w("| Memory (broker VmRSS) | " + " | ".join(self.brokers()) + " |")
        w("|---|" + "---:|" * len(self.brokers()))
        labels = {
            "connections1000": "with 1,000 idle connections open",
            "queues10000": "with 10,000 queues declared",
        }
        for key in MEMORY:
            runs = self.memory.get(key)
            if not runs:
                continue
            cells = []
            for name in self.brokers():
                run = runs.get(name)
                rss = ((run.result or {}).get("rss_kib") or {}) if run else {}
                cells.append(mib(rss.get("VmRSS")))
            w(f"| {labels[key]} | " + " | ".join(cells) + " |")
        w("")

    def _render_ceiling(self, w: Callable[[str], None]) -> None:
        if not self.ceiling:
            return
        w(f"## The client's ceiling (`--only {CEILING}`)")
        w("")
        w(
            "To make sure the perf client is not what limits the numbers, one perf "
            "publisher and one perf consumer ran against a stand-in broker (in "
            "`bench/compare.py`) that completes the handshake and then discards "
            "everything it receives without parsing it, or writes pre-built "
            "basic.deliver frames as fast as the consumer reads them. The same 16-byte "
            "bodies as in the main scenarios; also a publisher into a real broker's "
            "exchange with no bindings (the broker parses and drops every message)."
        )
        w("")
        w("| Measurement | msg/s | client CPU | command |")
        w("|---|---:|---:|---|")
        for label, run in self.ceiling.items():
            r = run.result or {}
            cpu = r.get("client_cpu", {})
            if "consumer" in label:
                rate = r.get("consume_rate")
                cpus = cpu.get("consumers", [])
            else:
                rate = r.get("publish_rate")
                cpus = cpu.get("publishers", [])
            cpu_s = " ".join(f"{c:.0%}" for c in cpus) or "n/a"
            shown = fmt_rate(rate) if not run.error else f"error: {run.error}"
            w(f"| {label} | {shown} | {cpu_s} | `{display(run.command)}` |")
        w("")
        w("Client CPU is the worker process's CPU time divided by its run time.")
        pub_max, con_max = self._per_process_peaks()
        sink = _rate(self.ceiling.get("publisher → stand-in sink"), "publish_rate")
        source = _rate(self.ceiling.get("consumer ← stand-in source"), "consume_rate")
        if pub_max and con_max and sink and source:
            w(
                f"The fastest any single perf publisher went against a real broker in the "
                f"scenarios below was {pub_max:,.0f} msg/s ({pub_max / sink:.1%} of its "
                f"ceiling); the fastest single consumer {con_max:,.0f} msg/s "
                f"({con_max / source:.1%} of its ceiling)."
            )
        w("")

    def _per_process_peaks(self) -> tuple[float, float]:
        """Highest per-publisher and per-consumer rates over all throughput runs."""
        pub = con = 0.0
        for runs in self.throughput.values():
            for run in runs.values():
                r = run.result
                if not r:
                    continue
                params = r.get("params", {})
                publishers = max(1, int(params.get("publishers", 1)))
                consumers = max(1, len(r.get("client_cpu", {}).get("consumers", [])) or 1)
                pub = max(pub, float(r.get("publish_rate", 0)) / publishers)
                con = max(con, float(r.get("consume_rate", 0)) / consumers)
        return pub, con

    def _render_observations(self, w: Callable[[str], None]) -> None:
        """Facts computed from the results (no hand-written claims)."""
        if not self.throughput:
            return
        lines: list[str] = []
        for other in self.others:
            ahead: list[str] = []
            behind: list[str] = []
            for sc in THROUGHPUT:
                runs = self.throughput.get(sc.key) or {}
                a = _rate(runs.get("Warren"), "consume_rate")
                b = _rate(runs.get(other), "consume_rate")
                if a and b:
                    (ahead if a >= b else behind).append(f"{sc.title} ({ratio(a, b)})")
            if ahead:
                lines.append(f"Warren delivers faster than {other} in: " + "; ".join(ahead) + ".")
            if behind:
                lines.append(f"Warren is behind {other} in: " + "; ".join(behind) + ".")
        for sc in THROUGHPUT:
            for name, run in (self.throughput.get(sc.key) or {}).items():
                r = run.result
                if not r:
                    continue
                fanout = max(1, len(r.get("queues", [])))
                offered = float(r["publish_rate"]) * fanout
                got = float(r["consume_rate"])
                if offered > 1.2 * got:
                    lines.append(
                        f"{name}, {sc.title}: accepted {r['publish_rate']:,.0f} msg/s"
                        + (f" (× {fanout} queues)" if fanout > 1 else "")
                        + f" but delivered {got:,.0f} msg/s, so a backlog grew during the "
                        "run and its latency mostly measures that backlog."
                    )
        if lines:
            w("## Observations")
            w("")
            for line in lines:
                w(f"- {line}")
            w("")

    def _render_queue_length(self, w: Callable[[str], None]) -> None:
        if not self.queue_length:
            return
        w(f"## Queue length and broker RAM (`--only {QUEUE_LENGTH}`)")
        w("")
        w(
            "`bench/queue_memory.py`: one raw connection publishes persistent 16-byte "
            "messages into one durable queue with no consumer, in large pre-encoded batches, "
            "until the queue holds them all; RssAnon is the broker's anonymous memory "
            "(file-backed pages of mapped segments are page cache and do not count). "
            f"{self.qlen_note}"
        )
        w("")
        w("| Broker | messages | RssAnon empty | RssAnon full | growth | publish msg/s |")
        w("|---|---:|---:|---:|---:|---:|")
        for b in self.brokers():
            r = self.queue_length.get(b)
            if not r:
                continue
            w(
                f"| {b} | {int(r['messages']):,} | {r['rss_anon_empty_mb']:.1f} MiB | "
                f"{r['rss_anon_full_mb']:.1f} MiB | {r['growth_mb']:.1f} MiB | "
                f"{r['publish_rate']:,.0f} |"
            )
        w("")

    def _render_memory(self, w: Callable[[str], None]) -> None:
        if not self.memory and not self.idle_rss:
            return
        w("## Memory")
        w("")
        w(
            "Measured before anything else, so on fresh brokers: "
            + "; ".join(self.memory_notes)
            + ". *Before* is the broker's idle footprint just before the "
            "perf command, *with* is while the connections are open / after the queues "
            "were declared (after a 1 s settle)."
        )
        w("")
        for key in MEMORY:
            runs = self.memory.get(key)
            if not runs:
                continue
            if key == "connections1000":
                w(f"### 1,000 idle connections, one channel each (`--only {key}`)")
            else:
                w(
                    f"### 10,000 transient queues, declared pipelined on one channel (`--only {key}`)"
                )
            w("")
            timing = "open s" if key == "connections1000" else "declare s"
            w(
                f"| Broker | {timing} | VmRSS before | VmRSS with | RssAnon before | "
                "RssAnon with | VmRSS per item |"
            )
            w("|---|---:|---:|---:|---:|---:|---:|")
            for b in self.brokers():
                run = runs.get(b)
                if run is None:
                    continue
                r = run.result or {}
                before = r.get("rss_kib_before") or {}
                after = r.get("rss_kib") or {}
                secs = r.get("open_s") if key == "connections1000" else r.get("declare_s")
                n = r.get("connections") if key == "connections1000" else r.get("queues")
                per = "n/a"
                if before.get("VmRSS") and after.get("VmRSS") and n:
                    per = f"{(after['VmRSS'] - before['VmRSS']) / n:,.1f} KiB"
                if run.error:
                    w(f"| {b} | error: {run.error} | | | | | |")
                    continue
                w(
                    f"| {b} | {secs:.2f} | {mib(before.get('VmRSS'))} | {mib(after.get('VmRSS'))} | "
                    f"{mib(before.get('RssAnon'))} | {mib(after.get('RssAnon'))} | {per} |"
                )
            w("")
            w("Commands:")
            w("")
            w("```sh")
            for b in self.brokers():
                run = runs.get(b)
                if run is not None:
                    w(display(run.command))
            w("```")
            w("")
        for note in self.memory_notes_after:
            w(f"- {note}")
        if self.memory_notes_after:
            w("")

    def _render_throughput(self, w: Callable[[str], None]) -> None:
        if not self.throughput:
            return
        w("## Throughput scenarios")
        w("")
        w(
            f"Each scenario ran for {self.duration:g} s per broker (`-z {self.duration:g}`). "
            "*Broker RSS* is the broker's VmRSS sampled every 0.25 s during the run (peak) "
            "and after it."
        )
        w("")
        for sc in THROUGHPUT:
            runs = self.throughput.get(sc.key)
            if not runs:
                continue
            w(f"### {sc.title} (`--only {sc.key}`)")
            w("")
            w(
                "| Broker | published msg/s | consumed msg/s | latency p50 ms | p95 ms | p99 ms "
                "| broker RSS peak / after | client CPU pub / con |"
            )
            w("|---|---:|---:|---:|---:|---:|---:|---|")
            for b in self.brokers():
                run = runs.get(b)
                if run is None:
                    continue
                if run.error or run.result is None:
                    w(f"| {b} | error: {run.error} | | | | | | |")
                    continue
                r = run.result
                cpu = r.get("client_cpu", {})
                cpu_s = (
                    " ".join(f"{c:.0%}" for c in cpu.get("publishers", []))
                    + " / "
                    + " ".join(f"{c:.0%}" for c in cpu.get("consumers", []))
                )
                w(
                    f"| {b} | {fmt_rate(r['publish_rate'])} | {fmt_rate(r['consume_rate'])} | "
                    f"{fmt_ms(_lat(run, 'p50'))} | {fmt_ms(_lat(run, 'p95'))} | "
                    f"{fmt_ms(_lat(run, 'p99'))} | {mib(run.rss_peak_kib)} / "
                    f"{mib(run.rss_end_kib)} | {cpu_s} |"
                )
            wr = runs.get("Warren")
            for other in self.others:
                rr = runs.get(other)
                w(
                    f"| **Warren / {other}** | {ratio(_rate(wr, 'publish_rate'), _rate(rr, 'publish_rate'))} "
                    f"| **{ratio(_rate(wr, 'consume_rate'), _rate(rr, 'consume_rate'))}** | "
                    f"{ratio(_lat(wr, 'p50'), _lat(rr, 'p50'))} | "
                    f"{ratio(_lat(wr, 'p95'), _lat(rr, 'p95'))} | "
                    f"{ratio(_lat(wr, 'p99'), _lat(rr, 'p99'))} | | |"
                )
            w("")
            order = self.order.get(sc.key)
            if order:
                w(f"Order: {' then '.join(order)}. Command (per broker, `--uri` differs):")
            w("")
            w("```sh")
            for b in self.brokers():
                run = runs.get(b)
                if run is not None:
                    w(display(run.command))
            w("```")
            w("")


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
        choices=ALL_KEYS,
        metavar="SCENARIO",
        help=f"run only this scenario (repeatable): {', '.join(ALL_KEYS)}",
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
    p.add_argument("--warren-port", type=int, default=WARREN_PORT)
    p.add_argument("--lavinmq-port", type=int, default=LAVINMQ_PORT)
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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    selected = set(args.only or ALL_KEYS)
    with contextlib.suppress(ValueError, OSError):
        _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    report = Report(
        duration=args.duration,
        machine=machine_info(),
        versions=warren_versions(),
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
    text = report.render()
    out = Path(args.output)
    if out.exists():
        text = keep_other_sections(text, out.read_text())
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n")
    log(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
