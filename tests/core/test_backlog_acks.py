"""A classic queue's backlog through real clients (issue 27): delivered in spans
(runs framed from the segment's map), held unacked as runs, settled by range
(single acks in a row as one, amqp/ack_scan.py), and every other way a
delivery ends (acks out of order, multiple acks across runs and segments,
nack and reject of part of a run, a cancelled consumer, a closing channel, a
restart and kill -9), priorities and TTL, several consumers: what the clients
see is what the one-by-one path gave them.

The broker tests that speak only raw frames run in memory in
tests/protocol/amqp/test_backlog_ack_runs.py; the ones here stay on sockets
for real clients (pika) or a kill -9 of a broker process."""

from __future__ import annotations

import os
import signal
import struct
from array import array
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from amqp_runs import (
    _consume,
    _declare,
    _fill,
    _receive,
    _round_trip,
    _spans,
    ack_frame,
)
from conftest import BrokerThread, start_broker
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands
from pikahelp import barrier, connect, uniq, wait_until
from procs import start_warren
from rawamqp import RawAMQP

import warren
from examples import examples
from warren.amqp.ack_scan import scan_acks_python
from warren.core.clock import ManualClock
from warren.core.unsettled import UnsettledDeliveries, UnsettledRun
from warren.core.vhost import VHost

_native = warren.native_module("_fastpath")


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerThread]:
    # Small segments: a backlog of a few thousand messages spans several.
    b = start_broker(tmp_path / "data", segment_size=64 * 1024)
    try:
        yield b
    finally:
        b.stop()


# -- the scanner: C against its reference ---------------------------------------------


# basic.ack, basic.reject, basic.nack: the flags a run of each may carry.
RUN_BITS = {80: (0,), 90: (0, 1), 120: (0, 2)}


@st.composite
def frame_soups(draw: st.DrawFn) -> bytes:
    """Acks, rejects and nacks mostly in rows of consecutive tags, with what
    ends a row mixed in: another channel, a gap, another method or other
    flags (multiple, requeue, reserved bits), a bad end octet, a torn frame."""
    out = b""
    tag = draw(st.integers(0, 2**64 - 50))
    for _ in range(draw(st.integers(0, 12))):
        kind = draw(st.sampled_from(["row", "row", "row", "gap", "ch", "other", "end"]))
        method = draw(st.sampled_from([80, 80, 90, 120]))
        bits = draw(st.integers(0, 3) | st.sampled_from(RUN_BITS[method]))
        if kind == "row":
            for _ in range(draw(st.integers(1, 6))):
                out += ack_frame(1, tag, bits, method=method)
                tag += 1
        elif kind == "gap":
            tag += draw(st.integers(2, 5))
        elif kind == "ch":
            out += ack_frame(2, tag, bits, method=method)
        elif kind == "other":
            out += ack_frame(1, tag, draw(st.integers(0, 255)), method=draw(st.integers(79, 121)))
        else:
            out += ack_frame(1, tag, bits, 0, method)
    cut = draw(st.integers(0, 20))
    return out[: len(out) - cut] if cut else out


@settings(max_examples=examples(300), deadline=None)
@given(data=frame_soups(), pos=st.integers(0, 30), max_n=st.integers(0, 40))
def test_c_and_python_find_the_same_runs_of_single_settlements(
    data: bytes, pos: int, max_n: int
) -> None:
    pos = min(pos, len(data))
    got = scan_acks_python(data, pos, max_n)
    # The model: frame by frame while each is the first one's method with its
    # flags (a single ack, reject or nack) on its channel with the next tag.
    n, first, at = 0, 0, pos
    while n < max_n and len(data) - at >= 21:
        ftype, ch, size, cls, mid, tag, bits, end = struct.unpack_from(">BHIHHQBB", data, at)
        if (ftype, size, cls, end) != (1, 13, 60, 0xCE):
            break
        if n == 0:
            if bits not in RUN_BITS.get(mid, ()):
                break
            channel, first, method, flags = ch, tag, mid, bits
        elif ch != channel or tag != first + n or (mid, bits) != (method, flags):
            break
        n += 1
        at += 21
    assert got == ((n, first, at) if n else (0, 0, pos))
    if _native is not None:
        assert _native.scan_acks(data, pos, max_n) == got


# -- ranges of tags out of the unacked bookkeeping ----------------------------------


@settings(max_examples=examples(300), deadline=None)
@given(
    layout=st.lists(st.tuples(st.sampled_from(["single", "run"]), st.integers(1, 6)), max_size=8),
    takes=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 12)), max_size=6),
)
def test_a_range_of_tags_comes_out_as_single_acks_would(
    layout: list[tuple[str, int]], takes: list[tuple[int, int]]
) -> None:
    """Runs side by side, singles, ranges cut from the middle and across runs:
    take_range removes exactly the tags first .. last when runs or singles
    alone hold them all, with their seqs; else nothing at all."""
    unacked = UnsettledDeliveries()
    queue = VHost("/", lambda fn: None).declare_queue("q")
    model: dict[int, tuple[str, int]] = {}  # tag -> (kind, seq)
    tag = 1
    for kind, n in layout:
        if kind == "single":
            unacked.add(tag, (queue, 5000 + tag, None, None, 1))
            model[tag] = ("single", 5000 + tag)
            tag += 1
        else:
            offsets = array("I", [7000 + tag + i for i in range(n)])
            unacked.add_run(UnsettledRun(tag, queue, None, 3, offsets, array("I", [2] * n)))
            model.update({tag + i: ("run", (3 << 32) | (7000 + tag + i)) for i in range(n)})
            tag += n
    for first, length in takes:
        last = first + length
        tags = range(first, last + 1)
        whole = all(t in model for t in tags)
        kinds = {model[t][0] for t in tags} if whole else set()
        before = unacked.entries()
        got = unacked.take_range(first, last)
        if not whole or len(kinds) != 1:
            assert got is None and unacked.entries() == before
            continue
        assert got is not None
        singles, runs = got
        out = [(t, e[1]) for t, e in singles] + [(t, e[1]) for r in runs for t, e in r.entries()]
        assert out == [(t, model.pop(t)[1]) for t in tags]
        assert [(t, e[1]) for t, e in unacked.entries()] == [
            (t, v[1]) for t, v in sorted(model.items())
        ]


# -- through a broker -----------------------------------------------------------------


def test_a_cancelled_consumer_and_a_closing_channel_give_runs_back_in_place(
    broker: BrokerThread,
) -> None:
    """pika: two consumers on two channels share a backlog in runs; one is
    cancelled with its runs unacked (its acks still count), then its channel
    closes: what it held comes back redelivered, ahead of what was behind it,
    to the other consumer, in the original order."""
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    q = uniq()
    ch.queue_declare(q)
    bodies = [str(i).encode() for i in range(1200)]
    for body in bodies:
        ch.basic_publish("", q, body)
    got: dict[int, list[Any]] = {1: [], 2: []}
    chans = {}
    for k, prefetch in ((1, 300), (2, 200)):
        c = conn.channel()
        c.basic_qos(prefetch_count=prefetch)
        c.basic_consume(q, lambda ch_, m, p, b, k=k: got[k].append((m, b)), consumer_tag=f"c{k}")
        chans[k] = c
    wait_until(conn, lambda: len(got[1]) == 300 and len(got[2]) == 200)
    assert len(_spans(broker)) >= 2
    first = [b for _, b in got[1]]
    assert sorted(first + [b for _, b in got[2]], key=int) == bodies[:500]
    chans[1].basic_cancel("c1")
    chans[1].basic_ack(got[1][99][0].delivery_tag, multiple=True)  # after the cancel
    chans[1].close()  # 200 come back, in place
    held2 = len(got[2])
    chans[2].basic_ack(got[2][-1][0].delivery_tag, multiple=True)
    wait_until(conn, lambda: len(got[2]) == held2 + 200)
    back = got[2][held2:]
    assert [b for _, b in back] == first[100:]
    assert all(m.redelivered for m, _ in back)
    # Then the rest, in order, nothing lost or repeated.
    while len(got[2]) < 1100:
        chans[2].basic_ack(got[2][-1][0].delivery_tag, multiple=True)
        n = len(got[2])
        wait_until(conn, lambda n=n: len(got[2]) > n)
    seen = [b for _, b in got[1][:100]] + [b for _, b in got[2]]
    assert sorted(seen, key=int) == bodies and len(seen) == len(set(seen))
    conn.close()


def _raw_drain(port: int, queue: str, n: int) -> list[tuple[bytes, bool]]:
    c = RawAMQP(port, timeout=20)
    c.handshake()
    c.open_channel(1)
    _consume(c, queue, prefetch=500)
    out = []
    while len(out) < n:
        for _, r, b, _ in _receive(c, min(500, n - len(out))):
            out.append((b, r))
        c.send_method(1, commands.Basic.Ack(delivery_tag=0, multiple=True))
    c.close()
    return out


def test_runs_unacked_at_a_kill_9_come_back(tmp_path: Path) -> None:
    """Runs delivered and partly acked (a row of single acks), then kill -9 of a
    broker process: everything not acked comes back, in order. (The same after
    a clean restart runs in memory: tests/protocol/amqp/test_backlog_ack_runs.py.)"""
    bodies = [f"r{i:04d}".encode() * 10 for i in range(2000)]
    proc, port = start_warren(tmp_path / "killed", "--segment-size", str(64 * 1024))
    try:
        c = RawAMQP(port, timeout=20)
        c.handshake()
        c.open_channel(1)
        c.open_channel(2)
        _declare(c, "k", durable=True)
        _fill(c, "k", bodies, channel=2)
        _consume(c, "k", prefetch=1000)
        _receive(c, 1000)
        c.send(b"".join(ack_frame(1, t) for t in range(1, 501)))
        _receive(c, 500)  # the credit brings 500 more
        for _ in range(2):  # handled, and the loop turn that did it is over
            _round_trip(c, 2)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(10)
    proc, port = start_warren(tmp_path / "killed")
    try:
        got = _raw_drain(port, "k", 1500)
    finally:
        proc.terminate()
        proc.wait(10)
    assert [x for x, _ in got] == bodies[500:]
    assert all(r for _, r in got)  # after a crash every recovered message may have been seen


def test_a_priority_queue_with_ttl_drains_its_backlog_in_order(
    broker_factory: Callable[..., BrokerThread],
) -> None:
    """A priority queue with a TTL and a dead-letter exchange, messages with and
    without their own (long) expiration waiting at every level: all of them in
    priority order, FIFO within a priority, acked singly and by multiple; then
    a short TTL that runs out (the broker's ManualClock, moved by the test)
    while a consumer holds a prefetch's worth: those are delivered once, the
    rest dead-lettered once."""
    broker = broker_factory(segment_size=64 * 1024, clock=ManualClock())
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    q, dlq = uniq(), uniq("dlq")
    ch.queue_declare(dlq)
    args = {"x-max-priority": 5, "x-message-ttl": 60_000, "x-dead-letter-exchange": ""}
    ch.queue_declare(q, arguments={**args, "x-dead-letter-routing-key": dlq})
    want = []
    for i in range(900):
        prio = (i * 7) % 6
        expiration = "50000" if i % 11 == 0 else None
        ch.basic_publish(
            "", q, str(i).encode(), pika.BasicProperties(priority=prio, expiration=expiration)
        )
        want.append((-prio, i))
    got: list[tuple[int, bytes]] = []
    ch.basic_qos(prefetch_count=100)
    ch.basic_consume(q, lambda c, m, p, b: got.append((m.delivery_tag, b)))
    acked = 0
    while len(got) < 900:
        seen = len(got)
        wait_until(conn, lambda seen=seen: len(got) > seen)
        tags = [t for t, _ in got[acked:]]
        if len(got) % 2:
            ch.basic_ack(tags[-1], multiple=True)
        else:
            for t in tags:
                ch.basic_ack(t)
        acked = len(got)
    assert [int(b) for _, b in got] == [i for _, i in sorted(want)]
    # A short TTL: what the consumer does not hold when it runs out is dead-lettered.
    q2 = uniq()
    ch.queue_declare(q2, arguments={**args, "x-message-ttl": 30, "x-dead-letter-routing-key": dlq})
    want = []
    for i in range(400):
        ch.basic_publish("", q2, f"t{i}".encode(), pika.BasicProperties(priority=i % 6))
        want.append((-(i % 6), i))
    late: list[tuple[int, bytes]] = []
    ch.basic_consume(q2, lambda c, m, p, b: late.append((m.delivery_tag, b)))
    wait_until(conn, lambda: len(late) == 100)  # the prefetch: held, not acked
    dead: list[bytes] = []
    ch.basic_consume(dlq, lambda c, m, p, b: dead.append(b), auto_ack=True)
    broker.advance(29)  # 1 ms short: all still ready
    assert ch.queue_declare(q2, passive=True).method.message_count == 300
    broker.advance(1)
    assert ch.queue_declare(q2, passive=True).method.message_count == 0
    wait_until(conn, lambda: len(dead) == 300)
    ch.basic_ack(late[-1][0], multiple=True)
    barrier(ch)
    order = [f"t{i}".encode() for _, i in sorted(want)]
    assert [b for _, b in late] == order[:100]  # the highest priorities, FIFO within
    assert sorted(dead) == sorted(order[100:])
    assert len(late) == 100 and len(set(dead)) == 300
    conn.close()


def test_a_quorum_backlog_after_a_restart_shows_its_delivery_counts(tmp_path: Path) -> None:
    """Returned messages of a quorum queue keep their counts over a restart
    (store/delivery_counts.py); a consumer draining the backlog afterwards gets
    them in their old places, each with its x-delivery-count, the others in
    runs without one."""
    data = tmp_path / "data"
    b = start_broker(data)
    q = uniq()
    try:
        conn = connect(b)
        ch = conn.channel()
        ch.queue_declare(q, durable=True, arguments={"x-queue-type": "quorum"})
        ch.confirm_delivery()
        for i in range(300):
            ch.basic_publish("", q, f"m{i}".encode())
        for _ in range(2):  # m0 comes back twice
            method, _props, body = ch.basic_get(q)
            assert body == b"m0"
            ch.basic_nack(method.delivery_tag, requeue=True)
        got: list[Any] = []
        ch.basic_qos(prefetch_count=10)
        ctag = ch.basic_consume(q, lambda c, m, p, body: got.append((m.delivery_tag, body)))
        wait_until(conn, lambda: len(got) == 10)
        ch.basic_cancel(ctag)  # returns below are not redelivered
        for tag, body in got:
            if body in (b"m0", b"m5"):
                ch.basic_nack(tag, requeue=True)  # m0 a third time, m5 once
            else:
                ch.basic_ack(tag)
        conn.close()
    finally:
        b.stop()
    b = start_broker(data)
    try:
        conn = connect(b)
        ch = conn.channel()
        ch.basic_qos(prefetch_count=100)
        seen: list[tuple[bytes, Any]] = []

        def take(c: Any, m: Any, p: Any, body: bytes) -> None:
            seen.append((body, (p.headers or {}).get("x-delivery-count")))
            c.basic_ack(m.delivery_tag)

        ch.basic_consume(q, take)
        wait_until(conn, lambda: len(seen) == 292)
        want = [b"m0", b"m5", *(f"m{i}".encode() for i in range(10, 300))]
        assert [body for body, _ in seen] == want
        counts = {body: n for body, n in seen if n is not None}
        assert counts == {b"m0": 3, b"m5": 1}
        conn.close()
    finally:
        b.stop()
