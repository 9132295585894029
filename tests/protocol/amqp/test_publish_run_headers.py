"""Publish runs whose messages carry a headers table (amqp/publish_run.py's
simple_delivery_mode and _simple_table, and their C twin in warren._fastpath):
a flat, plain table joins the run; anything a check or the routing could read
(CC/BCC, nested tables, floats, malformed bytes) goes the slow way and gets
the same reply as before.

Moved from tests/ to the in-memory harness (tests/harness): the broker part
feeds the same raw frames to AMQPConnection with no socket, each send one
read, so a run is always cut where the test cuts it; nothing here needs a
socket."""

from __future__ import annotations

import importlib
import struct
from collections.abc import Callable
from typing import Any

import pytest
from harness import Harness, harness_fixture
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands
from rawamqp import body_frame, method_frame, raw_frame
from test_publish_run import SCANNERS

from examples import examples
from warren.amqp import publish_run
from warren.amqp.publish_checks import check_message, validate_publish_properties
from warren.core.codec_errors import DecodeError, UnsafeValue
from warren.core.errors import BrokerError
from warren.core.message import Message

Scanner = Callable[..., Any]


def table(*entries: bytes) -> bytes:
    raw = b"".join(entries)
    return struct.pack(">I", len(raw)) + raw


def entry(key: bytes, tag: bytes, value: bytes) -> bytes:
    return bytes((len(key),)) + key + tag + value


def longstr(value: bytes) -> bytes:
    return struct.pack(">I", len(value)) + value


def with_headers(headers: bytes, before: bytes = b"", after: bytes = b"", flags: int = 0) -> bytes:
    """A property list: ``flags`` | headers, the bytes of the properties before
    the table (content-type, content-encoding) and after it."""
    return struct.pack(">H", flags | 0x2000) + before + headers + after


def publish(body: bytes, props: bytes, rk: str = "q", channel: int = 1) -> bytes:
    out = method_frame(channel, commands.Basic.Publish(routing_key=rk))
    out += raw_frame(2, channel, struct.pack(">HHQ", 60, 0, len(body)) + props)
    if body:
        out += body_frame(channel, body)
    return out


KEY = entry(b"x-deduplication-header", b"S", longstr(b"write:0:1:42"))
#: Tables a run takes: flat, ASCII keys, every fixed-size type, strings, timestamps.
SIMPLE = [
    pytest.param(table(), id="empty"),
    pytest.param(table(KEY), id="dedup-key"),
    pytest.param(
        table(
            entry(b"t", b"t", b"\x01"),
            entry(b"b", b"b", b"\xff"),
            entry(b"B", b"B", b"\x01"),
            entry(b"s", b"s", b"\x00\x01"),
            entry(b"u", b"u", b"\xff\xff"),
            entry(b"I", b"I", b"\x00\x00\x00\x01"),
            entry(b"i", b"i", b"\x00\x00\x00\x01"),
            entry(b"l", b"l", bytes(8)),
            entry(b"L", b"L", bytes(8)),
            entry(b"D", b"D", bytes(5)),
            entry(b"V", b"V", b""),
            entry(b"x", b"x", longstr(b"\x00\xff\xfe")),
            entry(b"S", b"S", longstr("é".encode())),
            entry(b"T", b"T", struct.pack(">Q", 1_700_000_000)),
            entry(b"", b"S", longstr(b"empty key")),
        ),
        id="every-type",
    ),
]
#: Tables the slow way must see: what a check or a route reads, or what it refuses.
NOT_SIMPLE = [
    pytest.param(table(entry(b"CC", b"A", struct.pack(">I", 0))), id="CC"),
    pytest.param(table(entry(b"BCC", b"S", longstr(b"k"))), id="BCC"),
    pytest.param(table(entry(b"CC", b"S", longstr(b"k"))), id="CC-string"),
    pytest.param(table(entry(b"k", b"S", longstr(b"aCCb"))), id="CC-bytes-anywhere"),
    pytest.param(table(entry(b"n", b"F", table())), id="nested-table"),
    pytest.param(table(entry(b"a", b"A", struct.pack(">I", 0))), id="array"),
    pytest.param(table(entry(b"f", b"f", struct.pack(">f", 1.5))), id="float"),
    pytest.param(table(entry(b"d", b"d", struct.pack(">d", float("nan")))), id="nan"),
    pytest.param(table(entry(b"k\xff", b"S", longstr(b"v"))), id="key-not-ascii"),
    pytest.param(table(entry(b"k", b"T", struct.pack(">Q", 253_402_300_800))), id="year-10000"),
    pytest.param(table(entry(b"k", b"Z", b"")), id="unknown-type"),
    pytest.param(struct.pack(">I", 40) + entry(b"k", b"S", longstr(b"v")), id="table-overruns"),
    pytest.param(table(entry(b"k", b"S", struct.pack(">I", 9))), id="string-overruns"),
    pytest.param(table(entry(b"k", b"I", b"\x00")), id="value-overruns"),
    pytest.param(table(b"\x05ab"), id="truncated-entry"),
]


@pytest.mark.parametrize("scan", SCANNERS)
@pytest.mark.parametrize("headers", SIMPLE)
def test_a_simple_table_joins_the_run(scan: Scanner, headers: bytes) -> None:
    props = [
        with_headers(headers),
        with_headers(headers, after=b"\x02", flags=0x1000),  # + delivery-mode 2
        with_headers(headers, before=b"\x04text", flags=0x8000),  # content-type first
    ]
    data = publish(b"a", b"\x00\x00") + b"".join(
        publish(b"m%d" % i, p) for i, p in enumerate(props)
    )
    run = scan(data, 0, 131072, 1 << 27, 100)
    assert run is not None and len(run) == 4 and run.end == len(data)
    assert [bytes(run.properties(i)) for i in range(1, 4)] == props
    assert [publish_run.simple_delivery_mode(p) for p in props] == [0, 2, 0]


@pytest.mark.parametrize("scan", SCANNERS)
@pytest.mark.parametrize("headers", NOT_SIMPLE)
def test_anything_else_in_a_table_ends_the_run(scan: Scanner, headers: bytes) -> None:
    first = publish(b"a", with_headers(table(KEY)))
    data = first + publish(b"b", with_headers(headers))
    run = scan(data, 0, 131072, 1 << 27, 100)
    assert run is not None and len(run) == 1 and run.end == len(first)
    assert scan(data, len(first), 131072, 1 << 27, 100) is None
    assert publish_run.simple_delivery_mode(with_headers(headers)) is None


# -- both scanners alike, and what they take passes every check of the slow way ------

_TAGS = b"tbBsuIilLDVSxTFAfdZ"


@st.composite
def tables(draw: st.DrawFn) -> bytes:
    """Tables of every kind, most of them well formed, some cut or padded."""
    entries = []
    for _ in range(draw(st.integers(0, 5))):
        key = draw(st.sampled_from([b"k", b"CC", b"BCC", b"x-key", b"k\xc3\xa9", b"\xff", b""]))
        tag = draw(st.sampled_from(list(_TAGS)))
        size = {
            ord(c): n
            for c, n in zip("tbBsuIilLDVT", [1, 1, 1, 2, 2, 4, 4, 8, 8, 5, 0, 8], strict=True)
        }
        if tag in size:
            value = draw(st.binary(min_size=size[tag], max_size=size[tag]))
        elif tag in b"Sx":
            value = longstr(draw(st.binary(max_size=12)))
        elif tag in b"FA":
            value = longstr(draw(st.binary(max_size=6)))
        elif tag == ord("f"):
            value = struct.pack(">f", draw(st.floats(width=32)))
        elif tag == ord("d"):
            value = struct.pack(">d", draw(st.floats()))
        else:
            value = b""
        entries.append(entry(key, bytes((tag,)), value))
    raw = table(*entries)
    damage = draw(st.integers(0, 6))
    if damage == 1:
        raw = raw[: draw(st.integers(0, len(raw)))]
    elif damage == 2:
        raw = struct.pack(">I", draw(st.integers(0, len(raw) + 4))) + raw[4:]
    return raw


@st.composite
def property_lists(draw: st.DrawFn) -> bytes:
    flags = 0x2000
    before = b""
    if draw(st.booleans()):
        flags |= 0x8000
        before = b"\x10application/json"
    after = b""
    if draw(st.booleans()):
        flags |= 0x1000
        after += bytes((draw(st.sampled_from([1, 2, 3])),))
    if draw(st.booleans()):
        flags |= 0x0080
        after += b"\x03m-1"
    return with_headers(draw(tables()), before, after, flags) + draw(
        st.sampled_from([b"", b"", b"\x00"])
    )


@pytest.mark.skipif(len(SCANNERS) < 2, reason="warren._fastpath is not built")
@settings(max_examples=examples(400), deadline=None)
@given(props=property_lists())
def test_the_c_scanner_agrees_and_a_taken_table_passes_every_check(props: bytes) -> None:
    fast = importlib.import_module("warren._fastpath")
    data = publish(b"a", b"\x00\x00") + publish(b"b", props)
    py_run = publish_run.scan_publishes(data, 0, 131072, 1 << 27, 10)
    c_run = fast.scan_publishes(data, 0, 131072, 1 << 27, 10)
    assert len(py_run) == len(c_run)
    taken = publish_run.simple_delivery_mode(props) is not None
    assert len(py_run) == (2 if taken else 1)
    if taken:
        # The slow way would have said nothing, and changed nothing.
        validate_publish_properties(props)
        msg = Message("", "q", props, b"b", 0)
        assert check_message(msg, None, None) is msg


@settings(max_examples=examples(400), deadline=None)
@given(props=property_lists())
def test_a_table_the_slow_way_refuses_is_never_taken(props: bytes) -> None:
    try:
        validate_publish_properties(props)
        check_message(Message("", "q", props, b"", 0), None, None)
    except (BrokerError, DecodeError, UnsafeValue):
        assert publish_run.simple_delivery_mode(props) is None


# -- through the broker ---------------------------------------------------------------


broker = harness_fixture(sync=False)


def _close_after(b: Harness, data: bytes) -> tuple[int, str]:
    c = b.amqp_client()
    c.send_method(1, commands.Queue.Declare(queue="q"))
    c.expect_method(commands.Queue.DeclareOk)
    c.send(data)
    while True:
        _, frame = c.read_frame()
        if isinstance(frame, commands.Connection.Close | commands.Channel.Close):
            c.close_socket()
            return frame.reply_code, frame.reply_text


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param(struct.pack(">I", 40) + entry(b"k", b"S", longstr(b"v")), id="overrun"),
        pytest.param(table(entry(b"k", b"Z", b"")), id="unknown-type"),
        pytest.param(table(entry(b"k\xff", b"S", longstr(b"v"))), id="key-not-utf8"),
        pytest.param(table(entry(b"CC", b"S", longstr(b"k"))), id="CC-not-array"),
    ],
)
def test_a_bad_table_in_a_run_gets_the_reply_it_gets_alone(broker: Harness, headers: bytes) -> None:
    good = b"".join(publish(b"m%d" % i, with_headers(table(KEY))) for i in range(5))
    bad = publish(b"bad", with_headers(headers))
    alone = _close_after(broker, bad)
    assert _close_after(broker, good + bad + good) == alone
    assert alone[0] in (406, 501, 502, 505)


def test_a_headers_exchange_routes_each_message_of_a_run_by_its_headers(
    broker: Harness,
) -> None:
    c = broker.amqp_client()
    for name, value in (("qa", "a"), ("qb", "b")):
        c.send_method(1, commands.Queue.Declare(queue=name))
        c.expect_method(commands.Queue.DeclareOk)
        c.send_method(
            1,
            commands.Queue.Bind(
                queue=name, exchange="amq.headers", arguments={"x-match": "all", "k": value}
            ),
        )
        c.expect_method(commands.Queue.BindOk)
    c.send_method(1, commands.Confirm.Select())
    c.expect_method(commands.Confirm.SelectOk)
    data = b""
    for i in range(20):
        value = b"a" if i % 3 else b"b"
        props = with_headers(table(entry(b"k", b"S", longstr(value))))
        out = method_frame(1, commands.Basic.Publish(exchange="amq.headers", routing_key="r"))
        out += raw_frame(2, 1, struct.pack(">HHQ", 60, 0, 3) + props) + body_frame(1, b"%03d" % i)
        data += out
    c.send(data)
    acked = 0
    while acked < 20:
        _, method = c.read_frame()
        assert isinstance(method, commands.Basic.Ack)
        acked = method.delivery_tag
    got = {}
    for name in ("qa", "qb"):
        bodies = []
        while True:
            c.send_method(1, commands.Basic.Get(queue=name, no_ack=True))
            _, method = c.read_frame()
            if isinstance(method, commands.Basic.GetEmpty):
                break
            bodies.append(c.expect_content()[1])
        got[name] = bodies
    assert got == {
        "qa": [b"%03d" % i for i in range(20) if i % 3],
        "qb": [b"%03d" % i for i in range(20) if not i % 3],
    }
    c.close()
