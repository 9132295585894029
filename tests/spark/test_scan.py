"""The read task's scanner and column builder on deliveries built with Warren's codec.

No broker and no Spark: deliveries are the frames a broker sends (built by
warren.amqp.frames), cut into random pieces as a socket would return them;
what the scanner makes of them is held to Warren's own property decoder.
"""

from __future__ import annotations

import datetime
import random
import struct
from typing import Any

import pyarrow as pa
import pytest

from warren.amqp import spec
from warren.amqp.frames import HEARTBEAT_FRAME, message_frames, method_frame
from warren.core.properties import BasicProperties
from warren.core.table_encode import encode_field_value
from warren.spark.columns import COLUMNS, KAFKA_HEADERS, arrow_schema, columns, to_batch
from warren.spark.connection import DataLossError, SourceError
from warren.spark.options import OptionError
from warren.spark.scan import Rows, Scanner

# No Spark: the scanner in memory, which takes the C loop where the compiled build
# has it and the Python one in the pure pass (tests/passes.py).
pytestmark = [pytest.mark.spark, pytest.mark.passes("compiled", "pure")]

QUEUE = "events"


def table(entries: list[tuple[str, bytes]]) -> bytes:
    raw = b"".join(bytes((len(k),)) + k.encode() + v for k, v in entries)
    return struct.pack(">I", len(raw)) + raw


def properties(
    offset: int,
    stamp: int | None = None,
    headers: dict[str, Any] | None = None,
    offset_type: str = "l",
    **props: Any,
) -> bytes:
    """Raw properties with a headers table as a broker writes it: the message's own
    headers, then x-stream-offset (and x-stream-timestamp) as longs."""
    entries = [(k, encode_field_value(v)) for k, v in (headers or {}).items()]
    if offset_type == "l":
        entries.append(("x-stream-offset", b"l" + struct.pack(">q", offset)))
    else:
        entries.append(("x-stream-offset", encode_field_value(offset)))
    if stamp is not None:
        entries.append(("x-stream-timestamp", b"l" + struct.pack(">q", stamp)))
    raw = BasicProperties(**props).encode()
    flags = struct.unpack_from(">H", raw)[0]
    pos = 2
    for bit in (0x8000, 0x4000):  # content-type and -encoding come before the headers
        if flags & bit:
            pos += 1 + raw[pos]
    return struct.pack(">H", flags | 0x2000) + raw[2:pos] + table(entries) + raw[pos:]


def delivery(
    tag: int, raw_props: bytes, body: bytes, routing_key: str = QUEUE, frame_max: int = 131072
) -> bytes:
    method = spec.BasicDeliver(
        consumer_tag="ctag-1", delivery_tag=tag, exchange="", routing_key=routing_key
    ).encode()
    return b"".join(message_frames(1, method, raw_props, body, frame_max))


def scan(
    data: bytes, start: int, end: int, rng: random.Random, **kw: Any
) -> tuple[Scanner, list[Rows]]:
    """Feed ``data`` in random pieces, as recv would return it."""
    scanner = Scanner(QUEUE, start, end, batch_rows=kw.pop("batch_rows", 50), **kw)
    batches: list[Rows] = []
    buf = b""
    at = 0
    while not scanner.done and at < len(data):
        step = rng.choice((1, 7, 13, 100, 1000, 5000))
        buf += data[at : at + step]
        at += step
        used, _need = scanner.feed(buf)
        buf = buf[used:]
        batches.extend(scanner.take())
    return scanner, batches


def rows_of(batches: list[Rows]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for rows in batches:
        out.extend(to_batch(rows, QUEUE).to_pylist())
    return out


def mixed_messages(rng: random.Random, n: int) -> list[tuple[bytes, bytes, dict[str, Any]]]:
    """Runs of same-shaped messages (templates) and odd ones (the general path)."""
    out = []
    for i in range(n):
        kind = (i // 10) % 6
        body = bytes(rng.randrange(256) for _ in range(20))
        if kind == 0:
            props, extra = properties(i), {}
        elif kind == 1:  # a per-message id of varying length (the sink's keys)
            key = f"q:0:1:{i * 37}"
            props, extra = (
                properties(i, headers={"x-deduplication-header": key}),
                {"x-deduplication-header": key},
            )
        elif kind == 2:  # Warren's time header, two string headers, properties
            headers = {"a": f"x{i}", "b": "same"}
            props = properties(
                i, stamp=1_700_000_000_000 + i, headers=headers, delivery_mode=2, message_id=f"m{i}"
            )
            extra = headers
        elif kind == 3:  # odd types, a timestamp property, no time header
            headers = {"n": i, "t": True, "f": 1.5, "l": [1, "x"]}
            props = properties(i, headers=headers, content_type="a/b", timestamp=1_700_000_000)
            extra = {"n": str(i), "t": "true", "f": "1.5", "l": '[1, "x"]'}
        elif kind == 4:  # x-stream-offset as another integer type
            props, extra = properties(i, offset_type="I", app_id="app"), {}
        else:
            body = b""
            props, extra = properties(i, priority=9), {}
        out.append((props, body, extra))
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_delivery_is_read_as_the_broker_sent_it(seed: int) -> None:
    rng = random.Random(seed)
    messages = mixed_messages(rng, 240)
    data = b"".join(delivery(i + 1, p, b) for i, (p, b, _) in enumerate(messages))
    scanner, batches = scan(data, 0, 240, rng)
    assert scanner.done and scanner.tag == 240
    got = rows_of(batches)
    assert [r["offset"] for r in got] == list(range(240))
    for i, (r, (_props, body, headers)) in enumerate(zip(got, messages, strict=True)):
        assert r["body"] == body
        assert dict(r["headers"]) == headers
        assert (r["queue"], r["exchange"], r["routing_key"]) == (QUEUE, "", QUEUE)
        kind = (i // 10) % 6
        if kind == 2:
            assert r["timestamp"] == datetime.datetime.fromtimestamp(
                1_700_000_000 + i / 1000, datetime.UTC
            )
            assert (r["delivery_mode"], r["message_id"]) == (2, f"m{i}")
        elif kind == 3:
            assert r["timestamp"] == datetime.datetime.fromtimestamp(1_700_000_000, datetime.UTC)
            assert r["content_type"] == "a/b"
        else:
            assert r["timestamp"] is None
        assert r["app_id"] == ("app" if kind == 4 else None)
        assert r["priority"] == (9 if kind == 5 else None)


def test_templates_take_over_for_runs_of_one_shape() -> None:
    rng = random.Random(5)
    data = b"".join(
        delivery(i + 1, properties(i, stamp=1000 + i, headers={"id": f"{i:06d}"}), b"x" * 100)
        for i in range(3000)
    )
    scanner, batches = scan(data, 0, 3000, rng, batch_rows=1000)
    assert scanner.template_hits > 2900
    got = rows_of(batches)
    assert [r["headers"] for r in got] == [[("id", f"{i:06d}")] for i in range(3000)]
    assert [len(b) for b in batches] == [1000, 1000, 1000]


def test_a_range_skips_what_lies_before_it_and_stops_at_its_end() -> None:
    rng = random.Random(7)
    # A consumer can get the rest of a chunk that starts before the range.
    data = b"".join(delivery(i + 1, properties(i), b"b%d" % i) for i in range(100))
    scanner, batches = scan(data, 20, 60, rng)
    assert [r["offset"] for r in rows_of(batches)] == list(range(20, 60))
    assert scanner.done


def test_big_bodies_span_frames_and_other_frames_are_skipped() -> None:
    rng = random.Random(11)
    body = bytes(range(256)) * 40  # 10 KiB in 4 KiB frames
    parts = [method_frame(1, spec.BasicConsumeOk(consumer_tag="ctag-1")), HEARTBEAT_FRAME]
    for i in range(5):
        parts.append(delivery(i + 1, properties(i), body, frame_max=4096))
        parts.append(HEARTBEAT_FRAME)
    _, batches = scan(b"".join(parts), 0, 5, rng)
    assert [r["body"] for r in rows_of(batches)] == [body] * 5


def test_lost_offsets_fail_unless_told_otherwise(caplog: pytest.LogCaptureFixture) -> None:
    data = b"".join(delivery(i + 1, properties(i), b"m") for i in range(30, 40))
    with pytest.raises(DataLossError, match=r"offsets \[10, 30\).*failOnDataLoss"):
        scan(data, 10, 40, random.Random(1))
    _, batches = scan(data, 10, 40, random.Random(1), fail_on_data_loss=False)
    assert [r["offset"] for r in rows_of(batches)] == list(range(30, 40))
    assert "skipping ahead to offset 30" in caplog.text


def test_offsets_without_messages_are_no_loss() -> None:
    """RabbitMQ gives an offset to each segment's tracking chunk: a range can start on one."""
    data = b"".join(delivery(i + 1, properties(i), b"m") for i in range(31, 40))
    asked = []

    def first_retained() -> int:
        asked.append(True)
        return 12  # retention is behind the start: offset 30 simply has no message

    _, batches = scan(data, 30, 40, random.Random(1), first_retained=first_retained)
    assert [r["offset"] for r in rows_of(batches)] == list(range(31, 40))
    assert asked == [True]
    with pytest.raises(DataLossError, match=r"offsets \[30, 31\)"):
        scan(data, 30, 40, random.Random(1), first_retained=lambda: 31)


def test_what_ends_a_read() -> None:
    close = method_frame(1, spec.ChannelClose(reply_code=404, reply_text="NOT_FOUND - no queue"))
    with pytest.raises(SourceError, match="NOT_FOUND"):
        Scanner(QUEUE, 0, 10).feed(close)
    cancel = method_frame(1, spec.BasicCancel(consumer_tag="ctag-1"))
    with pytest.raises(SourceError, match="deleted"):
        Scanner(QUEUE, 0, 10).feed(cancel)
    classic = delivery(1, BasicProperties().encode(), b"m")
    with pytest.raises(OptionError, match="option 'queue'.*not a stream queue"):
        Scanner(QUEUE, 0, 10).feed(classic)


@pytest.mark.parametrize("include_headers", [None, True, False])
def test_the_arrow_schema_is_the_one_spark_expects(include_headers: bool | None) -> None:
    """For each value of includeHeaders (not given, true, false)."""
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        IntegerType,
        LongType,
        MapType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    from warren.spark.options import SourceOptions
    from warren.spark.source import _check_schema

    kinds = columns(include_headers)
    assert kinds[: len(COLUMNS)] == COLUMNS or include_headers is not None
    spark_types = {
        "string": StringType(),
        "bigint": LongType(),
        "int": IntegerType(),
        "binary": BinaryType(),
        "timestamp": TimestampType(),
        "map<string,string>": MapType(StringType(), StringType()),
        KAFKA_HEADERS: ArrayType(
            StructType([StructField("key", StringType()), StructField("value", BinaryType())])
        ),
    }
    assert {kind for _, kind in kinds} <= set(spark_types)
    schema = StructType([StructField(name, spark_types[kind]) for name, kind in kinds])
    given = {} if include_headers is None else {"includeHeaders": str(include_headers).lower()}
    options = SourceOptions.parse({"url": "amqp://x/", "queue": QUEUE, **given}, streaming=False)
    _check_schema(schema, options)  # the schema Spark derives from schema_ddl() is accepted
    assert to_arrow_schema(schema, timezone="UTC").equals(arrow_schema(include_headers))
    empty = Rows()
    batch = to_batch(empty, QUEUE, include_headers)
    assert batch.schema.equals(arrow_schema(include_headers))
    assert isinstance(batch, pa.RecordBatch)
