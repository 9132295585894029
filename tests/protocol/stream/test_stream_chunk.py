"""osiris's chunk format against rstream's chunk reading (its Deliver checks
the data length and CRC-32 and unpacks simple entries and sub-entry batches
with its own none and gzip codecs), and rstream's sub-entry batches read by ours."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rstream import encoding
from rstream.compression import GzipCompressionCodec, NoneCompressionCodec

from examples import examples
from warren.stream_protocol.chunk import (
    CHUNK_HEADER_SIZE,
    MAGIC_VERSION,
    ChunkHeader,
    build_chunk,
    decode_delivered_chunk,
    read_records,
    simple_entry,
    sub_batch_entry,
)
from warren.stream_protocol.constants import Compression
from warren.stream_protocol.frames import decode_frame
from warren.stream_protocol.publish import Deliver
from warren.stream_protocol.wire import StreamProtocolError

N = examples(150)

records = st.lists(st.binary(max_size=48), min_size=1, max_size=6)
#: An entry: a simple record, or a batch of records (uncompressed or gzip).
entries = st.one_of(
    st.binary(max_size=48).map(lambda r: ("simple", [r])),
    st.tuples(st.sampled_from([Compression.NONE, Compression.GZIP]), records),
)


def _entry(kind: object, recs: list[bytes]) -> bytes:
    if kind == "simple":
        return simple_entry(recs[0])
    assert isinstance(kind, Compression)
    return sub_batch_entry(recs, kind)


@settings(max_examples=N, deadline=None)
@given(
    st.lists(entries, min_size=1, max_size=8),
    st.integers(0, 2**63),
    st.integers(0, 2**62),
    st.integers(0, 255),
    st.booleans(),
)
def test_rstream_reads_our_chunks(
    spec: list[tuple[object, list[bytes]]], first: int, ts: int, sub: int, v2: bool
) -> None:
    chunk = build_chunk(
        [_entry(k, r) for k, r in spec], first_offset=first, timestamp=ts, bloom=b"\x01" * 16
    )
    want = [rec for _, recs in spec for rec in recs]
    frame = Deliver(sub, chunk.delivered(), 99 if v2 else None).encode()
    ours = decode_frame(frame[4:])
    assert isinstance(ours, Deliver)
    header, data, located = decode_delivered_chunk(ours.chunk)
    assert header == chunk.header and header.bloom_size == 16
    assert [r for e in located for r in read_records(data, e)] == want
    if v2:
        assert ours.committed_offset == 99
        return  # rstream reads Deliver v1 only
    theirs = encoding.decode_frame(frame[4:])  # checks length and CRC itself
    assert theirs.subscription_id == sub
    assert theirs.chunk_first_offset == first
    assert theirs.timestamp == ts
    assert theirs.num_entries == len(spec)
    assert theirs.num_records == len(want)
    assert theirs.magic_version == MAGIC_VERSION
    assert theirs.get_messages() == want


@settings(max_examples=N, deadline=None)
@given(records, st.booleans())
def test_we_read_rstreams_sub_entry_batches(recs: list[bytes], gzip: bool) -> None:
    codec = GzipCompressionCodec() if gzip else NoneCompressionCodec()
    codec.compress(recs)
    entry = (
        bytes([0x80 | codec.compression_type() << 4])
        + codec.messages_count().to_bytes(2, "big")
        + codec.uncompressed_size().to_bytes(4, "big")
        + codec.compressed_size().to_bytes(4, "big")
        + codec.data()
    )
    chunk = build_chunk([entry], first_offset=0, timestamp=0)
    _, data, located = decode_delivered_chunk(chunk.delivered())
    assert read_records(data, located[0]) == recs


def test_header_layout() -> None:
    h = ChunkHeader(0, 2, 3, -1, 7, 100, 0xDEADBEEF, 10, 4, 16)
    raw = h.pack()
    assert len(raw) == CHUNK_HEADER_SIZE
    assert raw[0] == 0x50 and raw[1] == 0
    assert raw[2:4] == b"\0\x02" and raw[-4:] == b"\x10\0\0\0"
    assert ChunkHeader.unpack(raw) == h


def test_crc_covers_the_data_only() -> None:
    chunk = build_chunk([simple_entry(b"abc")], first_offset=0, timestamp=0, trailer=b"t" * 9)
    assert chunk.header.crc == zlib.crc32(simple_entry(b"abc"))
    assert chunk.header.trailer_length == 9
    assert len(chunk.stored()) == CHUNK_HEADER_SIZE + 7 + 9
    bad = bytearray(chunk.delivered())
    bad[-1] ^= 1
    with pytest.raises(StreamProtocolError, match="CRC"):
        decode_delivered_chunk(bytes(bad))


@pytest.mark.parametrize(
    "mutate",
    [
        lambda b: b[:20],  # short header
        lambda b: b"\x60" + b[1:],  # wrong magic
        lambda b: b + b"x",  # data longer than the header says
    ],
)
def test_bad_chunks_are_refused(mutate: object) -> None:
    raw = build_chunk([simple_entry(b"abc")], first_offset=0, timestamp=0).delivered()
    with pytest.raises(StreamProtocolError):
        decode_delivered_chunk(mutate(raw))  # type: ignore[operator]


def test_gzip_bomb_is_refused_before_inflating() -> None:
    entry = sub_batch_entry([b"\0" * 1000], Compression.GZIP)
    _, data, located = decode_delivered_chunk(
        build_chunk([entry], first_offset=0, timestamp=0).delivered()
    )
    with pytest.raises(StreamProtocolError):
        read_records(data, located[0], max_uncompressed=100)
    lying = bytearray(entry)
    lying[3:7] = (10).to_bytes(4, "big")  # says it inflates to 10 bytes
    chunk = build_chunk([bytes(lying)], first_offset=0, timestamp=0)
    _, data, located = decode_delivered_chunk(chunk.delivered())
    with pytest.raises(StreamProtocolError):
        read_records(data, located[0])
