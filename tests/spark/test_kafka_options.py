"""Kafka's option names with Kafka's meaning, and what the source refuses.

A user who knows Spark's Kafka source writes ``subscribe``,
``maxOffsetsPerTrigger``, ``startingTimestamp``, ``includeHeaders``...: each
must do what it does there, and an option the source does not know must
fail the query instead of being ignored.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from free_ports import free_port

from warren.core.properties import BasicProperties
from warren.spark.listing import management_url
from warren.spark.options import OptionError, SourceOptions
from warren.spark.source import StreamReader

from .helpers import BrokerInfo, declare_queue, declare_stream, delete_queue, publish
from .test_source import offsets_in, reader, run_available_now, stream_reader

pytestmark = pytest.mark.spark

URL = "amqp://guest:guest@127.0.0.1/"


def load(spark: Any, streaming: bool = False, **options: Any) -> Any:
    """A reader with exactly these options (no 'queue' unless given)."""
    r = (spark.readStream if streaming else spark.read).format("warren")
    for key, value in options.items():
        r = r.option(key, str(value))
    return r.load()


def parse(streaming: bool = False, **options: str) -> SourceOptions:
    return SourceOptions.parse({"url": URL, **options}, streaming=streaming)


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"queue": "q", "startingOfsets": "earliest"}, "option 'startingOfsets': unknown option"),
        ({"queue": "q", "kafka.bootstrap.servers": "h:9092"}, "use option 'url'"),
        ({"queue": "q", "assign": '{"t": [0]}'}, "use option 'subscribe'"),
        ({"queue": "q", "groupIdPrefix": "g"}, "no consumer group"),
        ({"queue": "q", "kafka.security.protocol": "SSL"}, "no Warren equivalent"),
        ({"queue": "q", "subscribe": "q"}, "give option 'queue' or 'subscribe', not both"),
        ({"subscribePattern": "("}, "option 'subscribePattern': not a regular expression"),
        ({"queue": "q", "maxOffsetsPerTrigger": "5"}, "only for streaming reads"),
        ({"queue": "q", "maxTriggerDelay": "5m"}, "only for streaming reads"),
        ({"queue": "q", "startingTimestamp": "soon"}, "option 'startingTimestamp'"),
        ({"queue": "q", "startingOffsetsByTimestamp": '{"x": 1}'}, "not subscribed to: x"),
        ({"queue": "q", "endingOffsetsByTimestamp": '{"q": "a"}'}, "epoch milliseconds"),
        ({"queue": "q", "startingTimestamp": "9", "endingTimestamp": "3"}, "ending time 3"),
        ({"queue": "q", "includeHeaders": "yes"}, "option 'includeHeaders'"),
        ({"queue": "q", "managementUrl": "http://h/"}, "only with subscribePattern"),
    ],
)
def test_options_refused(options: dict[str, str], expected: str) -> None:
    with pytest.raises(OptionError, match=expected) as info:
        parse(**options)
    if "unknown option" in str(info.value):
        assert "(known: url, username, password" in str(info.value)


def test_kafka_names_mean_what_they_mean_in_kafka() -> None:
    # Spark hands options in any case; its own (path) are let through.
    o = parse(True, SUBSCRIBE="a, b", maxOffsetsPerTrigger="10", path="x", maxTriggerDelay="2s")
    assert o.queues == ("a", "b") and o.max_records_per_trigger == 10
    assert o.max_trigger_delay_ms == 2000
    assert parse(True, queue="a", minOffsetsPerTrigger="5").max_trigger_delay_ms == 15 * 60_000
    # startingTimestamp wins over startingOffsetsByTimestamp, which wins over startingOffsets.
    o = parse(
        queue="a,b",
        startingTimestamp="7",
        startingOffsetsByTimestamp='{"a": 8}',
        startingOffsets="latest",
    )
    assert (o.starting["a"].kind, o.starting["a"].value, o.starting["b"].value) == (
        "timestamp",
        7,
        7,
    )
    o = parse(queue="a,b", startingOffsetsByTimestamp='{"a": {"0": 8}}')
    assert (o.starting["a"].value, o.starting["b"].kind) == (8, "earliest")
    # Kafka's -2 / -1 in JSON: earliest / latest.
    o = parse(True, queue="a,b", startingOffsets='{"a": -2, "b": -1}')
    assert (o.starting["a"].kind, o.starting["b"].kind) == ("earliest", "latest")
    assert management_url("broker", None) == "http://broker:15672/"
    assert management_url("::1", None) == "http://[::1]:15672/"
    assert management_url("broker", "https://m:443/") == "https://m:443/"
    o = parse(subscribePattern="ev-.*", startingOffsets='{"ev-1": 5}')
    assert (
        o.queues == () and o.starting["ev-1"].value == 5 and o.starting["ev-9"].kind == "earliest"
    )


def test_max_offsets_per_trigger_and_subscribe(
    spark: Any, spark_broker: BrokerInfo, stream: Callable[..., str], tmp_path: Path
) -> None:
    """Kafka's names for the limit and the subscription: micro-batches of 100."""
    url = spark_broker.url
    queue = stream()
    publish(url, queue, [b"m%d" % i for i in range(300)])
    df = (
        spark.readStream.format("warren")
        .option("url", url)
        .option("subscribe", queue)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", 100)
        .load()
    )
    out = str(tmp_path / "out")
    assert run_available_now(df, out, str(tmp_path / "ck")) == [100] * 3
    assert offsets_in(spark, out) == [(queue, i) for i in range(300)]


def test_starting_and_ending_timestamps(
    spark: Any,
    spark_broker: BrokerInfo,
    stream: Callable[..., str],
    tmp_path: Path,
    warren_only: None,
) -> None:
    url = spark_broker.url
    queue = stream()
    publish(url, queue, [b"old-%d" % i for i in range(600)])
    newest_old = max(r.timestamp for r in reader(spark, url, queue).select("timestamp").collect())
    cut = int(newest_old.replace(tzinfo=datetime.UTC).timestamp() * 1000) + 1
    while time.time() * 1000 < cut + 1:  # the next messages get later stamps than the cut
        pass
    publish(url, queue, [b"new-%d" % i for i in range(400)])

    def offsets(df: Any) -> list[int]:
        return sorted(r.offset for r in df.select("offset").collect())

    assert offsets(reader(spark, url, queue, startingTimestamp=cut)) == list(range(600, 1000))
    by_queue = f'{{"{queue}": {cut}}}'
    assert offsets(reader(spark, url, queue, endingOffsetsByTimestamp=by_queue)) == list(range(600))
    assert offsets(reader(spark, url, queue, startingOffsetsByTimestamp=by_queue)) == list(
        range(600, 1000)
    )
    assert offsets(reader(spark, url, queue, endingTimestamp=cut, startingOffsets=100)) == list(
        range(100, 600)
    )
    later = int(time.time() * 1000) + 60_000
    with pytest.raises(Exception, match="startingOffsetsByTimestampStrategy"):
        reader(
            spark, url, queue, startingTimestamp=later, startingOffsetsByTimestampStrategy="error"
        ).collect()
    # Streaming, from a time: every message since (not the end, as "latest" would).
    df = stream_reader(spark, url, queue, startingTimestamp=0)
    assert run_available_now(df, str(tmp_path / "out"), str(tmp_path / "ck")) == [1000]


def test_min_offsets_per_trigger(
    spark: Any, spark_broker: BrokerInfo, stream: Callable[..., str], tmp_path: Path
) -> None:
    """A running query holds a micro-batch back until 100 offsets wait (maxTriggerDelay,
    15 minutes by default, does not pass here)."""
    url = spark_broker.url
    queue = stream()
    df = stream_reader(spark, url, queue, startingOffsets="earliest", minOffsetsPerTrigger=100)
    out = str(tmp_path / "out")
    query = (
        df.writeStream.format("parquet")
        .option("path", out)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    try:
        publish(url, queue, [b"a"] * 60)
        query.processAllAvailable()
        assert [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]] == []
        publish(url, queue, [b"b"] * 60)
        query.processAllAvailable()
        assert [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]] == [120]
    finally:
        query.stop()


def test_max_trigger_delay_lets_a_small_batch_through(
    spark_broker: BrokerInfo, stream: Callable[..., str]
) -> None:
    """The reader Spark keeps for a query, on the real broker, with its clock injected."""
    from pyspark.sql.streaming.datasource import ReadMinRows

    url = spark_broker.url
    queue = stream()
    publish(url, queue, [b"m"] * 30)
    now = [1000.0]
    options = SourceOptions.parse(
        {"url": url, "queue": queue, "minOffsetsPerTrigger": "50", "maxTriggerDelay": "10s"},
        streaming=True,
    )
    r = StreamReader(options, clock=lambda: now[0])
    start = {queue: 0}
    limit = r.getDefaultReadLimit()
    assert limit == ReadMinRows(50)
    assert r.latestOffset(start, limit) == start
    now[0] += 9.9
    assert r.latestOffset(start, limit) == start
    now[0] += 0.1
    assert r.latestOffset(start, limit) == {queue: 30}
    # The delay counts from that batch.
    publish(url, queue, [b"m"] * 10)
    assert r.latestOffset({queue: 30}, limit) == {queue: 30}
    publish(url, queue, [b"m"] * 40)
    assert r.latestOffset({queue: 30}, limit) == {queue: 80}


def test_include_headers_and_time_columns(
    spark: Any, spark_broker: BrokerInfo, stream: Callable[..., str]
) -> None:
    """includeHeaders=true: Kafka's (key, binary value) array, in the message's order,
    byte strings exactly; false: no headers column. timestampType and the publisher's
    timestamp property."""
    url = spark_broker.url
    queue = stream()
    headers = {"s": "text", "raw": b"\xff\x00x", "n": 7, "flag": True, "t": {"a": 1}}
    props = BasicProperties(headers=headers, timestamp=1_700_000_000)
    publish(url, queue, [(b"with", props), b"bare"] * 3)

    rows = sorted(
        reader(spark, url, queue, includeHeaders="true").collect(), key=lambda r: r.offset
    )
    assert [(h.key, h.value) for h in rows[0].headers] == [
        ("s", b"text"),
        ("raw", b"\xff\x00x"),
        ("n", b"7"),
        ("flag", b"true"),
        ("t", b'{"a": 1}'),
    ]
    assert [rows[i].headers for i in (1, 3, 5)] == [[], [], []]
    assert rows[4].headers == rows[2].headers == rows[0].headers
    published = datetime.datetime(2023, 11, 14, 22, 13, 20)  # 1_700_000_000, UTC
    assert [r.amqp_timestamp for r in rows] == [published, None] * 3
    if spark_broker.is_warren:  # x-stream-timestamp: set by the broker (LogAppendTime)
        assert {r.timestampType for r in rows} == {1}
    else:  # the publisher's property (CreateTime), else none
        assert [r.timestampType for r in rows] == [0, None] * 3

    plain = reader(spark, url, queue, includeHeaders="false")
    assert "headers" not in plain.columns and plain.count() == 6
    assert reader(spark, url, queue).schema["headers"].dataType.simpleString() == (
        "map<string,string>"
    )


def test_subscribe_pattern(
    spark: Any,
    spark_broker: BrokerInfo,
    names: Callable[[str], str],
    tmp_path: Path,
) -> None:
    """The vhost's streams matching the pattern, listed through the management API; a
    running query picks a new one up at its next trigger, from its first message."""
    if spark_broker.embedded is None:
        pytest.skip("needs the embedded Warren's management port")
    url = spark_broker.url
    management = f"http://127.0.0.1:{spark_broker.embedded.http_port}/"
    prefix = names("p")
    a, b, other, classic = f"{prefix}-a", f"{prefix}-b", f"x{prefix}-c", f"{prefix}-q"
    for q in (a, b, other):
        declare_stream(url, q)
    declare_queue(url, classic)
    try:
        publish(url, a, [b"a"] * 30)
        publish(url, b, [b"b"] * 20)
        publish(url, other, [b"c"] * 5)
        publish(url, classic, [b"q"] * 5)
        pattern = f"{prefix}-.*"
        df = load(spark, url=url, subscribePattern=pattern, managementUrl=management)
        got = sorted((r.queue, r.offset) for r in df.select("queue", "offset").collect())
        assert got == [(a, i) for i in range(30)] + [(b, i) for i in range(20)]
        closed = f"http://127.0.0.1:{free_port()}/"
        with pytest.raises(Exception, match="option 'managementUrl': cannot list"):
            load(spark, url=url, subscribePattern=pattern, managementUrl=closed).collect()

        out = str(tmp_path / "out")
        query = (
            load(spark, True, url=url, subscribePattern=pattern, managementUrl=management)
            .writeStream.format("parquet")
            .option("path", out)
            .option("checkpointLocation", str(tmp_path / "ck"))
            .start()
        )
        try:
            query.processAllAvailable()  # starts at the end (latest): nothing yet
            c = f"{prefix}-new"
            declare_stream(url, c)
            publish(url, c, [b"new"] * 15)
            publish(url, a, [b"a"] * 5)
            query.processAllAvailable()
        finally:
            query.stop()
            delete_queue(url, f"{prefix}-new")
        assert offsets_in(spark, out) == sorted(
            [(a, i) for i in range(30, 35)] + [(c, i) for i in range(15)]
        )
    finally:
        for q in (a, b, other, classic):
            delete_queue(url, q)


def test_a_stream_declared_again_under_a_checkpoint(
    spark: Any, spark_broker: BrokerInfo, stream: Callable[..., str], tmp_path: Path
) -> None:
    """As Kafka does for a re-created topic: fail naming the stream, or with
    failOnDataLoss=false read the new stream from its first offset."""
    url = spark_broker.url
    queue = stream()
    publish(url, queue, [b"old"] * 50)
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")
    df = stream_reader(spark, url, queue, startingOffsets="earliest")
    assert run_available_now(df, out, ck) == [50]
    delete_queue(url, queue)
    declare_stream(url, queue)
    publish(url, queue, [b"new"] * 20)
    with pytest.raises(Exception, match=f"queue '{queue}' ends at offset 20, before offset 50"):
        run_available_now(stream_reader(spark, url, queue), out, ck)
    df = stream_reader(spark, url, queue, failOnDataLoss="false")
    assert run_available_now(df, out, ck) == [20]
    bodies = spark.read.parquet(out).groupBy("body").count().collect()
    assert sorted((bytes(r.body), r["count"]) for r in bodies) == [(b"new", 20), (b"old", 50)]


def test_warren_message_comes_first(spark: Any, spark_broker: BrokerInfo) -> None:
    """The first line of what Spark raises carries Warren's message, not "Traceback".
    (Spark hands a data source its option names in lower case.)"""
    with pytest.raises(Exception) as info:  # noqa: PT011 - Spark wraps the Python error
        reader(spark, spark_broker.url, "q", startingOfsets="earliest").collect()
    first = str(info.value).strip().splitlines()[0]
    assert "option 'startingofsets': unknown option (known: url, username," in first, first
    query = (
        stream_reader(spark, spark_broker.url, "no-such-stream-kafkaopts")
        .writeStream.format("noop")
        .start()
    )
    try:
        with pytest.raises(Exception) as info:  # noqa: PT011 - StreamingQueryException
            query.awaitTermination(60)
    finally:
        query.stop()
    first = str(info.value).strip().splitlines()[0]
    assert "option 'queue': queue 'no-such-stream-kafkaopts' not found" in first, first


def test_format_warren_works_without_register(
    spark: Any, spark_broker: BrokerInfo, stream: Callable[..., str]
) -> None:
    """pyspark finds the source by its short name through the pyspark_warren package:
    the tests' SparkSession (conftest.py) never calls register()."""
    import pyspark_warren
    from warren.spark.source import WarrenDataSource

    assert pyspark_warren.DefaultSource is WarrenDataSource
    queue = stream()
    publish(spark_broker.url, queue, [b"m"] * 3)
    assert reader(spark, spark_broker.url, queue).count() == 3
