"""The stream protocol's publish and deliver rates (issue 31's 1M msg/s target).

    .venv/bin/python bench/stream_protocol_rate.py --messages 2000000 --publishers 4

Starts a Warren from ``--tree`` (default: this checkout; another worktree
measures another version) in a subprocess on a scratch data directory with
the stream port open, then:

* ``publish``: ``--publishers`` processes, each its own connection and
  publisher, send ``--messages`` / publishers messages of ``--size`` bytes
  (raw bytes, not AMQP 1.0: what the broker stores either way) in Publish
  frames of ``--batch`` messages, pre-encoded before the clock starts, at
  most ``--window`` unconfirmed; the time is from the first send to the
  last PublishConfirm of all of them;
* ``deliver``: one subscriber reads the whole stream from ``first`` with
  credit kept topped up, counting the records of each Deliver's chunk.

The frames are encoded with Warren's own codec (stream_protocol's Publish)
and read by hand: the client side is a raw socket, so it costs little next to
the broker. Reports messages/s and the broker's CPU per message (utime +
stime from /proc over each phase).
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
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
sys.path.insert(0, str(ROOT / "src"))

from rstream import encoding, schema  # noqa: E402

from warren.stream_protocol.publish import Publish, PublishedMessage  # noqa: E402

_TICK = os.sysconf("SC_CLK_TCK")
_SIZE = struct.Struct(">I")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def warren(tree: Path, pure: bool) -> Iterator[tuple[int, int]]:
    """(stream port, pid) of a Warren from ``tree`` on a scratch data dir."""
    amqp, stream = free_port(), free_port()
    with tempfile.TemporaryDirectory(prefix="warren-stream-rate-") as tmp:
        cmd = [sys.executable, "-m", "warren", "--amqp-port", str(amqp)]
        if os.environ.get("BENCH_PROFILE"):  # cProfile's output there, at exit
            cmd[1:1] = ["-m", "cProfile", "-o", os.environ["BENCH_PROFILE"]]
        cmd += ["--stream-port", str(stream), "--http-port", "-1", "--mqtt-port", "-1"]
        cmd += ["--prometheus-port", "-1", "-D", f"{tmp}/data", "--log-level", "warning"]
        env = dict(os.environ, PYTHONPATH=str(tree / "src"))
        if pure:
            env["WARREN_PURE_PYTHON"] = "1"
        with open(f"{tmp}/warren.log", "wb") as logf:
            proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env)
        try:
            deadline = time.monotonic() + 60
            while True:
                with (
                    contextlib.suppress(OSError),
                    socket.create_connection(("127.0.0.1", stream), 1),
                ):
                    break
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(Path(tmp, "warren.log").read_text())
                time.sleep(0.1)
            yield stream, proc.pid
        finally:
            proc.terminate()
            proc.wait(60)
            if os.environ.get("BENCH_LOG"):
                print(Path(tmp, "warren.log").read_text()[-3000:])


class Conn:
    """A raw stream protocol connection: rstream's frames for the handshake."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
        self.corr = 0

    def send(self, frame: object) -> None:
        self.sock.sendall(bytes(encoding.encode_frame(frame)))

    def frame(self) -> bytes:
        while True:
            if len(self.buf) >= 4:
                (n,) = _SIZE.unpack_from(self.buf, 0)
                if len(self.buf) >= 4 + n:
                    out = bytes(self.buf[4 : 4 + n])
                    del self.buf[: 4 + n]
                    return out
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError("closed")
            self.buf += data

    def request(self, frame: object) -> object:
        self.send(frame)
        return encoding.decode_frame(self.frame())

    def next_id(self) -> int:
        self.corr += 1
        return self.corr

    def open(self) -> None:
        self.request(schema.PeerProperties(self.next_id(), [schema.Property("product", "b")]))
        self.request(schema.SaslHandshake(self.next_id()))
        self.send(schema.SaslAuthenticate(self.next_id(), "PLAIN", b"\0guest\0guest"))
        encoding.decode_frame(self.frame())
        tune = encoding.decode_frame(self.frame())
        self.send(schema.Tune(min(tune.frame_max, 1 << 20), 0))  # type: ignore[attr-defined]
        self.request(schema.Open(self.next_id(), "/"))


def publisher(
    port: int,
    stream: str,
    pid: int,
    n: int,
    batch: int,
    size: int,
    window: int,
    start: mp.Barrier,
    out: mp.Queue,
) -> None:  # type: ignore[type-arg]
    conn = Conn(port)
    conn.open()
    conn.request(schema.DeclarePublisher(conn.next_id(), 1, "", stream))
    body = b"x" * size
    frames = []
    for first in range(1, n + 1, batch):
        msgs = [PublishedMessage.simple(i, body) for i in range(first, min(first + batch, n + 1))]
        frames.append((len(msgs), Publish.of(1, msgs).encode()))
    start.wait()
    t0 = time.perf_counter()
    sent = confirmed = 0
    i = 0
    while confirmed < n:
        while i < len(frames) and sent - confirmed < window:
            k, data = frames[i]
            conn.sock.sendall(data)
            sent += k
            i += 1
        f = conn.frame()
        key = struct.unpack_from(">H", f, 0)[0]
        if key == 3:  # PublishConfirm: publisher id, count, ids
            confirmed += struct.unpack_from(">I", f, 5)[0]
        elif key == 4:
            raise RuntimeError("PublishError")
    out.put((pid, t0, time.perf_counter()))


def subscriber(port: int, stream: str, total: int) -> float:
    conn = Conn(port)
    conn.open()
    first = schema.OffsetSpecification(offset_type=1, offset=None)  # type: ignore[arg-type]
    conn.request(schema.Subscribe(conn.next_id(), 1, stream, first, 1000, []))
    got = 0
    t0 = time.perf_counter()
    chunks = 0
    while got < total:
        f = conn.frame()
        if struct.unpack_from(">H", f, 0)[0] != 8:
            continue
        # Deliver v1: key, version, subscription id, then the chunk header.
        got += struct.unpack_from(">I", f, 5 + 4)[0]
        chunks += 1
        if chunks % 500 == 0:
            conn.sock.sendall(bytes(encoding.encode_frame(schema.Credit(1, 500))))
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tree", type=Path, default=ROOT)
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--publishers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--size", type=int, default=16)
    ap.add_argument("--window", type=int, default=20_000)
    ap.add_argument("--pure", action="store_true", help="WARREN_PURE_PYTHON=1 for the broker")
    args = ap.parse_args()
    per = args.messages // args.publishers
    total = per * args.publishers
    with warren(args.tree, args.pure) as (port, pid):
        setup = Conn(port)
        setup.open()
        setup.request(schema.Create(setup.next_id(), "bench", []))
        start = mp.Barrier(args.publishers + 1)
        out: mp.Queue = mp.Queue()  # type: ignore[type-arg]
        procs = [
            mp.Process(
                target=publisher,
                args=(port, "bench", i, per, args.batch, args.size, args.window, start, out),
            )
            for i in range(args.publishers)
        ]
        for p in procs:
            p.start()
        start.wait()
        cpu0 = cpu_seconds(pid)
        times = [out.get() for _ in procs]
        cpu1 = cpu_seconds(pid)
        for p in procs:
            p.join()
        t0 = min(t[1] for t in times)
        t1 = max(t[2] for t in times)
        rate = total / (t1 - t0)
        print(
            f"publish: {total} x {args.size} B, {args.publishers} publishers, "
            f"{args.batch}/Publish: {rate:,.0f} msg/s, broker CPU "
            f"{(cpu1 - cpu0) / total * 1e6:.2f} us/msg"
        )
        cpu0 = cpu_seconds(pid)
        secs = subscriber(port, "bench", total)
        cpu1 = cpu_seconds(pid)
        print(
            f"deliver: {total / secs:,.0f} msg/s, broker CPU {(cpu1 - cpu0) / total * 1e6:.2f} us/msg"
        )


if __name__ == "__main__":
    main()
