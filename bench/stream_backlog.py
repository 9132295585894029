"""Draining a stream's backlog, with a raw-socket AMQP client that shares no code with Warren.

    .venv/bin/python bench/stream_backlog.py                      # a Warren from this checkout
    .venv/bin/python bench/stream_backlog.py --pure               # ... with WARREN_PURE_PYTHON=1
    .venv/bin/python bench/stream_backlog.py --url amqp://guest:guest@127.0.0.1:5672/
    .venv/bin/python bench/stream_backlog.py --stream-protocol --size 16 --tree ../other

Publishes --messages bodies of --size bytes into a fresh stream (confirms),
then one consumer reads them all from offset "first" with prefetch --prefetch,
acking (multiple) every half prefetch, --repeat times. Reported: messages/s
of each read and the broker's CPU per message over it (from /proc, when the
broker is a local process this script started). The client speaks AMQP 0-9-1
with socket and struct only (bench/raw_amqp.py's encoder and connection), so a
pattern of Warren's own client cannot flatter the numbers (issue 27).
With --stream-protocol the messages are published with ``warren perf stream``
instead (AMQP 1.0 messages stored as chunk records, issue 31), into a Warren
from --tree (default: this checkout) with its stream port open; with --raw
as raw bytes that are no AMQP 1.0 message (bench/stream_protocol_rate.py's
publisher), which a 0-9-1 reader gets one message at a time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
# The shared raw-socket encoder and connection (bench/raw_amqp.py, no Warren code).
import multiprocessing as mp  # noqa: E402

from raw_amqp import (  # noqa: E402
    FRAME,
    Conn,
    ack_frame,
    method,
    publish_confirmed,
    shortstr,
    table,
)


def fresh_stream(conn: Conn, name: str) -> None:
    conn.delete(name)
    conn.declare(name, durable=True, args={"x-queue-type": "stream"})


def drain(raw: Conn, name: str, count: int, prefetch: int) -> float:
    """Read offsets 0 .. count - 1; returns the seconds it took."""
    raw.sock.sendall(method(1, 60, 10, struct.pack(">IHB", 0, prefetch, 0)))
    raw.expect(60, 11)
    raw.sock.sendall(
        method(1, 60, 20, b"\x00\x00" + shortstr(name) + shortstr("") + b"\x00"
               + table({"x-stream-offset": "first"}))
    )  # fmt: skip
    ctag = raw.expect(60, 21)[1:]
    started = time.perf_counter()
    got = unacked = 0
    marker = b"\x00\x3c\x00\x3c"
    buf = raw.buf
    raw.buf = b""
    sock = raw.sock
    pos = 0
    tag = 0
    while got < count:
        n = len(buf)
        while n - pos >= 7:
            ftype, _ch, size = FRAME.unpack_from(buf, pos)
            end = pos + 8 + size
            if end > n:
                break
            if ftype == 1 and buf.startswith(marker, pos + 7):
                tag = struct.unpack_from(">Q", buf, pos + 12 + buf[pos + 11])[0]
                got += 1
                unacked += 1
            pos = end
        if unacked >= prefetch // 2 or got >= count:
            sock.sendall(ack_frame(tag, True))
            unacked = 0
        if got >= count:
            break
        data = sock.recv(1 << 20)
        if not data:
            raise EOFError("the broker closed the connection")
        buf = buf[pos:] + data
        pos = 0
    seconds = time.perf_counter() - started
    raw.sock.sendall(method(1, 60, 30, shortstr(ctag.decode()) + b"\x00"))  # basic.cancel
    return seconds


def perf_stream(port: int, name: str, count: int, size: int) -> float:
    """Publish ``count`` messages of ``size`` bytes into stream ``name`` with
    ``warren perf stream`` (this checkout's), 1,000 to a Publish; its msg/s."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), WARREN_PURE_PYTHON="1")
    cmd = [sys.executable, "-m", "warren", "perf", "stream", "--uri",
           f"rabbitmq-stream://guest:guest@127.0.0.1:{port}/%2F", "-x", "1", "-y", "0",
           "-C", str(count), "-s", str(size), "-b", "1000", "--stream", name, "--keep",
           "--json"]  # fmt: skip
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    summary = json.loads(out)
    return float(summary.get("publish_rate") or summary.get("summary", {}).get("publish_rate", 0))


def raw_stream(port: int, name: str, count: int, size: int) -> float:
    """Publish ``count`` raw records of ``size`` bytes into stream ``name`` over the
    stream protocol (bench/stream_protocol_rate.py's publisher); its msg/s."""
    from stream_protocol_rate import publisher

    out: mp.Queue = mp.Queue()  # type: ignore[type-arg]
    publisher(port, name, 0, count, 1000, size, 20_000, mp.Barrier(1), out)
    _pid, t0, t1 = out.get()
    return float(count / (t1 - t0))


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def warren(
    pure: bool, src: Path = ROOT / "src", stream_port: int = -1
) -> Iterator[tuple[int, int]]:
    """A Warren from ``src`` (pure Python if ``pure``) on a free port with a scratch
    data dir, as a child process: (AMQP port, pid); stopped on exit."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="warren-backlog-") as tmp:
        env = dict(os.environ, PYTHONPATH=str(src))
        env.pop("WARREN_PURE_PYTHON", None)
        if pure:
            env["WARREN_PURE_PYTHON"] = "1"
        cmd = [sys.executable, "-m", "warren", "--amqp-port", str(port), "--http-port", "-1",
               "--mqtt-port", "-1", "--prometheus-port", "-1", "-D", f"{tmp}/data",
               "--log-level", "warning"]  # fmt: skip
        if "--stream-port" in (src / "warren" / "cli.py").read_text():  # not in older ones
            cmd += ["--stream-port", str(stream_port)]
        proc = subprocess.Popen(cmd, env=env, cwd=tmp)
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                    break
                time.sleep(0.1)
            yield port, proc.pid
        finally:
            proc.terminate()
            proc.wait(30)


def broker(
    stack: contextlib.ExitStack[bool | None],
    url: str | None,
    pure: bool,
    src: Path = ROOT / "src",
    stream_port: int = -1,
) -> tuple[str, int, int | None]:
    """(host, port, pid): the broker at ``url`` (no pid), else a Warren started
    here (warren()) for as long as ``stack`` lasts."""
    if url:
        host, port = url.rsplit("@", 1)[-1].strip("/").split(":")[:2]
        return host, int(port), None
    port_, pid = stack.enter_context(warren(pure, src, stream_port))
    return "127.0.0.1", port_, pid


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="host:port of a running broker (default: start a Warren)")
    parser.add_argument("--pure", action="store_true", help="the Warren started: pure Python")
    parser.add_argument("--messages", type=int, default=2_000_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--prefetch", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--stream-protocol", action="store_true", help="publish with `warren perf stream`"
    )
    parser.add_argument("--raw", action="store_true", help="with --stream-protocol: raw records")
    parser.add_argument("--tree", type=Path, default=ROOT, help="the Warren's source checkout")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        stream_port = free_port() if args.stream_protocol else -1
        src = args.tree.resolve() / "src"
        host, port, pid = broker(stack, args.url, args.pure, src, stream_port)
        raw = Conn.open(port, host)
        fresh_stream(raw, "backlog")
        if args.stream_protocol and args.raw:
            rate = raw_stream(stream_port, "backlog", args.messages, args.size)
        elif args.stream_protocol:
            rate = perf_stream(stream_port, "backlog", args.messages, args.size)
        else:
            rate = publish_confirmed(raw, "backlog", args.messages, args.size)
        runs = []
        for _ in range(args.repeat):
            reader = Conn.open(port, host)
            before = cpu_seconds(pid) if pid else 0.0
            seconds = drain(reader, "backlog", args.messages, args.prefetch)
            cpu = cpu_seconds(pid) - before if pid else None
            reader.sock.close()
            runs.append({
                "msg_per_s": round(args.messages / seconds),
                "broker_cpu_us_per_msg": None if cpu is None else round(cpu / args.messages * 1e6, 3),
            })  # fmt: skip
    print(json.dumps({"publish_msg_per_s": round(rate), "load_average": os.getloadavg(),
                      "runs": runs}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
