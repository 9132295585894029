"""Runs of identical publishes (amqp/publish_run.py, the C version in
warren._fastpath when built): the scanner against frames marshalled by pamqp,
and what a client sees when a run is cut short, mixed with other frames or
broken in the middle, through a broker in memory.

Moved from tests/ to the in-memory harness (tests/harness): the broker part
feeds the same raw frames to AMQPConnection with no socket, each send one
read, so a run is always cut where the test cuts it; nothing here needs a
socket."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import pytest
from harness import Harness, MemoryAMQP, harness_fixture
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands
from rawamqp import body_frame, header_frame, method_frame, publish_frames, raw_frame

from examples import examples
from warren.amqp import publish_run

Scanner = Callable[..., Any]


def _scanners() -> list[Any]:
    scanners = [pytest.param(publish_run.scan_publishes, id="python")]
    try:
        fast = importlib.import_module("warren._fastpath")
    except ImportError:
        pass
    else:
        scanners.append(pytest.param(fast.scan_publishes, id="c"))
    return scanners


SCANNERS = _scanners()
PERSISTENT = commands.Basic.Properties(delivery_mode=2)


def publish(
    body: bytes,
    rk: str = "q",
    channel: int = 1,
    exchange: str = "",
    properties: commands.Basic.Properties | None = None,
    mandatory: bool = False,
    immediate: bool = False,
) -> bytes:
    out = method_frame(
        channel,
        commands.Basic.Publish(
            exchange=exchange, routing_key=rk, mandatory=mandatory, immediate=immediate
        ),
    )
    out += header_frame(channel, len(body), properties)
    if body:
        out += body_frame(channel, body)
    return out


def messages(run: Any) -> list[tuple[bytes, bytes]]:
    return [(bytes(run.properties(i)), bytes(run.body(i))) for i in range(len(run))]


@pytest.mark.parametrize("scan", SCANNERS)
def test_a_run_ends_where_the_routing_or_the_properties_change(scan: Scanner) -> None:
    data = (
        publish(b"a")
        + publish(b"", properties=PERSISTENT)
        + publish(b"c" * 300)
        + publish(b"d", rk="other")
        + publish(b"e")
    )
    run = scan(data, 0, 131072, 1 << 27, 100)
    assert run.channel == 1 and len(run) == 3
    assert messages(run) == [
        (b"\x00\x00", b"a"),
        (b"\x10\x00\x02", b""),
        (b"\x00\x00", b"c" * 300),
    ]
    assert bytes(run.method)[:4] == b"\x00\x3c\x00\x28"
    assert data[run.end :].startswith(publish(b"d", rk="other"))
    run2 = scan(data, run.end, 131072, 1 << 27, 100)
    assert len(run2) == 1 and messages(run2) == [(b"\x00\x00", b"d")]
    assert run2.end == len(data) - len(publish(b"e"))


@pytest.mark.parametrize("scan", SCANNERS)
@pytest.mark.parametrize(
    "tail",
    [
        pytest.param(
            publish(b"x", properties=commands.Basic.Properties(headers={"h": [1]})), id="props"
        ),
        pytest.param(publish(b"x", channel=2), id="other-channel"),
        pytest.param(publish(b"x", mandatory=True), id="other-bits"),
        pytest.param(method_frame(1, commands.Basic.Ack(delivery_tag=1)), id="other-method"),
        pytest.param(raw_frame(8, 0, b""), id="heartbeat"),
        pytest.param(publish(b"xy")[:-1], id="incomplete"),
        pytest.param(
            method_frame(1, commands.Basic.Publish(routing_key="q"))
            + header_frame(1, 4)
            + body_frame(1, b"ab")
            + body_frame(1, b"cd"),
            id="two-body-frames",
        ),
        pytest.param(publish(b"x")[:-1] + b"\x00", id="bad-frame-end"),
        pytest.param(publish(b"x" * 2000), id="over-max-body"),
    ],
)
def test_anything_else_ends_the_run(scan: Scanner, tail: bytes) -> None:
    data = publish(b"first") + tail
    run = scan(data, 0, 131072, 1000, 100)
    assert len(run) == 1 and run.end == len(publish(b"first"))


@pytest.mark.parametrize("scan", SCANNERS)
def test_no_run_when_the_first_message_is_not_one(scan: Scanner) -> None:
    cases = [
        publish(b"x", immediate=True),
        # Headers a check reads (CC), or nested (tests/test_publish_run_headers.py).
        publish(b"x", properties=commands.Basic.Properties(headers={"CC": ["k"]})),
        publish(b"x", properties=commands.Basic.Properties(headers={"a": {"b": 1}})),
        publish(b"x")[:10],
        publish(b"x", channel=0),
        method_frame(1, commands.Basic.Ack(delivery_tag=1)),
        raw_frame(2, 1, b"\x00\x3c\x00\x00" + bytes(8) + b"\x00\x00"),
        # A content header whose weight is not zero is no content header to RabbitMQ.
        method_frame(1, commands.Basic.Publish(routing_key="q"))
        + raw_frame(2, 1, b"\x00\x3c\x00\x01" + (1).to_bytes(8, "big") + b"\x00\x00")
        + body_frame(1, b"x"),
        # A frame larger than frame_max is an error the slow path reports.
        publish(b"x" * 5000),
        # A basic.publish payload with bytes after the bits octet.
        raw_frame(1, 1, b"\x00\x3c\x00\x28\x00\x00\x00\x01q\x00\xff") + header_frame(1, 0),
    ]
    for data in cases:
        assert scan(data, 0, 4096, 1 << 27, 100) is None, data


@pytest.mark.parametrize("scan", SCANNERS)
def test_the_limit_and_the_start_offset(scan: Scanner) -> None:
    one = publish(b"m")
    data = b"junk" + one * 10
    run = scan(data, 4, 131072, 1 << 27, 3)
    assert len(run) == 3 and run.end == 4 + 3 * len(one)


@st.composite
def streams(draw: st.DrawFn) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """A stream of publishes (some alike, some not) and the run expected at 0."""
    rk = draw(st.sampled_from(["q", "", "k" * 254, "ключ"]))
    plain = st.sampled_from([None, commands.Basic.Properties(delivery_mode=1), PERSISTENT])
    bodies = st.binary(max_size=600) | st.integers(0, 70_000).map(lambda n: b"z" * n)
    expected: list[tuple[bytes, bytes]] = []
    out = b""
    ended = False
    for i in range(draw(st.integers(1, 12))):
        # The run starts with the first publish, whatever it is: make it one of "same".
        kind = (
            "same" if not i else draw(st.sampled_from(["same", "same", "rk", "props", "channel"]))
        )
        body = draw(bodies)
        if kind == "same":
            props = draw(plain)
            frames = publish(body, rk=rk, properties=props)
            if not ended:
                raw = header_frame(1, len(body), props)[7 + 12 : -1]
                expected.append((raw, body))
        elif kind == "rk":
            frames = publish(body, rk=rk + "x")
            ended = True
        elif kind == "props":
            frames = publish(body, rk=rk, properties=commands.Basic.Properties(reply_to="m"))
            ended = True
        else:
            frames = publish(body, rk=rk, channel=3)
            ended = True
        out += frames
    cut = draw(st.integers(0, 40))
    if cut:
        # A read that ends inside a message: that message is not part of the run.
        out = out[: max(0, len(out) - cut)]
        expected = _complete_prefix(out, rk, expected)
    return out, expected


def _complete_prefix(
    data: bytes, rk: str, candidates: list[tuple[bytes, bytes]]
) -> list[tuple[bytes, bytes]]:
    """Those of the expected messages whose frames lie wholly within ``data``."""
    pos = 0
    kept = []
    method = method_frame(1, commands.Basic.Publish(routing_key=rk))
    for props, body in candidates:
        size = len(method) + 7 + 12 + len(props) + 1 + (len(body) + 8 if body else 0)
        if pos + size > len(data):
            break
        kept.append((props, body))
        pos += size
    return kept


@pytest.mark.parametrize("scan", SCANNERS)
@settings(max_examples=examples(200), deadline=None)
@given(case=streams())
def test_the_run_is_the_complete_alike_prefix(
    scan: Scanner, case: tuple[bytes, list[tuple[bytes, bytes]]]
) -> None:
    data, expected = case
    run = scan(data, 0, 131072, 1 << 27, 1000)
    if not expected:
        assert run is None
    else:
        assert run is not None and messages(run) == expected


# -- through the broker ---------------------------------------------------------------


broker = harness_fixture(sync=False)


def _declare(c: MemoryAMQP, name: str) -> None:
    c.send_method(1, commands.Queue.Declare(queue=name))
    c.expect_method(commands.Queue.DeclareOk)


def _get_all(c: MemoryAMQP, queue: str) -> list[bytes]:
    got = []
    while True:
        c.send_method(1, commands.Basic.Get(queue=queue, no_ack=True))
        _, method = c.read_frame()
        if isinstance(method, commands.Basic.GetEmpty):
            return got
        assert isinstance(method, commands.Basic.GetOk)
        _header, body = c.expect_content()
        got.append(body)


def test_one_write_with_runs_cut_by_other_frames_keeps_every_message_in_order(
    broker: Harness,
) -> None:
    c = broker.amqp_client()
    _declare(c, "a")
    _declare(c, "b")
    c.send_method(1, commands.Confirm.Select())
    c.expect_method(commands.Confirm.SelectOk)
    data = b""
    expected: dict[str, list[bytes]] = {"a": [], "b": []}
    n = 0
    for i in range(60):
        q = "a" if i % 7 < 5 else "b"
        props = None
        if i % 11 == 0:
            props = commands.Basic.Properties(message_id=f"m{i}", headers={"i": i})
        elif i % 3 == 0:
            props = PERSISTENT
        data += publish_frames(1, f"{q}{i}".encode(), q, properties=props)
        expected[q].append(f"{q}{i}".encode())
        n += 1
        if i % 13 == 0:
            data += raw_frame(8, 0, b"")
    c.send(data)
    acked: set[int] = set()
    while len(acked) < n:
        _, method = c.read_frame()
        assert isinstance(method, commands.Basic.Ack)
        if method.multiple:
            acked.update(range(1, method.delivery_tag + 1))
        else:
            acked.add(method.delivery_tag)
    assert acked == set(range(1, n + 1))
    assert _get_all(c, "a") == expected["a"]
    assert _get_all(c, "b") == expected["b"]
    c.close()


def test_unroutable_mandatory_messages_of_a_run_each_come_back(broker: Harness) -> None:
    c = broker.amqp_client()
    data = b"".join(publish(f"m{i}".encode(), rk="nowhere", mandatory=True) for i in range(5))
    c.send(data)
    for i in range(5):
        method = c.expect_method(commands.Basic.Return)
        assert (method.reply_code, method.reply_text) == (312, "NO_ROUTE")
        _header, body = c.expect_content()
        assert body == f"m{i}".encode()
    c.close()


def test_a_run_to_a_missing_exchange_closes_the_channel_once(broker: Harness) -> None:
    c = broker.amqp_client()
    _declare(c, "after")
    data = b"".join(publish(b"x", exchange="missing", rk="k") for _ in range(20))
    c.send(data)
    assert c.expect_channel_close(1) == (
        404,
        "NOT_FOUND - no exchange 'missing' in vhost '/'",
        60,
        40,
    )
    c.send_method(1, commands.Channel.CloseOk())
    # The connection goes on: a new channel publishes (a run again) normally.
    c.send_method(2, commands.Channel.Open())
    c.expect_method(commands.Channel.OpenOk)
    c.send(b"".join(publish(b"y", channel=2, rk="after") for _ in range(3)))
    c.send_method(2, commands.Queue.Declare(queue="after", passive=True))
    assert c.expect_method(commands.Queue.DeclareOk, channel=2).message_count == 3
    c.close()


def test_a_run_in_a_transaction_is_held_until_commit(broker: Harness) -> None:
    c = broker.amqp_client()
    _declare(c, "t")
    c.send_method(1, commands.Tx.Select())
    c.expect_method(commands.Tx.SelectOk)
    c.send(b"".join(publish(f"t{i}".encode(), rk="t") for i in range(10)))
    c.send_method(1, commands.Queue.Declare(queue="t", passive=True))
    assert c.expect_method(commands.Queue.DeclareOk).message_count == 0
    c.send_method(1, commands.Tx.Commit())
    c.expect_method(commands.Tx.CommitOk)
    assert _get_all(c, "t") == [f"t{i}".encode() for i in range(10)]
    c.close()


def test_a_run_split_across_reads(broker: Harness) -> None:
    c = broker.amqp_client()
    _declare(c, "s")
    data = b"".join(publish(f"s{i}".encode() * 50, rk="s") for i in range(200))
    for at in range(0, len(data), 997):  # cuts land inside frames: one read each
        c.send(data[at : at + 997])
    c.send_method(1, commands.Queue.Declare(queue="s", passive=True))
    assert c.expect_method(commands.Queue.DeclareOk).message_count == 200
    assert _get_all(c, "s") == [f"s{i}".encode() * 50 for i in range(200)]
    c.close()


# -- the C encoder of a run's deliveries -----------------------------------------------

_fast = importlib.import_module("warren._fastpath") if len(SCANNERS) > 1 else None
needs_c = pytest.mark.skipif(_fast is None, reason="warren._fastpath not built")


@needs_c
@settings(max_examples=examples(200), deadline=None)
@given(
    bodies=st.lists(
        st.binary(max_size=300) | st.integers(0, 20_000).map(b"b".__mul__), min_size=1, max_size=8
    ),
    rk=st.sampled_from(["q", "", "r" * 200]),
    exchange=st.sampled_from(["", "amq.direct", "x" * 100]),
    tag=st.sampled_from(["ctag", "", "amq.ctag-" + "z" * 200]),
    channel=st.integers(1, 65535),
    first=st.integers(1, 2**64 - 100),
    frame_max=st.sampled_from([4096, 131072, 0]),
    slice_=st.tuples(st.integers(0, 8), st.integers(0, 8)),
    step=st.integers(1, 4),
)
def test_deliver_frames_agrees_with_message_frames(
    bodies: list[bytes],
    rk: str,
    exchange: str,
    tag: str,
    channel: int,
    first: int,
    frame_max: int,
    slice_: tuple[int, int],
    step: int,
) -> None:
    from warren.amqp.frames import message_frames

    assert _fast is not None
    props = [b"\x00\x00", b"\x10\x00\x01", b"\x10\x00\x02"]
    data = b"".join(
        publish(
            body,
            rk=rk,
            exchange=exchange,
            properties=[None, commands.Basic.Properties(delivery_mode=1), PERSISTENT][i % 3],
        )
        for i, body in enumerate(bodies)
    )
    run = _fast.scan_publishes(data, 0, 0, 1 << 27, 100)
    assert run is not None and len(run) == len(bodies)
    start, stop = sorted(min(x, len(bodies)) for x in slice_)
    raw_tag = tag.encode()
    head = b"\x00\x3c\x00\x3c" + bytes([len(raw_tag)]) + raw_tag
    got = _fast.deliver_frames(run, start, stop, step, channel, head, first, frame_max)
    ex_rk = bytes([len(exchange)]) + exchange.encode() + bytes([len(rk.encode())]) + rk.encode()
    expected = b"".join(
        b"".join(
            message_frames(
                channel,
                head + (first + (i - start) // step).to_bytes(8, "big") + b"\x00" + ex_rk,
                props[i % 3],
                bodies[i],
                frame_max or 1 << 40,
            )
        )
        for i in range(start, stop, step)
    )
    assert got == expected


@needs_c
def test_deliver_frames_refuses_bad_arguments() -> None:
    assert _fast is not None
    run = _fast.scan_publishes(publish(b"x"), 0, 0, 1 << 27, 10)
    with pytest.raises(ValueError):
        _fast.deliver_frames(run, 0, 2, 1, 1, b"\x00\x3c\x00\x3c\x00", 1, 4096)
    with pytest.raises(TypeError):
        _fast.deliver_frames(object(), 0, 1, 1, 1, b"", 1, 4096)
    with pytest.raises(ValueError):
        _fast.deliver_frames(run, 0, 1, 1, 70000, b"", 1, 4096)
    with pytest.raises(ValueError):
        _fast.deliver_frames(run, 0, 1, 0, 1, b"", 1, 4096)


def test_a_run_to_a_no_ack_consumer_arrives_whole_and_counted(broker: Harness) -> None:
    """Published in one write, delivered at once (deliver_frames when built): tags
    in order, exchange, routing key, properties and bodies as sent, and the
    queue's and channel's counters as if one by one."""
    c = broker.amqp_client()
    _declare(c, "n")
    c.send_method(1, commands.Basic.Consume(queue="n", consumer_tag="ct", no_ack=True))
    c.expect_method(commands.Basic.ConsumeOk)
    bodies = [f"n{i}".encode() * (i + 1) for i in range(50)]
    props = [None, PERSISTENT]
    c.send(b"".join(publish(b, rk="n", properties=props[i % 2]) for i, b in enumerate(bodies)))
    for i, body in enumerate(bodies):
        deliver = c.expect_method(commands.Basic.Deliver)
        assert (deliver.consumer_tag, deliver.delivery_tag, deliver.redelivered) == (
            "ct",
            i + 1,
            False,
        )
        assert (deliver.exchange, deliver.routing_key) == ("", "n")
        header, got = c.expect_content()
        assert got == body
        assert header.properties.delivery_mode == (2 if i % 2 else None)

    def counters() -> tuple[int, int, int]:
        (q,) = [q for q in broker.broker.vhosts["/"].queues.values() if q.name == "n"]
        return (
            q.stats.publish,
            q.stats.deliver_no_ack,
            broker.broker.vhosts["/"].default_exchange.stats.publish_in,
        )

    assert broker.call(counters) == (50, 50, 50)
    c.close()


def test_a_run_is_shared_round_robin_among_no_ack_consumers(broker: Harness) -> None:
    """Three no-ack consumers, each on its own channel: each gets every third
    message, in order, as one by one round-robin would hand them out; two of
    them on one channel keep the one-by-one interleaving."""
    c = broker.amqp_client()
    _declare(c, "rr")
    for ch in (2, 3):
        c.send_method(ch, commands.Channel.Open())
        c.expect_method(commands.Channel.OpenOk, channel=ch)
    for ch in (1, 2, 3):
        c.send_method(ch, commands.Basic.Consume(queue="rr", consumer_tag=f"c{ch}", no_ack=True))
        c.expect_method(commands.Basic.ConsumeOk, channel=ch)
    c.send(b"".join(publish(f"r{i}".encode(), rk="rr") for i in range(30)))
    got: dict[int, list[bytes]] = {1: [], 2: [], 3: []}
    tags: dict[int, list[int]] = {1: [], 2: [], 3: []}
    for _ in range(30):
        ch, deliver = c.read_frame()
        assert isinstance(deliver, commands.Basic.Deliver)
        _header, body = c.expect_content()
        got[ch].append(body)
        tags[ch].append(deliver.delivery_tag)
    firsts = sorted((int(v[0][1:]), k) for k, v in got.items())
    assert [f for f, _ in firsts] == [0, 1, 2]
    for first, ch in firsts:
        assert got[ch] == [f"r{i}".encode() for i in range(first, 30, 3)]
        assert tags[ch] == list(range(1, 11))
    # The next message goes to the consumer whose turn it is.
    c.send(publish(b"next", rk="rr"))
    ch, deliver = c.read_frame()
    assert ch == firsts[0][1]
    c.expect_content()
    c.close()


def test_consumers_sharing_a_channel_interleave_as_one_by_one(broker: Harness) -> None:
    c = broker.amqp_client()
    _declare(c, "sh")
    for tag in ("a", "b"):
        c.send_method(1, commands.Basic.Consume(queue="sh", consumer_tag=tag, no_ack=True))
        c.expect_method(commands.Basic.ConsumeOk)
    c.send(b"".join(publish(f"s{i}".encode(), rk="sh") for i in range(10)))
    order = []
    for i in range(10):
        deliver = c.expect_method(commands.Basic.Deliver)
        _header, body = c.expect_content()
        assert body == f"s{i}".encode() and deliver.delivery_tag == i + 1
        order.append(deliver.consumer_tag)
    assert order in (["a", "b"] * 5, ["b", "a"] * 5)
    c.close()


def test_a_run_through_fanout_reaches_every_queue_whichever_way(broker: Harness) -> None:
    """Three queues bound to a fanout exchange: one with a no-ack consumer (the
    run at once), one with an acking consumer and one with none (message by
    message). Each gets every message in order; the exchange counts each
    message once in and three times out."""
    c = broker.amqp_client()
    c.send_method(1, commands.Exchange.Declare(exchange="fan", exchange_type="fanout"))
    c.expect_method(commands.Exchange.DeclareOk)
    for q in ("f1", "f2", "f3"):
        _declare(c, q)
        c.send_method(1, commands.Queue.Bind(queue=q, exchange="fan"))
        c.expect_method(commands.Queue.BindOk)
    c.send_method(1, commands.Basic.Consume(queue="f1", consumer_tag="noack", no_ack=True))
    c.expect_method(commands.Basic.ConsumeOk)
    c.send_method(2, commands.Channel.Open())
    c.expect_method(commands.Channel.OpenOk, channel=2)
    c.send_method(2, commands.Basic.Consume(queue="f2", consumer_tag="acks"))
    c.expect_method(commands.Basic.ConsumeOk, channel=2)
    c.send_method(3, commands.Channel.Open())
    c.expect_method(commands.Channel.OpenOk, channel=3)
    c.send_method(3, commands.Confirm.Select())
    c.expect_method(commands.Confirm.SelectOk, channel=3)
    bodies = [f"f{i}".encode() for i in range(40)]
    c.send(b"".join(publish(b, exchange="fan", rk="", channel=3, mandatory=True) for b in bodies))
    got: dict[str, list[bytes]] = {"noack": [], "acks": []}
    acked = 0
    while len(got["noack"]) + len(got["acks"]) < 80 or acked < 40:
        ch, frame = c.read_frame()
        if isinstance(frame, commands.Basic.Ack):
            acked = max(acked, frame.delivery_tag)
            continue
        assert isinstance(frame, commands.Basic.Deliver), frame
        _header, body = c.expect_content()
        got[frame.consumer_tag].append(body)
    assert got == {"noack": bodies, "acks": bodies}
    assert _get_all(c, "f3") == bodies

    def exchange_counts() -> tuple[int, int]:
        stats = broker.broker.vhosts["/"].exchanges["fan"].stats
        return stats.publish_in, stats.publish_out

    assert broker.call(exchange_counts) == (40, 120)
    c.close()
