"""The warren source against a real broker: batch reads and Structured Streaming.

Every test publishes its own messages (with confirms) into a fresh stream,
reads them through Spark and compares offsets and columns with what was
published. Streaming tests use trigger(availableNow=True), so a query ends
by itself when it has read what the stream held when it started.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from warren.core.properties import BasicProperties

from .helpers import BrokerInfo, publish

pytestmark = pytest.mark.spark


def message(i: int) -> tuple[bytes, BasicProperties]:
    """Message i: a body naming it; every 7th carries properties and headers."""
    if i % 7:
        return b"body-%d" % i, BasicProperties()
    return b"body-%d" % i, BasicProperties(
        content_type="text/plain",
        content_encoding="utf-8",
        headers={"k": f"v{i}", "n": i, "flag": True, "raw": b"\xffx"},
        delivery_mode=2,
        priority=3,
        correlation_id=f"c{i}",
        reply_to="replies",
        expiration="600000",
        message_id=f"m{i}",
        timestamp=1_700_000_000 + i,
        type="kind",
        user_id="guest",
        app_id="tests",
    )


def reader(spark: Any, url: str, queue: str, **options: Any) -> Any:
    r = spark.read.format("warren").option("url", url).option("queue", queue)
    for key, value in options.items():
        r = r.option(key, str(value))
    return r.load()


def stream_reader(spark: Any, url: str, queue: str, **options: Any) -> Any:
    r = spark.readStream.format("warren").option("url", url).option("queue", queue)
    for key, value in options.items():
        r = r.option(key, str(value))
    return r.load()


def run_available_now(df: Any, path: str, checkpoint: str) -> list[int]:
    """Run to completion into a parquet sink; returns each micro-batch's row count."""
    query = (
        df.writeStream.format("parquet")
        .option("path", path)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(90)
    assert not query.isActive, "the availableNow query did not finish"
    if query.exception() is not None:
        raise AssertionError(str(query.exception()))
    return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]


def offsets_in(spark: Any, path: str) -> list[tuple[str, int]]:
    rows = spark.read.parquet(path).select("queue", "offset").collect()
    return sorted((r.queue, r.offset) for r in rows)


def test_batch_read_returns_exactly_the_range(
    spark: Any, spark_broker: BrokerInfo, stream: Callable[..., str]
) -> None:
    url = spark_broker.url
    queue = stream()
    publish(url, queue, [message(i) for i in range(300)])

    df = reader(spark, url, queue, startingOffsets=40, endingOffsets=260, minPartitions=3)
    assert df.rdd.getNumPartitions() == 3
    rows = df.orderBy("offset").collect()
    assert [r.offset for r in rows] == list(range(40, 260))
    assert [r.body for r in rows] == [b"body-%d" % i for i in range(40, 260)]
    assert {r.queue for r in rows} == {queue}
    assert {(r.exchange, r.routing_key) for r in rows} == {("", queue)}

    whole = reader(spark, url, queue).select("offset").collect()
    assert sorted(r.offset for r in whole) == list(range(300))
    # An ending offset past the end reads to the end; a start past it reads nothing.
    assert reader(spark, url, queue, startingOffsets=290, endingOffsets=10_000).count() == 10
    assert reader(spark, url, queue, startingOffsets="latest").count() == 0


def test_columns(spark: Any, spark_broker: BrokerInfo, stream: Callable[..., str]) -> None:
    url = spark_broker.url
    queue = stream()
    # collect() gives naive datetimes in the session's time zone, UTC (conftest.py).
    before = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
    publish(url, queue, [message(i) for i in range(15)])
    after = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
    rows = {r.offset: r for r in reader(spark, url, queue).collect()}

    full = rows[14]
    assert full.body == b"body-14"
    assert full.headers == {"k": "v14", "n": "14", "flag": "true", "raw": "\ufffdx"}
    assert (full.content_type, full.content_encoding) == ("text/plain", "utf-8")
    assert (full.delivery_mode, full.priority) == (2, 3)
    assert (full.correlation_id, full.reply_to, full.expiration) == ("c14", "replies", "600000")
    assert (full.message_id, full.type, full.user_id, full.app_id) == (
        "m14",
        "kind",
        "guest",
        "tests",
    )

    bare = rows[13]
    assert bare.headers == {}
    assert bare.content_type is None and bare.delivery_mode is None and bare.message_id is None
    if spark_broker.is_warren:
        # x-stream-timestamp: when the broker took the message, to the millisecond.
        for r in rows.values():
            assert (
                before - datetime.timedelta(seconds=1)
                <= r.timestamp
                <= after + datetime.timedelta(seconds=1)
            )
    else:
        # RabbitMQ adds no time header: the timestamp property, when set, else null.
        assert full.timestamp == datetime.datetime(2023, 11, 14, 22, 13, 34)  # 1_700_000_014
        assert bare.timestamp is None


def test_starting_at_a_timestamp(
    spark: Any, spark_broker: BrokerInfo, stream: Callable[..., str], warren_only: None
) -> None:
    """Warren stamps every message (x-stream-timestamp, ms): the start is exact."""
    url = spark_broker.url
    queue = stream()
    publish(url, queue, [b"old-%d" % i for i in range(20)])
    newest_old = max(r.timestamp for r in reader(spark, url, queue).collect())
    cut = int(newest_old.replace(tzinfo=datetime.UTC).timestamp() * 1000) + 1
    while time.time() * 1000 < cut + 1:  # the next messages get later stamps than the cut
        pass
    publish(url, queue, [b"new-%d" % i for i in range(10)])
    rows = reader(spark, url, queue, startingOffsets=f"timestamp:{cut}").collect()
    assert sorted(r.offset for r in rows) == list(range(20, 30))
    later = int(time.time() * 1000) + 60_000
    assert reader(spark, url, queue, startingOffsets=f"timestamp:{later}").count() == 0


def test_available_now_bounds_every_micro_batch(
    spark: Any, spark_broker: BrokerInfo, stream: Callable[..., str], tmp_path: Path
) -> None:
    url = spark_broker.url
    queue = stream()
    publish(url, queue, [b"m%d" % i for i in range(250)])
    df = stream_reader(spark, url, queue, startingOffsets="earliest", maxRecordsPerTrigger=100)
    sizes = run_available_now(df, str(tmp_path / "out"), str(tmp_path / "ck"))
    assert sizes == [100, 100, 50]
    assert offsets_in(spark, str(tmp_path / "out")) == [(queue, i) for i in range(250)]


def test_restart_from_checkpoint_reads_exactly_the_rest(
    spark: Any, spark_broker: BrokerInfo, stream: Callable[..., str], tmp_path: Path
) -> None:
    """Two queues, two runs: the second reads only what arrived since, each offset once."""
    url = spark_broker.url
    a, b = stream("a"), stream("b")
    publish(url, a, [b"a%d" % i for i in range(200)])
    publish(url, b, [b"b%d" % i for i in range(50)])
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")

    def run() -> list[int]:
        df = stream_reader(
            spark, url, f"{a}, {b}", startingOffsets="earliest", maxRecordsPerTrigger=120
        )
        return run_available_now(df, out, ck)

    first = run()
    assert sum(first) == 250 and max(first) <= 120
    publish(url, a, [b"a%d" % i for i in range(200, 270)])
    publish(url, b, [b"b%d" % i for i in range(50, 80)])
    second = run()
    assert sum(second) == 100 and max(second) <= 120
    expected = [(a, i) for i in range(270)] + [(b, i) for i in range(80)]
    assert offsets_in(spark, out) == sorted(expected)


def test_starting_at_latest_reads_nothing_old(
    spark: Any, spark_broker: BrokerInfo, stream: Callable[..., str], tmp_path: Path
) -> None:
    url = spark_broker.url
    queue = stream()
    publish(url, queue, [b"old"] * 40)
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")
    assert run_available_now(stream_reader(spark, url, queue), out, ck) == []
    publish(url, queue, [b"new"] * 25)
    assert run_available_now(stream_reader(spark, url, queue), out, ck) == [25]
    assert offsets_in(spark, out) == [(queue, i) for i in range(40, 65)]


def test_a_query_on_an_empty_stream_starts_at_its_first_message(
    spark: Any, spark_broker: BrokerInfo, stream: Callable[..., str], tmp_path: Path
) -> None:
    url = spark_broker.url
    queue = stream()
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")
    assert run_available_now(stream_reader(spark, url, queue), out, ck) == []
    publish(url, queue, [b"first"] * 5)
    assert run_available_now(stream_reader(spark, url, queue), out, ck) == [5]
    assert offsets_in(spark, out) == [(queue, i) for i in range(5)]


def test_offsets_removed_by_retention(
    spark: Any, spark_broker: BrokerInfo, stream: Callable[..., str], tmp_path: Path
) -> None:
    """failOnDataLoss: a batch read or a restarted query that needs offsets retention
    removed fails by default, and skips ahead to the first offset left when told to."""
    url = spark_broker.url
    queue = stream(**{"x-max-length-bytes": 20_000, "x-stream-max-segment-size-bytes": 10_000})
    publish(url, queue, [bytes(100)] * 100)
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")
    df = stream_reader(spark, url, queue, startingOffsets="earliest")
    assert run_available_now(df, out, ck) == [100]
    old = set(offsets_in(spark, out))
    for _ in range(40):  # 1,000 more: segments roll over and the oldest are removed
        publish(url, queue, [bytes(100)] * 25)
    first = min(r.offset for r in reader(spark, url, queue, failOnDataLoss="false").collect())
    assert first > 100

    with pytest.raises(Exception, match=r"offsets \[0, \d+\) of queue .* no longer in the stream"):
        reader(spark, url, queue, startingOffsets=0).collect()
    assert reader(spark, url, queue, startingOffsets=0, failOnDataLoss="false").count() > 0
    with pytest.raises(Exception, match=r"offsets \[\d+, \d+\) of queue .* no longer in the"):
        run_available_now(stream_reader(spark, url, queue), out, ck)
    df = stream_reader(spark, url, queue, failOnDataLoss="false")
    assert sum(run_available_now(df, out, ck)) > 0
    assert min(o for _, o in set(offsets_in(spark, out)) - old) == first
