"""The report bench/compare.py writes (docs/benchmarks.md): the machine, the
versions, and a section per kind of measurement with Warren's ratios to the
other brokers; the sections of the previous file that other scripts wrote are
kept. bench/scale.py uses its helpers for its own section.

Imported by scripts that put bench/ and src/ on sys.path first.
"""

from __future__ import annotations

import contextlib
import os
import platform
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import equal_rate  # bench/equal_rate.py
from amqp_brokers import display, sh  # bench/amqp_brokers.py
from compare_scenarios import CEILING, MEMORY, QUEUE_LENGTH, THROUGHPUT
from perf_runs import Run

from warren import __version__ as WARREN_VERSION

ROOT = Path(__file__).resolve().parents[1]


def mib(kib: int | None) -> str:
    return "n/a" if kib is None else f"{kib / 1024:,.1f} MiB"


def _sections(text: str, marker: str = "## ") -> list[tuple[str, str]]:
    """(``marker`` heading, the text up to the next one); the first has heading ""."""
    parts: list[tuple[str, str]] = []
    heading, lines = "", list[str]()
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
            "`bench/amqp_standin.py`) that completes the handshake and then discards "
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
