"""warren.cluster.codec: every frame survives encode -> decode however the bytes
are split, and what is not the protocol raises ProtocolError."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warren.cluster import codec as c

segment = st.text(
    alphabet=st.characters(blacklist_characters="/\0", blacklist_categories=("Cs",)),
    min_size=1,
    max_size=12,
).filter(lambda s: s not in (".", ".."))
paths = st.lists(segment, min_size=1, max_size=4).map("/".join)
u64 = st.integers(min_value=0, max_value=2**64 - 1)
data = st.binary(max_size=300)

frames = st.one_of(
    st.builds(c.Hello, st.text(max_size=30), st.text(max_size=30)),
    st.builds(
        c.Hello,
        st.text(max_size=30),
        st.text(max_size=30),
        st.text(max_size=30),
        stream_protocol_reads=st.text(max_size=30),
    ),
    st.builds(c.IndexEntry, paths, u64, st.binary(min_size=20, max_size=20)),
    st.builds(c.IndexEnd, u64),
    st.builds(c.Request, paths),
    st.just(c.RequestsEnd()),
    st.builds(c.FileData, paths, u64, data),
    st.just(c.SyncDone()),
    st.builds(c.Append, paths, u64, data),
    st.builds(c.Allocate, paths, u64),
    st.builds(c.Replace, paths, data),
    st.builds(c.Delete, paths),
    st.builds(c.Rename, paths, paths),
    st.builds(c.Ack, u64),
    st.just(c.Heartbeat()),
    st.builds(c.Refused, st.text(max_size=50)),
)


@given(st.lists(frames, max_size=20), st.lists(st.integers(0, 2000), max_size=10))
def test_frames_round_trip_across_any_split(sent: list[c.Frame], cuts: list[int]) -> None:
    wire = b"".join(c.encode(f) for f in sent)
    decoder = c.Decoder()
    got: list[c.Frame] = []
    pos = 0
    for cut in sorted(min(x, len(wire)) for x in cuts) + [len(wire)]:
        got += decoder.feed(wire[pos:cut])
        pos = cut
    assert got == sent


def _frame(kind: int, payload: bytes) -> bytes:
    return struct.pack(">IB", len(payload) + 1, kind) + payload


def _s(text: bytes) -> bytes:
    return struct.pack(">H", len(text)) + text


@pytest.mark.parametrize(
    "wire, message",
    [
        (_frame(99, b""), "unknown frame type"),
        (struct.pack(">IB", c.MAX_FRAME + 1, 16), "out of range"),
        (struct.pack(">IB", 0, 16), "out of range"),
        (_frame(18, _s(b"../etc/passwd")), "bad path"),
        (_frame(18, _s(b"/abs")), "bad path"),
        (_frame(18, _s(b"a//b")), "bad path"),
        (_frame(18, _s(b"a/./b")), "bad path"),
        (_frame(18, _s(b"")), "bad path"),
        (_frame(18, _s(b"ok") + b"x"), "trailing bytes"),
        (_frame(32, b"\0\0\0"), "truncated number"),
        (_frame(2, _s(b"p") + b"\0" * 8 + b"\0" * 19), "truncated frame"),
        (_frame(18, b"\0\x09ab"), "truncated string"),
        (_frame(1, _s(b"SOMETHING-ELSE") + _s(b"") + _s(b"")), "not a Warren replication peer"),
    ],
)
def test_what_is_not_the_protocol_is_refused(wire: bytes, message: str) -> None:
    with pytest.raises(c.ProtocolError, match=message):
        c.Decoder().feed(wire)


def test_encode_refuses_what_it_cannot_carry() -> None:
    with pytest.raises(ValueError):
        c.encode(c.IndexEntry("p", 1, b"short"))
    with pytest.raises(ValueError):
        c.encode(c.Delete("x" * 70000))


def test_a_hello_without_a_stream_protocol_read_service_is_the_older_frame() -> None:
    """The field is left out when empty: the frame an older follower writes."""
    hello = c.Hello("s3cret", "f1", "h:1")
    old = c.encode(hello)
    assert c.Decoder().feed(old) == [hello]
    longer = c.encode(c.Hello("s3cret", "f1", "h:1", stream_protocol_reads="h:2"))
    assert longer[5 : len(old)] == old[5:] and len(longer) == len(old) + 2 + 3
