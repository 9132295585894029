"""The sink's C encoder (warren._fastpath.encode_publishes) writes what its Python loop writes.

In memory: random body columns (binary and string, empty and multi-frame
bodies, slices of a larger array), row numbers and the persistent option go
through an Encoder with the C path and one without; the publish frames must
be the same bytes.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warren.spark.options import SinkOptions
from warren.spark.publish import Encoder, SinkPlan, _encode_publishes

# No Spark: the C encoder is the compiled build's (it skips in the pure pass, and
# runs in the compiled one; tests/passes.py).
pytestmark = [
    pytest.mark.spark,
    pytest.mark.passes("compiled", "pure"),
    pytest.mark.skipif(_encode_publishes is None, reason="warren._fastpath is not built"),
]


@settings(max_examples=60, deadline=None)
@given(
    bodies=st.lists(st.binary(max_size=300), min_size=1, max_size=1200),
    cut=st.integers(0, 5),
    first_row=st.sampled_from([0, 7, 10**12]),
    persistent=st.booleans(),
    string=st.booleans(),
    frame_max=st.sampled_from([4096, 131072, 9 + 100]),
)
def test_the_c_encoder_writes_what_the_python_loop_writes(
    bodies: list[bytes],
    cut: int,
    first_row: int,
    persistent: bool,
    string: bool,
    frame_max: int,
) -> None:
    options = SinkOptions.parse(
        {
            "url": "amqp://127.0.0.1/",
            "routingKey": "events",
            "persistent": str(persistent).lower(),
        }
    )
    if string:
        column = pa.array([b.hex() for b in bodies], pa.string())
    else:
        column = pa.array(bodies, pa.binary())
    column = column.slice(min(cut, len(bodies) - 1))  # an offset into the buffers
    plan = SinkPlan.from_schema(options, [("body", "string" if string else "binary")])
    batch = pa.RecordBatch.from_arrays([column], names=["body"])
    c = Encoder(plan, "write:0:3:", frame_max)
    python = Encoder(plan, "write:0:3:", frame_max, native=False)
    assert c.native is not None and python.native is None
    assert c.encode(batch, first_row) == python.encode(batch, first_row)


def test_other_columns_take_the_python_loop() -> None:
    options = SinkOptions.parse({"url": "amqp://127.0.0.1/", "routingKey": "events"})
    for fields in (
        [("body", "binary"), ("key", "string")],
        [("body", "binary"), ("headers", "map<string,string>")],
        [("body", "binary"), ("content_type", "string")],
    ):
        assert Encoder(SinkPlan.from_schema(options, fields), "w:0:0:", 131072).native is None
