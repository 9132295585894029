"""All variants against an independent model of the kernel, on generated
streams: run with `python -m pytest bench/fastpath_ab/test_fastpath.py` after
build.sh. FASTPATH_REQUIRE_ALL=1 fails instead of skipping unbuilt variants."""

from __future__ import annotations

import os
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from variants import load

KERNELS = load(require_all=os.environ.get("FASTPATH_REQUIRE_ALL") == "1")


def frame(ftype: int, channel: int, payload: bytes, end: int = 0xCE) -> bytes:
    return struct.pack(">BHI", ftype, channel, len(payload)) + payload + bytes([end])


def shortstr(s: bytes) -> bytes:
    return bytes([len(s)]) + s


def publish(channel: int, exchange: bytes, rk: bytes, bits: int = 0) -> bytes:
    return frame(1, channel, struct.pack(">HHH", 60, 40, 0) + shortstr(exchange) + shortstr(rk) + bytes([bits]))


def header(channel: int, body_size: int, props: bytes, weight: int = 0) -> bytes:
    return frame(2, channel, struct.pack(">HHQ", 60, weight, body_size) + props)


def bodies(channel: int, body: bytes, chunks: list[int]) -> bytes:
    out, at = [], 0
    for size in chunks:
        out.append(frame(3, channel, body[at : at + size]))
        at += size
    return b"".join(out)


def chunking(draw: st.DrawFn, size: int, limit: int) -> list[int]:
    """Frame sizes adding up to size, each 1..limit."""
    chunks: list[int] = []
    left = size
    while left:
        take = min(left, limit) if draw(st.booleans()) else draw(st.integers(1, min(left, limit)))
        chunks.append(take)
        left -= take
    return chunks


PROPS = st.one_of(
    st.just(b"\x00\x00"),
    st.just(b"\x10\x00\x01"),  # delivery-mode 1
    st.binary(min_size=2, max_size=300),  # not checked by the kernel: copied as is
)
NAME = st.binary(max_size=255)
BODY_SIZE = st.one_of(st.integers(0, 64), st.integers(0, 5000), st.integers(0, 300 * 1024))


@st.composite
def streams(draw: st.DrawFn) -> tuple[bytes, int, int, bytes, int, int, tuple[int, int, bytes]]:
    frame_max = draw(st.sampled_from([4096, 8192, 131072]))
    limit = frame_max - 8
    channel = draw(st.integers(1, 3))
    ctag_head = shortstr(draw(st.binary(max_size=60)))
    first_tag = draw(st.integers(1, 2**40))
    prefix = draw(st.binary(max_size=20))
    parts = [prefix]
    pos = len(prefix)
    expected: list[bytes] = []
    ends = [pos]  # where each consumed message ends, for a truncated stream
    stopped = False
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.sampled_from(["msg"] * 14 + ["mandatory", "channel", "weight", "oversize", "badend",
                                                   "heartbeat", "ack", "partialbody"]))
        exchange, rk, props = draw(NAME), draw(NAME), draw(PROPS)
        body = os.urandom(draw(BODY_SIZE))
        chunks = chunking(draw, len(body), limit)
        if kind == "msg":
            item = publish(channel, exchange, rk, draw(st.sampled_from([0, 0, 4, 8]))) + header(
                channel, len(body), props) + bodies(channel, body, chunks)
        elif kind == "mandatory":
            item = publish(channel, exchange, rk, draw(st.sampled_from([1, 2, 3]))) + header(
                channel, len(body), props) + bodies(channel, body, chunks)
        elif kind == "channel":
            item = publish(channel + 1, exchange, rk) + header(channel + 1, len(body), props) + bodies(
                channel + 1, body, chunks)
        elif kind == "weight":
            item = publish(channel, exchange, rk) + header(channel, len(body), props, weight=1) + bodies(
                channel, body, chunks)
        elif kind == "oversize":  # a body frame over frame_max
            body = os.urandom(limit + 1 + len(body) % 100)
            item = publish(channel, exchange, rk) + header(channel, len(body), props) + frame(3, channel, body)
        elif kind == "badend":
            item = publish(channel, exchange, rk)[:-1] + b"\x00" + header(channel, len(body), props) + bodies(
                channel, body, chunks)
        elif kind == "heartbeat":
            item = frame(8, 0, b"")
        elif kind == "ack":
            item = frame(1, channel, struct.pack(">HHQB", 60, 80, 1, 0))
        else:  # a body shorter than the header says, then the next publish
            item = publish(channel, exchange, rk) + header(channel, len(body) + 1, props) + bodies(
                channel, body, chunks)
        parts.append(item)
        pos += len(item)
        if kind == "msg" and not stopped:
            tag = first_tag + len(expected)
            deliver = frame(1, channel, b"\x00\x3c\x00\x3c" + ctag_head + struct.pack(">QB", tag, 0)
                            + shortstr(exchange) + shortstr(rk))
            out = [deliver, header(channel, len(body), props)]
            for at in range(0, len(body), limit):
                out.append(frame(3, channel, body[at : at + limit]))
            expected.append(b"".join(out))
            ends.append(pos)
        else:
            stopped = True
    data = b"".join(parts)
    if draw(st.booleans()) and data:
        data = data[: draw(st.integers(len(prefix), len(data)))]
    complete = [end for end in ends if end <= len(data)]
    count = len(complete) - 1
    result = (complete[-1], count, b"".join(expected[:count]))
    return data, len(prefix), channel, ctag_head, first_tag, frame_max, result


@settings(max_examples=int(os.environ.get("FASTPATH_EXAMPLES", "300")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(streams())
def test_variants_match_the_model(case: tuple) -> None:  # type: ignore[type-arg]
    *args, expected = case
    for name, kernel in KERNELS.items():
        got = kernel(*args)
        assert got[:2] == expected[:2], name
        assert got[2] == expected[2], name


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_edges(name: str) -> None:
    kernel = KERNELS[name]
    msg = publish(1, b"ex", b"rk") + header(1, 3, b"\x00\x00") + frame(3, 1, b"abc")
    assert kernel(b"", 0, 1, b"\x01t", 1, 4096) == (0, 0, b"")
    assert kernel(msg, 0, 1, b"\x01t", 7, 4096)[:2] == (len(msg), 1)
    assert kernel(msg, 0, 2, b"\x01t", 7, 4096) == (0, 0, b"")
    assert kernel(msg, 1, 1, b"\x01t", 7, 4096) == (1, 0, b"")
    assert kernel(msg, len(msg) + 5, 1, b"\x01t", 7, 4096) == (len(msg) + 5, 0, b"")
    assert kernel(bytearray(msg * 2), 0, 1, b"\x01t", 7, 4096)[:2] == (2 * len(msg), 2) if name in (
        "python", "c", "cython") else True
    out = kernel(msg, 0, 1, b"\x01t", 2**64 - 1, 4096)[2]
    assert out[13:21] == b"\xff" * 8
