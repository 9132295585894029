"""The C read loop (warren._fastpath.scan_stream_deliveries) reads what the Python one reads.

In memory, no broker: random streams of deliveries, some of the shape the C
loop takes (only the stream's two headers, the body in one frame) and some
not (other headers, properties, split bodies, an x-stream-offset of another
type, heartbeats between them), cut into random pieces as recv returns them,
go through a Scanner with the C loop and one without; the rows, delivery
tags, counts and errors must be the same (where batches end may differ: the
C loop ends its batch where a delivery of another shape follows).
"""

from __future__ import annotations

import random
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warren.amqp.frames import HEARTBEAT_FRAME
from warren.spark.column_buffers import native_scan
from warren.spark.columns import to_batch
from warren.spark.connection import DataLossError
from warren.spark.scan import Scanner

from .test_scan import QUEUE, delivery, properties

# No Spark: the C loop is the compiled build's (it skips in the pure pass, and runs
# in the compiled one; tests/passes.py).
pytestmark = [
    pytest.mark.spark,
    pytest.mark.passes("compiled", "pure"),
    pytest.mark.skipif(native_scan is None, reason="warren._fastpath is not built"),
]

#: (kind, body size, routing key) per message; kinds: 0 the C loop's shape, 1 another
#: header, 2 a property, 3 a body over several frames, 4 x-stream-offset as 'I',
#: 5 the shape with a heartbeat before it.
_MESSAGE = st.tuples(
    st.sampled_from([0, 0, 0, 0, 1, 2, 3, 4, 5]),
    st.integers(0, 300),
    st.sampled_from([QUEUE, "", "ключ", "k" * 255]),
)


def _stream(messages: list[tuple[int, int, str]], first: int, rng: random.Random) -> bytes:
    out = []
    for i, (kind, size, key) in enumerate(messages):
        offset = first + i
        stamp = 1_700_000_000_000 + offset
        body = bytes(rng.randrange(256) for _ in range(size))
        frame_max = 131072
        if kind == 1:
            props = properties(offset, stamp, headers={"id": f"m{offset}"})
        elif kind == 2:
            props = properties(offset, stamp, delivery_mode=2)
        elif kind == 3:
            props, frame_max = properties(offset, stamp), 8 + max(1, size // 3)
        elif kind == 4:
            props = properties(offset, offset_type="I")
        else:
            props = properties(offset, stamp)
        if kind == 5:
            out.append(HEARTBEAT_FRAME)
        out.append(delivery(i + 1, props, body, key, frame_max))
    return b"".join(out)


def _read(data: bytes, start: int, end: int, seed: int, native: bool, **kw: Any) -> Any:
    rng = random.Random(seed)
    scanner = Scanner(QUEUE, start, end, batch_rows=37, native=native, **kw)
    rows: list[dict[str, Any]] = []
    buf = b""
    at = 0
    try:
        while not scanner.done and at < len(data):
            step = rng.choice((1, 7, 100, 1000, 5000, 100_000))
            buf += data[at : at + step]
            at += step
            used, need = scanner.feed(buf)
            buf = buf[used:]
            assert need > 0
            for batch in scanner.take():
                rows.extend(to_batch(batch, QUEUE, kw.get("include_headers")).to_pylist())
    except DataLossError as exc:
        return ("data loss", str(exc))
    if len(scanner.rows):  # the stream ended first: what waits for the next batch
        rows.extend(to_batch(scanner.rows, QUEUE, kw.get("include_headers")).to_pylist())
    return rows, scanner.done, scanner.tag, scanner.unacked


@settings(max_examples=60, deadline=None)
@given(
    messages=st.lists(_MESSAGE, min_size=1, max_size=120),
    first=st.integers(0, 5),
    start=st.integers(0, 8),
    length=st.integers(1, 130),
    seed=st.integers(0, 1000),
    fail_on_data_loss=st.booleans(),
)
def test_the_c_loop_reads_what_the_python_loop_reads(
    messages: list[tuple[int, int, str]],
    first: int,
    start: int,
    length: int,
    seed: int,
    fail_on_data_loss: bool,
) -> None:
    data = _stream(messages, first, random.Random(seed))
    end = start + length
    kw = {"fail_on_data_loss": fail_on_data_loss}
    python = _read(data, start, end, seed, False, **kw)
    c = _read(data, start, end, seed, True, **kw)
    assert c == python


def test_the_c_loop_takes_the_common_shape_in_whole_batches() -> None:
    """10,000 plain deliveries: every batch is the C loop's (column buffers, no list),
    full but the last, and the columns are the messages'."""
    n = 10_000
    data = b"".join(
        delivery(i + 1, properties(i, 1_700_000_000_000 + i), struct.pack(">Q", i) * 12)
        for i in range(n)
    )
    scanner = Scanner(QUEUE, 0, n, batch_rows=4096)
    batches = []
    pos = 0
    while not scanner.done:
        used, _ = scanner.feed(data[pos : pos + 65536])
        pos += used
        batches += scanner.take()
    assert [len(b.buffers) for b in batches] == [4096, 4096, 1808]
    assert not any(b.offsets for b in batches)
    assert [b.last_offset for b in batches] == [4095, 8191, n - 1]  # where a retry resumes
    assert scanner.tag == n and scanner.unacked == n
    got = [r for b in batches for r in to_batch(b, QUEUE).to_pylist()]
    assert [r["offset"] for r in got] == list(range(n))
    assert got[7]["body"] == struct.pack(">Q", 7) * 12
    assert got[7]["timestamp"].timestamp() == 1_700_000_000.007
    assert (got[7]["timestampType"], got[7]["headers"], got[7]["routing_key"]) == (1, [], QUEUE)
