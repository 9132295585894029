"""Mistakes a user can make, and what they see: an error naming the option to fix.

Also: the source and the sink leave no connection open behind them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from free_ports import free_port

from warren.spark.options import SinkOptions, SourceOptions

from .helpers import (
    WORKER_DID_NOT_CONNECT,
    BrokerInfo,
    SparkWorkerDidNotConnect,
    declare_queue,
    publish,
)

pytestmark = pytest.mark.spark


def read_error(spark: Any, streaming: bool = False, **options: Any) -> str:
    """The message of the error a read with these options raises (at load or at run)."""
    reader = spark.readStream if streaming else spark.read
    r = reader.format("warren")
    for key, value in options.items():
        r = r.option(key, str(value))
    with pytest.raises(Exception) as info:  # noqa: PT011 - Spark wraps the Python error
        df = r.load()
        if streaming:
            q = df.writeStream.format("noop").trigger(availableNow=True).start()
            try:
                q.awaitTermination(60)
                if q.exception() is not None:
                    raise RuntimeError(str(q.exception()))
            finally:
                q.stop()
        else:
            df.collect()
    message = str(info.value)
    if WORKER_DID_NOT_CONNECT in message:
        raise SparkWorkerDidNotConnect(message)  # not the error asked for: rerun
    return message


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"queue": "q"}, "option 'url': required"),
        ({"url": "http://localhost/", "queue": "q"}, "option 'url': unsupported URI scheme"),
        ({"url": "amqp://guest:guest@localhost:99999/", "queue": "q"}, "option 'url': bad port"),
        ({"url": "amqp://localhost/"}, "option 'queue': required"),
        ({"url": "amqp://localhost/", "queue": "a,,b"}, "option 'queue': empty queue name"),
        ({"url": "amqp://x/", "queue": "q", "startingOffsets": "soon"}, "option 'startingOffsets'"),
        ({"url": "amqp://x/", "queue": "q", "startingOffsets": "-3"}, "option 'startingOffsets'"),
        ({"url": "amqp://x/", "queue": "q", "startingOffsets": "timestamp:x"}, "timestamp:<epoch"),
        ({"url": "amqp://x/", "queue": "q", "endingOffsets": "earliest"}, "option 'endingOffsets'"),
        (
            {"url": "amqp://x/", "queue": "q", "startingOffsets": "9", "endingOffsets": "3"},
            "option 'endingOffsets': ending offset 3",
        ),
        (
            {"url": "amqp://x/", "queue": "q", "startingOffsets": '{"other": 1}'},
            "names queues not subscribed to: other",
        ),
        ({"url": "amqp://x/", "queue": "q", "maxRecordsPerTrigger": "10"}, "only for streaming"),
        ({"url": "amqp://x/", "queue": "q", "failOnDataLoss": "maybe"}, "option 'failOnDataLoss'"),
        ({"url": "amqp://x/", "queue": "q", "minPartitions": "0"}, "option 'minPartitions'"),
    ],
)
def test_option_errors(options: dict[str, str], expected: str) -> None:
    """Checked before anything runs (no Spark needed to see them)."""
    with pytest.raises(ValueError, match=expected):
        SourceOptions.parse(options, streaming=False)


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"url": "amqp://x/", "queue": "q", "endingOffsets": "5"}, "only for batch reads"),
        ({"url": "amqp://x/", "queue": "q", "maxRecordsPerTrigger": "x"}, "maxRecordsPerTrigger"),
    ],
)
def test_streaming_option_errors(options: dict[str, str], expected: str) -> None:
    with pytest.raises(ValueError, match=expected):
        SourceOptions.parse(options, streaming=True)


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"url": "amqp://x/", "routingKey": "a", "routingKeyColumn": "b"}, "not both"),
        ({"url": "amqp://x/", "routingKey": "a", "persistent": "yes"}, "option 'persistent'"),
        (
            {"url": "amqp://x/", "routingKey": "a", "maxUnconfirmed": "-1"},
            "option 'maxUnconfirmed'",
        ),
    ],
)
def test_sink_option_errors(options: dict[str, str], expected: str) -> None:
    with pytest.raises(ValueError, match=expected):
        SinkOptions.parse(options)


def test_errors_through_spark(
    spark: Any, spark_broker: BrokerInfo, names: Callable[[str], str]
) -> None:
    url = spark_broker.url
    refused = f"amqp://guest:secret@127.0.0.1:{free_port()}/"
    message = read_error(spark, url=refused, queue="q", maxRetries=0)
    assert "option 'url': cannot connect to amqp://guest:***@127.0.0.1" in message
    assert "secret" not in message
    wrong_password = url.replace("guest:guest@", "guest:wrong@")
    assert "option 'url'" in read_error(spark, url=wrong_password, queue="q")

    missing = names("missing")
    assert f"option 'queue': queue '{missing}' not found" in read_error(
        spark, url=url, queue=missing
    )
    assert f"option 'queue': queue '{missing}' not found" in read_error(
        spark, streaming=True, url=url, queue=missing
    )
    classic = names("classic")
    declare_queue(url, classic)
    publish(url, classic, [b"m"])
    assert "not a stream queue" in read_error(spark, url=url, queue=classic)
    assert "option 'endingOffsets'" in read_error(
        spark, streaming=True, url=url, queue=classic, endingOffsets=5
    )
    with pytest.raises(Exception, match="columns are fixed"):
        spark.read.format("warren").schema("body binary").option("url", url).option(
            "queue", "q"
        ).load().collect()


def test_sink_errors_through_spark(spark: Any, spark_broker: BrokerInfo) -> None:
    url = spark_broker.url
    df = spark.range(3).selectExpr("id")
    with pytest.raises(Exception, match="use mode\\('append'\\)"):
        df.write.format("warren").option("url", url).option("routingKey", "q").mode(
            "overwrite"
        ).save()
    with pytest.raises(Exception, match="needs a 'body' \\(or Kafka's 'value'\\) column"):
        df.write.format("warren").option("url", url).option("routingKey", "q").mode("append").save()
    # With the default exchange something must name the queue (checked with the
    # columns: a 'key' column would do).
    with pytest.raises(Exception, match="option 'routingKey': required with the default exchange"):
        spark.range(3).selectExpr("cast(id as string) as body").write.format("warren").option(
            "url", url
        ).mode("append").save()
    bodies = spark.range(3).selectExpr("cast(id as string) as body", "id as rk")
    with pytest.raises(Exception, match="column 'rk' must be a string"):
        bodies.write.format("warren").option("url", url).option("routingKeyColumn", "rk").mode(
            "append"
        ).save()
    with pytest.raises(Exception, match="option 'exchange': exchange 'no-such-exchange' not found"):
        bodies.write.format("warren").option("url", url).option(
            "exchange", "no-such-exchange"
        ).option("routingKey", "x").mode("append").save()


def test_no_connection_is_left_open(
    spark: Any, spark_broker: BrokerInfo, stream: Callable[..., str], tmp_path: Any
) -> None:
    """After a batch read, and after a streaming query stops (counted on the embedded Warren)."""
    if spark_broker.embedded is None:
        pytest.skip("counts the embedded Warren's connections (WARREN_SPARK_BROKER_URL is set)")
    warren = spark_broker.embedded
    url = spark_broker.url

    def ours() -> int:
        return warren.call(
            lambda: sum(
                1
                for conn in warren.broker.connections
                if str(conn.client_properties.get("connection_name", "")).startswith("warren-spark")
            )
        )

    def wait_for_none() -> None:
        deadline = time.monotonic() + 10
        while ours():
            assert time.monotonic() < deadline, f"{ours()} connections still open"
            time.sleep(0.05)

    queue = stream()
    publish(url, queue, [b"m%d" % i for i in range(100)])
    assert (
        spark.read.format("warren").option("url", url).option("queue", queue).load().count() == 100
    )
    wait_for_none()
    query = (
        spark.readStream.format("warren")
        .option("url", url)
        .option("queue", queue)
        .option("startingOffsets", "earliest")
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    try:
        query.processAllAvailable()
        publish(url, queue, [b"more"] * 10)
        query.processAllAvailable()
    finally:
        query.stop()
    wait_for_none()
