"""Broker RAM while a long stream is read end to end by many consumers.

A stream queue keeps its messages in segment files and every consumer reads
them through a memory map of its own, so neither the length of the stream nor
the number of consumers reading it should cost the broker anonymous memory
(RssAnon; the mapped segments are page cache and do not count). Run:

    .venv/bin/python bench/stream_memory.py --count 10000000 --consumers 10

It starts `python -m warren` on a scratch data dir, declares a stream
(x-queue-type: stream), publishes N persistent 16-byte messages over one raw
connection (pre-encoded frames in large batches, no confirms; then waits until
the stream's message_count, from a passive declare, is N) and reads RssAnon.
Then each consumer, in a process and on a connection of its own, sets basic.qos
prefetch 1000, consumes with x-stream-offset "first", acks (multiple=true) every
500 deliveries and reads until it has seen offset N-1, checking that offsets
arrive in order without gaps. Meanwhile the broker's RssAnon is sampled every
0.5 s. Printed: RssAnon of the empty broker, after publishing, its peak while
the consumers read, the growth per message, and the times and rates.

The consumers scan received bytes in bulk: once one delivery has arrived whole,
every delivery has the same length (16-byte bodies, offset and timestamp headers
of fixed width), so a run of k whole deliveries is checked with one
``bytes.count`` of the deliver frame's prefix plus its first and last offsets,
and only the deliveries that end an ack batch are looked at individually.
Anything else (a partial delivery, another method) goes frame by frame.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import struct
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # queue_memory, beside this script

from queue_memory import RawClient, rss_anon_kb, warren_broker  # noqa: E402

import warren  # noqa: E402
from warren.amqp import spec  # noqa: E402

STREAM = "bench-stream"
#: A consumer reports its progress to the parent at most this often (seconds).
PROGRESS_S = 1.0
#: No consumer progress for this long (seconds) is reported as a stall.
STALL_S = 60.0
RECV_SIZE = 1 << 20

_HDR = struct.Struct(">BHI")  # frame type, channel, payload size
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")
_DELIVER = _U32.pack(spec.BasicDeliver.INDEX)
#: The x-stream-offset entry of a headers table: name (shortstr), then type 'l' (long).
_OFFSET_ENTRY = b"\x0fx-stream-offsetl"
_CLOSES = {spec.ConnectionClose.INDEX, spec.ChannelClose.INDEX, spec.BasicCancel.INDEX}


# -- consumer process -------------------------------------------------------------------------


@dataclass
class ReaderResult:
    index: int
    count: int  # deliveries received
    last_offset: int
    seconds: float  # from basic.consume to offset N-1
    start: float  # time.monotonic() when it sent basic.consume
    end: float  # ... and when it saw offset N-1
    bulk: int  # deliveries taken by the bulk path
    acks: int  # basic.ack frames sent
    cpu: float  # CPU seconds of the process while it read


def _ack_frame(tag: int) -> bytes:
    """basic.ack(delivery_tag=tag, multiple=true) on channel 1."""
    return _HDR.pack(1, 1, 13) + _U32.pack(spec.BasicAck.INDEX) + _U64.pack(tag) + b"\x01\xce"


class StreamReader:
    """The consuming loop of one consumer (see the module docstring)."""

    def __init__(self, client: RawClient, count: int, ack_every: int, conn: Connection) -> None:
        self.client = client
        self.count = count
        self.ack_every = ack_every
        self.conn = conn
        self.got = 0  # deliveries received
        self.next_offset = 0  # the offset expected next
        self.last_tag = 0
        self.acked_tag = 0
        self.bulk = 0
        self.acks = 0
        # The delivery template, from the first delivery that arrived whole:
        self.length = 0  # bytes of one delivery (3 frames)
        self.prefix = b""  # deliver frame: header, method id, consumer tag
        self.tag_at = 0  # where the delivery tag sits in a delivery
        self.offset_at = 0  # ... and the x-stream-offset value
        # The delivery being read frame by frame (slow path):
        self.in_delivery = False
        self.cur_tag = 0
        self.cur_start = -1  # its first byte in the buffer, -1 once the buffer moved on
        self.cur_offset = -1
        self.cur_offset_at = 0
        self.remaining = 0

    def run(self, buf: bytes) -> None:
        sock = self.client.sock
        recv = sock.recv
        next_report = time.monotonic() + PROGRESS_S
        pos = self.parse(buf, 0)
        buf = buf[pos:]
        while self.next_offset < self.count:
            data = recv(RECV_SIZE)
            if not data:
                raise EOFError("broker closed the connection")
            buf = buf + data if buf else data
            self.cur_start = -1  # a delivery in progress began in the previous buffer
            pos = self.parse(buf, 0)
            buf = buf[pos:] if pos < len(buf) else b""
            now = time.monotonic()
            if now >= next_report:
                next_report = now + PROGRESS_S
                self.conn.send(("progress", self.got))
        if self.last_tag > self.acked_tag:
            sock.sendall(_ack_frame(self.last_tag))
            self.acks += 1
            self.acked_tag = self.last_tag
        self.client.buf = buf

    def parse(self, buf: bytes, pos: int) -> int:
        """Take every whole frame of ``buf`` from ``pos``; returns where the rest starts."""
        n = len(buf)
        acks: list[bytes] = []
        length = self.length
        while n - pos >= 7:
            if length and not self.in_delivery:
                k = (n - pos) // length
                if k:
                    taken = self.bulk_take(buf, pos, k, acks)
                    if taken:
                        pos += taken * length
                        if self.next_offset >= self.count:
                            break
                        continue
                elif buf.startswith(self.prefix, pos):
                    break  # the start of a delivery: wait for the rest of it
            ftype, _ch, size = _HDR.unpack_from(buf, pos)
            end = pos + 8 + size
            if end > n:
                break
            if buf[end - 1] != 0xCE:
                raise RuntimeError(f"bad frame end at delivery {self.got}")
            self.frame(buf, pos, ftype, end, acks)
            length = self.length
            pos = end
            if self.next_offset >= self.count:
                break
        if acks:
            self.client.sock.sendall(b"".join(acks))
            self.acks += len(acks)
        return pos

    def bulk_take(self, buf: bytes, pos: int, k: int, acks: list[bytes]) -> int:
        """Take k whole deliveries at ``pos`` if they look like a run of the template
        with consecutive offsets and delivery tags; returns k, or 0 to go frame by frame."""
        length = self.length
        end = pos + k * length
        last = end - length
        offset_at = self.offset_at
        tag_at = self.tag_at
        if (
            buf.count(self.prefix, pos, end) != k
            or _I64.unpack_from(buf, pos + offset_at)[0] != self.next_offset
            or _I64.unpack_from(buf, last + offset_at)[0] != self.next_offset + k - 1
        ):
            return 0
        first_tag = _U64.unpack_from(buf, pos + tag_at)[0]
        last_tag = _U64.unpack_from(buf, last + tag_at)[0]
        if last_tag - first_tag != k - 1 or buf[end - 1] != 0xCE:
            return 0
        got = self.got
        every = self.ack_every
        boundary = (got // every + 1) * every  # the next delivery count that gets an ack
        while boundary <= got + k:
            tag = _U64.unpack_from(buf, pos + (boundary - got - 1) * length + tag_at)[0]
            acks.append(_ack_frame(tag))
            self.acked_tag = tag
            boundary += every
        self.got = got + k
        self.next_offset += k
        self.last_tag = last_tag
        self.bulk += k
        return k

    def frame(self, buf: bytes, pos: int, ftype: int, end: int, acks: list[bytes]) -> None:
        """One whole frame, by the general path."""
        if ftype == 1:
            idx = _U32.unpack_from(buf, pos + 7)[0]
            if idx == spec.BasicDeliver.INDEX:
                tag_at = 12 + buf[pos + 11]  # after the consumer tag (shortstr)
                self.cur_tag = _U64.unpack_from(buf, pos + tag_at)[0]
                self.cur_start = pos
                self.in_delivery = True
                self.cur_offset = -1
                self.remaining = -1
            elif idx in _CLOSES:
                method = spec.decode_method(buf[pos + 7 : end - 1])
                raise RuntimeError(f"broker sent {method!r} at delivery {self.got}")
            return
        if not self.in_delivery:
            if ftype == 8:
                return  # heartbeat
            raise RuntimeError(f"frame type {ftype} outside a delivery at delivery {self.got}")
        complete = False
        if ftype == 2:
            self.remaining = _U64.unpack_from(buf, pos + 11)[0]
            at = buf.find(_OFFSET_ENTRY, pos + 7, end)
            if at < 0:
                raise RuntimeError(f"delivery {self.got} has no x-stream-offset header")
            self.cur_offset_at = at + len(_OFFSET_ENTRY)
            self.cur_offset = _I64.unpack_from(buf, self.cur_offset_at)[0]
            complete = self.remaining == 0
        elif ftype == 3:
            self.remaining -= end - pos - 8
            complete = self.remaining <= 0
        if not complete:
            return
        self.in_delivery = False
        if self.cur_offset != self.next_offset:
            raise RuntimeError(
                f"expected offset {self.next_offset}, got {self.cur_offset} "
                f"(delivery {self.got + 1}, tag {self.cur_tag})"
            )
        self.next_offset += 1
        self.got += 1
        self.last_tag = self.cur_tag
        if self.got % self.ack_every == 0:
            acks.append(_ack_frame(self.cur_tag))
            self.acked_tag = self.cur_tag
        start = self.cur_start
        if not self.length and start >= 0 and buf[start + 7 : start + 11] == _DELIVER:
            # Whole in this buffer: it becomes the template of the bulk path.
            self.tag_at = 12 + buf[start + 11]
            self.prefix = buf[start : start + self.tag_at]
            self.offset_at = self.cur_offset_at - start
            self.length = end - start


def consumer_main(
    index: int, port: int, count: int, prefetch: int, ack_every: int, conn: Connection
) -> None:
    """A consumer process: connect, report ready, wait for go, read the whole stream."""
    try:
        client = RawClient(port, STREAM)
        client.send(1, spec.BasicQos(prefetch_count=prefetch))
        client.expect(spec.BasicQosOk)
        conn.send(("ready", 0))
        conn.recv()  # go
        start = time.monotonic()
        cpu0 = time.process_time()
        client.send(
            1,
            spec.BasicConsume(
                queue=STREAM,
                consumer_tag=f"reader-{index}",
                arguments={"x-stream-offset": "first"},
            ),
        )
        client.expect(spec.BasicConsumeOk)
        buf, client.buf = client.buf, b""
        reader = StreamReader(client, count, ack_every, conn)
        reader.run(buf)
        end = time.monotonic()
        client.send(0, spec.ConnectionClose(reply_code=200, reply_text="done"))
        client.expect(spec.ConnectionCloseOk)
        client.sock.close()
        result = ReaderResult(
            index=index,
            count=reader.got,
            last_offset=reader.next_offset - 1,
            seconds=end - start,
            start=start,
            end=end,
            bulk=reader.bulk,
            acks=reader.acks,
            cpu=time.process_time() - cpu0,
        )
        conn.send(("done", asdict(result)))
    except BaseException:
        conn.send(("error", traceback.format_exc()))


# -- parent -------------------------------------------------------------------------------------


class RssSampler:
    """The broker's RssAnon every ``interval`` seconds, in a thread, until stopped."""

    def __init__(self, pid: int, interval: float = 0.5) -> None:
        self.pid = pid
        self.interval = interval
        self.samples: list[tuple[float, int]] = []  # (time.monotonic(), kB)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while True:  # the last sample is taken when stopped
            stopping = self._stop.is_set()
            try:
                self.samples.append((time.monotonic(), rss_anon_kb(self.pid)))
            except (OSError, AssertionError):
                return  # the broker is gone
            if stopping:
                return
            self._stop.wait(self.interval)

    @property
    def peak(self) -> int:
        return max((kb for _t, kb in self.samples), default=0)

    @property
    def last(self) -> int:
        return self.samples[-1][1] if self.samples else 0

    def at(self, when: float) -> int:
        """The last sample taken at or before ``when`` (else the first)."""
        before = [kb for t, kb in self.samples if t <= when]
        return before[-1] if before else self.samples[0][1]

    def peak_after(self, when: float) -> int:
        return max((kb for t, kb in self.samples if t >= when), default=self.at(when))

    def slope_after(self, when: float) -> float:
        """Least-squares slope of RssAnon (kB per second) over the samples from ``when``."""
        points = [(t, kb) for t, kb in self.samples if t >= when]
        if len(points) < 2:
            return 0.0
        mt = sum(t for t, _ in points) / len(points)
        mk = sum(kb for _, kb in points) / len(points)
        var = sum((t - mt) ** 2 for t, _ in points)
        return sum((t - mt) * (kb - mk) for t, kb in points) / var if var else 0.0


@dataclass
class ReadPhase:
    results: list[ReaderResult]
    seconds: float  # from go to the last consumer done
    rss: RssSampler
    broker_cpu: float  # broker CPU seconds meanwhile
    tenth: float  # time.monotonic() when every consumer had read a tenth of the stream


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def data_dir_bytes(pid: int) -> int:
    """Bytes of the files in the broker's data dir (its ``-D`` argument)."""
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    data = Path(os.fsdecode(argv[argv.index(b"-D") + 1]))
    return sum(f.stat().st_size for f in data.rglob("*") if f.is_file())


def read_stream(
    pid: int,
    alive: Callable[[], bool],
    port: int,
    count: int,
    consumers: int,
    prefetch: int,
    ack_every: int,
) -> ReadPhase:
    """Run the consumers, sampling the broker's RssAnon while they read."""
    ctx = multiprocessing.get_context("spawn")
    procs: list[multiprocessing.process.BaseProcess] = []
    conns: list[Connection] = []
    for i in range(consumers):
        parent_end, child_end = ctx.Pipe()
        proc = ctx.Process(
            target=consumer_main,
            args=(i, port, count, prefetch, ack_every, child_end),
            daemon=True,
        )
        proc.start()
        child_end.close()
        procs.append(proc)
        conns.append(parent_end)
    finished = False
    try:
        for c in conns:
            kind, payload = c.recv()
            if kind != "ready":
                raise RuntimeError(f"consumer failed to start:\n{payload}")
        progress = [0] * consumers
        results: dict[int, ReaderResult] = {}
        cpu0 = cpu_seconds(pid)
        with RssSampler(pid) as sampler:
            t0 = time.monotonic()
            for c in conns:
                c.send("go")
            last_change = t0
            tenth = 0.0
            last_total = 0
            next_line = t0 + 10
            while len(results) < consumers:
                for ready in wait([conns[i] for i in range(consumers) if i not in results], 1.0):
                    assert isinstance(ready, Connection)
                    i = conns.index(ready)
                    kind, payload = ready.recv()
                    if kind == "progress":
                        progress[i] = payload
                    elif kind == "done":
                        results[i] = ReaderResult(**payload)
                        progress[i] = results[i].count
                    else:
                        raise RuntimeError(f"consumer {i} failed:\n{payload}")
                now = time.monotonic()
                if not tenth and min(progress) >= count // 10:
                    tenth = now
                if not alive():
                    raise RuntimeError("the broker exited while the consumers were reading")
                total = sum(progress)
                if total != last_total:
                    last_total, last_change = total, now
                elif now - last_change > STALL_S:
                    raise RuntimeError(
                        f"no consumer progress for {STALL_S:.0f} s; deliveries per consumer "
                        f"{progress} of {count}, broker RssAnon {sampler.last / 1024:.1f} MiB"
                    )
                if now >= next_line:
                    next_line += 10
                    print(
                        f"  {now - t0:6.0f} s: {total:,} deliveries "
                        f"({total / (now - t0):,.0f}/s), min {min(progress):,} "
                        f"max {max(progress):,}, RssAnon {sampler.last / 1024:.1f} MiB",
                        file=sys.stderr,
                    )
            seconds = max(r.end for r in results.values()) - t0
        cpu = cpu_seconds(pid) - cpu0
        finished = True
        return ReadPhase([results[i] for i in range(consumers)], seconds, sampler, cpu, tenth)
    finally:
        for child in procs:
            child.join(5 if finished else 0)
            if child.is_alive():
                child.terminate()
                child.join()


def run(count: int, consumers: int, size: int, prefetch: int, ack_every: int) -> dict[str, Any]:
    # The broker decides as this process did a moment ago (warren/__init__.py): a source
    # newer than its compiled module makes every module run from its .py.
    build = warren.build_description()
    if not build.startswith("compiled"):
        print(f"warning: Warren runs as {build}; `make build` compiles it", file=sys.stderr)
    with warren_broker() as (broker, port):
        pid = broker.pid
        client = RawClient(port, STREAM)
        client.send(
            1,
            spec.QueueDeclare(queue=STREAM, durable=True, arguments={"x-queue-type": "stream"}),
        )
        client.expect(spec.QueueDeclareOk)
        empty = rss_anon_kb(pid)
        print(f"publishing {count:,} messages ...", file=sys.stderr)
        with RssSampler(pid) as publishing:
            publish_seconds = client.publish(count, size)
        published = rss_anon_kb(pid)
        print(f"  {publish_seconds:.1f} s; reading with {consumers} consumers ...", file=sys.stderr)
        phase = read_stream(
            pid, lambda: broker.poll() is None, port, count, consumers, prefetch, ack_every
        )
        time.sleep(1)
        after = rss_anon_kb(pid)
        stored = client.message_count()
        disk = data_dir_bytes(pid)
        client.sock.close()
    results = phase.results
    for r in results:
        if r.count != count or r.last_offset != count - 1:
            raise RuntimeError(f"consumer {r.index} read {r.count} ending at {r.last_offset}")
    reading = phase.rss
    peak = max(reading.peak, published)
    at_tenth = reading.at(phase.tenth)
    late = reading.peak_after(phase.tenth) - at_tenth
    # RssAnon's trend over those nine tenths, per message of the stream read by every
    # consumer (each of them reads count / phase.seconds messages a second).
    trend = reading.slope_after(phase.tenth) * 1024 * phase.seconds / count
    mib = 1024.0
    return {
        "messages": count,
        "body_bytes": size,
        "consumers": consumers,
        "prefetch": prefetch,
        "ack_every": ack_every,
        "warren_build": build,
        "stream_message_count_after": stored,
        "data_dir_mib": round(disk / 1024 / 1024),
        "rss_anon_empty_mib": round(empty / mib, 1),
        "rss_anon_peak_publishing_mib": round(publishing.peak / mib, 1),
        "rss_anon_published_mib": round(published / mib, 1),
        "rss_anon_peak_reading_mib": round(peak / mib, 1),
        "rss_anon_after_reading_mib": round(after / mib, 1),
        "rss_samples_reading": len(reading.samples),
        "growth_publish_mib": round((published - empty) / mib, 1),
        "growth_peak_mib": round((peak - empty) / mib, 1),
        # Everything the broker grew, the consumers' fixed cost included, per stored message:
        "growth_per_message_bytes": round((peak - empty) * 1024 / count, 3),
        # Once every consumer had read a tenth of the stream: RssAnon then, and how
        # much more it grew while they read the other nine tenths, per message read.
        "rss_anon_at_tenth_read_mib": round(at_tenth / mib, 1),
        "growth_last_nine_tenths_mib": round(late / mib, 1),
        "growth_per_message_last_nine_tenths_bytes": round(
            late * 1024 / max(1, count - count // 10), 3
        ),
        "trend_per_message_last_nine_tenths_bytes": round(trend, 3),
        "publish_seconds": round(publish_seconds, 1),
        "publish_rate": round(count / publish_seconds),
        "read_seconds": round(phase.seconds, 1),
        "read_rate": round(count * consumers / phase.seconds),
        "consumer_seconds_min": round(min(r.seconds for r in results), 1),
        "consumer_seconds_max": round(max(r.seconds for r in results), 1),
        "broker_cpu_reading": round(phase.broker_cpu / phase.seconds, 2),
        "consumers_cpu_reading": round(sum(r.cpu for r in results) / phase.seconds, 2),
        "bulk_fraction": round(sum(r.bulk for r in results) / (count * consumers), 4),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=10_000_000, help="messages in the stream")
    p.add_argument("--consumers", type=int, default=10, help="consumers reading it all")
    p.add_argument("--size", type=int, default=16, help="body bytes")
    p.add_argument("--prefetch", type=int, default=1000, help="basic.qos prefetch count")
    p.add_argument("--ack", type=int, default=500, help="ack (multiple) every N deliveries")
    args = p.parse_args()
    if args.count < 1 or args.consumers < 1 or args.prefetch < 1 or args.ack < 1:
        p.error("--count, --consumers, --prefetch and --ack must be at least 1")
    if args.ack > args.prefetch:
        p.error("--ack must not exceed --prefetch (the consumers would wait for ever)")
    result = run(args.count, args.consumers, args.size, args.prefetch, args.ack)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
