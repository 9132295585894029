"""What rstream cannot check: the commands it lacks, written out as RabbitMQ's
rabbit_stream_core lays them out; RabbitMQ's optional trailing fields; the
frame reader over bytes split anywhere and its refusals; and every command
round-tripping through our own codec with any Unicode."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from examples import examples
from warren.stream_protocol import commands as c
from warren.stream_protocol.chunk import sub_batch_entry
from warren.stream_protocol.constants import Compression, OffsetType, ResponseCode
from warren.stream_protocol.frames import FrameReader, decode_frame
from warren.stream_protocol.publish import Deliver, Publish, PublishedMessage, deliver_prefix
from warren.stream_protocol.wire import OffsetSpec, StreamProtocolError

N = examples(200)


def s(text: str) -> bytes:
    data = text.encode()
    return struct.pack(">H", len(data)) + data


def frame(key: int, body: bytes, version: int = 1) -> bytes:
    return struct.pack(">IHH", len(body) + 4, key, version) + body


@pytest.mark.parametrize(
    ("command", "wire"),
    [
        (c.StreamStats(9, "s1"), frame(0x1C, b"\0\0\0\x09" + s("s1"))),
        (
            c.StreamStatsResponse(9, 1, {"first_chunk_id": 0, "committed_chunk_id": -1}),
            frame(
                0x801C,
                b"\0\0\0\x09\0\x01\0\0\0\x02"
                + s("first_chunk_id")
                + struct.pack(">q", 0)
                + s("committed_chunk_id")
                + struct.pack(">q", -1),
            ),
        ),
        (
            c.ResolveOffsetSpec(4, "s", OffsetSpec(OffsetType.TIMESTAMP, -5)),
            frame(0x1F, b"\0\0\0\x04" + s("s") + b"\0\x05" + struct.pack(">q", -5)),
        ),
        (
            c.ResolveOffsetSpec(4, "s", OffsetSpec(OffsetType.FIRST), {"filter.0": "a"}),
            frame(0x1F, b"\0\0\0\x04" + s("s") + b"\0\x01\0\0\0\x01" + s("filter.0") + s("a")),
        ),
        (
            c.ResolveOffsetSpecResponse(4, 1, 4, 77),
            frame(0x801F, b"\0\0\0\x04\0\x01\0\x04" + struct.pack(">Q", 77)),
        ),
        # RabbitMQ leaves an empty property map out of Subscribe and Open's response.
        (
            c.Subscribe(1, 2, "s", OffsetSpec(OffsetType.NEXT), 10),
            frame(0x07, b"\0\0\0\x01\x02" + s("s") + b"\0\x03\0\x0a"),
        ),
        (c.OpenResponse(3), frame(0x8015, b"\0\0\0\x03\0\x01")),
        (
            c.OpenResponse(3, 1, {"advertised_host": "h"}),
            frame(0x8015, b"\0\0\0\x03\0\x01\0\0\0\x01" + s("advertised_host") + s("h")),
        ),
        (c.SaslAuthenticateResponse(5, 1), frame(0x8013, b"\0\0\0\x05\0\x01")),
        (
            c.SaslAuthenticateResponse(5, 0x0A, b"chal"),
            frame(0x8013, b"\0\0\0\x05\0\x0a\0\0\0\x04chal"),
        ),
        (
            c.ConsumerUpdateResponse(6, 1, OffsetSpec(OffsetType.NONE)),
            frame(0x801A, b"\0\0\0\x06\0\x01\0\x00"),
        ),
        (c.CreditResponse(0x04, 7), frame(0x8009, b"\0\x04\x07")),
        (c.Heartbeat(), frame(0x17, b"")),
        (
            Deliver(3, b"chunk", committed_offset=42),
            frame(0x08, b"\x03" + struct.pack(">Q", 42) + b"chunk", version=2),
        ),
        (Deliver(3, b"chunk"), frame(0x08, b"\x03chunk")),
    ],
    ids=lambda v: type(v).__name__ if not isinstance(v, bytes) else "",
)
def test_rabbitmq_layout(command: c.Command, wire: bytes) -> None:
    assert command.encode() == wire
    assert decode_frame(wire[4:]) == command


def test_sasl_authenticate_null_data_reads_as_empty() -> None:
    """RabbitMQ writes an empty SASL response as length -1."""
    wire = frame(0x13, b"\0\0\0\x01" + s("PLAIN") + b"\xff\xff\xff\xff")
    assert decode_frame(wire[4:]) == c.SaslAuthenticate(1, "PLAIN", b"")


def test_deliver_prefix_is_the_frame_before_the_chunk() -> None:
    chunk = b"x" * 100
    for committed in (None, 9):
        whole = Deliver(1, chunk, committed).encode()
        assert deliver_prefix(1, len(chunk), committed) + chunk == whole


def test_response_codes_match_the_protocol_table() -> None:
    assert ResponseCode.OK == 0x01
    assert ResponseCode.UNKNOWN_FRAME == 0x0D
    assert ResponseCode.FRAME_TOO_LARGE == 0x0E
    assert ResponseCode.NO_OFFSET == 0x13
    assert [int(code) for code in ResponseCode] == list(range(1, 0x16))


# --- refusals -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b"",  # no key
        b"\x00\x01",  # no version
        b"\x00\x63\x00\x01",  # unknown key
        b"\x00\x01\x00\x07\0\0\0\0\x01\0\0\0\0",  # unknown version
        b"\x00\x17\x00\x01\x00",  # a byte after a Heartbeat
        b"\x00\x15\x00\x01\0\0\0\x01\x00\x05ab",  # string longer than the frame
        b"\x00\x15\x00\x01\0\0\0\x01\x00\x02\xff\xfe",  # not UTF-8
        b"\x00\x07\x00\x01\0\0\0\x01\x02\x00\x01s\x00\x09\x00\x01",  # offset type 9
        b"\x00\x0f\x00\x01\0\0\0\x01\x7f\xff\xff\xff",  # 2^31 - 1 streams
        b"\x00\x1a\x00\x01\0\0\0\x01\x02\x07",  # active byte 7
    ],
)
def test_garbled_frames_are_refused_with_a_code(body: bytes) -> None:
    with pytest.raises(StreamProtocolError) as err:
        decode_frame(body)
    assert err.value.code in (ResponseCode.UNKNOWN_FRAME, ResponseCode.PRECONDITION_FAILED)


@pytest.mark.parametrize(
    "messages",
    [
        b"\0" * 8,  # a publishing id and no entry
        b"\0" * 8 + b"\0\0\0\x05abc",  # entry longer than the frame
        b"\0" * 8 + b"\0\0\0\x01a" + b"junk",  # bytes after the last message
    ],
)
def test_bad_publish_batches_are_refused_by_scan(messages: bytes) -> None:
    publish = decode_frame(frame(0x02, b"\x01\0\0\0\x01" + messages)[4:])
    assert isinstance(publish, Publish)
    with pytest.raises(StreamProtocolError):
        publish.scan()


def test_publish_count_larger_than_the_frame() -> None:
    publish = decode_frame(frame(0x02, b"\x01\xff\xff\xff\xff")[4:])
    assert isinstance(publish, Publish)
    with pytest.raises(StreamProtocolError):
        publish.scan()


@pytest.mark.parametrize("compression", [5, 6, 7])
def test_unknown_sub_entry_compression_is_refused(compression: int) -> None:
    batch = bytes([0x80 | compression << 4]) + b"\0\x01\0\0\0\x05\0\0\0\x01a"
    publish = decode_frame(frame(0x02, b"\x01\0\0\0\x01" + b"\0" * 8 + batch)[4:])
    assert isinstance(publish, Publish)
    with pytest.raises(StreamProtocolError) as err:
        publish.scan()
    assert err.value.code == ResponseCode.PRECONDITION_FAILED


def test_publish_v1_mixes_simple_entries_and_batches() -> None:
    messages = [
        PublishedMessage.simple(1, b"a"),
        PublishedMessage(2, sub_batch_entry([b"b", b"c", b"d"], Compression.GZIP)),
        PublishedMessage(3, sub_batch_entry([b"e"])),
        PublishedMessage.simple(4, b"f"),
    ]
    publish = decode_frame(Publish.of(7, messages).encode()[4:])
    assert isinstance(publish, Publish)
    entries = publish.scan()
    assert entries.publishing_ids == [1, 2, 3, 4]
    assert entries.records == 6
    assert publish.published() == messages


def test_sub_entry_batch_in_publish_v2_is_refused() -> None:
    body = (
        b"\x01\0\0\0\x01" + b"\0" * 8 + b"\xff\xff" + b"\x80\0\x01\0\0\0\x05\0\0\0\x05\0\0\0\x01a"
    )
    publish = decode_frame(frame(0x02, body, version=2)[4:])
    assert isinstance(publish, Publish)
    with pytest.raises(StreamProtocolError) as err:
        publish.scan()
    assert err.value.code == ResponseCode.PRECONDITION_FAILED


# --- the frame reader -----------------------------------------------------------------


def _stream() -> tuple[bytes, list[c.Command]]:
    commands: list[c.Command] = [
        c.PeerProperties(1, {"product": "x"}),
        c.SaslHandshake(2),
        c.SaslAuthenticate(3, "PLAIN", b"\0guest\0guest"),
        c.TuneResponse(1 << 20, 60),
        c.Open(4, "/"),
        c.Heartbeat(),
        Publish.of(1, [PublishedMessage.simple(i, b"m" * i) for i in range(20)]),
        c.Credit(1, 5),
    ]
    return b"".join(cmd.encode() for cmd in commands), commands


@settings(max_examples=N, deadline=None)
@given(st.data())
def test_reader_over_bytes_split_anywhere(data: st.DataObject) -> None:
    wire, want = _stream()
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=12)))
    reader = FrameReader(frame_max=4096)
    got: list[c.Command] = []
    for a, b in zip([0, *cuts], [*cuts, len(wire)], strict=True):
        got.extend(decode_frame(f) for f in reader.feed(wire[a:b]))
    assert got == want
    assert reader.buffered() == 0


def test_reader_refuses_an_oversized_frame_before_buffering_it() -> None:
    reader = FrameReader(frame_max=100)
    ok = c.Heartbeat().encode()
    frames = reader.feed(ok + struct.pack(">I", 101) + b"\x00\x17")
    assert [bytes(f) for f in frames] == [ok[4:]]  # the frame before it first
    with pytest.raises(StreamProtocolError) as err:
        reader.feed(b"more")
    assert err.value.code == ResponseCode.FRAME_TOO_LARGE
    assert reader.buffered() == 0


def test_reader_refuses_a_frame_too_short_for_its_key() -> None:
    with pytest.raises(StreamProtocolError) as err:
        FrameReader().feed(b"\0\0\0\x02\0\x17")
    assert err.value.code == ResponseCode.UNKNOWN_FRAME


def test_reader_refuses_a_frame_cut_short_by_the_peer() -> None:
    reader = FrameReader()
    wire = c.Open(1, "/").encode()
    assert reader.feed(wire[:-1]) == []
    assert reader.buffered() == len(wire) - 1
    with pytest.raises(StreamProtocolError) as err:
        reader.eof()
    assert err.value.code == ResponseCode.UNKNOWN_FRAME
    assert len(reader.feed(wire[-1:])) == 1
    reader.eof()  # nothing left over


def test_frame_max_zero_is_unlimited_and_can_be_raised_after_open() -> None:
    big = c.PeerProperties(1, {"k": "v" * 20000}).encode()
    reader = FrameReader(frame_max=8192)
    with pytest.raises(StreamProtocolError):
        reader.feed(big)
    reader = FrameReader(frame_max=8192)
    reader.frame_max = 0
    assert len(reader.feed(big)) == 1


# --- our own round trip, any text --------------------------------------------------------

text = st.text(max_size=30)
any_map = st.dictionaries(text, text, max_size=4)


@settings(max_examples=N, deadline=None)
@given(
    st.one_of(
        st.builds(c.DeclarePublisher, st.integers(0, 2**32 - 1), st.integers(0, 255), text, text),
        st.builds(c.Create, st.integers(0, 9), text, any_map),
        st.builds(
            c.CreateSuperStream, st.integers(0, 9), text, st.lists(text), st.lists(text), any_map
        ),
        st.builds(
            c.StreamStatsResponse,
            st.integers(0, 9),
            st.integers(0, 9),
            st.dictionaries(text, st.integers(-(2**63), 2**63 - 1), max_size=4),
        ),
        st.builds(c.Close, st.integers(0, 9), st.integers(0, 65535), text),
        st.builds(
            c.ResolveOffsetSpec,
            st.integers(0, 9),
            text,
            st.builds(OffsetSpec, st.just(OffsetType.OFFSET), st.integers(0, 2**64 - 1)),
            any_map,
        ),
        st.builds(
            c.SaslAuthenticateResponse, st.integers(0, 9), st.integers(0, 9), st.binary(max_size=9)
        ),
    )
)
def test_own_round_trip_with_any_text(command: c.Command) -> None:
    assert decode_frame(command.encode()[4:]) == command


def test_values_that_do_not_fit_are_refused_when_encoding() -> None:
    with pytest.raises(StreamProtocolError):
        c.DeclarePublisher(1, 256, "r", "s").encode()
    with pytest.raises(StreamProtocolError):
        c.Open(1, "x" * 40000).encode()
