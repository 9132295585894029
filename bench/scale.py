"""Scale curves for Warren (issue 15): throughput, RAM and startup as counts grow.

    .venv/bin/python bench/scale.py                          # full sizes, docs/benchmarks.md
    .venv/bin/python bench/scale.py --queues 1,10 --connections 1,10 --idle 500 \\
        --queuecount 2000 --startup-queues 1000 --startup-messages 100000 \\
        --duration 4 --output /tmp/scale-test.md             # a quick trial

Parts (``--only KEY``, repeatable):

- ``queues``: msg/s with 1, 10, 100, 1,000 queues. One client process with one
  publisher connection (round-robin over the queues, default exchange) and one
  consumer connection (a no-ack consumer on every queue), so the client side
  is the same at every point and only the number of queues changes.
  ``warren perf throughput`` runs one OS process per consumer, which for 1,000
  queues on a small machine would measure the scheduler, not the broker.
- ``connections``: msg/s with 1, 10, 100, 1,000 connections, each publishing
  to and consuming (no-ack) its own queue, all in one client process.
- ``idle``: broker VmRSS/RssAnon and open time with 10,000 and 50,000 idle
  connections (``warren perf connection-count``).
- ``queuecount``: the same with 100,000 queues (``warren perf queue-count``).
- ``startup``: a data dir with 100,000 durable queues and 10,000,000
  persistent messages; time from exec to the AMQP port accepting and to
  passive queue.declare reporting every message, and RSS then.

Every part starts a fresh Warren (bench/amqp_brokers.py). Counts beyond the
open-file limit (raised here to the hard limit, which children inherit) are
measured as far as the limit allows and the report says why.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import resource
import selectors
import socket
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from amqp_brokers import Warren, display, log, perf_env, port_open  # noqa: E402
from compare_report import (  # noqa: E402
    _sections,
    keep_other_sections,
    machine_info,
    mib,
    warren_versions,
)
from perf_runs import perf_cmd, read_status, run_perf, uri  # noqa: E402

from warren.amqp import spec  # noqa: E402
from warren.amqp.frames import method_frame  # noqa: E402
from warren.client import AMQPError, Client  # noqa: E402
from warren.perf.message import message_template  # noqa: E402

HEADING = "## Scale curves (`bench/scale.py`)"
KEYS = ("queues", "connections", "idle", "queuecount", "startup")
_HDR = struct.Struct(">BHI")
_U32 = struct.Struct(">I")
_DELIVER = spec.BasicDeliver.INDEX
_CLOSES = (spec.ConnectionClose.INDEX, spec.ChannelClose.INDEX)


def ints(text: str) -> list[int]:
    return [int(x.replace("_", "")) for x in text.split(",") if x.strip()]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fd_limit() -> int:
    """Raise this process's soft open-file limit to the hard one (children inherit it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    return int(soft)


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc/<pid>/stat."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return 0.0


def qname(i: int) -> str:
    """Queue names of one length, so every delivery has the same size."""
    return f"scale-{i:05d}"


# =====================================================================================
# Throughput: one client process, many connections/queues, a bounded in-flight window
# =====================================================================================


@dataclass
class _Conn:
    client: Client
    sock: socket.socket
    batch: bytes = b""  # pre-encoded publishes, round-robin over this connection's queues
    batch_n: int = 0
    pending: memoryview = field(default_factory=lambda: memoryview(b""))
    buf: bytes = b""
    writing: bool = False


def _count_deliveries(c: _Conn, data: bytes, rest_len: int) -> int:
    """Deliveries in the bytes received; ``rest_len``: content header + body frame bytes,
    skipped at once after a basic.deliver (every message has the same shape)."""
    buf = c.buf + data if c.buf else data
    n, pos, count = len(buf), 0, 0
    unpack_hdr, unpack_u32 = _HDR.unpack_from, _U32.unpack_from
    while n - pos >= 7:
        ftype, _ch, size = unpack_hdr(buf, pos)
        end = pos + 8 + size
        if end > n:
            break
        if ftype == 1:
            idx = unpack_u32(buf, pos + 7)[0]
            if idx == _DELIVER:
                count += 1
                if end + rest_len <= n:
                    end += rest_len
            elif idx in _CLOSES:
                method = spec.decode_method(buf[pos + 7 : end - 1])
                raise AMQPError(f"{method.NAME}: {getattr(method, 'reply_text', '')}")
        pos = end
    c.buf = buf[pos:]
    return count


def traffic(
    port: int,
    pid: int,
    plan: list[tuple[list[str], list[str]]],
    seconds: float,
    warmup: float = 1.0,
    window: int = 20_000,
    size: int = 16,
) -> dict[str, float]:
    """Run connections in this process: ``plan`` is (queues to publish to round-robin,
    queues to consume from) per connection. At most ``window`` messages are in flight
    (published, not yet consumed), so queues stay short and the rate is end to end."""
    names = {q for pubs, cons in plan for q in (*pubs, *cons)}
    control = Client(uri(port), name="scale control").connect()
    control.channel_open(1)
    for q in sorted(names):
        control.queue_declare(1, q)
    conns: list[_Conn] = []
    rest_len = 0
    tag = 0
    for pubs, cons in plan:
        client = Client(uri(port), name=f"scale {len(conns)}").connect()
        client.channel_open(1)
        for q in cons:
            tag += 1
            client.consume(1, q, no_ack=True, consumer_tag=f"c{tag:06d}")
        assert client.sock is not None
        c = _Conn(client, client.sock, buf=client.unread())
        if pubs:
            msgs = []
            for q in pubs:
                head, tail = message_template(1, "", q, size, False, client.frame_max)
                msgs.append(head + bytes(8) + tail)
                publish = len(method_frame(1, spec.BasicPublish(routing_key=q)))
                rest_len = len(msgs[-1]) - publish
            reps = max(1, 500 // len(msgs))
            c.batch, c.batch_n = b"".join(msgs) * reps, len(msgs) * reps
        c.sock.setblocking(False)
        conns.append(c)
    sel = selectors.DefaultSelector()
    for c in conns:
        sel.register(c.sock, selectors.EVENT_READ, c)
    published = consumed = 0
    start = time.monotonic()
    t0, end = start + warmup, start + warmup + seconds
    at_t0: tuple[int, float, float] | None = None
    pubs_conns = [c for c in conns if c.batch]
    while True:
        now = time.monotonic()
        if at_t0 is None and now >= t0:
            at_t0 = (consumed, _self_cpu(), cpu_seconds(pid))
        if now >= end:
            break
        for c in pubs_conns:
            if not c.pending and published - consumed < window:
                c.pending = memoryview(c.batch)
                published += c.batch_n
            if c.pending:
                try:
                    sent = c.sock.send(c.pending)
                    c.pending = c.pending[sent:]
                except BlockingIOError:
                    pass
                want = bool(c.pending)
                if want != c.writing:
                    c.writing = want
                    mask = selectors.EVENT_READ | (selectors.EVENT_WRITE if want else 0)
                    sel.modify(c.sock, mask, c)
        for key, mask in sel.select(0.05):
            if mask & selectors.EVENT_READ:
                c = key.data
                with contextlib.suppress(BlockingIOError):
                    data = c.sock.recv(1 << 20)
                    if not data:
                        raise AMQPError("the broker closed a connection")
                    consumed += _count_deliveries(c, data, rest_len)
    assert at_t0 is not None
    result = {
        "msg_s": (consumed - at_t0[0]) / seconds,
        "client_cpu": (_self_cpu() - at_t0[1]) / seconds,
        "broker_cpu": (cpu_seconds(pid) - at_t0[2]) / seconds,
        "rss_kib": float((read_status(pid) or {}).get("VmRSS", 0)),
    }
    sel.close()
    for c in conns:
        c.sock.setblocking(True)
        c.client.abort()
    for q in sorted(names):
        control.queue_delete(1, q)
    control.close()
    return result


def _self_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


# =====================================================================================
# Startup with a full data dir
# =====================================================================================


def passive_total(port: int, names: list[str]) -> int:
    """Sum of message counts by pipelined passive queue.declare (404 = not there yet)."""
    client = Client(uri(port), name="scale passive").connect()
    try:
        client.channel_open(1)
        total = 0
        for i in range(0, len(names), 1000):
            chunk = names[i : i + 1000]
            client.send(
                b"".join(method_frame(1, spec.QueueDeclare(queue=n, passive=True)) for n in chunk)
            )
            for _ in chunk:
                total += client.wait_method(1, spec.QueueDeclareOk).message_count
        return total
    finally:
        client.close()


def fill(port: int, names: list[str], messages: int) -> float:
    """Publish ``messages`` persistent 16-byte messages spread evenly over ``names``
    (pre-encoded, one write per queue); returns seconds until all are counted."""
    client = Client(uri(port), name="scale fill").connect()
    client.channel_open(1)
    assert client.sock is not None
    start = time.monotonic()
    per, extra = divmod(messages, len(names))
    for i, q in enumerate(names):
        head, tail = message_template(1, "", q, 16, True, client.frame_max)
        k = per + (1 if i < extra else 0)
        if k:
            client.sock.sendall((head + bytes(8) + tail) * k)
    while passive_total(port, names) < messages:
        time.sleep(1)
    client.close()
    return time.monotonic() - start


def startup(queues: int, messages: int, loaded: int, timeout: float) -> dict[str, Any]:
    """Build the data dir with one broker, stop it (SIGTERM), time a second start.
    The messages go to the first ``loaded`` queues: a queue being written keeps its
    segment file open, and the broker's open-file limit here is 20,000."""
    loaded = max(1, min(loaded, queues))
    out: dict[str, Any] = {"queues": queues, "messages": messages, "loaded": loaded}
    names = [f"scale-d-{i}" for i in range(1, queues + 1)]
    with tempfile.TemporaryDirectory(prefix="warren-scale-") as tmp:
        w = Warren(free_port())
        w.data_dir = Path(tmp) / "data"
        cmd = w.command(Path(tmp))
        out["command"] = display(cmd).replace(str(w.data_dir), "<tmp dir>")
        proc = subprocess.Popen(cmd, env=perf_env(), stdin=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while not port_open(w.port):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("Warren did not start")
                time.sleep(0.1)
            declare = run_perf(
                "Warren",
                perf_cmd(
                    "queue-count",
                    "--uri",
                    uri(w.port),
                    "--queues",
                    str(queues),
                    "--durable",
                    "--keep",
                    "--prefix",
                    "scale-d-",
                    "--json",
                ),
                proc.pid,
                timeout,
            )
            if declare.error:
                raise RuntimeError(f"declaring the queues: {declare.error}")
            out["declare_s"] = (declare.result or {}).get("declare_s")
            log(f"publishing {messages:,} persistent messages over {loaded:,} queues")
            out["fill_s"] = fill(w.port, names[:loaded], messages)
        finally:
            proc.terminate()
            proc.wait(timeout)
        out["data_mib"] = sum(p.stat().st_size for p in w.data_dir.rglob("*") if p.is_file()) / (
            1 << 20
        )
        log(f"restarting on {out['data_mib']:,.0f} MiB of data")
        start = time.monotonic()
        proc = subprocess.Popen(cmd, env=perf_env(), stdin=subprocess.DEVNULL)
        try:
            deadline = start + timeout
            while not port_open(w.port):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("Warren did not restart")
                time.sleep(0.01)
            out["port_s"] = time.monotonic() - start
            while True:
                with contextlib.suppress(AMQPError, OSError, EOFError):
                    if passive_total(w.port, names) >= messages:
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError("the messages did not all come back")
                time.sleep(0.05)
            out["ready_s"] = time.monotonic() - start
            out["rss"] = read_status(proc.pid)
        finally:
            proc.terminate()
            proc.wait(timeout)
    return out


# =====================================================================================
# Main
# =====================================================================================


class Fresh:
    """A fresh Warren for one measurement, stopped (and its data dir removed) after."""

    def __enter__(self) -> Warren:
        self.w = Warren(free_port())
        self.w.start()
        time.sleep(1)
        return self.w

    def __exit__(self, *exc: object) -> None:
        self.w.stop()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--only", action="append", choices=KEYS, metavar="KEY", help=", ".join(KEYS))
    p.add_argument("--queues", type=ints, default=[1, 10, 100, 1000], help="default 1,10,100,1000")
    p.add_argument("--connections", type=ints, default=[1, 10, 100, 1000])
    p.add_argument("--duration", type=float, default=15.0, help="seconds per throughput point")
    p.add_argument("--idle", type=ints, default=[10_000, 50_000], help="idle connections")
    p.add_argument("--queuecount", type=ints, default=[100_000], help="declared queues")
    p.add_argument("--startup-queues", type=int, default=100_000)
    p.add_argument("--startup-messages", type=int, default=10_000_000)
    p.add_argument(
        "--startup-loaded",
        type=int,
        default=1_000,
        help="how many of the startup queues hold the messages (the rest stay empty)",
    )
    p.add_argument("--output", default=str(ROOT / "docs" / "benchmarks.md"))
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    only = set(args.only or KEYS)
    limit = fd_limit()
    cap = (limit // 1000 - 1) * 1000  # the broker and the holder need other descriptors too
    timeout = 3600.0
    w_lines: list[str] = []
    w = w_lines.append
    machine = machine_info()
    versions = warren_versions()
    cmdline = "bench/scale.py " + " ".join(argv if argv is not None else sys.argv[1:])
    shown = display(Warren(0).command(Path("/t"))).replace(" -D . ", " -D <tmp dir> ")
    shown = shown.replace("--amqp-port 0", "--amqp-port <port>")
    w(HEADING)
    w("")
    w(
        f"`.venv/bin/python {cmdline.strip()}`, "
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, {machine['CPUs (nproc)']} "
        f"CPUs ({machine['CPU model']}), {machine['Memory']}, Warren {versions['Warren']}, "
        f"open-file limit {limit:,} (hard). Each part starts a fresh broker: "
        f"`{shown}` with its own port and a scratch data dir."
    )
    w("")
    for curve in ("queues", "connections"):
        if curve not in only:
            continue
        w(f"### Throughput against the number of {curve} (`--only {curve}`)")
        w("")
        if curve == "queues":
            w(
                "One client process: one connection publishes 16-byte transient messages "
                "round-robin to the N queues (default exchange), another has a no-ack consumer "
                "on each of them. At most 20,000 messages in flight, so the rate is end to end."
            )
        else:
            w(
                "N connections in one client process, each publishing 16-byte transient "
                "messages to its own queue and consuming them (no-ack); at most 20,000 "
                "messages in flight in all."
            )
        w(
            f"{args.duration:g} s per point after 1 s of warm-up. CPU is seconds per second "
            "over the measured span: where the client's is near 1.0 the client, not the "
            "broker, sets the rate. A socket read's publishes become runs, one per "
            'routing key (docs/architecture.md, "Publish runs"): round-robin over N '
            "queues makes runs of about 800 / N messages, so the per-message cost "
            "returns as N grows."
        )
        w("")
        w(f"| {curve} | msg/s | broker CPU | client CPU | broker VmRSS after |")
        w("|---:|---:|---:|---:|---:|")
        for n in getattr(args, curve):
            if curve == "queues":
                names = [qname(i) for i in range(n)]
                plan = [(names, []), ([], names)]
            else:
                plan = [([qname(i)], [qname(i)]) for i in range(n)]
            if n + 100 > cap:
                w(f"| {n:,} | not run: open-file limit {limit:,} | | | |")
                continue
            with Fresh() as b:
                assert b.pid is not None
                log(f"{curve} = {n}")
                try:
                    r = traffic(b.port, b.pid, plan, args.duration)
                except (AMQPError, OSError, EOFError) as exc:
                    w(f"| {n:,} | error: {exc} | | | |")
                    continue
            log(f"{n} {curve}: {r['msg_s']:,.0f} msg/s")
            w(
                f"| {n:,} | {r['msg_s']:,.0f} | {r['broker_cpu']:.2f} | {r['client_cpu']:.2f} "
                f"| {mib(int(r['rss_kib']))} |"
            )
        w("")
    memory_rows: list[str] = []
    notes: list[str] = []
    commands: list[str] = []
    for key, sizes in (("idle", args.idle), ("queuecount", args.queuecount)):
        if key not in only:
            continue
        for n in sizes:
            held = min(n, cap) if key == "idle" else n
            with Fresh() as b:
                pid, port = b.pid, b.port
                if key == "idle":
                    cmd = perf_cmd(
                        "connection-count",
                        "--uri",
                        uri(b.port),
                        "--connections",
                        str(held),
                        "--channels",
                        "1",
                        "--consumers",
                        "0",
                        "--pid",
                        str(b.pid),
                        "--settle",
                        "1",
                        "--json",
                    )
                else:
                    cmd = perf_cmd(
                        "queue-count",
                        "--uri",
                        uri(b.port),
                        "--queues",
                        str(n),
                        "--pid",
                        str(b.pid),
                        "--settle",
                        "1",
                        "--json",
                    )
                run = run_perf("Warren", cmd, b.pid, timeout)
            shown_cmd = display(cmd).replace(f":{port}/", ":<port>/")
            commands.append(shown_cmd.replace(f"--pid {pid} ", "--pid <pid> "))
            what = f"{n:,} idle connections" if key == "idle" else f"{n:,} queues"
            r = run.result or {}
            if run.error and not r:
                memory_rows.append(f"| {what} | error: {run.error} | | | | | | |")
                continue
            got = r.get("connections") if key == "idle" else r.get("queues")
            secs = r.get("open_s") if key == "idle" else r.get("declare_s")
            before, after = r.get("rss_kib_before") or {}, r.get("rss_kib") or {}
            per = "n/a"
            if got and before.get("VmRSS") and after.get("VmRSS"):
                per = f"{(after['VmRSS'] - before['VmRSS']) / got:,.2f} KiB"
            if key == "idle" and held < n:
                what += f" (held {got:,})"
                notes.append(
                    f"{n:,} idle connections: not reachable here. The open-file hard limit is "
                    f"{limit:,} and cannot be raised (no CAP_SYS_RESOURCE in this container), and "
                    "Warren is one process with one descriptor per connection; more loopback "
                    "source addresses only help the client side. Measured with "
                    f"{held:,}; the per-connection figure is what scales."
                )
            memory_rows.append(
                f"| {what} | {got or 0:,} | {secs if secs is not None else 'n/a'} s | "
                f"{mib(before.get('VmRSS'))} | {mib(after.get('VmRSS'))} | "
                f"{mib(before.get('RssAnon'))} | {mib(after.get('RssAnon'))} | {per} |"
            )
    if memory_rows:
        w(
            "### Broker RAM with many idle connections and queues (`--only idle`, `--only queuecount`)"
        )
        w("")
        w(
            "A fresh broker each time; *before* just before the perf command, *with* 1 s after "
            "the last connection opened / queue was declared. Connections have one channel "
            "and no consumers; queues are transient (`queue-count` without `--durable`)."
        )
        w("")
        w(
            "| | held | open / declare time | VmRSS before | VmRSS with | RssAnon before "
            "| RssAnon with | per item (VmRSS) |"
        )
        w("|---|---:|---:|---:|---:|---:|---:|---:|")
        for row in memory_rows:
            w(row)
        w("")
        for note in notes:
            w(f"- {note}")
        if notes:
            w("")
        w("```sh")
        for c in commands:
            w(c)
        w("```")
        w("")
    if "startup" in only:
        log(f"startup: {args.startup_queues:,} queues, {args.startup_messages:,} messages")
        w("### Startup with a full data dir (`--only startup`)")
        w("")
        try:
            s = startup(args.startup_queues, args.startup_messages, args.startup_loaded, timeout)
        except (RuntimeError, AMQPError, OSError, EOFError, subprocess.TimeoutExpired) as exc:
            w(f"Not measured: {exc}")
            w("")
        else:
            rss = s["rss"]
            w(
                f"{s['queues']:,} durable queues (`warren perf queue-count --durable --keep`, "
                f"{s['declare_s']} s) and {s['messages']:,} persistent 16-byte messages spread "
                f"evenly over {s['loaded']:,} of them (pre-encoded, one write per queue; "
                f"{s['fill_s']:.1f} s until all were counted), {s['data_mib']:,.0f} MiB on disk; "
                "the broker stopped with SIGTERM and started again on the same data dir. Only "
                f"{s['loaded']:,} queues hold messages because a queue that is being written "
                "keeps its segment file open, and the open-file limit here is 20,000: "
                "messages in every one of 100,000 queues at once would need 100,000 "
                "descriptors (see bench/README.md)."
            )
            w("")
            w("| until | seconds |")
            w("|---|---:|")
            w(f"| the AMQP port accepts | {s['port_s']:.2f} |")
            w(
                f"| passive queue.declare of every queue sums to {s['messages']:,} messages "
                f"| {s['ready_s']:.2f} |"
            )
            w("")
            w(
                f"Broker then: VmRSS {mib(rss.get('VmRSS'))}, RssAnon {mib(rss.get('RssAnon'))}, "
                f"peak (VmHWM) {mib(rss.get('VmHWM'))}."
            )
            w("")
    write(Path(args.output), "\n".join(w_lines).rstrip("\n") + "\n")
    log(f"wrote {args.output}")
    return 0


def _merge_parts(old: str, new: str) -> str:
    """The new section, keeping the old one's subsections that this run (a
    partial ``--only``) did not measure, in the old order."""
    old_parts = _sections(old, "### ")
    new_parts = _sections(new, "### ")
    fresh = dict(new_parts)
    merged = [fresh.get(h, body) if h else fresh[""] for h, body in old_parts]
    merged += [body for h, body in new_parts if h and h not in dict(old_parts)]
    return "".join(b if b.endswith("\n") else b + "\n" for b in merged).rstrip("\n") + "\n"


def write(out: Path, section: str) -> None:
    """Replace this section in ``out`` if there, else insert it before "## Observations"
    (or append); the other sections are left as they were."""
    if not out.exists():
        out.write_text(section)
        return
    previous = out.read_text()
    parts = _sections(previous)
    if any(h == HEADING for h, _ in parts):
        old = next(body for h, body in parts if h == HEADING)
        section = _merge_parts(old, section)
        text = "".join(section + "\n" if h == HEADING else body for h, body in parts)
    else:
        text = keep_other_sections(previous, section)
    out.write_text(text if text.endswith("\n") else text + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
