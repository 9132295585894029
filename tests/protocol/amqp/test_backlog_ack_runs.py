"""A classic queue's backlog delivered in spans and settled by range, through
raw frames (issue 27): acks out of order and in rows of consecutive tags
(one settlement, amqp/ack_scan.py), multiple acks across runs and segments,
nack and reject of part of a run.

Moved from tests/core/test_backlog_acks.py to the in-memory harness (tests/harness):
these spoke only raw frames, so the same frames go to AMQPConnection with no
socket (a row of acks sent at once is one read, as meant; a restart is a new
Harness on the same data dir). The file's tests with real clients (pika),
a kill -9 and the scanners stay there.
"""

from __future__ import annotations

import random
from pathlib import Path

from amqp_runs import (
    _consume,
    _declare,
    _fill,
    _queue_state,
    _receive,
    _round_trip,
    _segment_files,
    _spans,
    ack_frame,
)
from harness import Harness, MemoryAMQP, harness_fixture
from pamqp import commands

# Small segments: a backlog of a few thousand messages spans several.
broker = harness_fixture(segment_size=64 * 1024)


def test_single_acks_out_of_order_and_in_rows_settle_every_delivery_once(tmp_path: Path) -> None:
    """3,000 messages waiting, prefetch 1,000: delivered in runs; acked one by
    one, in rows of consecutive tags (one settlement) and shuffled; an ack of a
    tag already acked in the middle of a row closes the channel there, the
    tags before it acked, the ones after not. Every message exactly once, in
    order; the acks survive a restart."""
    broker = Harness(tmp_path / "data", segment_size=64 * 1024)
    try:
        _acks_out_of_order(broker)
    finally:
        broker.stop()
    again = Harness(tmp_path / "data", segment_size=64 * 1024)
    try:
        c = again.amqp_client()
        _consume(c, "out", prefetch=100)
        back = _receive(c, 50)
        assert [b for _, _, b, _ in back] == _bodies()[2950:]
        assert all(r for _, r, _, _ in back)
        c.send_method(1, commands.Basic.Ack(delivery_tag=0, multiple=True))
        _round_trip(c)
        assert _queue_state(again, "out")[:2] == (0, 0)
        c.close()
    finally:
        again.stop()


def _bodies() -> list[bytes]:
    return [f"o{i:04d}".encode() * (i % 9 + 20) for i in range(3000)]


def _acks_out_of_order(broker: Harness) -> None:
    c = broker.amqp_client(2)
    _declare(c, "out", durable=True)
    bodies = _bodies()
    _fill(c, "out", bodies, channel=2)
    _consume(c, "out", prefetch=1000)
    rng = random.Random(7)
    got: list[bytes] = []
    tags: list[int] = []
    while len(got) < 2900:
        batch = _receive(c, 1000 if not got else min(250, 2900 - len(got)))
        if not tags:
            assert len(_spans(broker)) >= 2  # runs, cut at segment ends
        got += [b for _, _, b, _ in batch]
        assert all(not r for _, r, _, _ in batch)
        new = [t for t, *_ in batch]
        tags += new
        order: list[list[int]] = []
        for i in range(0, len(new), 50):
            row = new[i : i + 50]
            order.append(row if i % 100 == 0 else rng.sample(row, len(row)))
        rng.shuffle(order)
        c.send(b"".join(ack_frame(1, t) for row in order for t in row))
    assert got == bodies[:2900]
    assert tags == list(range(1, 2901))
    rest = _receive(c, 100)  # the credit of the last acks
    assert [b for _, _, b, _ in rest] == bodies[2900:]
    _round_trip(c)
    assert _queue_state(broker, "out")[:2] == (0, 100)
    # A row with a tag acked before: 2,901 .. 2,950 then 10, then 2,951 ...
    c.send(b"".join(ack_frame(1, t) for t in [*range(2901, 2951), 10, *range(2951, 3001)]))
    assert c.expect_channel_close(1)[:2] == (406, "PRECONDITION_FAILED - unknown delivery tag 10")
    c.send_method(1, commands.Channel.CloseOk())
    _round_trip(c, 2)
    assert _queue_state(broker, "out")[:2] == (50, 0)  # 2,951 .. 3,000 back
    c.close()


def test_multiple_acks_across_runs_and_segments(broker: Harness) -> None:
    """A backlog over several segment files, prefetch 1,000: multiple acks that
    end inside a run, cover several runs and cross segments; the files of fully
    acknowledged segments go; the rest comes in order, nothing twice."""
    c = broker.amqp_client(2)
    _declare(c, "multi", durable=True)
    bodies = [f"x{i:05d}".encode() * 20 for i in range(2500)]
    _fill(c, "multi", bodies, channel=2)
    files = _segment_files(broker, "multi")
    assert files >= 5
    _consume(c, "multi", prefetch=1000)
    first = _receive(c, 1000)
    assert [b for _, _, b, _ in first] == bodies[:1000]
    runs = _spans(broker)
    assert sum(runs) == 1000 and len(runs) >= 3
    c.send_method(1, commands.Basic.Ack(delivery_tag=runs[0] + 3, multiple=True))  # inside run 2
    c.send_method(1, commands.Basic.Ack(delivery_tag=999, multiple=True))  # runs 2 .. n
    more = _receive(c, 999)
    assert [b for _, _, b, _ in more] == bodies[1000:1999]
    c.send_method(1, commands.Basic.Ack(delivery_tag=1998, multiple=True))  # tag 1,000 with it
    rest = _receive(c, 501)
    assert [b for _, _, b, _ in rest] == bodies[1999:]
    c.send_method(1, commands.Basic.Ack(delivery_tag=0, multiple=True))
    _round_trip(c)
    assert _queue_state(broker, "multi") == (0, 0, 2500, 2500, 2500)
    assert _segment_files(broker, "multi") <= 1
    c.close()


def test_nack_and_reject_of_part_of_a_run_requeue_in_the_old_order(broker: Harness) -> None:
    c = broker.amqp_client(2)
    _declare(c, "nk")
    bodies = [f"n{i}".encode() for i in range(100)]
    _fill(c, "nk", bodies, channel=2)
    _consume(c, "nk", prefetch=100)
    got = _receive(c, 100)
    assert [t for t, *_ in got] == list(range(1, 101)) and _spans(broker) == [100]
    c.send_method(1, commands.Basic.Ack(delivery_tag=9, multiple=True))
    c.send_method(1, commands.Basic.Reject(delivery_tag=50, requeue=True))
    assert [(r, b) for _, r, b, _ in _receive(c, 1)] == [(True, bodies[49])]
    c.send_method(1, commands.Basic.Nack(delivery_tag=19, multiple=True, requeue=True))
    c.send_method(1, commands.Basic.Nack(delivery_tag=70, requeue=False))  # dropped
    again = _receive(c, 10)
    assert [b for _, _, b, _ in again] == bodies[9:19]
    assert all(r for _, r, _, _ in again)
    assert _spans(broker) == [30, 19, 30]  # 20 .. 49, 51 .. 69, 71 .. 100
    c.send_method(1, commands.Basic.Ack(delivery_tag=0, multiple=True))
    _round_trip(c)
    assert _queue_state(broker, "nk")[:2] == (0, 0)
    c.close()


def _drain(c: MemoryAMQP, queue: str, n: int) -> list[tuple[bytes, bool]]:
    """(body, redelivered) of the next ``n`` messages, acked 500 at a time."""
    _consume(c, queue, prefetch=500)
    out = []
    while len(out) < n:
        for _, r, b, _ in _receive(c, min(500, n - len(out))):
            out.append((b, r))
        c.send_method(1, commands.Basic.Ack(delivery_tag=0, multiple=True))
    return out


def test_runs_unacked_at_a_restart_come_back(tmp_path: Path) -> None:
    """Runs delivered and partly acked (a multiple ack, a row of single acks),
    then a clean restart: the unacked ones come back redelivered, in order, the
    rest after them. (Moved from test_backlog_acks.py's restart and kill -9 test,
    whose kill -9 half stays there.)"""
    data = tmp_path / "data"
    bodies = [f"r{i:04d}".encode() * 10 for i in range(2000)]
    with Harness(data, segment_size=64 * 1024) as b:
        c = b.amqp_client(2)
        _declare(c, "dur", durable=True)
        _fill(c, "dur", bodies, channel=2)
        _consume(c, "dur", prefetch=800)
        _receive(c, 800)
        assert len(_spans(b)) >= 2
        c.send_method(1, commands.Basic.Ack(delivery_tag=300, multiple=True))
        c.send(b"".join(ack_frame(1, t) for t in range(301, 401)))
        _receive(c, 400)  # the credit brings 400 more
        _round_trip(c)
        assert _queue_state(b, "dur")[:2] == (800, 800)
        c.close_socket()
    with Harness(data, segment_size=64 * 1024) as b:
        c = b.amqp_client()
        got = _drain(c, "dur", 1600)
        c.close()
    assert [x for x, _ in got] == bodies[400:]
    assert all(r for _, r in got[:800]) and not any(r for _, r in got[800:])
