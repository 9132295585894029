"""Reading a super stream as one table, one or more Spark partitions per partition.

A super stream is made here as RabbitMQ's Java client makes one over AMQP
0-9-1 (a direct exchange with ``x-super-stream``, streams bound with
``x-stream-partition-order``), so the same tests run against RabbitMQ. The
source learns the partitions from the exchange's bindings through the
management API, as subscribePattern lists streams.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from warren.amqp import spec
from warren.client import AMQPError
from warren.spark.listing import partition_order
from warren.spark.options import OptionError, SourceOptions

from .helpers import BrokerInfo, channel, declare_stream, delete_queue, publish
from .test_source import offsets_in, run_available_now

pytestmark = pytest.mark.spark

ORDER = "x-stream-partition-order"


def bind_partition(url: str, exchange: str, stream: str, key: str, order: int) -> None:
    declare_stream(url, stream)
    with channel(url) as c:
        c.rpc(
            1,
            spec.QueueBind(
                queue=stream, exchange=exchange, routing_key=key, arguments={ORDER: order}
            ),
            spec.QueueBindOk,
        )


@pytest.fixture
def super_stream(
    spark_broker: BrokerInfo, names: Callable[[str], str]
) -> Iterator[Callable[[int], tuple[str, list[str]]]]:
    """make(n): a super stream of n partitions ``name-0``... bound with keys "0"...;
    the exchange and its partitions are deleted after the test."""
    url = spark_broker.url
    exchanges: list[str] = []

    def make(n: int) -> tuple[str, list[str]]:
        name = names("ss")
        exchanges.append(name)
        with channel(url) as c:
            c.rpc(
                1,
                spec.ExchangeDeclare(
                    exchange=name, type="direct", durable=True, arguments={"x-super-stream": True}
                ),
                spec.ExchangeDeclareOk,
            )
        # Bound in reverse: the order comes from the binding argument, not the listing.
        for i in reversed(range(n)):
            bind_partition(url, name, f"{name}-{i}", str(i), i)
        return name, [f"{name}-{i}" for i in range(n)]

    yield make
    for name in exchanges:
        for i in range(8):
            delete_queue(url, f"{name}-{i}")
        with channel(url) as c, contextlib.suppress(AMQPError):
            c.exchange_delete(1, name)


def management(broker: BrokerInfo) -> dict[str, str]:
    """managementUrl for the embedded Warren (its HTTP port is a free one); for a broker
    at WARREN_SPARK_BROKER_URL, WARREN_SPARK_MANAGEMENT_URL or the default (port 15672
    of the broker's host)."""
    if broker.embedded is None:
        given = os.environ.get("WARREN_SPARK_MANAGEMENT_URL")
        return {"managementUrl": given} if given else {}
    return {"managementUrl": f"http://127.0.0.1:{broker.embedded.http_port}/"}


def load(spark: Any, broker: BrokerInfo, name: str, streaming: bool = False, **opts: Any) -> Any:
    r = (spark.readStream if streaming else spark.read).format("warren")
    options = {"url": broker.url, "superStream": name, **management(broker), **opts}
    for key, value in options.items():
        r = r.option(key, str(value))
    return r.load()


def test_partitions_in_binding_order_and_options() -> None:
    """RabbitMQ's order (x-stream-partition-order, those without after them), each
    stream once; superStream excludes the other ways to subscribe."""
    bindings = [
        {"destination": "s-x", "destination_type": "queue", "arguments": {}},
        {"destination": "s-1", "destination_type": "queue", "arguments": {ORDER: "1"}},
        {"destination": "e", "destination_type": "exchange", "arguments": {ORDER: 0}},
        {"destination": "s-0", "destination_type": "queue", "arguments": {ORDER: 0}},
        {"destination": "s-1", "destination_type": "queue", "arguments": {ORDER: 3}},
    ]
    assert partition_order(bindings) == ["s-0", "s-1", "s-x"]
    o = SourceOptions.parse(
        {"url": "amqp://h/", "superStream": "s", "startingOffsets": '{"s-1": 7}'}, streaming=True
    )
    assert (o.super_stream, o.queues, o.starting["s-1"].value) == ("s", (), 7)
    with pytest.raises(OptionError, match="give option 'subscribePattern' or 'superStream'"):
        SourceOptions.parse(
            {"url": "amqp://h/", "superStream": "s", "subscribePattern": "s-.*"}, False
        )
    with pytest.raises(OptionError, match="names queues not subscribed to: s"):
        SourceOptions.parse(
            {"url": "amqp://h/", "superStream": "s", "startingOffsets": '{"s": 1}'}, False
        )


def test_batch_read_and_sink_routing(
    spark: Any, spark_broker: BrokerInfo, super_stream: Callable[[int], tuple[str, list[str]]]
) -> None:
    """Every partition read whole, each in its own Spark partitions; rows the sink
    writes to the super stream's exchange land in the partition their key is bound to."""
    url = spark_broker.url
    name, parts = super_stream(3)
    for i in range(3):
        publish(url, str(i), [b"p%d-%d" % (i, n) for n in range(10 * (i + 1))], exchange=name)

    df = load(spark, spark_broker, name, minPartitions=1)
    got = sorted((r.queue, r.offset, bytes(r.body)) for r in df.collect())
    assert got == sorted(
        (stream, n, b"p%d-%d" % (i, n))
        for i, stream in enumerate(parts)
        for n in range(10 * (i + 1))
    )
    # One Spark partition per stream partition at least (minPartitions=1), more on demand.
    assert df.rdd.getNumPartitions() == 3
    split = load(spark, spark_broker, name, minPartitions=1, maxRecordsPerPartition=10)
    assert split.rdd.getNumPartitions() == 1 + 2 + 3

    rows = [(f"w{n}", str(n % 3)) for n in range(30)]
    written = spark.createDataFrame(rows, "body string, key string")
    sink = written.write.format("warren").option("url", url).option("exchange", name)
    sink.option("routingKeyColumn", "key").mode("append").save()
    starts = json.dumps({stream: 10 * (i + 1) for i, stream in enumerate(parts)})
    again = load(spark, spark_broker, name, startingOffsets=starts)
    landed = sorted((r.queue, bytes(r.body).decode()) for r in again.collect())
    assert landed == sorted((parts[int(k)], b) for b, k in rows)
    stray = spark.createDataFrame([("x", "9")], "body string, key string")
    with pytest.raises(Exception, match="unroutable"):
        stray.write.format("warren").option("url", url).option("exchange", name).option(
            "routingKeyColumn", "key"
        ).mode("append").save()

    with pytest.raises(Exception, match="option 'superStream': no super stream 'nope-"):
        load(spark, spark_broker, f"nope-{name}").collect()


def test_streaming_restart_resumes_each_partition_and_finds_a_new_one(
    spark: Any,
    spark_broker: BrokerInfo,
    super_stream: Callable[[int], tuple[str, list[str]]],
    tmp_path: Path,
) -> None:
    """Offsets per partition in the checkpoint: a restarted query reads exactly what
    came since in each, and a partition added meanwhile from its first offset; one
    deleted fails the query unless failOnDataLoss is false."""
    url = spark_broker.url
    name, parts = super_stream(3)
    for i in range(3):
        publish(url, str(i), [b"a"] * (20 + 10 * i), exchange=name)
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")

    def run(**options: Any) -> list[int]:
        df = load(
            spark,
            spark_broker,
            name,
            True,
            startingOffsets="earliest",
            maxRecordsPerTrigger=40,
            **options,
        )
        return run_available_now(df, out, ck)

    first = run()
    assert sum(first) == 90 and max(first) <= 40
    new = f"{name}-3"
    bind_partition(url, name, new, "3", 3)
    publish(url, "0", [b"b"] * 5, exchange=name)
    publish(url, "2", [b"b"] * 7, exchange=name)
    publish(url, "3", [b"b"] * 11, exchange=name)
    second = run()
    assert sum(second) == 23
    expected = (
        [(parts[0], n) for n in range(25)]
        + [(parts[1], n) for n in range(30)]
        + [(parts[2], n) for n in range(47)]
        + [(new, n) for n in range(11)]
    )
    assert offsets_in(spark, out) == sorted(expected)

    delete_queue(url, parts[1])
    publish(url, "0", [b"c"] * 3, exchange=name)
    with pytest.raises(Exception, match=f"stream '{parts[1]}' is no longer a partition"):
        run()
    assert run(failOnDataLoss="false") == [3]
    assert offsets_in(spark, out) == sorted(expected + [(parts[0], n) for n in range(25, 28)])
