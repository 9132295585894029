"""A stream's chunk records framed in C for AMQP 0-9-1 readers (issue 31):
warren._fastpath's deliver_entries, through StreamCursor.entries and the
EntryDecoder's layouts, against the Python path it stands in for
(StreamCursor.next, the broker's AMQP 1.0 mapping, message_frames), on
generated chunks of AMQP 1.0 messages (simple ones, others, not AMQP at all)
in a real StreamStore. The C is the compiled build's: the compiled pass runs
this module (the pure build never asks for it)."""

from __future__ import annotations

import struct
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import warren
from examples import examples
from warren.amqp.frames import message_frames
from warren.amqp1.message import (
    AmqpMessage,
    AmqpValue,
    ApplicationProperties,
    Data,
    DeliveryAnnotations,
    Footer,
    Header,
    MessageAnnotations,
    Properties,
    encode_message,
)
from warren.amqp1.types import Symbol
from warren.app import AMQP1StreamMessages
from warren.store.stream_records import MAX_LAYOUTS, EntryDecoder
from warren.store.stream_store import StreamStore

pytestmark = pytest.mark.passes("compiled")

_native = warren.native_module("_fastpath")
needs_c = pytest.mark.skipif(
    _native is None or not hasattr(_native, "deliver_entries"), reason="not built"
)

HEAD = b"\x00\x3c\x00\x3c\x05ctag1"
CHANNEL = 3
ROUTING_KEY = "s\u00e9"


def entries(*messages: bytes) -> bytes:
    return b"".join(struct.pack(">I", len(m)) + m for m in messages)


def ex_rk() -> bytes:
    rk = ROUTING_KEY.encode()
    return b"\x00" + bytes((len(rk),)) + rk


def amqp_decoder() -> EntryDecoder:
    """The broker's decoder of chunk entries (warren.app's), a fresh cache."""
    own = EntryDecoder()
    own.decode = AMQP1StreamMessages().to_core
    return own


def store_of(d: Path, chunks: list[list[bytes]]) -> StreamStore:
    store = StreamStore(d, 8 * 1024 * 1024)
    store.decoder = amqp_decoder()
    store.chunk_routing_key = ROUTING_KEY
    for i, chunk in enumerate(chunks):
        store.append_chunk(entries(*chunk), len(chunk), 1_700_000_000_000 + i, "", 0)
    return store


def one_by_one(store: StreamStore, frame_max: int) -> bytes:
    """Every message as the Python path delivers it (tags from 1)."""
    cursor = store.cursor(0)
    out: list[bytes] = []
    while (item := cursor.next()) is not None:
        msg = item[1]
        payload = HEAD + struct.pack(">QB", len(out) + 1, 0) + msg.exchange_and_key()
        out.append(b"".join(message_frames(CHANNEL, payload, msg.properties, msg.body, frame_max)))
    cursor.close()
    return b"".join(out)


def in_spans(
    store: StreamStore, frame_max: int, max_ns: list[int], max_bytes: int
) -> tuple[bytes, int]:
    """Every message as the delivery pass gives them to a 0-9-1 consumer that
    frames chunk entries in C (StreamDelivery._deliver_span), falling back to
    one by one where C stops; and how many went through C."""
    cursor = store.cursor(0)
    out: list[bytes] = []
    tag = 1
    in_c = 0
    turn = 0
    while True:
        got = cursor.entries()
        if got is not None:
            buf, pos, end, left, ts, routing_key, decoder = got
            assert routing_key == ROUTING_KEY
            max_n = min(max_ns[turn % len(max_ns)], left)
            turn += 1
            rk = routing_key.encode()
            frames, n, nxt, sizes = _native.deliver_entries(
                buf, pos, end, max_n, cursor.offset, ts, decoder.layouts, decoder.learn,
                CHANNEL, HEAD, tag, frame_max, b"\x00" + bytes((len(rk),)) + rk, max_bytes,
            )  # fmt: skip
            assert n <= max_n and len(sizes) == 4 * n
            if n:
                out.append(frames)
                cursor.skip_entries(n, nxt)
                tag += n
                in_c += n
                continue
        item = cursor.next()
        if item is None:
            break
        msg = item[1]
        payload = HEAD + struct.pack(">QB", tag, 0) + msg.exchange_and_key()
        out.append(b"".join(message_frames(CHANNEL, payload, msg.properties, msg.body, frame_max)))
        tag += 1
    cursor.close()
    return b"".join(out), in_c


BODY_SIZES = st.sampled_from([0, 1, 16, 255, 256, 1000, 5000])


@st.composite
def messages(draw: Any) -> bytes:
    """An AMQP 1.0 message as a stream client publishes it: mostly a data
    section behind a few layouts (C's), sometimes another body, a footer or
    bytes that are no AMQP message (the Python path's)."""
    kind = draw(st.sampled_from(["simple"] * 6 + ["value", "two data", "footer", "raw"]))
    body = bytes(range(256)) * 20
    body = body[: draw(BODY_SIZES)]
    if kind == "raw":
        return b"\x01raw" + body
    header = draw(
        st.none()
        | st.builds(
            Header,
            durable=st.sampled_from([None, True, False]),
            priority=st.sampled_from([None, 0, 7]),
            ttl=st.sampled_from([None, 60000]),
        )
    )
    props = draw(
        st.none()
        | st.builds(
            Properties,
            message_id=st.sampled_from([None, "id-1", "id-2", 42, uuid.UUID(int=5)]),
            content_type=st.sampled_from([None, Symbol("text/plain")]),
            subject=st.sampled_from([None, "subj"]),
            group_id=st.sampled_from([None, "g"]),
        )
    )
    app = draw(
        st.none()
        | st.sampled_from(
            [
                {"k": "v"},
                {"n": 7, "f": 1.5},
                {"x-stream-offset": 99},
                {"x-stream-timestamp": "t", "a": True},
            ]
        ).map(lambda c: ApplicationProperties(dict(c)))
    )
    annotations = draw(
        st.none()
        | st.sampled_from([{Symbol("x-opt-a"): "b"}, {Symbol("x-cc"): ["q1"]}]).map(
            lambda c: MessageAnnotations(dict(c))
        )
    )
    delivery = draw(st.none() | st.just(DeliveryAnnotations({Symbol("x-d"): 1})))
    sections: list[Any] = [Data(body)]
    footer = None
    if kind == "value":
        sections = [AmqpValue("v:" + body[:10].hex())]
    elif kind == "two data":
        sections = [Data(body), Data(b"more")]
    elif kind == "footer":
        footer = Footer({Symbol("x-f"): 1})
    msg = AmqpMessage(
        header=header,
        delivery_annotations=delivery,
        message_annotations=annotations,
        properties=props,
        application_properties=app,
        body=sections,
        footer=footer,
    )
    return encode_message(msg)


@needs_c
@settings(
    max_examples=examples(150),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    chunks=st.lists(st.lists(messages(), min_size=1, max_size=12), min_size=1, max_size=4),
    max_ns=st.lists(st.integers(1, 20), min_size=1, max_size=3),
    frame_max=st.sampled_from([4096, 131072]),
    max_bytes=st.sampled_from([0, 1, 600, 1 << 21]),
)
def test_c_frames_chunk_entries_as_the_python_path(
    tmp_path_factory: pytest.TempPathFactory,
    chunks: list[list[bytes]],
    max_ns: list[int],
    frame_max: int,
    max_bytes: int,
) -> None:
    store = store_of(tmp_path_factory.mktemp("s"), chunks)
    try:
        want = one_by_one(store, frame_max)
        got, _in_c = in_spans(store, frame_max, max_ns, max_bytes)
        assert got == want
    finally:
        store.close()


@needs_c
def test_simple_messages_all_go_through_c_one_mapping_per_layout(tmp_path: Path) -> None:
    """perf stream's messages (a data section alone) and a client's with a
    header and properties: every one framed in C, the mapping run once per
    layout."""
    plain = encode_message(AmqpMessage(body=[Data(b"x" * 16)]))
    rich = encode_message(
        AmqpMessage(
            header=Header(durable=True),
            properties=Properties(message_id="m", content_type=Symbol("text/plain")),
            application_properties=ApplicationProperties({"k": "v"}),
            body=[Data(b"y" * 300)],
        )
    )
    store = store_of(tmp_path, [[plain] * 50, [rich, plain] * 40])
    try:
        got, in_c = in_spans(store, 131072, [1000], 0)
        assert in_c == 130
        assert got == one_by_one(store, 131072)
        assert len(store.decoder.layouts) == 2
    finally:
        store.close()


def test_learn_keeps_a_bounded_cache_and_refuses_what_it_cannot_stamp() -> None:
    decoder = amqp_decoder()
    plain = encode_message(AmqpMessage(body=[Data(b"abc")]))
    layout = decoder.learn(b"", plain)
    assert layout is not None and decoder.layouts == {b"": layout}
    props, offset_at, ts_at = layout
    assert props[offset_at : offset_at + 8] == bytes(8) == props[ts_at : ts_at + 8]
    # The mapping's body is not the data section (not an AMQP message): None, cached.
    assert decoder.learn(b"\x00Sp", b"\x00Sp\xa0\x01z") is None
    assert decoder.layouts[b"\x00Sp"] is None
    # Full: nothing more is learned (those messages go one by one).
    decoder.layouts.update((bytes([i % 256, i // 256]), None) for i in range(MAX_LAYOUTS))
    before = len(decoder.layouts)
    head = encode_message(AmqpMessage(header=Header(durable=True), body=[Data(b"abc")]))
    assert decoder.learn(head[:-8], head) is None
    assert len(decoder.layouts) == before
    # A new mapping forgets the layouts of the old one.
    decoder.decode = AMQP1StreamMessages().to_core
    assert decoder.layouts == {}


@needs_c
def test_deliver_entries_bounds_and_a_failing_learn() -> None:
    msg = encode_message(AmqpMessage(body=[Data(b"abc")]))
    buf = entries(msg, msg)
    layout = amqp_decoder().learn(b"", msg)
    args = (CHANNEL, HEAD, 1, 4096, ex_rk())

    def frame(pos: int, end: int, max_n: int, layouts: Any, learn: Any) -> Any:
        return _native.deliver_entries(buf, pos, end, max_n, 5, 7, layouts, learn, *args)

    def refuse(prefix: bytes, entry: bytes) -> None:
        raise RuntimeError("no")

    assert frame(0, len(buf), 10**9, {b"": layout}, refuse)[1:3] == (2, len(buf))
    assert frame(0, len(buf) - 1, 5, {b"": layout}, refuse)[1:3] == (1, len(buf) // 2)
    assert frame(len(buf), 0, 5, {b"": layout}, refuse)[1:3] == (0, len(buf))
    assert frame(0, 10**9, 5, {b"": None}, refuse)[1:3] == (0, 0)
    with pytest.raises(RuntimeError):
        frame(0, len(buf), 5, {}, refuse)
    with pytest.raises(TypeError):
        frame(0, len(buf), 5, {b"": (b"\x00\x00", 0)}, refuse)
    with pytest.raises(ValueError):
        frame(0, len(buf), 5, {b"": (b"\x00\x00", 0, 0)}, refuse)
    with pytest.raises(TypeError):
        frame(0, len(buf), 5, [], refuse)
