"""The stream protocol codec against random and mutated bytes, fed to the frame
reader in random pieces: nothing escapes but StreamProtocolError (the codec's
own refusal, with a response code), and what decodes encodes to the same
command. tests/fuzz_targets.py's stream targets are the same checks for
`make fuzz` (atheris) and tests/protocol/amqp/test_codec_fuzz.py."""

from __future__ import annotations

import contextlib

from fuzz_targets import stream_chunk_records, stream_frames
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from examples import examples
from warren.stream_protocol import commands as c
from warren.stream_protocol.chunk import build_chunk, simple_entry, sub_batch_entry
from warren.stream_protocol.constants import Compression, OffsetType, ResponseCode
from warren.stream_protocol.frames import FrameReader, decode_frame
from warren.stream_protocol.publish import Deliver, Publish, PublishedMessage
from warren.stream_protocol.wire import OffsetSpec, StreamProtocolError

N = examples(600)

_CHUNK = build_chunk(
    [simple_entry(b"hello"), sub_batch_entry([b"a", b"bc"], Compression.GZIP)],
    first_offset=3,
    timestamp=7,
).delivered()

VALID = [
    c.PeerProperties(1, {"product": "rstream"}).encode(),
    c.Subscribe(2, 1, "s", OffsetSpec(OffsetType.TIMESTAMP, -1), 9, {"filter.0": "x"}).encode(),
    c.CreateSuperStream(3, "ss", ["p0", "p1"], ["0", "1"], {"max-age": "1h"}).encode(),
    Publish.of(1, [PublishedMessage.simple(i, b"m%d" % i, "f") for i in range(4)]).encode(),
    Publish.of(1, [PublishedMessage(9, sub_batch_entry([b"q"] * 3, Compression.GZIP))]).encode(),
    Deliver(1, _CHUNK, 2).encode(),
    c.MetadataResponse(4, [], []).encode(),
]


@st.composite
def hostile(draw: st.DrawFn) -> bytes:
    if draw(st.booleans()):
        return draw(st.binary(max_size=300))
    data = bytearray(b"".join(draw(st.lists(st.sampled_from(VALID), min_size=1, max_size=3))))
    for _ in range(draw(st.integers(1, 6))):
        at = draw(st.integers(0, len(data) - 1))
        op = draw(st.sampled_from(("flip", "cut", "insert")))
        if op == "flip":
            data[at] = draw(st.integers(0, 255))
        elif op == "cut":
            del data[at:]
        else:
            data[at:at] = draw(st.binary(min_size=1, max_size=6))
        if not data:
            break
    return bytes(data)


SETTINGS = settings(
    max_examples=N,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@SETTINGS
@given(hostile(), st.lists(st.integers(1, 64), max_size=10))
def test_split_reads_refuse_only_with_a_code(data: bytes, pieces: list[int]) -> None:
    reader = FrameReader(frame_max=4096)
    pos = 0
    try:
        for size in [*pieces, len(data)]:
            for frame in reader.feed(data[pos : pos + size]):
                try:
                    command = decode_frame(frame)
                except StreamProtocolError as exc:
                    assert exc.code in set(ResponseCode)
                    continue
                assert decode_frame(command.encode()[4:]) == command
                if isinstance(command, Publish):
                    with contextlib.suppress(StreamProtocolError):
                        command.scan()
            pos += size
    except StreamProtocolError as exc:
        assert exc.code in (ResponseCode.FRAME_TOO_LARGE, ResponseCode.UNKNOWN_FRAME)


@SETTINGS
@given(hostile())
def test_fuzz_targets_take_anything(data: bytes) -> None:
    stream_frames(data)
    stream_chunk_records(data[4 + 4 + 1 + 8 :] if len(data) > 17 else data)
