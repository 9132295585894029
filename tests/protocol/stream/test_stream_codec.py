"""Every stream protocol command against rstream's own encoder and decoder
(rstream/encoding.py and schema.py, an independent implementation): ours ->
rstream's decoder, rstream's encoder -> ours, and ours round-tripping alone.

rstream's quirks bound what the oracle can check: it writes a response's key
without the response bit (set here), a string's length
in characters (so its strings here are ASCII), its Tune fields are int32, its
decoder reads no offset value in Subscribe (those frames are compared byte
for byte with rstream's encoder instead), it writes no filter-value field in a
Publish v2 message without one, and it has no StreamStats, ResolveOffsetSpec
or challenge in SaslAuthenticate's response (checked against RabbitMQ's layout
by hand in test_stream_layouts.py)."""

from __future__ import annotations

import string
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rstream import encoding, schema
from rstream.constants import OffsetType as ROffsetType

from examples import examples
from warren.stream_protocol import commands as c
from warren.stream_protocol.chunk import simple_entry
from warren.stream_protocol.constants import Key, OffsetType
from warren.stream_protocol.frames import decode_frame
from warren.stream_protocol.publish import Publish, PublishedMessage
from warren.stream_protocol.wire import (
    Broker,
    CommandVersion,
    OffsetSpec,
    PublishingError,
    StreamMetadata,
)

N = examples(150)

u8 = st.integers(0, 0xFF)
u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFF_FFFF)
u64 = st.integers(0, (1 << 64) - 1)
i31 = st.integers(0, (1 << 31) - 1)
i64 = st.integers(-(1 << 63), (1 << 63) - 1)
ascii_ = st.text(alphabet=string.printable, max_size=40)
strmap = st.dictionaries(ascii_, ascii_, max_size=5)


def _props(d: dict[str, str]) -> list[schema.Property]:
    return [schema.Property(k, v) for k, v in d.items()]


def _rstream_frame(ours: Any, theirs: schema.Frame) -> bytes:
    """rstream's encoder writes a response's key without the response bit (as
    a client it sends no responses but ConsumerUpdate's): set it."""
    frame = bytearray(encoding.encode_frame(theirs))
    if ours.RESPONSE:
        frame[4] |= 0x80
    return bytes(frame)


def _body(frame: bytes) -> bytes:
    assert int.from_bytes(frame[:4], "big") == len(frame) - 4
    return frame[4:]


# Each case: a strategy of our command, and the rstream frame it must equal.
CASES: dict[str, tuple[st.SearchStrategy[Any], Callable[[Any], schema.Frame]]] = {
    "DeclarePublisher": (
        st.builds(c.DeclarePublisher, u32, u8, ascii_, ascii_),
        lambda o: schema.DeclarePublisher(o.correlation_id, o.publisher_id, o.reference, o.stream),
    ),
    "DeclarePublisherResponse": (
        st.builds(c.DeclarePublisherResponse, u32, u16),
        lambda o: schema.DeclarePublisherResponse(o.correlation_id, o.code),
    ),
    "PublishConfirm": (
        st.builds(c.PublishConfirm, u8, st.lists(u64, max_size=20)),
        lambda o: schema.PublishConfirm(o.publisher_id, o.publishing_ids),
    ),
    "PublishError": (
        st.builds(c.PublishError, u8, st.lists(st.builds(PublishingError, u64, u16), max_size=9)),
        lambda o: schema.PublishError(
            o.publisher_id, [schema.PublishingError(e.publishing_id, e.code) for e in o.errors]
        ),
    ),
    "QueryPublisherSequence": (
        st.builds(c.QueryPublisherSequence, u32, ascii_, ascii_),
        lambda o: schema.QueryPublisherSequence(o.correlation_id, o.reference, o.stream),
    ),
    "QueryPublisherSequenceResponse": (
        st.builds(c.QueryPublisherSequenceResponse, u32, u16, u64),
        lambda o: schema.QueryPublisherSequenceResponse(o.correlation_id, o.code, o.sequence),
    ),
    "DeletePublisher": (
        st.builds(c.DeletePublisher, u32, u8),
        lambda o: schema.DeletePublisher(o.correlation_id, o.publisher_id),
    ),
    "DeletePublisherResponse": (
        st.builds(c.DeletePublisherResponse, u32, u16),
        lambda o: schema.DeletePublisherResponse(o.correlation_id, o.code),
    ),
    "Subscribe": (
        st.builds(
            c.Subscribe,
            u32,
            u8,
            ascii_,
            st.sampled_from([OffsetType.FIRST, OffsetType.LAST, OffsetType.NEXT]).map(OffsetSpec),
            u16,
            strmap,
        ),
        lambda o: schema.Subscribe(
            o.correlation_id,
            o.subscription_id,
            o.stream,
            schema.OffsetSpec(o.offset.type),
            o.credit,
            _props(o.properties),
        ),
    ),
    "SubscribeResponse": (
        st.builds(c.SubscribeResponse, u32, u16),
        lambda o: schema.SubscribeResponse(o.correlation_id, o.code),
    ),
    "Credit": (
        st.builds(c.Credit, u8, u16),
        lambda o: schema.Credit(o.subscription_id, o.credit),
    ),
    "CreditResponse": (
        st.builds(c.CreditResponse, u16, u8),
        lambda o: schema.CreditResponse(o.code, o.subscription_id),
    ),
    "StoreOffset": (
        st.builds(c.StoreOffset, ascii_, ascii_, u64),
        lambda o: schema.StoreOffset(o.reference, o.stream, o.offset),
    ),
    "QueryOffset": (
        st.builds(c.QueryOffset, u32, ascii_, ascii_),
        lambda o: schema.QueryOffset(o.correlation_id, o.reference, o.stream),
    ),
    "QueryOffsetResponse": (
        st.builds(c.QueryOffsetResponse, u32, u16, u64),
        lambda o: schema.QueryOffsetResponse(o.correlation_id, o.code, o.offset),
    ),
    "Unsubscribe": (
        st.builds(c.Unsubscribe, u32, u8),
        lambda o: schema.Unsubscribe(o.correlation_id, o.subscription_id),
    ),
    "UnsubscribeResponse": (
        st.builds(c.UnsubscribeResponse, u32, u16),
        lambda o: schema.UnsubscribeResponse(o.correlation_id, o.code),
    ),
    "Create": (
        st.builds(c.Create, u32, ascii_, strmap),
        lambda o: schema.Create(o.correlation_id, o.stream, _props(o.arguments)),
    ),
    "CreateResponse": (
        st.builds(c.CreateResponse, u32, u16),
        lambda o: schema.CreateResponse(o.correlation_id, o.code),
    ),
    "Delete": (
        st.builds(c.Delete, u32, ascii_),
        lambda o: schema.Delete(o.correlation_id, o.stream),
    ),
    "DeleteResponse": (
        st.builds(c.DeleteResponse, u32, u16),
        lambda o: schema.DeleteResponse(o.correlation_id, o.code),
    ),
    "Metadata": (
        st.builds(c.Metadata, u32, st.lists(ascii_, max_size=6)),
        lambda o: schema.Metadata(o.correlation_id, o.streams),
    ),
    "MetadataResponse": (
        st.builds(
            c.MetadataResponse,
            u32,
            st.lists(st.builds(Broker, u16, ascii_, u32), max_size=4),
            st.lists(
                st.builds(StreamMetadata, ascii_, u16, u16, st.lists(u16, max_size=4).map(tuple)),
                max_size=4,
            ),
        ),
        lambda o: schema.MetadataResponse(
            o.correlation_id,
            [schema.Broker(b.reference, b.host, b.port) for b in o.brokers],
            [
                schema.StreamMetadata(s.stream, s.code, s.leader, list(s.replicas))
                for s in o.streams
            ],
        ),
    ),
    "MetadataUpdate": (
        st.builds(c.MetadataUpdate, u16, ascii_),
        lambda o: schema.MetadataUpdate(schema.MetadataInfo(o.code, o.stream)),
    ),
    "PeerProperties": (
        st.builds(c.PeerProperties, u32, strmap),
        lambda o: schema.PeerProperties(o.correlation_id, _props(o.properties)),
    ),
    "PeerPropertiesResponse": (
        st.builds(c.PeerPropertiesResponse, u32, u16, strmap),
        lambda o: schema.PeerPropertiesResponse(o.correlation_id, o.code, _props(o.properties)),
    ),
    "SaslHandshake": (
        st.builds(c.SaslHandshake, u32),
        lambda o: schema.SaslHandshake(o.correlation_id),
    ),
    "SaslHandshakeResponse": (
        st.builds(c.SaslHandshakeResponse, u32, u16, st.lists(ascii_, max_size=4)),
        lambda o: schema.SaslHandshakeResponse(o.correlation_id, o.code, o.mechanisms),
    ),
    "SaslAuthenticate": (
        st.builds(c.SaslAuthenticate, u32, ascii_, st.binary(max_size=64)),
        lambda o: schema.SaslAuthenticate(o.correlation_id, o.mechanism, o.data),
    ),
    "SaslAuthenticateResponse": (
        st.builds(c.SaslAuthenticateResponse, u32, u16),
        lambda o: schema.SaslAuthenticateResponse(o.correlation_id, o.code),
    ),
    "Tune": (
        st.builds(c.Tune, i31, i31),
        lambda o: schema.Tune(o.frame_max, o.heartbeat),
    ),
    "Open": (
        st.builds(c.Open, u32, ascii_),
        lambda o: schema.Open(o.correlation_id, o.virtual_host),
    ),
    "OpenResponse": (
        st.builds(c.OpenResponse, u32, u16, strmap),
        lambda o: schema.OpenResponse(o.correlation_id, o.code, _props(o.properties)),
    ),
    "Close": (
        st.builds(c.Close, u32, u16, ascii_),
        lambda o: schema.Close(o.correlation_id, o.code, o.reason),
    ),
    "CloseResponse": (
        st.builds(c.CloseResponse, u32, u16),
        lambda o: schema.CloseResponse(o.correlation_id, o.code),
    ),
    "Heartbeat": (st.just(c.Heartbeat()), lambda o: schema.Heartbeat()),
    "Route": (
        st.builds(c.Route, u32, ascii_, ascii_),
        lambda o: schema.SuperStreamRoute(o.correlation_id, o.routing_key, o.super_stream),
    ),
    "RouteResponse": (
        st.builds(c.RouteResponse, u32, u16, st.lists(ascii_, max_size=5)),
        lambda o: schema.SuperStreamRouteResponse(o.correlation_id, o.code, o.streams),
    ),
    "Partitions": (
        st.builds(c.Partitions, u32, ascii_),
        lambda o: schema.SuperStreamPartitions(o.correlation_id, o.super_stream),
    ),
    "PartitionsResponse": (
        st.builds(c.PartitionsResponse, u32, u16, st.lists(ascii_, max_size=5)),
        lambda o: schema.SuperStreamPartitionsResponse(o.correlation_id, o.code, o.streams),
    ),
    "ConsumerUpdate": (
        st.builds(c.ConsumerUpdate, u32, u8, st.booleans()),
        lambda o: schema.ConsumerUpdateResponse(o.correlation_id, o.subscription_id, int(o.active)),
    ),
    "ExchangeCommandVersions": (
        st.builds(
            c.ExchangeCommandVersions,
            u32,
            st.lists(st.builds(CommandVersion, u16, u16, u16), max_size=6),
        ),
        lambda o: schema.ExchangeCommandVersionRequest(
            o.correlation_id,
            [schema.FrameHandlerInfo(v.key, v.min_version, v.max_version) for v in o.versions],
        ),
    ),
    "ExchangeCommandVersionsResponse": (
        st.builds(
            c.ExchangeCommandVersionsResponse,
            u32,
            u16,
            st.lists(st.builds(CommandVersion, u16, u16, u16), max_size=6),
        ),
        lambda o: schema.ExchangeCommandVersionResponse(
            o.correlation_id,
            o.code,
            [schema.FrameHandlerInfo(v.key, v.min_version, v.max_version) for v in o.versions],
        ),
    ),
    "CreateSuperStream": (
        st.builds(
            c.CreateSuperStream,
            u32,
            ascii_,
            st.lists(ascii_, max_size=4),
            st.lists(ascii_, max_size=4),
            strmap,
        ),
        lambda o: schema.CreateSuperStream(
            o.correlation_id, o.name, o.partitions, o.binding_keys, _props(o.arguments)
        ),
    ),
    "CreateSuperStreamResponse": (
        st.builds(c.CreateSuperStreamResponse, u32, u16),
        lambda o: schema.CreateSuperStreamResponse(o.correlation_id, o.code),
    ),
    "DeleteSuperStream": (
        st.builds(c.DeleteSuperStream, u32, ascii_),
        lambda o: schema.DeleteSuperStream(o.correlation_id, o.name),
    ),
    "DeleteSuperStreamResponse": (
        st.builds(c.DeleteSuperStreamResponse, u32, u16),
        lambda o: schema.DeleteSuperStreamResponse(o.correlation_id, o.code),
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_ours_to_rstream_and_back(name: str) -> None:
    strategy, theirs = CASES[name]

    @settings(max_examples=N, deadline=None)
    @given(strategy)
    def run(ours: Any) -> None:
        frame = ours.encode()
        assert encoding.decode_frame(_body(frame)) == theirs(ours)
        from_theirs = _rstream_frame(ours, theirs(ours))
        assert decode_frame(_body(from_theirs)) == ours
        if not getattr(ours, "properties", True) and name in ("Subscribe", "OpenResponse"):
            return  # rstream writes the empty map's count, RabbitMQ leaves it out
        assert from_theirs == frame

    run()


def test_every_command_has_a_case() -> None:
    """All the protocol's commands are covered here or in test_stream_layouts.py."""
    covered = set(CASES) | {
        "Publish",
        "Deliver",
        "TuneResponse",
        "ConsumerUpdateResponse",
        "StreamStats",
        "StreamStatsResponse",
        "ResolveOffsetSpec",
        "ResolveOffsetSpecResponse",
    }
    assert {cls.__name__ for cls in c.COMMANDS.values()} == covered
    assert {k & 0x7FFF for k, _ in c.COMMANDS} == set(Key)


_OFFSETS = st.one_of(
    st.sampled_from([OffsetType.FIRST, OffsetType.LAST, OffsetType.NEXT]).map(OffsetSpec),
    st.builds(OffsetSpec, st.just(OffsetType.OFFSET), u64),
    st.builds(OffsetSpec, st.just(OffsetType.TIMESTAMP), i64),
)


def _rstream_offset(spec: OffsetSpec) -> schema.OffsetSpec:
    if spec.type in (OffsetType.OFFSET, OffsetType.TIMESTAMP):
        return schema.OffsetSpec.from_params(ROffsetType(spec.type), spec.value)
    return schema.OffsetSpec.from_params(ROffsetType(spec.type), None)


@settings(max_examples=N, deadline=None)
@given(st.builds(c.Subscribe, u32, u8, ascii_, _OFFSETS, u16, strmap.filter(bool)))
def test_subscribe_offsets_byte_for_byte(ours: c.Subscribe) -> None:
    theirs = schema.Subscribe(
        ours.correlation_id,
        ours.subscription_id,
        ours.stream,
        _rstream_offset(ours.offset),
        ours.credit,
        _props(ours.properties),
    )
    frame = encoding.encode_frame(theirs)
    assert frame == ours.encode()
    assert decode_frame(_body(frame)) == ours


@settings(max_examples=N, deadline=None)
@given(u32, u16, _OFFSETS)
def test_consumer_update_response_as_rstream_writes_it(
    corr: int, code: int, spec: OffsetSpec
) -> None:
    """rstream answers ConsumerUpdate (key 0x801a) with an 8-byte value after
    any offset type, as uint64; RabbitMQ ignores it where the type takes none."""
    theirs = schema.ConsumerUpdateServerResponse(
        corr, code, schema.OffsetSpecification(spec.type, spec.value & ((1 << 64) - 1))
    )
    frame = encoding.encode_frame(theirs)
    ours = c.ConsumerUpdateResponse(corr, code, spec)
    assert decode_frame(_body(frame)) == ours
    if spec.type in (OffsetType.OFFSET, OffsetType.TIMESTAMP):
        assert ours.encode() == frame
    else:
        assert ours.encode()[4:] == frame[4:-8]


@settings(max_examples=N, deadline=None)
@given(i31, i31)
def test_tune_response_is_tune_with_the_response_bit(frame_max: int, heartbeat: int) -> None:
    ours = c.TuneResponse(frame_max, heartbeat)
    theirs = _rstream_frame(ours, schema.Tune(frame_max, heartbeat))
    assert decode_frame(_body(theirs)) == ours
    assert ours.encode() == theirs


# --- Publish v1 and v2 --------------------------------------------------------------

_MESSAGES = st.lists(st.tuples(u64, st.binary(max_size=64)), max_size=12)


@settings(max_examples=N, deadline=None)
@given(u8, _MESSAGES)
def test_publish_v1_both_ways(publisher_id: int, messages: list[tuple[int, bytes]]) -> None:
    theirs = schema.Publish(publisher_id, [schema.Message(p, None, d) for p, d in messages])
    frame = encoding.encode_publish(theirs, 1)
    ours = Publish.of(publisher_id, [PublishedMessage.simple(p, d) for p, d in messages])
    assert ours.encode() == frame
    decoded = decode_frame(_body(frame))
    assert isinstance(decoded, Publish) and decoded.version == 1
    assert decoded.published() == [PublishedMessage.simple(p, d) for p, d in messages]
    assert encoding.decode_frame(_body(ours.encode()), 1) == theirs


@settings(max_examples=N, deadline=None)
@given(u8, st.lists(st.tuples(u64, ascii_, st.binary(max_size=64)), max_size=12))
def test_publish_v2_filter_values_both_ways(
    publisher_id: int, messages: list[tuple[int, str, bytes]]
) -> None:
    theirs = schema.Publish(publisher_id, [schema.Message(p, f, d) for p, f, d in messages])
    frame = encoding.encode_publish(theirs, 2)
    want = [PublishedMessage.simple(p, d, f) for p, f, d in messages]
    ours = Publish.of(publisher_id, want, v2=True)
    assert ours.encode() == frame
    decoded = decode_frame(_body(frame))
    assert isinstance(decoded, Publish) and decoded.version == 2
    assert decoded.published() == want
    entries = decoded.scan()
    assert entries.filter_values == [f for _, f, _ in messages]
    assert entries.records == len(messages)
    assert encoding.decode_frame(_body(ours.encode()), 2) == theirs


def test_publish_v2_without_a_filter_value_is_minus_one() -> None:
    """RabbitMQ reads a length of -1 as "no filter value" (rstream writes nothing there)."""
    ours = Publish.of(3, [PublishedMessage.simple(7, b"x"), PublishedMessage.simple(8, b"y", "f")])
    assert ours.version == 2
    body = _body(ours.encode())
    assert body[4 + 5 + 8 : 4 + 5 + 10] == b"\xff\xff"
    again = decode_frame(body)
    assert isinstance(again, Publish)
    assert again.scan().filter_values == [None, "f"]


@settings(max_examples=N, deadline=None)
@given(u8, u64, st.lists(st.binary(max_size=40), min_size=1, max_size=10), st.booleans())
def test_publish_sub_entry_batch_from_rstream(
    publisher_id: int, publishing_id: int, records: list[bytes], gzip: bool
) -> None:
    """A sub-entry batch as rstream's producer sends it (its compression codecs)."""
    from rstream.compression import GzipCompressionCodec, NoneCompressionCodec

    codec = GzipCompressionCodec() if gzip else NoneCompressionCodec()
    codec.compress(records)
    frame = encoding.encode_frame(
        schema.PublishSubBatching(
            publisher_id,
            1,
            publishing_id,
            0x80 | codec.compression_type() << 4,
            codec.messages_count(),
            codec.uncompressed_size(),
            codec.compressed_size(),
            codec.data(),
        )
    )
    decoded = decode_frame(_body(frame))
    assert isinstance(decoded, Publish) and decoded.count == 1
    entries = decoded.scan()
    assert entries.publishing_ids == [publishing_id]
    assert entries.records == len(records)
    from warren.stream_protocol.chunk import entry_at, read_records

    entry = entry_at(decoded.messages, entries.starts[0], entries.ends[0])
    assert read_records(decoded.messages, entry) == records


def test_publish_entries_are_offsets_into_the_frame() -> None:
    """The hot path: no object per message, the entries copied as they are."""
    bodies = [b"a", b"bb", b"ccc"]
    ours = Publish.of(1, [PublishedMessage.simple(10 + i, b) for i, b in enumerate(bodies)])
    decoded = decode_frame(_body(ours.encode()))
    assert isinstance(decoded, Publish)
    e = decoded.scan()
    buf = bytes(decoded.messages)
    assert [buf[s:t] for s, t in zip(e.starts, e.ends, strict=True)] == [
        simple_entry(b) for b in bodies
    ]
    assert e.publishing_ids == [10, 11, 12]
