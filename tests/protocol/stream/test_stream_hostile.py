"""An open stream connection fed valid commands with random fields and random
bytes: nothing escapes the connection (every refusal is a response code or a
Close with one), and another connection on the same broker is unaffected."""

from __future__ import annotations

import struct

from harness import harness_fixture
from harness.broker import Harness
from harness.stream import MemoryStream
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rstream import schema

from examples import examples
from warren.stream_protocol import commands as c
from warren.stream_protocol.constants import ResponseCode
from warren.stream_protocol.frames import decode_frame

broker = harness_fixture()

N = examples(150)
_HEALTH = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]

names = st.sampled_from(["s", "missing", "", "amq.x", "s\n", "é" * 3])
ids = st.integers(0, 255)
u32 = st.integers(0, 2**32 - 1)

commands = st.one_of(
    st.builds(
        c.Create,
        u32,
        names,
        st.dictionaries(
            st.sampled_from(["max-age", "max-length-bytes", "x"]), st.text(max_size=5), max_size=2
        ),
    ),
    st.builds(c.Delete, u32, names),
    st.builds(c.Metadata, u32, st.lists(names, max_size=3)),
    st.builds(c.StoreOffset, names, names, st.integers(0, 2**64 - 1)),
    st.builds(c.QueryOffset, u32, names, names),
    st.builds(c.DeclarePublisher, u32, ids, names, names),
    st.builds(c.QueryPublisherSequence, u32, names, names),
    st.builds(c.DeletePublisher, u32, ids),
    st.builds(c.Credit, ids, st.integers(0, 65535)),
    st.builds(c.Unsubscribe, u32, ids),
    st.builds(c.StreamStats, u32, names),
    st.builds(c.Route, u32, names, names),
    st.builds(c.Partitions, u32, names),
    st.builds(c.Heartbeat),
)


def opened(broker: Harness) -> MemoryStream:
    client = MemoryStream(broker)
    assert client.open().response_code == ResponseCode.OK
    return client


@settings(max_examples=N, deadline=None, suppress_health_check=_HEALTH)
@given(batch=st.lists(commands, max_size=8))
def test_random_commands_are_answered_with_codes(broker: Harness, batch: list[c.Command]) -> None:
    client = opened(broker)
    client.raw(c.Create(1, "s", {}).encode())
    for command in batch:
        for frame in client.raw(command.encode()):
            answer = decode_frame(frame)
            assert not isinstance(answer, c.Close), answer
    assert not client.lost
    client.raw(c.Close(99, 1, "bye").encode())
    assert client.lost


@settings(max_examples=N, deadline=None, suppress_health_check=_HEALTH)
@given(key=st.integers(0, 0xFFFF), version=st.integers(0, 3), body=st.binary(max_size=64))
def test_random_frames_close_with_a_code(
    broker: Harness, key: int, version: int, body: bytes
) -> None:
    client, bystander = opened(broker), opened(broker)
    frames = client.raw(struct.pack(">IHH", 4 + len(body), key, version) + body)
    for frame in frames:
        answer = decode_frame(frame)
        if isinstance(answer, c.Close):
            assert answer.code != ResponseCode.OK
            client.raw(c.CloseResponse(answer.correlation_id).encode())
            assert client.lost
    meta = bystander.request(schema.Metadata(bystander.next_id(), ["s"]))
    assert meta.metadata[0].name == "s"
    for conn in (client, bystander):
        if not conn.lost:
            conn.raw(c.Close(98, 1, "bye").encode())


def test_a_command_only_the_broker_sends_is_an_unknown_frame(broker: Harness) -> None:
    client = opened(broker)
    answer = decode_frame(client.raw(c.PublishConfirm(1, [1]).encode())[0])
    assert isinstance(answer, c.Close) and answer.code == ResponseCode.UNKNOWN_FRAME
