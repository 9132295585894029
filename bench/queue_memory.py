"""Broker RAM versus queue length: publish N messages into one queue, read RssAnon.

The segment store keeps messages on disk and lets the page cache cache them,
so the broker's anonymous memory (RssAnon; file-backed pages of mapped
segments do not count) must stay flat however long the queue grows. Run:

    .venv/bin/python bench/queue_memory.py --count 10000000

It starts `python -m warren` on a scratch data dir, publishes N persistent
16-byte messages to a durable queue over one raw AMQP connection (pre-encoded
frames, large batched writes), waits until the queue holds them all, and prints
RssAnon of the empty broker, of the broker holding N messages, and the growth.
With --rabbitmq it does the same against a running RabbitMQ (beam.smp).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from warren.amqp import spec  # noqa: E402
from warren.amqp.frames import content_frames, method_frame  # noqa: E402
from warren.core.properties import BasicProperties  # noqa: E402

QUEUE = "bench-memory"


def rss_anon_kb(pid: int) -> int:
    text = Path(f"/proc/{pid}/status").read_text()
    m = re.search(r"RssAnon:\s+(\d+) kB", text)
    if m:
        return int(m.group(1))
    # Kernels without RssAnon: VmRSS is the upper bound.
    m = re.search(r"VmRSS:\s+(\d+) kB", text)
    assert m is not None
    return int(m.group(1))


class RawClient:
    """Just enough AMQP to declare a queue and publish fast."""

    def __init__(self, port: int, queue: str = QUEUE) -> None:
        self.queue = queue
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.sock.sendall(b"AMQP\x00\x00\x09\x01")
        self.expect(spec.ConnectionStart)
        self.send(
            0,
            spec.ConnectionStartOk(
                client_properties={},
                mechanism="PLAIN",
                response=b"\x00guest\x00guest",
                locale="en_US",
            ),
        )
        tune = self.expect(spec.ConnectionTune)
        self.frame_max = tune.frame_max
        self.send(
            0,
            spec.ConnectionTuneOk(
                channel_max=tune.channel_max, frame_max=tune.frame_max, heartbeat=0
            ),
        )
        self.send(0, spec.ConnectionOpen(virtual_host="/"))
        self.expect(spec.ConnectionOpenOk)
        self.send(1, spec.ChannelOpen())
        self.expect(spec.ChannelOpenOk)

    def send(self, channel: int, method: spec.Method) -> None:
        self.sock.sendall(method_frame(channel, method))

    def expect(self, cls: type[spec.Method]) -> spec.Method:
        while True:
            if len(self.buf) >= 7:
                ftype, _ch, size = struct.unpack_from(">BHI", self.buf)
                if len(self.buf) >= size + 8:
                    payload = self.buf[7 : 7 + size]
                    self.buf = self.buf[size + 8 :]
                    if ftype != 1:
                        continue
                    method = spec.decode_method(payload)
                    if not isinstance(method, cls):
                        raise RuntimeError(f"expected {cls.__name__}, got {method!r}")
                    return method
            data = self.sock.recv(65536)
            if not data:
                raise RuntimeError("broker closed the connection")
            self.buf += data

    def message_count(self) -> int:
        self.send(1, spec.QueueDeclare(queue=self.queue, passive=True))
        ok = self.expect(spec.QueueDeclareOk)
        assert isinstance(ok, spec.QueueDeclareOk)
        return ok.message_count

    def publish(self, count: int, size: int) -> float:
        props = BasicProperties(delivery_mode=2).encode()
        one = b"".join(
            [method_frame(1, spec.BasicPublish(exchange="", routing_key=self.queue))]
            + content_frames(1, props, b"x" * size, self.frame_max)
        )
        batch = 10_000
        chunk = one * batch
        start = time.monotonic()
        sent = 0
        while sent < count:
            n = min(batch, count - sent)
            self.sock.sendall(chunk if n == batch else one * n)
            sent += n
        # A synchronous round trip per second until the broker has taken them all.
        while self.message_count() < count:
            time.sleep(0.5)
        return time.monotonic() - start


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def warren_broker() -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """Run `python -m warren` on a scratch data dir; yields (process, AMQP port) once it
    listens, and stops it afterwards."""
    with tempfile.TemporaryDirectory(prefix="warren-bench-") as data:
        env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1] / "src"))
        port = _free_port()
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "warren",
                "--amqp-port",
                str(port),
                "--http-port",
                "-1",
                "--mqtt-port",
                "-1",
                "--stream-port",
                "-1",
                "--prometheus-port",
                "-1",
                "-D",
                data,
                "--log-level",
                "warning",
            ],
            stdout=subprocess.DEVNULL,
            env=env,
        )
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise RuntimeError("warren did not start") from None
                    time.sleep(0.1)
            yield proc, port
        finally:
            proc.terminate()
            proc.wait(60)


def run_warren(count: int, size: int) -> dict[str, float]:
    with warren_broker() as (proc, port):
        return _measure(proc.pid, port, count, size)


def _measure(pid: int, port: int, count: int, size: int) -> dict[str, float]:
    client = RawClient(port)
    client.send(1, spec.QueueDeclare(queue=QUEUE, durable=True))
    client.expect(spec.QueueDeclareOk)
    return _measure_existing(client, pid, count, size)


def run_rabbitmq(
    count: int, size: int, port: int = 5672, pid: int | None = None
) -> dict[str, float]:
    if pid is None:
        pid = int(subprocess.check_output(["pidof", "beam.smp"]).split()[0])
    return run_running(count, size, port, pid)


def run_running(count: int, size: int, port: int, pid: int) -> dict[str, float]:
    """Measure a broker that is already running (RabbitMQ, LavinMQ): ``pid`` is the
    process whose memory is read; the queue is deleted before and after."""
    client = RawClient(port)
    client.send(1, spec.QueueDelete(queue=QUEUE))
    client.expect(spec.QueueDeleteOk)
    client.send(1, spec.QueueDeclare(queue=QUEUE, durable=True))
    client.expect(spec.QueueDeclareOk)
    try:
        return _measure_existing(client, pid, count, size)
    finally:
        client.send(1, spec.QueueDelete(queue=QUEUE))
        client.expect(spec.QueueDeleteOk)


def _measure_existing(client: RawClient, pid: int, count: int, size: int) -> dict[str, float]:
    empty = rss_anon_kb(pid)
    seconds = client.publish(count, size)
    full = rss_anon_kb(pid)
    return {
        "messages": count,
        "body_bytes": size,
        "rss_anon_empty_mb": empty / 1024,
        "rss_anon_full_mb": full / 1024,
        "growth_mb": (full - empty) / 1024,
        "publish_seconds": seconds,
        "publish_rate": count / seconds,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=10_000_000)
    p.add_argument("--size", type=int, default=16)
    p.add_argument("--rabbitmq", action="store_true", help="measure a running RabbitMQ instead")
    args = p.parse_args()
    result = (
        run_rabbitmq(args.count, args.size) if args.rabbitmq else run_warren(args.count, args.size)
    )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
