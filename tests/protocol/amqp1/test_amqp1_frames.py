"""AMQP 1.0 framing (warren.amqp1.frames): the reader over bytes split anywhere,
its refusals, transfer splitting, and python-qpid-proton's engine
(proton.Transport) as the peer on the other side of the bytes."""

from __future__ import annotations

import proton
import pytest
from amqp1help import PAYLOAD, conversation, summary, transfer_payload
from hypothesis import given, settings
from hypothesis import strategies as st

from examples import examples
from warren.amqp1 import performatives as p
from warren.amqp1.codec import DecodeError, decode, encode
from warren.amqp1.frames import (
    AMQP_HEADER,
    HEARTBEAT,
    SASL_HEADER,
    TYPE_SASL,
    Frame,
    FrameError,
    FrameReader,
    TransferEncoder,
    decode_transfer,
    encode_frame,
    protocol_id,
    transfer_frames,
)
from warren.amqp1.types import Symbol


def test_whole_conversation_at_once() -> None:
    data, want = conversation()
    items = FrameReader(1024, expect_header=True).feed(data)
    assert summary(items) == want
    assert transfer_payload(items) == PAYLOAD
    transfers = [
        i.performative
        for i in items
        if isinstance(i, Frame) and isinstance(i.performative, p.Transfer)
    ]
    assert [t.more for t in transfers] == [True] * (len(transfers) - 1) + [False]


@settings(max_examples=examples(200), deadline=None)
@given(st.data())
def test_random_splits_give_the_same_frames(data: st.DataObject) -> None:
    raw, want = conversation()
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=40)))
    reader = FrameReader(1024, expect_header=True)
    items: list[Frame | bytes] = []
    start = 0
    for cut in [*cuts, len(raw)]:
        chunk = raw[start:cut]
        items += reader.feed(bytearray(chunk) if data.draw(st.booleans()) else chunk)
        start = cut
    assert summary(items) == want
    assert transfer_payload(items) == PAYLOAD


def test_byte_at_a_time() -> None:
    raw, want = conversation()
    reader = FrameReader(1024, expect_header=True)
    items: list[Frame | bytes] = []
    for i in range(len(raw)):
        items += reader.feed(raw[i : i + 1])
    assert summary(items) == want


def test_extended_header_is_skipped() -> None:
    body = encode_frame(3, p.End())[8:]
    raw = (12 + len(body)).to_bytes(4, "big") + b"\x03\x00\x00\x03" + b"ext!" + body
    [frame] = FrameReader(512).feed(raw)
    assert isinstance(frame, Frame)
    assert (frame.channel, frame.performative) == (3, p.End())


def test_header_after_sasl_even_unannounced() -> None:
    """A client may send the AMQP header right behind its last SASL frame."""
    reader = FrameReader(512, expect_header=True)
    outcome = encode_frame(0, p.SaslResponse(response=b"r"), type=TYPE_SASL)
    items = reader.feed(
        SASL_HEADER + outcome + AMQP_HEADER + encode_frame(0, p.Open(container_id="c"))
    )
    assert summary(items) == [SASL_HEADER, ("sasl", p.SaslResponse), AMQP_HEADER, (0, p.Open)]


def test_expect_header_later() -> None:
    reader = FrameReader(512)
    assert summary(reader.feed(HEARTBEAT)) == [(0, None)]
    reader.expect_header()
    assert reader.feed(AMQP_HEADER) == [AMQP_HEADER]


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b"\x00\x00\x00\x07\x02\x00\x00\x00", "below 8"),
        (b"\x00\x00\x00\x08\x01\x00\x00\x00", "data offset"),
        (b"\x00\x00\x00\x0c\x04\x00\x00\x00\x00\x00\x00\x00", "data offset"),
        (b"\x00\x00\x02\x01\x02\x00\x00\x00", "max frame size"),
        (b"\xff\xff\xff\xff\x02\x00\x00\x00", "max frame size"),
        (b"\x00\x00\x00\x08\x02\x02\x00\x00", "frame type"),
    ],
)
def test_bad_frame_headers_are_framing_errors_before_any_body(raw: bytes, why: str) -> None:
    with pytest.raises(FrameError, match=why) as caught:
        FrameReader(512).feed(raw)
    assert caught.value.condition == "amqp:connection:framing-error"
    assert isinstance(caught.value, DecodeError)


def test_max_frame_size_can_grow_after_open() -> None:
    big = encode_frame(0, p.Open(container_id="c" * 600))
    with pytest.raises(FrameError):
        FrameReader(512).feed(big)
    reader = FrameReader(512)
    reader.max_frame_size = 4096
    assert summary(reader.feed(big)) == [(0, p.Open)]


@pytest.mark.parametrize(
    "raw",
    [
        encode_frame(0, p.SaslInit(mechanism=Symbol("PLAIN"))),  # a SASL body in an AMQP frame
        encode_frame(0, p.Open(container_id="c"), type=TYPE_SASL),
        encode_frame(0, "just a string"),
        encode_frame(0, p.Accepted()),
        b"\x00\x00\x00\x0b\x02\x00\x00\x00\x00\x53\x10",  # a performative cut short by the frame
        b"\x00\x00\x00\x0a\x02\x00\x00\x00\xa1\x05"
        + b"abcde",  # a string running into the next frame
    ],
)
def test_bodies_that_are_not_performatives_are_decode_errors(raw: bytes) -> None:
    with pytest.raises(DecodeError):
        FrameReader(512).feed(raw)


def test_mandatory_field_missing_in_a_frame() -> None:
    raw = encode_frame(0, p.Transfer(handle=0))
    raw = raw[:8] + bytes.fromhex("005314") + b"\x45"  # transfer with an empty list
    raw = len(raw).to_bytes(4, "big") + raw[4:]
    with pytest.raises(DecodeError) as caught:
        FrameReader(512).feed(raw)
    assert caught.value.condition == "amqp:invalid-field"


def test_encode_frame_layout() -> None:
    assert encode_frame(0, None) == HEARTBEAT
    raw = encode_frame(5, p.End(), b"xy", type=TYPE_SASL)
    assert raw == b"\x00\x00\x00\x0e\x02\x01\x00\x05" + bytes.fromhex("00531745") + b"xy"


@pytest.mark.parametrize("size", [0, 1, 100, 489, 490, 491, 2000, 4096])
@pytest.mark.parametrize("max_frame_size", [512, 1000])
def test_transfer_frames_split_and_join(size: int, max_frame_size: int) -> None:
    payload = bytes(i % 251 for i in range(size))
    transfer = p.Transfer(handle=2, delivery_id=9, delivery_tag=b"tag", settled=True)
    frames = transfer_frames(4, transfer, payload, max_frame_size)
    assert all(len(raw) <= max_frame_size for raw in frames)
    assert all(len(raw) == max_frame_size for raw in frames[:-1])
    items = FrameReader(max_frame_size).feed(b"".join(frames))
    assert transfer_payload(items) == payload
    performatives = [i.performative for i in items if isinstance(i, Frame)]
    assert [t.more for t in performatives] == [True] * (len(frames) - 1) + [False]
    assert all((t.handle, t.delivery_id, t.delivery_tag) == (2, 9, b"tag") for t in performatives)
    assert {i.channel for i in items if isinstance(i, Frame)} == {4}


def test_transfer_frames_need_room_for_payload() -> None:
    with pytest.raises(ValueError):
        transfer_frames(0, p.Transfer(handle=0, delivery_tag=b"t" * 100), b"x" * 1000, 100)


_UINTS = st.sampled_from([0, 1, 255, 256, 65535, 2**32 - 1]) | st.integers(0, 2**32 - 1)


@settings(max_examples=examples(300), deadline=None)
@given(
    channel=st.sampled_from([0, 1, 65535]),
    handle=_UINTS,
    delivery_id=_UINTS,
    tag=st.binary(max_size=40),
    settled=st.booleans(),
    size=st.sampled_from([0, 16, 400, 470, 480, 1024]),
    max_frame_size=st.sampled_from([512, 1 << 20]),
)
def test_transfer_encoder_writes_what_transfer_frames_writes(
    channel: int,
    handle: int,
    delivery_id: int,
    tag: bytes,
    settled: bool,
    size: int,
    max_frame_size: int,
) -> None:
    """The per-link encoder's one frame is byte for byte the generic encoder's;
    None exactly when the generic one needs several frames."""
    payload = bytes(i % 251 for i in range(size))
    transfer = p.Transfer(
        handle=handle, delivery_id=delivery_id, delivery_tag=tag, message_format=0, settled=settled
    )
    want = transfer_frames(channel, transfer, payload, max_frame_size)
    got = TransferEncoder(channel, handle).frame(delivery_id, tag, settled, payload, max_frame_size)
    if got is None:
        assert len(want) > 1
    else:
        assert [got] == want


_TRANSFERS = st.builds(
    p.Transfer,
    handle=_UINTS,
    delivery_id=st.none() | _UINTS,
    delivery_tag=st.none() | st.binary(max_size=300),
    message_format=st.none() | _UINTS,
    settled=st.none() | st.booleans(),
    more=st.booleans(),
    rcv_settle_mode=st.none() | st.sampled_from([0, 1]),
    aborted=st.booleans(),
)


@settings(max_examples=examples(400), deadline=None)
@given(transfer=_TRANSFERS, data=st.data())
def test_decode_transfer_agrees_with_the_generic_decoder(
    transfer: p.Transfer, data: st.DataObject
) -> None:
    """The transfer fast path reads what the generic decoder reads, or leaves
    it (None), also for bytes damaged anywhere or cut short; the common shape
    (the first six fields, a short tag) is always read fast."""
    out = bytearray()
    encode(transfer, out)
    out += b"payload"
    raw = bytes(out)
    fast = decode_transfer(raw, 0, len(raw))
    common = (
        transfer.rcv_settle_mode is None
        and not transfer.aborted
        and len(transfer.delivery_tag or b"") < 200
    )
    if common:
        assert fast is not None
    if fast is not None:
        assert fast == (transfer, len(raw) - 7)
    damaged = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 3))):
        damaged[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    end = len(raw) - data.draw(st.sampled_from([0, 0, 1, 8]))
    fast = decode_transfer(bytes(damaged), 0, end)
    if fast is not None:
        assert decode(memoryview(bytes(damaged))[:end], 0) == fast


def test_proton_transfers_take_the_fast_path() -> None:
    """The transfers proton's engine sends (an independent encoder) are read by
    decode_transfer as the generic decoder reads them."""
    transport = proton.Transport()
    connection = proton.Connection()
    transport.bind(connection)
    connection.open()
    session = connection.session()
    session.open()
    sender = session.sender("out")
    sender.target.address = "/queues/q"
    sender.open()
    raw = _drain(transport)
    transport.push(
        AMQP_HEADER
        + encode_frame(0, p.Open(container_id="warren", max_frame_size=65536))
        + encode_frame(
            0,
            p.Begin(remote_channel=0, next_outgoing_id=0, incoming_window=100, outgoing_window=100),
        )
        + encode_frame(
            0,
            p.Attach(name="out", handle=0, role=p.RECEIVER, target=p.Target(address="/queues/q")),
        )
        + encode_frame(
            0,
            p.Flow(
                incoming_window=100,
                next_outgoing_id=0,
                outgoing_window=100,
                handle=0,
                delivery_count=0,
                link_credit=10,
            ),
        )
    )
    for i in range(3):
        delivery = sender.delivery(b"tag-%d" % i)
        sender.send(proton.Message(body=f"m{i}").encode())
        if i == 1:
            delivery.settle()
        sender.advance()
    raw += _drain(transport)
    assert raw[:8] == AMQP_HEADER
    read = []
    pos = 8
    while pos < len(raw):
        size, doff = int.from_bytes(raw[pos : pos + 4], "big"), raw[pos + 4]
        body = pos + doff * 4
        if raw[body : body + 3] == bytes.fromhex("005314"):
            fast = decode_transfer(raw, body, pos + size)
            assert fast is not None
            assert fast == decode(memoryview(raw)[: pos + size], body)
            read.append(fast[0])
        pos += size
    assert [t.delivery_tag for t in read] == [b"tag-0", b"tag-1", b"tag-2"]
    assert [bool(t.settled) for t in read] == [False, True, False]


def test_protocol_id() -> None:
    assert protocol_id(AMQP_HEADER) == 0
    assert protocol_id(SASL_HEADER) == 3
    assert protocol_id(b"AMQP\x00\x00\x09\x01") is None
    assert protocol_id(b"MQTT\x00\x01\x00\x00") is None


def _drain(transport: proton.Transport) -> bytes:
    out = b""
    while (n := transport.pending()) > 0:
        out += transport.peek(n)
        transport.pop(n)
    return out


def test_proton_engine_as_a_client() -> None:
    """proton's own frames read by ours, and ours driving proton's connection
    through open, begin, attach, flow and a message split in several transfers."""
    transport = proton.Transport()
    connection = proton.Connection()
    connection.container = "proton-client"
    transport.bind(connection)
    connection.open()
    session = connection.session()
    session.open()
    sender = session.sender("link-1")
    sender.target.address = "/queues/q"
    sender.open()
    reader = FrameReader(512, expect_header=True)
    items = reader.feed(_drain(transport))
    assert summary(items) == [AMQP_HEADER, (0, p.Open), (0, p.Begin), (0, p.Attach)]
    opened, attach = items[1].performative, items[3].performative  # type: ignore[union-attr]
    assert opened.container_id == "proton-client"
    assert (attach.name, attach.role, attach.target.address) == ("link-1", p.SENDER, "/queues/q")

    reply = (
        AMQP_HEADER
        + encode_frame(0, p.Open(container_id="warren", max_frame_size=512))
        + encode_frame(
            0,
            p.Begin(remote_channel=0, next_outgoing_id=0, incoming_window=100, outgoing_window=100),
        )
        + encode_frame(
            0,
            p.Attach(
                name="link-1",
                handle=0,
                role=p.RECEIVER,
                source=p.Source(),
                target=p.Target(address="/queues/q"),
            ),
        )
        + encode_frame(
            0,
            p.Flow(
                next_incoming_id=0,
                incoming_window=100,
                next_outgoing_id=0,
                outgoing_window=100,
                handle=0,
                delivery_count=0,
                link_credit=5,
            ),
        )
    )
    transport.push(reply)
    assert transport.condition is None
    assert connection.remote_container == "warren"
    assert sender.credit == 5

    message = proton.Message(body="x" * 1500, subject="s")
    sender.delivery(b"d1")
    sender.send(message.encode())
    sender.advance()
    items = reader.feed(_drain(transport))
    transfers = [
        i for i in items if isinstance(i, Frame) and isinstance(i.performative, p.Transfer)
    ]
    assert len(transfers) > 2
    assert [t.performative.more for t in transfers] == [True] * (len(transfers) - 1) + [False]
    assert transfers[0].performative.delivery_tag == b"d1"
    got = proton.Message()
    got.decode(transfer_payload(items))
    assert (got.body, got.subject) == ("x" * 1500, "s")


def test_proton_engine_reads_our_split_transfers() -> None:
    """A proton receiver gets a message we split with transfer_frames."""
    transport = proton.Transport()
    connection = proton.Connection()
    transport.bind(connection)
    connection.open()
    session = connection.session()
    session.open()
    receiver = session.receiver("in")
    receiver.source.address = "/queues/q"
    receiver.open()
    receiver.flow(3)
    reader = FrameReader(512, expect_header=True)
    reader.feed(_drain(transport))
    body = proton.Message(body=b"y" * 3000, id="m1").encode()
    transport.push(
        AMQP_HEADER
        + encode_frame(0, p.Open(container_id="warren", max_frame_size=512))
        + encode_frame(
            0,
            p.Begin(remote_channel=0, next_outgoing_id=0, incoming_window=100, outgoing_window=100),
        )
        + encode_frame(
            0,
            p.Attach(
                name="in",
                handle=0,
                role=p.SENDER,
                source=p.Source(address="/queues/q"),
                target=p.Target(),
                initial_delivery_count=0,
            ),
        )
        + b"".join(
            transfer_frames(
                0,
                p.Transfer(handle=0, delivery_id=0, delivery_tag=b"t0", message_format=0),
                body,
                512,
            )
        )
    )
    assert transport.condition is None
    delivery = receiver.current
    assert delivery is not None and not delivery.partial
    got = proton.Message()
    got.decode(receiver.recv(delivery.pending))
    assert (got.body, got.id) == (b"y" * 3000, "m1")


def test_proton_sasl_client() -> None:
    """proton's SASL PLAIN exchange read by ours; after our outcome it sends the
    AMQP header and its open together, unannounced to the reader."""
    transport = proton.Transport()
    connection = proton.Connection()
    connection.container = "sasl-client"
    connection.user = "guest"
    connection.password = "secret"
    sasl = transport.sasl()
    sasl.allowed_mechs("PLAIN")
    sasl.allow_insecure_mechs = True
    transport.bind(connection)
    connection.open()
    reader = FrameReader(512, expect_header=True)
    assert reader.feed(_drain(transport)) == [SASL_HEADER]
    mechanisms = p.SaslMechanisms(sasl_server_mechanisms=("PLAIN", "ANONYMOUS"))
    transport.push(SASL_HEADER + encode_frame(0, mechanisms, type=TYPE_SASL))
    [init] = reader.feed(_drain(transport))
    assert isinstance(init, Frame) and init.type == TYPE_SASL
    assert init.performative == p.SaslInit(
        mechanism=Symbol("PLAIN"), initial_response=b"\0guest\0secret"
    )
    transport.push(encode_frame(0, p.SaslOutcome(code=p.SASL_OK), type=TYPE_SASL))
    assert sasl.outcome == proton.SASL.OK
    items = reader.feed(_drain(transport))
    assert summary(items) == [AMQP_HEADER, (0, p.Open)]
    assert items[1].performative.container_id == "sasl-client"  # type: ignore[union-attr]
