"""A classic queue's backlog delivered in spans (issue 27): the records framed in
one pass from the segment's map, C's deliver_records against its Python
reference (amqp/record_deliveries.py) and both against the one-by-one frames
(decode_record, message_frames), damaged records, the stops (TTL, own
expirations, the byte limit) and the redelivered bit included; then the
store's spans (SegmentStore and PriorityStore) against shift()."""

from __future__ import annotations

import random
import struct
from array import array
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import warren
from examples import examples
from warren.amqp.frames import message_frames
from warren.amqp.record_deliveries import deliver_records_python
from warren.core.message import Message
from warren.core.store import StoredRun, StoreSpan
from warren.store.priority_store import PriorityStore
from warren.store.records import CorruptRecord, decode_record, encode_record
from warren.store.segment_store import SegmentStore

_native = warren.native_module("_fastpath")
HEAD = b"\x00\x3c\x00\x3c\x05ctag1"
CHANNEL = 7
SEED = 0x5A17C0DE
EXPIRING = b"\x01\x00\x0410000"  # an expiration property of 10 s
PROPS = [b"\x00\x00", b"\x10\x00\x02", b"\x80\x00\x0atext/plain", EXPIRING, b"\x09\x00\x05\x02"]


def record_bytes(i: int) -> bytes:
    """Bodies of 0 to ~5,000 bytes, several exchanges and keys, properties with
    and without an expiration; timestamps 1000 + i."""
    rng = random.Random(i)
    body = bytes(rng.randrange(256) for _ in range(rng.choice((0, 1, 16, 100, 5000))))
    exchange = ["", "ex", "e" * 200][i % 3].encode()
    return encode_record(exchange, f"key-{i % 5}".encode(), PROPS[i % 5], body, 1000 + i, SEED)


def one_by_one(
    buf: bytes, pos: int, tag: int, frame_max: int, redelivered: bool
) -> tuple[bytes, int, int] | None:
    """One delivery as AMQPConsumer.deliver frames a shifted message: (frames,
    body size, record length), or None where the record does not decode."""
    try:
        msg, length = decode_record(buf, pos, len(buf), True, SEED)
    except CorruptRecord:
        return None
    payload = HEAD + struct.pack(">QB", tag, redelivered) + msg.exchange_and_key()
    frames = message_frames(CHANNEL, payload, msg.properties, msg.body, frame_max)
    return b"".join(frames), len(msg.body), length


def framers() -> list[Any]:
    return [deliver_records_python] + ([_native.deliver_records] if _native is not None else [])


@settings(max_examples=examples(200), deadline=None)
@given(
    count=st.integers(0, 30),
    damaged=st.lists(st.integers(0, 29), max_size=2),
    max_n=st.integers(1, 40),
    frame_max=st.sampled_from([4096, 131072]),
    redelivered=st.booleans(),
    expired_at=st.sampled_from([-1, 0, 1005, 1020, 10**6]),
    own_expiry=st.booleans(),
    max_bytes=st.sampled_from([0, 1, 300, 5000, 1 << 20]),
    start=st.integers(0, 5),
)
def test_c_and_python_frame_a_span_as_the_one_by_one_path(
    count: int,
    damaged: list[int],
    max_n: int,
    frame_max: int,
    redelivered: bool,
    expired_at: int,
    own_expiry: bool,
    max_bytes: int,
    start: int,
) -> None:
    recs = [record_bytes(i) for i in range(count)]
    data = bytearray(b"HEADER" + b"".join(recs) + b"\x00" * 8)  # a mark-like tail
    offsets = []
    at = 6
    for rec in recs:
        offsets.append(at)
        at += len(rec)
    for i in damaged:  # a flipped byte in the record: it is never framed
        if i < count:
            data[offsets[i] + 20] ^= 0x40
    buf = bytes(data)
    pos = offsets[min(start, count - 1)] if count else 6
    # The reference: record after record as the one-by-one path frames them, up
    # to the first stop.
    want: list[bytes] = []
    want_sizes: list[int] = []
    want_offsets: list[int] = []
    q, tag, total = pos, 100, 0
    while len(want) < max_n:
        one = one_by_one(buf, q, tag, frame_max, redelivered)
        if one is None:
            break
        msg, _ = decode_record(buf, q, len(buf), True, SEED)
        if expired_at >= 0 and msg.timestamp <= expired_at:
            break
        if own_expiry and msg.properties[0] & 1:
            break
        if want and max_bytes and total + len(one[0]) > max_bytes:
            break
        total += len(one[0])
        want.append(one[0])
        want_sizes.append(one[1])
        want_offsets.append(q)
        q += one[2]
        tag += 1
    expected = (
        b"".join(want),
        len(want),
        q,
        array("I", want_sizes).tobytes(),
        array("I", want_offsets).tobytes(),
    )
    args = (buf, pos, len(buf), SEED, max_n, CHANNEL, HEAD, 100, frame_max)
    extra = (redelivered, expired_at, own_expiry, max_bytes)
    for framer in framers():
        assert framer(*args, *extra) == expected, framer
        if not (redelivered or own_expiry or max_bytes) and expired_at == -1:
            assert framer(*args) == expected  # the defaults


def test_a_span_in_a_memory_map_and_its_limits() -> None:
    """The limit cuts a span short of the buffer's end; a record cut by it is not
    framed; n = 0 leaves everything where it was."""
    recs = [record_bytes(i) for i in range(5)]
    buf = b"".join(recs)
    cut = len(recs[0]) + len(recs[1]) + 3
    for framer in framers():
        frames, n, end, sizes, offsets = framer(buf, 0, cut, SEED, 10, 1, HEAD, 1, 131072)
        assert (n, end) == (2, len(recs[0]) + len(recs[1]))
        assert array("I", offsets).tolist() == [0, len(recs[0])]
        assert framer(buf, 0, len(buf), SEED + 1, 10, 1, HEAD, 1, 131072) == (
            b"",
            0,
            0,
            b"",
            b"",
        )


# -- the stores' spans against shift() ----------------------------------------------


def message(i: int, expiring: bool = False) -> Message:
    props = EXPIRING if expiring else PROPS[i % 3]
    return Message("", f"k{i % 3}", props, f"m{i}".encode() * (i % 7), 1000 + i)


def drain_by_spans(store: Any, rng: random.Random, framer: Any) -> list[tuple[int, bytes, bool]]:
    """Everything ready, taken in spans of random sizes (one by one where the
    store or the framer says so): (seq, body, redelivered)."""
    out: list[tuple[int, bytes, bool]] = []
    while store.ready_count:
        span = store.span()
        if span is not None:
            assert isinstance(span, StoreSpan)
            want = min(span.left, rng.choice((1, 2, 5, 50)))
            frames, n, end, raw_sizes, raw_offsets = framer(
                span.buf, span.pos, span.limit, span.seed, want, 1, HEAD, 1, 131072,
                span.redelivered,
            )  # fmt: skip
            if n:
                span.end = end
                sizes = array("I")
                sizes.frombytes(raw_sizes)
                offsets = array("I")
                offsets.frombytes(raw_offsets)
                store.take_span(span, StoredRun(span.segment, offsets, sizes, 0), False)
                for off in offsets:
                    seq = (span.segment << 32) | off
                    out.append((seq, store.read(seq).body, span.redelivered))
                continue
        item = store.shift()
        assert item is not None
        out.append((item[0], item[1].body, item[2]))
    return out


def drain_by_shift(store: Any) -> list[tuple[int, bytes, bool]]:
    out = []
    while (item := store.shift()) is not None:
        out.append((item[0], item[1].body, item[2]))
    return out


@pytest.mark.parametrize("framer", framers(), ids=lambda f: f.__module__)
@pytest.mark.parametrize("seed", range(6))
def test_spans_take_what_shift_would_in_the_same_order(
    tmp_path: Path, framer: Any, seed: int
) -> None:
    """A store with several segments, acks out of order and requeues in the
    middle, a restart (a delivered mark: redelivered below it), records taken
    out ahead (remove_ready): spans and shift() hand out the same messages, in
    the same order, with the same redelivered bit; counts agree at the end."""
    rng = random.Random(seed)
    results = []
    for mode in ("spans", "shift"):
        d = tmp_path / f"{mode}"
        store = SegmentStore(d, segment_size=4096)
        seqs = [store.append(message(i)) for i in range(300)]
        for _ in range(40):  # delivered before the restart; some acked
            assert store.shift() is not None
        for seq in seqs[:40:3]:
            store.ack(seq)
        mark = store.delivered_marks()[d]
        store.close()
        store = SegmentStore(d, segment_size=4096, delivered_mark=mark)
        r = random.Random(seed)
        taken = []
        for k in range(5):  # shifts, requeues, removals between the spans
            for _ in range(r.randrange(30)):
                item = store.shift()
                if item is not None:
                    taken.append(item)
            if taken and r.random() < 0.5:
                seq, msg, _ = taken.pop(r.randrange(len(taken)))
                store.requeue(seq, msg)
            if k == 2:
                for seq in seqs[200:260:7]:
                    store.remove_ready(seq)
        got = drain_by_spans(store, rng, framer) if mode == "spans" else drain_by_shift(store)
        results.append(([(t[0], t[1].body, t[2]) for t in taken], got))
        assert store.ready_count == 0 and store.ready_bytes == 0
        store.close()
    assert results[0] == results[1]


@pytest.mark.parametrize("framer", framers(), ids=lambda f: f.__module__)
def test_priority_spans_go_highest_level_first(tmp_path: Path, framer: Any) -> None:
    def level(p: int) -> SegmentStore:
        return SegmentStore(tmp_path / f"p{p:03d}", segment_size=4096)

    store = PriorityStore(5, level, tmp_path)
    want = []
    for i in range(200):
        prio = i % 4
        props = b"\x08\x00" + bytes((prio,))  # priority
        store.append(Message("", "k", props, f"m{i}".encode(), 1000 + i))
        want.append((-prio, i))
    got = drain_by_spans(store, random.Random(1), framer)
    assert [body for _, body, _ in got] == [f"m{i}".encode() for _, i in sorted(want)]
    assert store.ready_count == 0
    store.close()


# -- publish runs into a backlog ------------------------------------------------------


def test_a_publish_run_into_a_backlog_is_stored_whole_and_comes_out_after_it(
    tmp_path: Path,
) -> None:
    """A plain queue with messages waiting takes a whole publish run in one
    write (ready, behind them; the store to sync for its persistent ones); a
    queue with a length limit or priorities leaves it to go one by one."""
    from amqp_runs import _runs, publish
    from pamqp import commands

    from warren.core.message import MessageRun
    from warren.core.vhost import VHost

    def store(vhost: Any, name: str, persistent: bool, max_priority: int) -> Any:
        if max_priority:
            return PriorityStore(max_priority, lambda p: SegmentStore(tmp_path / name / str(p)))
        return SegmentStore(tmp_path / name, segment_size=4096)

    vhost = VHost("/", lambda fn: None, store_factory=store)
    plain = vhost.declare_queue("plain")
    limited = vhost.declare_queue("limited", arguments={"x-max-length": 1000})
    prio = vhost.declare_queue("prio", arguments={"x-max-priority": 3})
    persistent = commands.Basic.Properties(delivery_mode=2)
    bodies = [f"run{i}".encode() * 30 for i in range(40)]
    data = b"".join(publish(b, "plain", properties=persistent) for b in bodies)
    for run in _runs(data):
        for q in (plain, limited, prio):
            q.publish(message(0))
        mrun = MessageRun("", "plain", run.method[6:-1], run, 5000)
        durable: list[Any] = []
        assert plain.publish_run(mrun, durable) == 40
        assert durable == [plain.store]
        assert limited.publish_run(mrun, []) == 0
        assert prio.publish_run(mrun, []) == 0
        assert plain.message_count == 41 and plain.stats.publish == 41
        got = drain_by_shift(plain.store)
        assert [body for _, body, _ in got] == [message(0).body, *bodies]
        assert len({seq >> 32 for seq, _, _ in got[1:]}) == 1  # one write, one segment
        for q in (limited, prio):
            drain_by_shift(q.store)
        plain.stats.publish = 0


@pytest.mark.parametrize("framer", framers(), ids=lambda f: f.__module__)
@pytest.mark.parametrize("mix", ["all-transient", "mixed", "all-persistent"])
def test_spans_keep_the_transient_counts_exact(tmp_path: Path, framer: Any, mix: str) -> None:
    """A durable queue's store counts its live transient messages (the
    persistent counts): spans taken by an acknowledging consumer hold theirs
    until acked, a no-ack consumer's go at once; the counts match the
    messages' delivery modes at every step."""
    store = SegmentStore(tmp_path / "q", segment_size=4096)
    modes = {"all-transient": [1], "mixed": [1, 2, 2, 1, 2], "all-persistent": [2]}[mix]
    live: dict[int, tuple[int, int]] = {}  # seq -> (delivery mode, body size)
    for i in range(200):
        mode = modes[i % len(modes)]
        props = b"\x10\x00" + bytes((mode,))
        body = f"t{i}".encode() * (i % 5 + 1)
        live[store.append(Message("", "k", props, body, 1000 + i))] = (mode, len(body))

    def expected() -> tuple[int, int]:
        t = [size for mode, size in live.values() if mode != 2]
        return len(t), sum(t)

    rng = random.Random(mix)
    held: list[StoredRun] = []
    while store.ready_count:
        assert store.transient() == expected()
        span = store.span()
        assert span is not None
        acked = rng.random() < 0.3
        frames, n, end, raw_sizes, raw_offsets = framer(
            span.buf, span.pos, span.limit, span.seed, min(span.left, rng.choice((1, 7, 40))),
            1, HEAD, 1, 131072,
        )  # fmt: skip
        assert n
        span.end = end
        sizes, offsets = array("I"), array("I")
        sizes.frombytes(raw_sizes)
        offsets.frombytes(raw_offsets)
        taken = StoredRun(span.segment, offsets, sizes, 0)
        store.take_span(span, taken, acked)
        if acked:
            store.ack_run(taken.segment, taken.offsets)
            for off in offsets:
                del live[(taken.segment << 32) | off]
        else:
            held.append(taken)
        if held and rng.random() < 0.4:
            run = held.pop(rng.randrange(len(held)))
            store.ack_run(run.segment, run.offsets)
            for off in run.offsets:
                del live[(run.segment << 32) | off]
    assert store.transient() == expected()
    for run in held:
        store.ack_run(run.segment, run.offsets)
    assert store.transient() == (0, 0)
    store.close()
