"""The codecs against arbitrary and mutated bytes for a bounded time (tests/fuzz_targets.py;
`make fuzz` runs the same targets much longer under atheris)."""

from __future__ import annotations

import pytest
from fuzz_targets import TARGETS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from examples import examples
from warren.amqp import spec
from warren.amqp1 import performatives as a1
from warren.amqp1.codec import encode
from warren.amqp1.frames import AMQP_HEADER, encode_frame, transfer_frames
from warren.amqp1.types import Array, Described, Symbol, UInt
from warren.stream_protocol import chunk as stream_chunk
from warren.stream_protocol import commands as stream
from warren.stream_protocol.constants import OffsetType
from warren.stream_protocol.publish import Deliver as StreamDeliver
from warren.stream_protocol.publish import Publish as StreamPublish
from warren.stream_protocol.publish import PublishedMessage
from warren.stream_protocol.wire import OffsetSpec, StreamMetadata


def _a1(value: object) -> bytes:
    out = bytearray()
    encode(value, out)
    return bytes(out)


_A1_ATTACH = a1.Attach(
    name="l",
    handle=0,
    role=a1.RECEIVER,
    source=a1.Source(
        address="/queues/q",
        filter={"f": Described(Symbol("x:f"), "a")},
        outcomes=("amqp:accepted:list",),
    ),
    target=a1.Target(),
)

_STREAM_CHUNK = stream_chunk.build_chunk(
    [
        stream_chunk.simple_entry(b"abc"),
        stream_chunk.sub_batch_entry([b"x", b"yy"], stream_chunk.Compression.GZIP),
        stream_chunk.sub_batch_entry([b"z"]),
    ],
    first_offset=5,
    timestamp=1,
).delivered()

#: Seeds that reach deep: well-formed payloads the fuzzer mutates.
SEEDS = {
    "amqp-method": [
        spec.BasicPublish(exchange="x", routing_key="k").encode(),
        spec.QueueDeclare(queue="q", arguments={"x-max-length": 5, "x-args": [1, "a"]}).encode(),
        spec.ConnectionStartOk(client_properties={"product": "p"}, response=b"\x00a\x00b").encode(),
    ],
    "amqp-table": [b"\x00\x00\x00\x0b\x01aS\x00\x00\x00\x02hi"],
    "amqp-content-header": [b"\x00\x3c\x00\x00" + b"\x00" * 8 + b"\x90\x00\x0atext/plain\x02"],
    "amqp1-value": [
        _a1(_A1_ATTACH),
        _a1(
            a1.Disposition(
                role=True, first=0, state=a1.Rejected(a1.Error(Symbol("amqp:x"), "d", {"k": 1}))
            )
        ),
        _a1([None, True, UInt(7), 1.5, "s", b"b", {Symbol("k"): [1]}, Array(0xA3, (Symbol("a"),))]),
    ],
    "amqp1-frames": [
        AMQP_HEADER
        + encode_frame(0, a1.Open(container_id="c"))
        + encode_frame(0, a1.Begin(next_outgoing_id=0, incoming_window=9, outgoing_window=9))
        + encode_frame(0, _A1_ATTACH)
        + b"".join(
            transfer_frames(
                0, a1.Transfer(handle=0, delivery_id=0, delivery_tag=b"t"), b"m" * 40, 64
            )
        ),
    ],
    "stream-frames": [
        stream.PeerProperties(1, {"product": "p"}).encode()
        + stream.SaslAuthenticate(2, "PLAIN", b"\0g\0g").encode()
        + stream.Subscribe(3, 1, "s", OffsetSpec(OffsetType.OFFSET, 9), 10, {"f": "1"}).encode(),
        StreamPublish.of(
            1, [PublishedMessage.simple(1, b"a", "f"), PublishedMessage.simple(2, b"b")]
        ).encode()
        + StreamPublish.of(
            1,
            [
                PublishedMessage(
                    3, stream_chunk.sub_batch_entry([b"c"], stream_chunk.Compression.GZIP)
                )
            ],
        ).encode(),
        StreamDeliver(1, _STREAM_CHUNK, 4).encode()
        + stream.MetadataResponse(1, [], [StreamMetadata("s", 1, 0, (1, 2))]).encode(),
    ],
    "stream-chunk": [_STREAM_CHUNK],
    "mqtt": [
        b"\x10\x10\x00\x04MQTT\x05\x02\x00\x3c\x00\x00\x03abc",
        b"\x30\x07\x00\x01a\x00hey",
    ],
}


@st.composite
def mutated(draw: st.DrawFn, target: str) -> bytes:
    """A seed with bytes flipped, cut or inserted, or plain random bytes."""
    if draw(st.booleans()):
        return draw(st.binary(max_size=512))
    data = bytearray(draw(st.sampled_from(SEEDS[target])))
    for _ in range(draw(st.integers(1, 8))):
        if not data:
            break
        at = draw(st.integers(0, len(data) - 1))
        op = draw(st.sampled_from(("flip", "cut", "insert")))
        if op == "flip":
            data[at] = draw(st.integers(0, 255))
        elif op == "cut":
            del data[at:]
        else:
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
    return bytes(data)


#: The pure-Python pass of `make test` runs a third (as tests/protocol/amqp/test_header_fuzz.py):
#: the compiled pass has just run them all on the same source.
EXAMPLES = examples(1500)


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_no_crash(target: str) -> None:
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(mutated(target))
    def run(data: bytes) -> None:
        TARGETS[target](data)

    run()
