"""Draining a stream's backlog, with a raw-socket AMQP client that shares no code with Warren.

    .venv/bin/python bench/stream_backlog.py                      # a Warren from this checkout
    .venv/bin/python bench/stream_backlog.py --pure               # ... with WARREN_PURE_PYTHON=1
    .venv/bin/python bench/stream_backlog.py --url amqp://guest:guest@127.0.0.1:5672/

Publishes --messages bodies of --size bytes into a fresh stream (confirms),
then one consumer reads them all from offset "first" with prefetch --prefetch,
acking (multiple) every half prefetch, --repeat times. Reported: messages/s
of each read and the broker's CPU per message over it (from /proc, when the
broker is a local process this script started). The client speaks AMQP 0-9-1
with socket and struct only, so a pattern of Warren's own client cannot
flatter the numbers (issue 27).
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
FRAME = struct.Struct(">BHI")


def shortstr(text: str) -> bytes:
    raw = text.encode()
    return bytes((len(raw),)) + raw


def table(entries: dict[str, str]) -> bytes:
    raw = b"".join(
        shortstr(k) + b"S" + struct.pack(">I", len(v)) + v.encode() for k, v in entries.items()
    )
    return struct.pack(">I", len(raw)) + raw


def method(channel: int, class_id: int, method_id: int, args: bytes) -> bytes:
    payload = struct.pack(">HH", class_id, method_id) + args
    return FRAME.pack(1, channel, len(payload)) + payload + b"\xce"


class Raw:
    """A blocking AMQP 0-9-1 connection on one socket: only what this benchmark needs."""

    def __init__(self, host: str, port: int) -> None:
        self.sock = socket.create_connection((host, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.sock.sendall(b"AMQP\x00\x00\x09\x01")
        self.expect(10, 10)  # connection.start
        self.sock.sendall(
            method(0, 10, 11, table({}) + shortstr("PLAIN")
                   + struct.pack(">I", 12) + b"\x00guest\x00guest" + shortstr("en_US"))
        )  # fmt: skip
        args = self.expect(10, 30)  # connection.tune
        channel_max, frame_max, _ = struct.unpack_from(">HIH", args)
        self.frame_max = frame_max
        self.sock.sendall(method(0, 10, 31, struct.pack(">HIH", channel_max, frame_max, 0)))
        self.sock.sendall(method(0, 10, 40, shortstr("/") + shortstr("") + b"\x00"))
        self.expect(10, 41)
        self.sock.sendall(method(1, 20, 10, shortstr("")))
        self.expect(20, 11)

    def frame(self) -> tuple[int, bytes]:
        while len(self.buf) < 7:
            self.recv()
        ftype, _ch, size = FRAME.unpack_from(self.buf)
        while len(self.buf) < 8 + size:
            self.recv()
        payload = self.buf[7 : 7 + size]
        self.buf = self.buf[8 + size :]
        return ftype, payload

    def recv(self) -> None:
        data = self.sock.recv(1 << 20)
        if not data:
            raise EOFError("the broker closed the connection")
        self.buf += data

    def expect(self, class_id: int, method_id: int) -> bytes:
        while True:
            ftype, payload = self.frame()
            if ftype != 1:
                continue
            got = struct.unpack_from(">HH", payload)
            if got == (class_id, method_id):
                return payload[4:]
            if got in ((10, 50), (20, 40)):
                raise RuntimeError(f"closed by the broker: {payload[6:]!r}")


def fresh_stream(raw: Raw, name: str) -> None:
    raw.sock.sendall(method(1, 50, 40, b"\x00\x00" + shortstr(name) + b"\x00"))  # delete
    raw.expect(50, 41)
    raw.sock.sendall(
        method(
            1, 50, 10, b"\x00\x00" + shortstr(name) + b"\x02" + table({"x-queue-type": "stream"})
        )
    )
    raw.expect(50, 11)


def publish(raw: Raw, name: str, count: int, size: int) -> float:
    raw.sock.sendall(method(1, 85, 10, b"\x00"))
    raw.expect(85, 11)
    body = bytes(size)
    one = (
        method(1, 60, 40, b"\x00\x00" + shortstr("") + shortstr(name) + b"\x00")
        + FRAME.pack(2, 1, 14) + struct.pack(">HHQH", 60, 0, size, 0) + b"\xce"
        + FRAME.pack(3, 1, size) + body + b"\xce"
    )  # fmt: skip
    started = time.perf_counter()
    confirmed = sent = 0
    while confirmed < count:
        if sent < count and sent - confirmed < 20_000:
            n = min(1000, count - sent)
            raw.sock.sendall(one * n)
            sent += n
            continue
        ftype, payload = raw.frame()
        if ftype == 1 and payload[:4] == b"\x00\x3c\x00\x50":  # basic.ack
            tag, multiple = struct.unpack_from(">QB", payload, 4)
            confirmed = tag if multiple & 1 else confirmed + 1
    return count / (time.perf_counter() - started)


def drain(raw: Raw, name: str, count: int, prefetch: int) -> float:
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
    deliver = b"\x01\x00\x01"  # a method frame on channel 1
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
            sock.sendall(method(1, 60, 80, struct.pack(">QB", tag, 1)))
            unacked = 0
        if got >= count:
            break
        data = sock.recv(1 << 20)
        if not data:
            raise EOFError("the broker closed the connection")
        buf = buf[pos:] + data
        pos = 0
    seconds = time.perf_counter() - started
    del deliver
    raw.sock.sendall(method(1, 60, 30, shortstr(ctag.decode()) + b"\x00"))  # basic.cancel
    return seconds


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def warren(pure: bool) -> Iterator[tuple[int, int]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="warren-backlog-") as tmp:
        env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
        if pure:
            env["WARREN_PURE_PYTHON"] = "1"
        cmd = [sys.executable, "-m", "warren", "--amqp-port", str(port), "--http-port", "-1",
               "--mqtt-port", "-1", "--prometheus-port", "-1", "-D", f"{tmp}/data", "--log-level", "warning"]  # fmt: skip
        proc = subprocess.Popen(cmd, env=env)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="host:port of a running broker (default: start a Warren)")
    parser.add_argument("--pure", action="store_true", help="the Warren started: pure Python")
    parser.add_argument("--messages", type=int, default=2_000_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--prefetch", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        if args.url:
            hostport = args.url.rsplit("@", 1)[-1].strip("/")
            host, port, pid = hostport.split(":")[0], int(hostport.split(":")[1]), None
        else:
            port, pid = stack.enter_context(warren(args.pure))
            host = "127.0.0.1"
        raw = Raw(host, port)
        fresh_stream(raw, "backlog")
        rate = publish(raw, "backlog", args.messages, args.size)
        runs = []
        for _ in range(args.repeat):
            reader = Raw(host, port)
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
