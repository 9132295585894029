"""The sink's Kafka-style columns, unroutable rows, and exactly-once through a
broker kill -9 (a real broker process, restarted on its data dir and port)."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from warren.amqp import spec

from .helpers import BrokerInfo, channel, declare_queue, drain, message_count, wait_for_count
from .test_sink import writer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from procs import Process, start_warren  # noqa: E402

pytestmark = pytest.mark.spark


def test_kafka_columns_and_unroutable_rows(
    spark: Any, spark_broker: BrokerInfo, names: Callable[[str], str]
) -> None:
    """value = body, key = routing key, topic = exchange; a row no queue takes fails
    the write naming its routing key, unless failOnUnroutable=false drops it."""
    url = spark_broker.url
    red, blue = names("red"), names("blue")
    with channel(url) as c:
        for queue in (red, blue):
            c.queue_declare(1, queue, durable=True)
            c.queue_bind(1, queue, "amq.direct", queue)
    rows = [(red if i % 2 else blue, f"v{i}".encode(), "amq.direct") for i in range(20)]
    df = spark.createDataFrame(rows, "key string, value binary, topic string").coalesce(1)
    writer(df, url).save()
    assert sorted(b for _, b in drain(url, red)) == sorted(v for k, v, _ in rows if k == red)
    assert message_count(url, blue) == 10

    lost = names("nobody")
    df = spark.createDataFrame([(lost, b"x"), (red, b"y")], "key string, value binary")
    with pytest.raises(Exception, match=f"unroutable.*routing key '{lost}'"):
        writer(df.coalesce(1), url, exchange="amq.direct").save()
    writer(df.coalesce(1), url, exchange="amq.direct", failOnUnroutable="false").save()
    assert message_count(url, red) == 2  # drained; the failed write had sent "y" too


def start(data: Path, *args: str) -> tuple[Process, int]:
    """A broker process whose log is read on (a full pipe would stall it)."""
    proc, port = start_warren(data, *args)
    out = proc.stdout
    assert out is not None
    threading.Thread(target=lambda: [None for _ in out], daemon=True).start()
    return proc, port


ROWS = 4000


def active(query: Any) -> Callable[[], None]:
    """For wait_for_count: fails the wait with the query's error once it stopped."""

    def check() -> None:
        assert query.isActive, query.exception()

    return check


def rate_to_queue(
    spark: Any, url: str, queue: str, checkpoint: Path, trigger: dict[str, Any], **options: Any
) -> Any:
    """A streaming write of rate-micro-batch rows (ROWS a batch, 2 partitions,
    the value as the body) into ``queue``."""
    writer = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", ROWS)
        .option("numPartitions", 2)
        .load()
        .selectExpr("cast(value as string) as body")
        .writeStream.format("warren")
        .option("url", url)
        .option("routingKey", queue)
        .option("checkpointLocation", str(checkpoint))
    )
    for key, value in options.items():
        writer = writer.option(key, value)
    return writer.trigger(**trigger).start()


@pytest.mark.parametrize("deduplicating", ["queue", "exchange"])
def test_exactly_once_through_a_broker_kill_9(
    spark: Any, tmp_path: Path, warren_only: None, deduplicating: str
) -> None:
    """A streaming write into a deduplicating queue, or through a deduplicating
    exchange into a plain queue; the broker is killed with SIGKILL while tasks
    publish, restarted on the same data dir and port, and the query restarted
    from its checkpoint: the queue holds each row exactly once."""
    data = tmp_path / "data"
    proc, port = start(data)
    url = f"amqp://guest:guest@127.0.0.1:{port}/"
    queue = "exactly-once"
    dedup = {"x-message-deduplication": True, "x-cache-size": 1_000_000}
    target: dict[str, Any] = {}
    if deduplicating == "queue":
        declare_queue(url, queue, dedup)
    else:
        declare_queue(url, queue)
        with channel(url) as c:
            declare = spec.ExchangeDeclare(
                exchange="exactly-once-x", type="fanout", durable=True, arguments=dedup
            )
            c.rpc(1, declare, spec.ExchangeDeclareOk)
            c.queue_bind(1, queue, "exactly-once-x", "")
        # A duplicate is unroutable at an exchange: the replay's returns must not
        # fail the write (docs/spark.md).
        target.update(exchange="exactly-once-x", failOnUnroutable="false")
    rows = ROWS

    def query(trigger: dict[str, Any], retries: int) -> Any:
        return rate_to_queue(
            spark, url, queue, tmp_path / "ck", trigger, maxRetries=retries, **target
        )

    try:
        # No retries: the kill fails the query (the sink's default waits for the
        # broker instead: the next test).
        q = query({"processingTime": "0 seconds"}, 0)
        # Into the second batch.
        wait_for_count(url, queue, rows + 1, 60, "the query published nothing", active(q))
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        with pytest.raises(Exception, match="Writing job failed"):
            q.awaitTermination(60)  # the failed query raises its exception here
        assert not q.isActive

        proc, _ = start(data, "--amqp-port", str(port))
        before = message_count(url, queue)
        q = query({"availableNow": True}, 10)
        q.awaitTermination(90)
        assert not q.isActive and q.exception() is None
        bodies = [int(b) for _, b in drain(url, queue)]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    assert before >= rows  # the kill came mid-write: at least a batch was there
    assert len(bodies) == len(set(bodies)), f"{len(bodies) - len(set(bodies))} duplicates"
    assert sorted(bodies) == list(range(len(bodies)))  # no row missing
    assert len(bodies) % rows == 0 and len(bodies) > before - rows


def test_a_running_write_rides_out_a_broker_kill_9(
    spark: Any, tmp_path: Path, warren_only: None
) -> None:
    """The broker is killed with SIGKILL while tasks publish and started again on
    the same data dir and port: the query is not restarted; its tasks connect
    again and publish what was unconfirmed again, and the deduplicating queue
    (its keys on disk) holds each row exactly once."""
    data = tmp_path / "data"
    proc, port = start(data)
    url = f"amqp://guest:guest@127.0.0.1:{port}/"
    queue = "rides-out"
    declare_queue(url, queue, {"x-message-deduplication": True, "x-cache-size": 1_000_000})
    rows = ROWS

    def query(trigger: dict[str, Any]) -> Any:
        retries = {"retryBackoffMs": 100, "retryMaxBackoffMs": 500, "maxRetries": 60}
        return rate_to_queue(spark, url, queue, tmp_path / "ck", trigger, **retries)

    try:
        q = query({"processingTime": "0 seconds"})
        # Into the second batch; generous: a busy machine.
        wait_for_count(url, queue, rows + 1, 180, "the query published nothing", active(q))
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        proc, _ = start(data, "--amqp-port", str(port))
        # Batches past the restart.
        wait_for_count(url, queue, 4 * rows, 180, "the query did not go on", active(q))
        assert q.isActive and q.exception() is None
        q.stop()  # possibly mid-batch: the next query finishes that batch
        q = query({"availableNow": True})
        q.awaitTermination(180)
        assert not q.isActive and q.exception() is None
        bodies = [int(b) for _, b in drain(url, queue)]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    assert len(bodies) == len(set(bodies)), f"{len(bodies) - len(set(bodies))} duplicates"
    assert sorted(bodies) == list(range(len(bodies)))  # no row missing
    assert len(bodies) % rows == 0 and len(bodies) >= 4 * rows
