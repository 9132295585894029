"""A run of publishes appended to a stream at once (StreamQueue.publish_run,
StreamStore.append_run, C's encode_stream_records) gives exactly what the
message-by-message path gives: the same records (stamped properties, bodies,
exchange, routing key, timestamp), the same offsets and segment boundaries;
deduplication drops duplicates within a run and across runs, also after a
restart; confirms come in publish order.

In memory against the per-message StreamStore.append over real segment files;
through a broker in memory with raw frames (one send: runs), both passes.

Moved from tests/ to the in-memory harness (tests/harness): the broker part
feeds the same raw frames to AMQPConnection with no socket, each send one
read, so a run is always cut where the test cuts it; nothing here needs a
socket."""

from __future__ import annotations

import importlib
import struct
from pathlib import Path
from typing import Any

import pytest
from harness import Harness, MemoryAMQP, harness_fixture
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands
from rawamqp import body_frame, method_frame, raw_frame
from test_publish_run import SCANNERS

from examples import examples
from warren.amqp import publish_run
from warren.core.dedup import Deduplicator
from warren.core.message import Message, MessageRun
from warren.core.properties import peek_headers
from warren.store.stream_records import run_records
from warren.store.stream_replica import ReplicaStreamStore
from warren.store.stream_store import StreamStore


def longstr(value: bytes) -> bytes:
    return struct.pack(">I", len(value)) + value


def headers(*entries: tuple[bytes, bytes]) -> bytes:
    raw = b"".join(bytes((len(k),)) + k + v for k, v in entries)
    return struct.pack(">I", len(raw)) + raw


def dedup_props(key: bytes, persistent: bool = True) -> bytes:
    table = headers((b"x-deduplication-header", b"S" + longstr(key)))
    return (b"\x30\x00" + table + b"\x02") if persistent else (b"\x20\x00" + table)


#: Property lists a run takes, the stream's stamp going in every way it can: no
#: headers yet (after content-type), a table to extend, a table that already
#: names x-stream-offset (the general edit), the plain ones.
PROPS = [
    b"\x00\x00",
    b"\x10\x00\x02",
    b"\x80\x00\x0atext/plain",
    dedup_props(b"k-1"),
    b"\xe0\x00\x04json\x04gzip" + headers((b"a", b"I\x00\x00\x00\x07")),
    b"\x20\x00" + headers((b"x-stream-offset", b"l" + bytes(8)), (b"z", b"V")),
    b"\x20\x80" + headers() + b"\x02id",
]


def frames(bodies: list[tuple[bytes, bytes]], rk: str = "s") -> bytes:
    out = b""
    for props, body in bodies:
        out += method_frame(1, commands.Basic.Publish(routing_key=rk))
        out += raw_frame(2, 1, struct.pack(">HHQ", 60, 0, len(body)) + props)
        if body:
            out += body_frame(1, body)
    return out


def records(store: StreamStore) -> list[tuple[Any, ...]]:
    cursor = store.cursor(0)
    out = []
    try:
        while (item := cursor.next()) is not None:
            offset, msg = item
            out.append(
                (offset, msg.exchange, msg.routing_key, msg.properties, msg.body, msg.timestamp)
            )
    finally:
        cursor.close()
    return out


def segments(store: StreamStore) -> list[tuple[int, int, int]]:
    return [(s.first_offset, s.count, s.bytes) for s in store._segs]


@pytest.mark.parametrize("scan", SCANNERS)
def test_a_run_is_stored_as_one_message_after_the_other(scan: Any, tmp_path: Path) -> None:
    messages = [(PROPS[i % len(PROPS)], b"body-%d" % i * (i % 9)) for i in range(300)]
    data = frames(messages)
    # Small segments: runs cross segment boundaries.
    one, many = StreamStore(tmp_path / "one", 4096), StreamStore(tmp_path / "many", 4096)
    try:
        for props, body in messages:
            msg = Message("", "s", props, body, 1_700_000_000_123)
            one.append(msg)
        pos = 0
        while pos < len(data):
            run = scan(data, pos, 131072, 1 << 27, 37)
            mrun = MessageRun("", "s", run.method[6:-1], run, 1_700_000_000_123)
            assert many.append_run(mrun, 0, len(run)) == many.next_offset - len(run)
            pos = run.end
        assert records(many) == records(one)
        assert segments(many) == segments(one)
        assert len(segments(one)) > 5
        assert [r[0] for r in records(one)] == list(range(300))
    finally:
        one.close()
        many.close()
    # And after a restart, from the files.
    one, many = StreamStore(tmp_path / "one", 4096), StreamStore(tmp_path / "many", 4096)
    try:
        assert records(many) == records(one)
        assert segments(many) == segments(one)
    finally:
        one.close()
        many.close()


@pytest.mark.skipif(len(SCANNERS) < 2, reason="warren._fastpath is not built")
def test_the_c_encoder_writes_the_reference_bytes() -> None:
    fast = importlib.import_module("warren._fastpath")
    messages = [(PROPS[i % len(PROPS)], bytes([i]) * (i * 7)) for i in range(len(PROPS) * 3)]
    data = frames(messages, rk="key")
    c_run = fast.scan_publishes(data, 0, 131072, 1 << 27, 1000)
    py_run = publish_run.scan_publishes(data, 0, 131072, 1 << 27, 1000)
    assert len(c_run) == len(py_run) == len(messages)
    for lo, hi in ((0, len(messages)), (3, 4), (0, 5), (6, 13)):
        mine = MessageRun("", "key", c_run.method[6:-1], c_run, 42)
        ref = MessageRun("", "key", py_run.method[6:-1], py_run, 42)
        want = run_records(ref, lo, hi, 1000, 42, 0xDEADBEEF)
        got = run_records(mine, lo, hi, 1000, 42, 0xDEADBEEF)
        assert got == want
    # Without the table that names x-stream-offset, C did the work itself.
    plain = [m for m in messages if b"x-stream-offset" not in m[0]]
    c_run = fast.scan_publishes(frames(plain), 0, 131072, 1 << 27, 1000)
    assert fast.encode_stream_records(c_run, 0, len(plain), b"\x00\x01s", 42, 0, 7) is not None


# -- through the broker ---------------------------------------------------------------


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


broker = harness_fixture()


def _publish_confirmed(c: MemoryAMQP, data: bytes, n: int, first: int = 1) -> list[tuple[str, int]]:
    """Send ``data`` (n publishes) at once; the confirms, as (kind, tag), until all came."""
    c.send(data)
    got: list[tuple[str, int]] = []
    done = first - 1
    while done < first - 1 + n:
        _, method = c.read_frame()
        assert isinstance(method, commands.Basic.Ack), method
        got.append(("multiple" if method.multiple else "single", method.delivery_tag))
        done = max(done, method.delivery_tag)
    return got


def _read_stream(b: Harness, name: str, n: int) -> list[tuple[int, bytes, str]]:
    """(x-stream-offset, body, dedup key) of the stream's first n messages."""
    c = b.amqp_client()
    c.send_method(1, commands.Basic.Qos(prefetch_count=n + 10))
    c.expect_method(commands.Basic.QosOk)
    c.send_method(1, commands.Basic.Consume(queue=name, arguments={"x-stream-offset": "first"}))
    c.expect_method(commands.Basic.ConsumeOk)
    out = []
    while len(out) < n:
        _, method = c.read_frame()
        assert isinstance(method, commands.Basic.Deliver), method
        header, body = c.expect_content()
        h = header.properties.headers
        out.append((h["x-stream-offset"], body, h.get("x-deduplication-header")))
    c.close()
    return out


def _declare_stream(c: MemoryAMQP, name: str, **arguments: Any) -> None:
    c.send_method(
        1,
        commands.Queue.Declare(
            queue=name, durable=True, arguments={"x-queue-type": "stream", **arguments}
        ),
    )
    c.expect_method(commands.Queue.DeclareOk)


def test_duplicates_within_and_across_runs_are_dropped_also_after_a_restart(
    data_dir: Path,
) -> None:
    b = Harness(data_dir)
    try:
        c = b.amqp_client()
        _declare_stream(c, "dd", **{"x-message-deduplication": True, "x-cache-size": 1000})
        c.send_method(1, commands.Confirm.Select())
        c.expect_method(commands.Confirm.SelectOk)
        keys = [b"k%d" % (i % 150) for i in range(200)]  # 50 duplicates within the write
        sent = [(dedup_props(k), b"first-%d" % i) for i, k in enumerate(keys)]
        acks = _publish_confirmed(c, frames(sent, rk="dd"), len(sent))
        assert [tag for _, tag in acks] == sorted(tag for _, tag in acks)  # in order
        again = [(dedup_props(b"k%d" % i), b"again-%d" % i) for i in range(140, 160)]
        _publish_confirmed(c, frames(again, rk="dd"), len(again), first=201)
        c.close()
        expected = [(i, b"first-%d" % i, f"k{i}") for i in range(150)]
        expected += [(150 + j, b"again-%d" % i, f"k{i}") for j, i in enumerate(range(150, 160))]
        assert _read_stream(b, "dd", len(expected)) == expected
    finally:
        b.stop()
    b = Harness(data_dir)
    try:
        c = b.amqp_client()
        c.send_method(1, commands.Confirm.Select())
        c.expect_method(commands.Confirm.SelectOk)
        after = [(dedup_props(b"k%d" % i), b"after-%d" % i) for i in range(155, 165)]
        _publish_confirmed(c, frames(after, rk="dd"), len(after))
        c.close()
        tail = [(160 + j, b"after-%d" % i, f"k{i}") for j, i in enumerate(range(160, 165))]
        assert _read_stream(b, "dd", len(expected) + 5) == expected + tail
    finally:
        b.stop()


def test_a_run_into_a_stream_and_a_classic_queue_reaches_both(broker: Harness) -> None:
    c = broker.amqp_client()
    _declare_stream(c, "fan-s")
    c.send_method(1, commands.Queue.Declare(queue="fan-q", durable=True))
    c.expect_method(commands.Queue.DeclareOk)
    for q in ("fan-s", "fan-q"):
        c.send_method(1, commands.Queue.Bind(queue=q, exchange="amq.fanout"))
        c.expect_method(commands.Queue.BindOk)
    c.send_method(1, commands.Confirm.Select())
    c.expect_method(commands.Confirm.SelectOk)
    sent = [(dedup_props(b"k%d" % i), b"m%d" % i) for i in range(50)]
    data = b""
    for props, body in sent:
        data += method_frame(1, commands.Basic.Publish(exchange="amq.fanout", routing_key="x"))
        data += raw_frame(2, 1, struct.pack(">HHQ", 60, 0, len(body)) + props)
        data += body_frame(1, body)
    _publish_confirmed(c, data, len(sent))
    got = []
    for _ in sent:
        c.send_method(1, commands.Basic.Get(queue="fan-q", no_ack=True))
        c.expect_method(commands.Basic.GetOk)
        got.append(c.expect_content()[1])
    c.close()
    assert got == [body for _, body in sent]
    assert _read_stream(broker, "fan-s", 50) == [(i, b"m%d" % i, f"k{i}") for i in range(50)]


# -- a run's deduplication keys, read from the property list --------------------------

_VALUES = st.sampled_from(
    [
        b"S" + longstr(b"key-1"),
        b"S" + longstr("ключ".encode()),
        b"S" + longstr(b"\xff\xfe"),
        b"x" + longstr(b"bin"),
        b"I\x00\x00\x00\x07",
        b"l" + (-5).to_bytes(8, "big", signed=True),
        b"t\x01",
        b"V",
        b"T" + (1_700_000_000).to_bytes(8, "big"),
        b"d" + struct.pack(">d", 1.5),
        b"A" + longstr(b"I\x00\x00\x00\x01"),
        b"F" + headers((b"n", b"V")),
    ]
)


@settings(max_examples=examples(300), deadline=None)
@given(
    entries=st.lists(
        st.tuples(st.sampled_from([b"x-deduplication-header", b"x-cache-ttl", b"k", b""]), _VALUES),
        max_size=6,
    ),
    before=st.sampled_from([b"", b"\x04json"]),
)
def test_the_key_read_in_place_is_the_decoded_one(
    entries: list[tuple[bytes, bytes]], before: bytes
) -> None:
    props = (b"\xa0\x00" if before else b"\x20\x00") + before + headers(*entries)
    dedup = Deduplicator(100, 1000, "x-deduplication-header", lambda: 0.0)
    assert dedup._raw_key_and_ttl(props) == dedup._key_and_ttl(peek_headers(props))
    other = Deduplicator(100, 1000, "x-deduplication-header", lambda: 0.0)
    assert dedup.seen_properties(props) == other.seen(Message("", "s", props, b"", 0)) is False
    assert dedup.seen_properties(props) == other.seen(Message("", "s", props, b"", 0))
    assert dedup._raw_key_and_ttl(b"\x00\x00") is None


def test_a_replica_copy_refuses_a_run_as_it_refuses_a_message(tmp_path: Path) -> None:
    store = StreamStore(tmp_path / "s", 4096)
    store.append(Message("", "s", b"\x00\x00", b"m", 1))
    store.close()
    replica = ReplicaStreamStore(tmp_path / "s")
    data = frames([(b"\x00\x00", b"r")])
    run = publish_run.scan_publishes(data, 0, 131072, 1 << 27, 10)
    with pytest.raises(RuntimeError, match="read-only"):
        replica.append_run(MessageRun("", "s", run.method[6:-1], run, 2), 0, 1)
    assert [r[4] for r in records(replica)] == [b"m"]
    replica.close()


def test_a_waiting_consumer_gets_a_whole_run_in_order(broker: Harness) -> None:
    reader = broker.amqp_client()
    _declare_stream(reader, "live", **{"x-max-length": 150})
    reader.send_method(1, commands.Basic.Qos(prefetch_count=1000))
    reader.expect_method(commands.Basic.QosOk)
    reader.send_method(1, commands.Basic.Consume(queue="live"))  # from the next message
    reader.expect_method(commands.Basic.ConsumeOk)
    c = broker.amqp_client()
    c.send_method(1, commands.Confirm.Select())
    c.expect_method(commands.Confirm.SelectOk)
    sent = [(dedup_props(b"k%d" % i), b"live-%d" % i) for i in range(200)]
    _publish_confirmed(c, frames(sent, rk="live"), len(sent))
    got = []
    while len(got) < len(sent):
        _, method = reader.read_frame()
        assert isinstance(method, commands.Basic.Deliver), method
        header, body = reader.expect_content()
        got.append((header.properties.headers["x-stream-offset"], body))
    assert got == [(i, b"live-%d" % i) for i in range(200)]
    c.send_method(1, commands.Queue.Declare(queue="live", passive=True))
    ok = c.expect_method(commands.Queue.DeclareOk)
    assert 150 <= ok.message_count <= 200  # whole segments go; the write segment stays
    reader.close()
    c.close()
