"""Runs whose messages carry simple properties (content-type, content-encoding,
priority, correlation-id, message-id, timestamp, type, app-id, a flat headers
table besides delivery-mode): which lists a run takes (C and Python alike, against
core/properties.py's decoder and channel.py's checks), and through a broker:
delivered byte for byte, stored and recovered.

Moved from tests/ to the in-memory harness (tests/harness): the broker part
feeds the same raw frames to AMQPConnection with no socket, each send one
read, so a run is always cut where the test cuts it; nothing here needs a
socket."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from harness import Harness
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands
from rawamqp import body_frame, header_frame, method_frame
from test_publish_run import SCANNERS

from examples import examples
from warren.amqp.publish_run import simple_delivery_mode
from warren.core.codec_errors import DecodeError
from warren.core.properties import decode_properties

Scanner = Callable[..., Any]


SIMPLE = ("content_type", "content_encoding", "priority", "correlation_id", "message_id",
          "timestamp", "message_type", "app_id", "delivery_mode")  # fmt: skip


def publish(body: bytes, rk: str, properties: commands.Basic.Properties | None) -> bytes:
    out = method_frame(1, commands.Basic.Publish(routing_key=rk))
    out += header_frame(1, len(body), properties)
    if body:
        out += body_frame(1, body)
    return out


def raw_properties(properties: commands.Basic.Properties) -> bytes:
    return header_frame(1, 0, properties)[7 + 12 : -1]


texts = st.text(max_size=20) | st.text(alphabet="abc/+", max_size=255)


@st.composite
def property_lists(draw: st.DrawFn) -> commands.Basic.Properties:
    kwargs: dict[str, Any] = {}
    for name in draw(
        st.sets(st.sampled_from([*SIMPLE, "headers", "reply_to", "expiration", "user_id"]))
    ):
        if name in ("priority",):
            kwargs[name] = draw(st.integers(0, 255))
        elif name == "delivery_mode":
            kwargs[name] = draw(st.integers(1, 2))  # pamqp refuses others: see below
        elif name == "timestamp":
            seconds = draw(st.integers(0, 253_402_300_799))
            kwargs[name] = datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC)
        elif name == "headers":
            # Flat (a run takes it, unless CC/BCC may be in it), nested (never).
            key = draw(st.sampled_from(["k", "CC", "BCC", "ключ"]))
            kwargs[name] = draw(st.sampled_from([{key: draw(texts)}, {key: {"n": 1}}]))
        else:
            kwargs[name] = draw(texts)
    return commands.Basic.Properties(**kwargs)


def _expected_simple(raw: bytes) -> bool:
    """What a run should take, read from the bytes (pamqp leaves out empty
    strings): only simple fields, ASCII, delivery-mode 1/2."""
    props = decode_properties(raw)
    for name in ("reply_to", "expiration", "user_id", "cluster_id"):
        if getattr(props, name) is not None:
            return False
    if props.headers is not None and (
        b"CC" in raw  # the checks of CC/BCC decide
        or any(not k.isascii() or isinstance(v, dict) for k, v in props.headers.items())
    ):
        return False
    if props.delivery_mode is not None and props.delivery_mode not in (1, 2):
        return False
    for name in (
        "content_type",
        "content_encoding",
        "correlation_id",
        "message_id",
        "type",
        "app_id",
    ):
        value = getattr(props, name)
        if value is not None and not value.isascii():
            return False
    return True


@pytest.mark.parametrize("scan", SCANNERS)
@settings(max_examples=examples(300), deadline=None)
@given(props=property_lists())
def test_a_run_takes_exactly_the_simple_property_lists(
    scan: Scanner, props: commands.Basic.Properties
) -> None:
    raw = raw_properties(props)
    data = publish(b"one", "q", None) + publish(b"two", "q", props)
    run = scan(data, 0, 131072, 1 << 27, 100)
    simple = _expected_simple(raw)
    assert len(run) == (2 if simple else 1)
    if simple:
        assert bytes(run.properties(1)) == raw
        mode = simple_delivery_mode(raw)
        assert mode == (props.delivery_mode or 0)
        assert decode_properties(raw).delivery_mode == props.delivery_mode


@settings(max_examples=examples(300), deadline=None)
@given(raw=st.binary(max_size=40))
def test_what_simple_delivery_mode_takes_the_decoder_reads(raw: bytes) -> None:
    mode = simple_delivery_mode(raw)
    if mode is None:
        return
    try:
        decoded = decode_properties(raw)
    except DecodeError as exc:  # pragma: no cover - the assertion says why
        raise AssertionError(f"taken but undecodable: {raw!r}") from exc
    assert (decoded.delivery_mode or 0) == mode
    assert decoded.headers is None and decoded.reply_to is None and decoded.expiration is None


def test_a_timestamp_after_the_year_9999_is_not_simple() -> None:
    last = 253_402_300_799
    assert simple_delivery_mode(b"\x00\x40" + last.to_bytes(8, "big")) == 0
    assert simple_delivery_mode(b"\x00\x40" + (last + 1).to_bytes(8, "big")) is None
    assert simple_delivery_mode(b"\x00\x40" + b"\x00" * 7) is None  # cut short
    assert simple_delivery_mode(b"\x90\x00\x01a\x02") == 2  # content-type "a", delivery-mode 2
    assert simple_delivery_mode(b"\x90\x00\x01a\x02\x00") is None  # a byte too many
    for mode in (0, 3, 255):  # RabbitMQ refuses these: the slow path says so
        assert simple_delivery_mode(b"\x10\x00" + bytes((mode,))) is None


@pytest.mark.parametrize("scan", SCANNERS)
def test_a_delivery_mode_channel_py_refuses_ends_a_run(scan: Scanner) -> None:
    def raw_publish(props: bytes) -> bytes:
        method = method_frame(1, commands.Basic.Publish(routing_key="q"))
        header = b"\x00\x3c\x00\x00" + (1).to_bytes(8, "big") + props
        frame = b"\x02\x00\x01" + len(header).to_bytes(4, "big") + header + b"\xce"
        return method + frame + body_frame(1, b"x")

    good = raw_publish(b"\x90\x00\x04text\x02")
    assert len(scan(good + good, 0, 131072, 1 << 27, 100)) == 2
    assert len(scan(good + raw_publish(b"\x90\x00\x04text\x03"), 0, 131072, 1 << 27, 100)) == 1


def test_runs_with_properties_are_delivered_as_sent_and_recovered(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    b = Harness(data_dir)
    props = [
        commands.Basic.Properties(
            content_type="application/json",
            content_encoding="utf-8",
            delivery_mode=2 if i % 2 else 1,
            priority=i % 10,
            correlation_id=f"c{i}",
            message_id=f"m{i}",
            timestamp=datetime.datetime.fromtimestamp(1_700_000_000 + i, tz=datetime.UTC),
            message_type="t",
            app_id="app",
        )
        for i in range(30)
    ]
    try:
        c = b.amqp()
        c.handshake()
        c.open_channel(1)
        for q in ("live", "kept"):
            c.send_method(1, commands.Queue.Declare(queue=q, durable=True))
            c.expect_method(commands.Queue.DeclareOk)
        c.send_method(1, commands.Basic.Consume(queue="live", consumer_tag="ct"))
        c.expect_method(commands.Basic.ConsumeOk)
        c.send(b"".join(publish(f"b{i}".encode(), "live", p) for i, p in enumerate(props)))
        for i, p in enumerate(props):
            deliver = c.expect_method(commands.Basic.Deliver)
            header, body = c.expect_content()
            assert (deliver.delivery_tag, body) == (i + 1, f"b{i}".encode())
            assert raw_properties(header.properties) == raw_properties(p)
        c.send_method(1, commands.Basic.Ack(delivery_tag=0, multiple=True))
        c.send(b"".join(publish(f"k{i}".encode(), "kept", p) for i, p in enumerate(props)))
        c.send_method(1, commands.Queue.Declare(queue="kept", durable=True, passive=True))
        assert c.expect_method(commands.Queue.DeclareOk).message_count == 30
        c.close()
    finally:
        b.stop()
    b = Harness(data_dir)
    try:
        c = b.amqp()
        c.handshake()
        c.open_channel(1)
        got = []
        while True:
            c.send_method(1, commands.Basic.Get(queue="kept", no_ack=True))
            _, frame = c.read_frame()
            if isinstance(frame, commands.Basic.GetEmpty):
                break
            header, body = c.expect_content()
            got.append((body, raw_properties(header.properties)))
        # Only the persistent ones survive a restart.
        assert got == [(f"k{i}".encode(), raw_properties(p)) for i, p in enumerate(props) if i % 2]
        c.close()
    finally:
        b.stop()
