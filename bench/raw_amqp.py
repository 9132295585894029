"""A raw-socket AMQP 0-9-1 load generator that shares no code with Warren (issue 27).

Plain sockets, ``struct`` and a hand-written encoder; nothing from ``warren``,
so a pattern Warren's own client (``warren perf``) happens to produce cannot
flatter the numbers. The other raw-socket clients (bench/wa_load.py,
bench/stream_backlog.py, bench/queue_backlog.py) take their encoder and
connection from here. What bench/backlog_bench.py needs:

- :class:`Conn`: one connection with channel 1 open; declare, delete, depth.
- :func:`fill`: put N messages into a queue (no confirms, large pre-encoded
  batches), then wait until the queue holds them all.
- :func:`drain`: consume N messages from a backlog: no-ack, single acks
  (``basic.ack`` with multiple=false for every delivery) or a multiple ack
  every K deliveries.
- :func:`publisher` / :func:`consumer`: the two sides of a timed run, each
  meant for a process of its own (:func:`run_pair`); the publisher with or
  without confirms (a window of unconfirmed messages), the consumer in any of
  the drain's ack modes.

Deliveries are counted without parsing each frame: every basic.deliver frame a
consumer gets has the same size (fixed consumer tag, exchange and routing key,
a 64-bit tag), so the 11 bytes "method frame, channel 1, that size, class 60
method 60" are a marker that ``bytes.count`` finds in C; bodies are bytes of
``x`` and cannot contain it. Delivery tags on a fresh channel run 1, 2, 3 ...,
so the n-th delivery's tag is n and acks need no parsing either.
"""

from __future__ import annotations

import multiprocessing
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import Any

FRAME = struct.Struct(">BHI")
_U64B = struct.Struct(">QB")
FRAME_END = b"\xce"
BODY_BYTE = b"x"

#: Ack modes of a consumer.
NOACK, SINGLE, MULTIPLE = "noack", "single", "multiple"
MODES = (NOACK, SINGLE, MULTIPLE)


def frame(ftype: int, channel: int, payload: bytes) -> bytes:
    return FRAME.pack(ftype, channel, len(payload)) + payload + FRAME_END


def method(channel: int, cls: int, mid: int, args: bytes = b"") -> bytes:
    return frame(1, channel, struct.pack(">HH", cls, mid) + args)


def shortstr(s: str) -> bytes:
    b = s.encode()
    return bytes([len(b)]) + b


def longstr(b: bytes) -> bytes:
    return struct.pack(">I", len(b)) + b


def table(entries: dict[str, str | int]) -> bytes:
    """A field table of string ("S") and 32-bit integer ("I") values."""
    parts = []
    for k, v in entries.items():
        if isinstance(v, int):
            parts.append(shortstr(k) + b"I" + struct.pack(">i", v))
        else:
            parts.append(shortstr(k) + b"S" + longstr(v.encode()))
    return longstr(b"".join(parts))


def publish_bytes(queue: str, size: int, persistent: bool, frame_max: int = 131072) -> bytes:
    """basic.publish to the default exchange, its content header (delivery-mode 2
    when persistent, else no properties) and the body of ``size`` bytes of ``x``."""
    out = [method(1, 60, 40, b"\x00\x00" + shortstr("") + shortstr(queue) + b"\x00")]
    if persistent:
        header = struct.pack(">HHQH", 60, 0, size, 0x1000) + b"\x02"
    else:
        header = struct.pack(">HHQH", 60, 0, size, 0)
    out.append(frame(2, 1, header))
    body = BODY_BYTE * size
    step = frame_max - 8
    for i in range(0, size, step):
        out.append(frame(3, 1, body[i : i + step]))
    return b"".join(out)


def ack_frame(tag: int, multiple: bool) -> bytes:
    return method(1, 60, 80, _U64B.pack(tag, 1 if multiple else 0))


#: basic.ack on channel 1: frame header and class/method ids, then tag and bits.
_ACK_HEAD = FRAME.pack(1, 1, 13) + struct.pack(">HH", 60, 80)
_ACK_ONE = _ACK_HEAD + bytes(9) + FRAME_END


def single_acks(first: int, last: int) -> bytes:
    """basic.ack(multiple=false) for every tag in first..last, as one buffer: a
    template of 21-byte frames whose tag bytes are filled by slices, no loop per tag."""
    n = last - first + 1
    if n <= 0:
        return b""
    buf = bytearray(_ACK_ONE * n)
    tags = struct.pack(f">{n}Q", *range(first, last + 1))
    size, at = len(_ACK_ONE), len(_ACK_HEAD)
    for j in range(8):
        buf[at + j :: size] = tags[j::8]
    return bytes(buf)


class Closed(Exception):
    """The broker closed the connection or the channel."""


@dataclass
class Conn:
    """One blocking connection with channel 1 open."""

    sock: socket.socket
    frame_max: int = 131072
    buf: bytes = b""
    sent: int = 0

    @classmethod
    def open(cls, port: int, host: str = "127.0.0.1", timeout: float = 120) -> Conn:
        sock = socket.create_connection((host, port), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        c = cls(sock)
        c.send(b"AMQP\x00\x00\x09\x01")
        c.expect(10, 10)  # connection.start
        auth = b"\x00guest\x00guest"
        c.send(method(0, 10, 11, table({}) + shortstr("PLAIN") + longstr(auth) + shortstr("en_US")))
        tune = c.expect(10, 30)
        channel_max, frame_max, _hb = struct.unpack_from(">HIH", tune)
        c.frame_max = frame_max or 131072
        c.send(method(0, 10, 31, struct.pack(">HIH", channel_max, c.frame_max, 0)))
        c.send(method(0, 10, 40, shortstr("/") + shortstr("") + b"\x00"))
        c.expect(10, 41)
        c.send(method(1, 20, 10, shortstr("")))
        c.expect(20, 11)
        return c

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)
        self.sent += len(data)

    def recv(self) -> bytes:
        data = self.sock.recv(1 << 20)
        if not data:
            raise Closed("the broker closed the connection")
        return data

    def frames(self) -> list[tuple[int, int, bytes]]:
        """The complete frames received so far (blocking until there is one)."""
        while True:
            out: list[tuple[int, int, bytes]] = []
            buf, pos, n = self.buf, 0, len(self.buf)
            while n - pos >= 7:
                ftype, ch, size = FRAME.unpack_from(buf, pos)
                if n - pos < size + 8:
                    break
                out.append((ftype, ch, buf[pos + 7 : pos + 7 + size]))
                pos += size + 8
            self.buf = buf[pos:]
            if out:
                return out
            self.buf += self.recv()

    def expect(self, cls: int, mid: int) -> bytes:
        """The arguments of the next method frame, which must be (cls, mid); frames
        after it stay in the buffer."""
        while True:
            frames = self.frames()
            for i, (ftype, _ch, payload) in enumerate(frames):
                if ftype != 1:
                    continue
                got = struct.unpack_from(">HH", payload)
                if got in ((10, 50), (20, 40)):
                    raise Closed(f"closed by the broker: {payload[6:].decode(errors='replace')}")
                if got != (cls, mid):
                    continue  # e.g. a late basic.ack confirm
                rest = b"".join(frame(t, ch, p) for t, ch, p in frames[i + 1 :])
                self.buf = rest + self.buf
                return payload[4:]

    def declare(
        self, queue: str, durable: bool = False, args: dict[str, str | int] | None = None
    ) -> int:
        """queue.declare; returns the message count."""
        flags = 0x02 if durable else 0
        self.send(
            method(1, 50, 10, b"\x00\x00" + shortstr(queue) + bytes([flags]) + table(args or {}))
        )
        reply = self.expect(50, 11)
        return int(struct.unpack_from(">I", reply, 1 + reply[0])[0])

    def depth(self, queue: str) -> int:
        """The queue's ready messages (passive queue.declare)."""
        self.send(method(1, 50, 10, b"\x00\x00" + shortstr(queue) + b"\x01" + table({})))
        reply = self.expect(50, 11)
        return int(struct.unpack_from(">I", reply, 1 + reply[0])[0])

    def delete(self, queue: str) -> None:
        self.send(method(1, 50, 40, b"\x00\x00" + shortstr(queue) + b"\x00"))
        self.expect(50, 41)

    def close(self) -> None:
        try:
            self.send(method(0, 10, 50, struct.pack(">H", 200) + shortstr("") + b"\0\0\0\0"))
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                if any(t == 1 and p[:4] == b"\x00\x0a\x00\x33" for t, _c, p in self.frames()):
                    break
        except (OSError, Closed):
            pass
        self.sock.close()


def fresh_queue(port: int, queue: str, durable: bool) -> None:
    """Delete ``queue`` if it exists and declare it again, empty."""
    c = Conn.open(port)
    c.delete(queue)
    c.declare(queue, durable)
    c.close()


def wait_depth(port: int, queue: str, n: int, timeout: float = 600) -> None:
    """Until the queue holds at least ``n`` ready messages."""
    c = Conn.open(port)
    deadline = time.monotonic() + timeout
    try:
        while (d := c.depth(queue)) < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{queue} holds {d:,} of {n:,} messages after {timeout:g} s")
            time.sleep(0.05)
    finally:
        c.close()


def publish_confirmed(c: Conn, queue: str, n: int, size: int, persistent: bool = False) -> float:
    """Publish ``n`` messages on ``c`` with confirms, at most 20,000 unconfirmed;
    returns messages/s from the first publish until the last confirm."""
    c.send(method(1, 85, 10, b"\x00"))
    c.expect(85, 11)
    one = publish_bytes(queue, size, persistent, c.frame_max)
    started = time.perf_counter()
    confirmed = sent = 0
    while confirmed < n:
        if sent < n and sent - confirmed < 20_000:
            k = min(1000, n - sent)
            c.send(one * k)
            sent += k
            continue
        for ftype, _ch, payload in c.frames():
            if ftype == 1 and payload[:4] == b"\x00\x3c\x00\x50":  # basic.ack
                tag, multiple = struct.unpack_from(">QB", payload, 4)
                confirmed = tag if multiple & 1 else confirmed + 1
    return n / (time.perf_counter() - started)


def fill(port: int, queue: str, n: int, size: int, persistent: bool) -> float:
    """Publish ``n`` messages (no confirms) and wait until the queue holds them all;
    returns messages/s from the first publish until then."""
    c = Conn.open(port)
    one = publish_bytes(queue, size, persistent, c.frame_max)
    per = 1000
    batch = one * per
    started = time.perf_counter()
    left = n
    while left >= per:
        c.send(batch)
        left -= per
    if left:
        c.send(one * left)
    wait_depth(port, queue, n)
    seconds = time.perf_counter() - started
    c.close()
    return n / seconds


# =====================================================================================
# Consuming: the deliver marker, the ack policy, the drain
# =====================================================================================


def deliver_marker(ctag: str, queue: str) -> bytes:
    """The first 11 bytes of every basic.deliver frame this consumer gets on channel 1
    (exchange "", routing key ``queue``): type, channel, size, class 60, method 60."""
    args = shortstr(ctag) + bytes(8) + b"\x00" + shortstr("") + shortstr(queue)
    return FRAME.pack(1, 1, 4 + len(args)) + struct.pack(">HH", 60, 60)


class Acker:
    """Sends the acks a consumer owes after each read: none (no-ack), one
    basic.ack per delivery (single), or one multiple ack every ``every``."""

    def __init__(self, conn: Conn, mode: str, every: int) -> None:
        self.conn = conn
        self.mode = mode
        self.every = max(1, every)
        self.acked = 0

    def settle(self, got: int, final: bool = False) -> None:
        if self.mode == NOACK or got <= self.acked:
            return
        if self.mode == SINGLE:
            self.conn.send(single_acks(self.acked + 1, got))
            self.acked = got
            return
        upto = got if final else got - got % self.every
        if upto > self.acked:
            self.conn.send(
                b"".join(
                    ack_frame(t, True) for t in range(self.acked + self.every, upto, self.every)
                )
                + ack_frame(upto, True)
            )
            self.acked = upto


def start_consume(c: Conn, queue: str, mode: str, prefetch: int, ctag: str = "c1") -> None:
    if mode != NOACK:
        c.send(method(1, 60, 10, struct.pack(">IHB", 0, prefetch, 0)))
        c.expect(60, 11)
    no_ack = 0x02 if mode == NOACK else 0
    c.send(
        method(
            1, 60, 20, b"\x00\x00" + shortstr(queue) + shortstr(ctag) + bytes([no_ack]) + table({})
        )
    )
    c.expect(60, 21)


class Counter:
    """Counts deliveries in the bytes as they arrive (see the module docstring)."""

    def __init__(self, marker: bytes, pending: bytes) -> None:
        self.marker = marker
        self.keep = len(marker) - 1
        self.tail = b""
        self.got = 0
        self.feed(pending)

    def feed(self, data: bytes) -> int:
        buf = self.tail + data
        n = buf.count(self.marker)
        self.got += n
        self.tail = buf[-self.keep :]
        return n


def drain(
    port: int, queue: str, n: int, mode: str, every: int = 100, prefetch: int = 1000
) -> dict[str, Any]:
    """Consume ``n`` messages from ``queue``; seconds from basic.consume to the last."""
    c = Conn.open(port)
    c.sock.settimeout(120)
    started = time.perf_counter()
    start_consume(c, queue, mode, prefetch)
    counter = Counter(deliver_marker("c1", queue), c.buf)
    c.buf = b""
    acker = Acker(c, mode, every)
    recv = c.sock.recv
    while counter.got < n:
        acker.settle(counter.got)
        data = recv(1 << 20)
        if not data:
            raise Closed("the broker closed the connection")
        counter.feed(data)
    seconds = time.perf_counter() - started
    acker.settle(counter.got, final=True)
    c.close()
    return {"count": counter.got, "seconds": seconds, "rate": counter.got / seconds}


# =====================================================================================
# Timed runs: a publisher and a consumer, each in a process of its own
# =====================================================================================


@dataclass(frozen=True)
class Window:
    """When a timed run starts and ends (time.monotonic, the same in every process on
    Linux), and how long after the start the measurement begins."""

    start: float
    seconds: float
    warmup: float

    @property
    def measure_from(self) -> float:
        return self.start + self.warmup

    @property
    def end(self) -> float:
        return self.start + self.warmup + self.seconds


def publisher(
    port: int, queue: str, size: int, persistent: bool, window: int, win: Window
) -> dict[str, Any]:
    """Publish as fast as the broker takes it until ``win.end``; with ``window`` > 0
    confirms are on and at most ``window`` messages are unconfirmed."""
    c = Conn.open(port)
    if window:
        c.send(method(1, 85, 10, b"\x00"))
        c.expect(85, 11)
    one = publish_bytes(queue, size, persistent, c.frame_max)
    batch = one * 100
    sent = confirmed = 0
    at_start = at_end = 0
    marked = False
    _sleep_until(win.start)
    if window == 0:
        while (now := time.monotonic()) < win.end:
            if not marked and now >= win.measure_from:
                at_start, marked = sent, True
            c.send(batch)
            sent += 100
        at_end = sent
    else:
        confirm_ok = b"\x00\x3c\x00\x50"
        while True:
            now = time.monotonic()
            if not marked and now >= win.measure_from:
                at_start, marked = confirmed, True
            if now >= win.end:
                at_end = confirmed
                break
            if sent - confirmed < window:
                k = min(window - (sent - confirmed), 100)
                c.send(one * k)
                sent += k
                continue
            for ftype, _ch, p in c.frames():
                if ftype == 1 and p[:4] == confirm_ok:
                    tag = struct.unpack_from(">Q", p, 4)[0]
                    confirmed = tag if p[12] & 1 else max(confirmed, tag)
                elif ftype == 1 and p[:4] in (b"\x00\x0a\x00\x32", b"\x00\x14\x00\x28"):
                    raise Closed(f"closed by the broker: {p[6:].decode(errors='replace')}")
    c.sock.close()  # no close handshake: a window of confirms may still be on its way
    return {"sent": sent, "measured": at_end - at_start, "confirms": bool(window)}


def consumer(
    port: int, queue: str, mode: str, every: int, prefetch: int, win: Window
) -> dict[str, Any]:
    """Consume until ``win.end``; ``measured`` counts the deliveries in the window."""
    c = Conn.open(port)
    start_consume(c, queue, mode, prefetch)
    counter = Counter(deliver_marker("c1", queue), c.buf)
    c.buf = b""
    acker = Acker(c, mode, every)
    at_start = 0
    marked = False
    c.sock.settimeout(0.2)
    _sleep_until(win.start)
    while True:
        now = time.monotonic()
        if not marked and now >= win.measure_from:
            at_start, marked = counter.got, True
        if now >= win.end:
            break
        acker.settle(counter.got)
        try:
            data = c.sock.recv(1 << 20)
        except TimeoutError:
            continue
        if not data:
            raise Closed("the broker closed the connection")
        counter.feed(data)
    at_end = counter.got
    acker.settle(counter.got, final=True)
    c.sock.close()
    return {"received": at_end, "measured": at_end - at_start}


def _sleep_until(t: float) -> None:
    delay = t - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def _child(fn: Any, kwargs: dict[str, Any], out: Any) -> None:
    try:
        out.send(("ok", fn(**kwargs)))
    except Exception as exc:  # noqa: BLE001  reported to the parent
        out.send(("error", f"{type(exc).__name__}: {exc}"))


@dataclass
class PairResult:
    published: dict[str, Any] = field(default_factory=dict)
    consumed: dict[str, Any] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def run_pair(
    pub: dict[str, Any], con: dict[str, Any], win: Window, during: Any = None
) -> PairResult:
    """Run :func:`publisher` and :func:`consumer` in processes of their own over ``win``;
    ``during(win)`` runs in this process meanwhile (the broker's CPU is read there)."""
    ctx = multiprocessing.get_context("fork")  # Linux: /proc is read anyway
    jobs = []
    for fn, kwargs in ((publisher, pub), (consumer, con)):
        parent, child = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_child, args=(fn, {**kwargs, "win": win}, child), daemon=True)
        proc.start()
        child.close()
        jobs.append((proc, parent))
    if during is not None:
        during(win)
    result = PairResult()
    for (proc, conn), name in zip(jobs, ("published", "consumed"), strict=True):
        if conn.poll(win.end - time.monotonic() + 60):
            status, value = conn.recv()
            if status == "ok":
                setattr(result, name, value)
            else:
                result.errors.append(f"{name}: {value}")
        else:
            result.errors.append(f"{name}: no result")
        proc.join(5)
        if proc.is_alive():
            proc.kill()
    return result
