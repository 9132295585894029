"""A load generator for bench/write_amplification.py that is not Warren's own.

Plain sockets and a hand-written AMQP 0-9-1 encoder (nothing from ``warren``), so
every byte a client sends is counted here, on the client's side of the socket:
that count is the "bytes received" of the write-amplification ratio. Publishers
and the consumer each run in their own process (multiprocessing), so several
publishers load the broker at once.

- :func:`publisher`: persistent messages round-robin over the queues, with at
  most ``window`` unconfirmed (``window`` 1 is a synchronous publisher: one
  message per confirm; 0 publishes without confirms).
- :func:`consumer`: consumes every queue on one channel with manual acks, one
  basic.ack per delivery (``ack_every`` 1) or one ``multiple`` ack every N.
"""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass
from typing import Any

_FRAME = struct.Struct(">BHI")
FRAME_END = b"\xce"


def frame(ftype: int, channel: int, payload: bytes) -> bytes:
    return _FRAME.pack(ftype, channel, len(payload)) + payload + FRAME_END


def method(channel: int, cls: int, mid: int, args: bytes = b"") -> bytes:
    return frame(1, channel, struct.pack(">HH", cls, mid) + args)


def shortstr(s: str) -> bytes:
    b = s.encode()
    return bytes([len(b)]) + b


def longstr(b: bytes) -> bytes:
    return struct.pack(">I", len(b)) + b


def table(entries: dict[str, str]) -> bytes:
    """A field table of string values (all these scenarios need)."""
    body = b"".join(shortstr(k) + b"S" + longstr(v.encode()) for k, v in entries.items())
    return longstr(body)


def publish_bytes(queue: str, size: int, frame_max: int) -> bytes:
    """basic.publish to the default exchange, a content header with delivery-mode 2,
    and the body split into frames no larger than frame_max."""
    out = [method(1, 60, 40, b"\x00\x00" + shortstr("") + shortstr(queue) + b"\x00")]
    header = struct.pack(">HHQH", 60, 0, size, 0x1000) + b"\x02"  # delivery-mode flag
    out.append(frame(2, 1, header))
    body = b"x" * size
    step = frame_max - 8
    for i in range(0, size, step):
        out.append(frame(3, 1, body[i : i + step]))
    return b"".join(out)


class Closed(Exception):
    """The broker closed the connection or the channel."""


@dataclass
class Conn:
    """One connection with channel 1 open; ``sent`` counts every byte written to it."""

    sock: socket.socket
    frame_max: int = 131072
    buf: bytes = b""
    sent: int = 0

    @classmethod
    def open(cls, port: int) -> Conn:
        sock = socket.create_connection(("127.0.0.1", port), timeout=60)
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

    def frames(self) -> list[tuple[int, int, bytes]]:
        """The complete frames received so far (blocking until there is one)."""
        while True:
            out: list[tuple[int, int, bytes]] = []
            buf, pos, n = self.buf, 0, len(self.buf)
            while n - pos >= 7:
                ftype, ch, size = _FRAME.unpack_from(buf, pos)
                if n - pos < size + 8:
                    break
                out.append((ftype, ch, buf[pos + 7 : pos + 7 + size]))
                pos += size + 8
            self.buf = buf[pos:]
            if out:
                return out
            data = self.sock.recv(1 << 20)
            if not data:
                raise Closed("the broker closed the connection")
            self.buf += data

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
                    raise Closed(f"expected {cls}.{mid}, got {got}")
                rest = b"".join(frame(t, ch, p) for t, ch, p in frames[i + 1 :])
                self.buf = rest + self.buf
                return payload[4:]

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


def declare(port: int, queues: list[str], stream: bool) -> None:
    c = Conn.open(port)
    args = table({"x-queue-type": "stream"}) if stream else table({})
    for q in queues:
        c.send(method(1, 50, 10, b"\x00\x00" + shortstr(q) + b"\x02" + args))  # durable
        c.expect(50, 11)
    c.close()


def delete(port: int, queues: list[str]) -> None:
    c = Conn.open(port)
    for q in queues:
        c.send(method(1, 50, 40, b"\x00\x00" + shortstr(q) + b"\x00"))
        c.expect(50, 41)
    c.close()


def publisher(
    port: int, queues: list[str], size: int, window: int, seconds: float
) -> dict[str, Any]:
    """Publish for ``seconds``, then wait for the outstanding confirms and close."""
    c = Conn.open(port)
    if window:
        c.send(method(1, 85, 10, b"\x00"))
        c.expect(85, 11)
    msgs = [publish_bytes(q, size, c.frame_max) for q in queues]
    published = confirmed = nacked = 0
    deadline = time.monotonic() + seconds
    if window == 0:
        # No confirms: batches of 100 round-robin messages until the deadline.
        batch = b"".join(msgs[i % len(msgs)] for i in range(max(100, len(msgs))))
        per = max(100, len(msgs))
        while time.monotonic() < deadline:
            c.send(batch)
            published += per
    else:
        # Confirms may come out of order (a message routed to several queue processes,
        # or to different queues in turn): track the unconfirmed tags themselves.
        n = len(msgs)
        pending: set[int] = set()
        while True:
            now = time.monotonic()
            if now < deadline and len(pending) < window:
                k = window - len(pending)
                c.send(b"".join(msgs[(published + i) % n] for i in range(k)))
                pending.update(range(published + 1, published + k + 1))
                published += k
            if not pending and now >= deadline:
                break
            if now > deadline + 30:
                break  # confirms that never came are reported as missing
            for ftype, _ch, p in c.frames():
                if ftype != 1:
                    continue
                cls_mid = p[:4]
                if cls_mid in (b"\x00\x3c\x00\x50", b"\x00\x3c\x00\x78"):  # basic.ack / nack
                    tag = struct.unpack_from(">Q", p, 4)[0]
                    # multiple: every tag up to this one
                    done = {t for t in pending if t <= tag} if p[12] & 1 else {tag} & pending
                    pending -= done
                    if cls_mid == b"\x00\x3c\x00\x50":
                        confirmed += len(done)
                    else:
                        nacked += len(done)
                elif cls_mid in (b"\x00\x0a\x00\x32", b"\x00\x14\x00\x28"):
                    raise Closed(f"closed by the broker: {p[6:].decode(errors='replace')}")
    c.close()
    return {
        "published": published,
        "confirmed": confirmed,
        "nacked": nacked,
        "sent": c.sent,
        "body_bytes": published * size,
    }


def consumer(
    port: int,
    queues: list[str],
    ack_every: int,
    prefetch: int,
    stream: bool,
    expected: Any,
    seconds: float,
) -> dict[str, Any]:
    """Consume with manual acks until ``expected.value`` (set by the caller once the
    publishers are done; -1 before) messages arrived or 30 s after the publishers."""
    c = Conn.open(port)
    c.send(method(1, 60, 10, struct.pack(">IHB", 0, prefetch, 0)))
    c.expect(60, 11)
    args = table({"x-stream-offset": "next"}) if stream else table({})
    for i, q in enumerate(queues):
        c.send(method(1, 60, 20, b"\x00\x00" + shortstr(q) + shortstr(f"c{i}") + b"\x00" + args))
        c.expect(60, 21)
    consumed = 0
    last_tag = acked_tag = 0
    give_up = time.monotonic() + seconds + 60
    while True:
        want = expected.value
        if want >= 0 and consumed >= want:
            break
        if time.monotonic() > give_up:
            break
        c.sock.settimeout(1.0)
        try:
            frames = c.frames()
        except TimeoutError:
            continue
        for ftype, _ch, p in frames:
            if ftype == 1 and p[:4] == b"\x00\x3c\x00\x3c":  # basic.deliver
                pos = 4 + 1 + p[4]
                last_tag = struct.unpack_from(">Q", p, pos)[0]
                consumed += 1
            elif ftype == 1 and p[:4] in (b"\x00\x0a\x00\x32", b"\x00\x14\x00\x28"):
                raise Closed(f"closed by the broker: {p[6:].decode(errors='replace')}")
        if ack_every == 1:
            if last_tag > acked_tag:
                c.send(
                    b"".join(
                        method(1, 60, 80, struct.pack(">QB", t, 0))
                        for t in range(acked_tag + 1, last_tag + 1)
                    )
                )
                acked_tag = last_tag
        elif last_tag - acked_tag >= ack_every:
            c.send(method(1, 60, 80, struct.pack(">QB", last_tag, 1)))
            acked_tag = last_tag
    if last_tag > acked_tag:
        c.send(method(1, 60, 80, struct.pack(">QB", last_tag, 1)))
    c.close()
    return {"consumed": consumed, "sent": c.sent}
