"""A load generator for bench/write_amplification.py that is not Warren's own.

Plain sockets and a hand-written AMQP 0-9-1 encoder (bench/raw_amqp.py's, nothing
from ``warren``), so every byte a client sends is counted here (``Conn.sent``), on
the client's side of the socket: that count is the "bytes received" of the
write-amplification ratio. Publishers
and the consumer each run in their own process (multiprocessing), so several
publishers load the broker at once.

- :func:`publisher`: persistent messages round-robin over the queues, with at
  most ``window`` unconfirmed (``window`` 1 is a synchronous publisher: one
  message per confirm; 0 publishes without confirms).
- :func:`consumer`: consumes every queue on one channel with manual acks, one
  basic.ack per delivery (``ack_every`` 1) or one ``multiple`` ack every N.
"""

from __future__ import annotations

import struct
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
# The shared raw-socket encoder and connection (bench/raw_amqp.py, no Warren code).
from raw_amqp import (  # noqa: E402
    Closed,
    Conn,
    ack_frame,
    method,
    publish_bytes,
    shortstr,
    single_acks,
    table,
)

__all__ = ["Closed", "consumer", "declare", "delete", "publisher"]

# How long the clients wait for any reply, in seconds.
_TIMEOUT = 60


def declare(port: int, queues: list[str], stream: bool) -> None:
    c = Conn.open(port, timeout=_TIMEOUT)
    args: dict[str, str | int] = {"x-queue-type": "stream"} if stream else {}
    for q in queues:
        c.declare(q, durable=True, args=args)
    c.close()


def delete(port: int, queues: list[str]) -> None:
    c = Conn.open(port, timeout=_TIMEOUT)
    for q in queues:
        c.delete(q)
    c.close()


def publisher(
    port: int, queues: list[str], size: int, window: int, seconds: float
) -> dict[str, Any]:
    """Publish for ``seconds``, then wait for the outstanding confirms and close."""
    c = Conn.open(port, timeout=_TIMEOUT)
    if window:
        c.send(method(1, 85, 10, b"\x00"))
        c.expect(85, 11)
    msgs = [publish_bytes(q, size, True, c.frame_max) for q in queues]
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
    c = Conn.open(port, timeout=_TIMEOUT)
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
                c.send(single_acks(acked_tag + 1, last_tag))
                acked_tag = last_tag
        elif last_tag - acked_tag >= ack_every:
            c.send(ack_frame(last_tag, True))
            acked_tag = last_tag
    if last_tag > acked_tag:
        c.send(ack_frame(last_tag, True))
    c.close()
    return {"consumed": consumed, "sent": c.sent}
