"""Runs of publishes to acknowledging consumers (Queue.publish_run's stored path):
stored in one write (store/records.py encode_run, C or Python), delivered at
once, kept unacked as runs (core/unsettled.py) and settled in bulk, and every
other way a delivery ends (single acks, nacks, rejects to a dead-letter
exchange, recover, a closing channel, a transaction, a restart) as if the
messages had gone one by one.

Moved from tests/ to the in-memory harness (tests/harness): the broker tests
send the same raw frames to AMQPConnection with no socket (a restart is a new
Harness on the same data dir); their frame helpers are tests/amqp_runs.py,
shared with the socket tests beside real clients (test_backlog_acks.py)."""

from __future__ import annotations

import zlib
from array import array
from pathlib import Path

import pytest
from amqp_runs import (
    PERSISTENT,
    _consume,
    _declare,
    _fast,
    _queue_state,
    _receive,
    _run_counts,
    _runs,
    publish,
)
from harness import Harness, harness_fixture
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands

from examples import examples
from warren.core.errors import PreconditionFailed
from warren.core.unsettled import UnsettledDeliveries, UnsettledRun
from warren.core.vhost import VHost
from warren.store.records import decode_record, encode_run

needs_c = pytest.mark.skipif(_fast is None, reason="warren._fastpath is not built")


# -- the unacked bookkeeping against a plain dict -----------------------------------


@st.composite
def unacked_ops(draw: st.DrawFn) -> list[tuple[str, int, bool]]:
    ops = []
    for _ in range(draw(st.integers(1, 40))):
        kind = draw(st.sampled_from(["single", "run", "take", "take"]))
        ops.append((kind, draw(st.integers(0, 12)), draw(st.booleans())))
    return ops


@settings(max_examples=examples(300), deadline=None)
@given(ops=unacked_ops())
def test_unacked_deliveries_settle_as_a_dict_of_tags_would(
    ops: list[tuple[str, int, bool]],
) -> None:
    """Singles and runs mixed, acks single and multiple, tag 0, unknown tags: the
    same tags come out (with the same seqs) as from a dict keyed by tag."""
    unacked = UnsettledDeliveries()
    model: dict[int, int] = {}  # tag -> seq
    queue = VHost("/", lambda fn: None).declare_queue("q")
    next_tag = 1
    for kind, value, multiple in ops:
        if kind == "single":
            unacked.add(next_tag, (queue, 1000 + next_tag, None, None, 1))
            model[next_tag] = 1000 + next_tag
            next_tag += 1
        elif kind == "run":
            n = value + 1
            offsets = array("I", [1000 + next_tag + i for i in range(n)])
            unacked.add_run(UnsettledRun(next_tag, queue, None, 0, offsets, array("I", [1] * n)))
            model.update({next_tag + i: 1000 + next_tag + i for i in range(n)})
            next_tag += n
        else:
            tag = value if value == 0 else (value * 3) % (next_tag + 1)
            if multiple:
                expected = sorted(t for t in model if tag == 0 or t <= tag)
            else:
                expected = [tag] if tag in model else []
            if not expected and not (multiple and tag == 0):  # 0: "all", maybe none
                with pytest.raises(PreconditionFailed):
                    unacked.take(tag, multiple)
                continue
            singles, runs = unacked.take(tag, multiple)
            got = sorted(
                [(t, e[1]) for t, e in singles] + [(t, e[1]) for r in runs for t, e in r.entries()]
            )
            assert got == [(t, model.pop(t)) for t in expected]
        assert len(unacked) == len(model)
        assert [(t, e[1]) for t, e in unacked.entries()] == sorted(model.items())
        assert [t for t in range(next_tag + 1) if t in unacked] == sorted(model)
        firsts = [t for t, _ in unacked.by_age()]
        assert firsts == sorted(firsts)


# -- records of a run ---------------------------------------------------------------


@settings(max_examples=examples(150), deadline=None)
@given(
    bodies=st.lists(st.binary(max_size=3000), min_size=1, max_size=12),
    modes=st.lists(st.sampled_from([None, 1, 2]), min_size=12, max_size=12),
    rk=st.text(max_size=20),
    base=st.integers(8, 1 << 20),
    cut=st.data(),
    seed=st.sampled_from([0, 1, 0xFFFFFFFF, 0x5A17C0DE]),
)
def test_a_runs_records_decode_back_and_agree_in_c_and_python(
    bodies: list[bytes],
    modes: list[int | None],
    rk: str,
    base: int,
    cut: st.DataObject,
    seed: int,
) -> None:
    data = b"".join(
        publish(
            b,
            rk,
            properties=None
            if modes[i] is None
            else commands.Basic.Properties(delivery_mode=modes[i]),
        )
        for i, b in enumerate(bodies)
    )
    start = cut.draw(st.integers(0, len(bodies) - 1))
    stop = cut.draw(st.integers(start, len(bodies)))
    raw_rk = rk.encode()
    ex_rk = b"\x00" + bytes((len(raw_rk),)) + raw_rk
    results = [encode_run(run, start, stop, ex_rk, 1234567, base, seed) for run in _runs(data)]
    assert all(r == results[0] for r in results)
    recs, offsets, sizes, persistent = results[0]
    assert list(sizes) == [len(b) for b in bodies[start:stop]]
    assert persistent == sum(1 for m in modes[start:stop] if m == 2)
    pos = 0
    for i in range(start, stop):
        assert offsets[i - start] == base + pos
        msg, length = decode_record(recs, pos, len(recs), True, seed)
        assert (msg.exchange, msg.routing_key, msg.body, msg.timestamp) == (
            "",
            rk,
            bodies[i],
            1234567,
        )
        assert msg.persistent == (modes[i] == 2)
        assert zlib.crc32(recs[pos : pos + length - 4], seed) == int.from_bytes(
            recs[pos + length - 4 : pos + length], "big"
        )
        pos += length
    assert pos == len(recs)


@needs_c
@given(data=st.binary(max_size=5000), value=st.integers(0, 0xFFFFFFFF))
def test_the_c_crc32_is_zlibs(data: bytes, value: int) -> None:
    assert _fast.crc32(data, value) == zlib.crc32(data, value)


# -- through a broker -----------------------------------------------------------------


broker = harness_fixture(sync=False)


def test_a_run_to_an_acking_consumer_waits_for_prefetch_and_settles_in_bulk(
    broker: Harness,
) -> None:
    c = broker.amqp_client()
    _declare(c, "a")
    _consume(c, "a", prefetch=10)
    bodies = [f"a{i}".encode() * (i % 5 + 1) for i in range(50)]
    c.send(
        b"".join(
            publish(b, "a", properties=PERSISTENT if i % 2 else None) for i, b in enumerate(bodies)
        )
    )
    got = _receive(c, 10)
    assert [(t, r, b) for t, r, b, _ in got] == [(i + 1, False, bodies[i]) for i in range(10)]
    assert [p.delivery_mode for *_, p in got] == [2 if i % 2 else None for i in range(10)]
    assert _run_counts(broker) == [10]  # the first ten went as one run
    assert _queue_state(broker, "a")[:2] == (40, 10)
    # Ack the first four: four more come; then all ten outstanding at once.
    c.send_method(1, commands.Basic.Ack(delivery_tag=4, multiple=True))
    got = _receive(c, 4)
    assert [b for _, _, b, _ in got] == bodies[10:14]
    c.send_method(1, commands.Basic.Ack(delivery_tag=14, multiple=True))
    received = 14
    while received < 50:
        batch = _receive(c, min(10, 50 - received))
        assert [b for _, _, b, _ in batch] == bodies[received : received + len(batch)]
        received += len(batch)
        c.send_method(1, commands.Basic.Ack(delivery_tag=received, multiple=True))
    c.send_method(1, commands.Basic.Qos(prefetch_count=10))  # a round trip: acks are in
    c.expect_method(commands.Basic.QosOk)
    assert _queue_state(broker, "a") == (0, 0, 50, 50, 50)
    assert _run_counts(broker) == []
    c.close()


def test_single_acks_nacks_and_requeues_inside_a_run(broker: Harness) -> None:
    """Acks of single tags in the middle of a run, a nack with requeue of a part,
    a reject of one: the requeued come back redelivered, in their old order,
    with their bodies and properties read back from the store."""
    c = broker.amqp_client()
    _declare(c, "m")
    _consume(c, "m", prefetch=100)
    bodies = [f"m{i}".encode() for i in range(20)]
    c.send(b"".join(publish(b, "m", properties=PERSISTENT) for b in bodies))
    first = _receive(c, 20)
    assert [t for t, *_ in first] == list(range(1, 21))
    for tag in (5, 1, 20):
        c.send_method(1, commands.Basic.Ack(delivery_tag=tag))
    c.send_method(1, commands.Basic.Nack(delivery_tag=10, multiple=True, requeue=True))
    # Requeued: 2, 3, 4, 6, 7, 8, 9, 10 (1 and 5 acked), in queue order.
    again = _receive(c, 8)
    assert [b for _, _, b, _ in again] == [bodies[i - 1] for i in (2, 3, 4, 6, 7, 8, 9, 10)]
    assert all(r for _, r, _, _ in again)
    assert all(p.delivery_mode == 2 for *_, p in again)
    assert [t for t, *_ in again] == list(range(21, 29))
    c.send_method(1, commands.Basic.Reject(delivery_tag=12, requeue=True))
    assert [(t, r, b) for t, r, b, _ in _receive(c, 1)] == [(29, True, bodies[11])]
    c.send_method(1, commands.Basic.Ack(delivery_tag=0, multiple=True))
    c.send_method(1, commands.Basic.Qos(prefetch_count=100))
    c.expect_method(commands.Basic.QosOk)
    assert _queue_state(broker, "m")[:2] == (0, 0)
    c.send_method(1, commands.Basic.Ack(delivery_tag=3))
    assert c.expect_channel_close(1)[:2] == (406, "PRECONDITION_FAILED - unknown delivery tag 3")
    c.close()


def test_rejected_run_deliveries_are_dead_lettered_whole(broker: Harness) -> None:
    c = broker.amqp_client()
    c.send_method(1, commands.Exchange.Declare(exchange="dlx", exchange_type="fanout"))
    c.expect_method(commands.Exchange.DeclareOk)
    _declare(c, "dead")
    c.send_method(1, commands.Queue.Bind(queue="dead", exchange="dlx"))
    c.expect_method(commands.Queue.BindOk)
    _declare(c, "live", **{"x-dead-letter-exchange": "dlx"})
    _consume(c, "live", prefetch=50)
    bodies = [f"d{i}".encode() * 3 for i in range(12)]
    c.send(b"".join(publish(b, "live", properties=PERSISTENT) for b in bodies))
    _receive(c, 12)
    c.send_method(1, commands.Basic.Nack(delivery_tag=6, multiple=True, requeue=False))
    c.send_method(1, commands.Basic.Ack(delivery_tag=0, multiple=True))
    c.send_method(1, commands.Basic.Get(queue="dead", no_ack=True))
    dead = []
    for _ in range(6):
        if dead:
            c.send_method(1, commands.Basic.Get(queue="dead", no_ack=True))
        c.expect_method(commands.Basic.GetOk)
        header, body = c.expect_content()
        dead.append((body, header.properties))
    assert [b for b, _ in dead] == bodies[:6]
    for _, props in dead:
        assert props.delivery_mode == 2
        (death,) = props.headers["x-death"]
        assert (death["queue"], death["reason"], death["count"]) == ("live", "rejected", 1)
    c.close()


def test_a_closing_channel_and_recover_give_run_deliveries_back_in_order(
    broker: Harness,
) -> None:
    c = broker.amqp_client(2)
    _declare(c, "r")
    _consume(c, "r", prefetch=30, channel=1, tag="first")
    bodies = [f"r{i}".encode() for i in range(30)]
    c.send(b"".join(publish(b, "r", channel=2) for b in bodies))
    _receive(c, 30)
    c.send_method(1, commands.Basic.Ack(delivery_tag=3, multiple=True))
    c.send_method(1, commands.Basic.Recover(requeue=True))
    c.expect_method(commands.Basic.RecoverOk)
    again = _receive(c, 27)
    assert [b for _, _, b, _ in again] == bodies[3:] and all(r for _, r, _, _ in again)
    # Closing the channel gives them back again; a consumer elsewhere gets them.
    c.send_method(
        1, commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)
    )
    c.expect_method(commands.Channel.CloseOk)
    _consume(c, "r", channel=2, tag="second")
    later = _receive(c, 27)
    assert [b for _, _, b, _ in later] == bodies[3:]
    c.close()


def test_acks_in_a_transaction_hold_until_commit_and_roll_back(broker: Harness) -> None:
    c = broker.amqp_client()
    _declare(c, "t")
    _consume(c, "t", prefetch=20)
    c.send(b"".join(publish(f"t{i}".encode(), "t") for i in range(20)))
    _receive(c, 20)
    c.send_method(1, commands.Tx.Select())
    c.expect_method(commands.Tx.SelectOk)
    c.send_method(1, commands.Basic.Ack(delivery_tag=10, multiple=True))
    c.send_method(1, commands.Tx.Rollback())
    c.expect_method(commands.Tx.RollbackOk)
    assert _queue_state(broker, "t")[:2] == (0, 20)
    c.send_method(1, commands.Basic.Ack(delivery_tag=5, multiple=True))
    c.send_method(1, commands.Basic.Ack(delivery_tag=12))
    c.send_method(1, commands.Tx.Commit())
    c.expect_method(commands.Tx.CommitOk)
    assert _queue_state(broker, "t")[:2] == (0, 14)
    c.close()
    assert _queue_state(broker, "t")[:2] == (14, 0)  # the closed channel's, requeued


def test_unacked_run_deliveries_survive_a_restart_and_acked_ones_do_not(tmp_path: Path) -> None:
    data = tmp_path / "data"
    b = Harness(data)
    try:
        c = b.amqp_client()
        _declare(c, "dur", durable=True)
        _consume(c, "dur", prefetch=100)
        c.send_method(1, commands.Confirm.Select())
        c.expect_method(commands.Confirm.SelectOk)
        bodies = [f"p{i}".encode() for i in range(40)]
        c.send(b"".join(publish(bd, "dur", properties=PERSISTENT) for bd in bodies))
        confirmed = 0
        delivered = []
        while confirmed < 40 or len(delivered) < 40:
            _, frame = c.read_frame()
            if isinstance(frame, commands.Basic.Ack):
                confirmed = (
                    frame.delivery_tag if frame.multiple else max(confirmed, frame.delivery_tag)
                )
            else:
                assert isinstance(frame, commands.Basic.Deliver)
                _header, body = c.expect_content()
                delivered.append(body)
        assert delivered == bodies
        assert _run_counts(b)  # delivered as runs
        c.send_method(1, commands.Basic.Ack(delivery_tag=15, multiple=True))
        c.send_method(1, commands.Basic.Ack(delivery_tag=30))
        c.send_method(1, commands.Basic.Qos(prefetch_count=100))
        c.expect_method(commands.Basic.QosOk)
        c.close_socket()
    finally:
        b.stop()
    b = Harness(data)
    try:
        c = b.amqp_client()
        got = []
        while True:
            c.send_method(1, commands.Basic.Get(queue="dur", no_ack=True))
            _, frame = c.read_frame()
            if isinstance(frame, commands.Basic.GetEmpty):
                break
            _header, body = c.expect_content()
            got.append(body)
        assert got == [bodies[i] for i in range(15, 40) if i != 29]
        c.close()
    finally:
        b.stop()
