"""The warren sink against a real broker: what arrives, where, and how often.

The sink writes to classic queues here (they need no stream support); the
messages are then taken back with basic.get and compared with the rows.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from .helpers import BrokerInfo, channel, declare_queue, drain, message_count

pytestmark = pytest.mark.spark

KEY = re.compile(r"^(?P<write>[0-9a-f-]+):(?P<batch>\d+):(?P<partition>\d+):(?P<row>\d+)$")


def writer(df: Any, url: str, **options: Any) -> Any:
    w = df.write.format("warren").option("url", url).mode("append")
    for key, value in options.items():
        w = w.option(key, str(value))
    return w


def test_batch_write_delivers_every_row_once_with_its_columns(
    spark: Any, spark_broker: BrokerInfo, names: Callable[[str], str]
) -> None:
    url = spark_broker.url
    queue = names("q")
    declare_queue(url, queue)
    df = (
        spark.range(500)
        .selectExpr(
            "cast(id as string) as body",
            "map('n', cast(id as string), 'const', 'c') as headers",
            "concat('m', id) as message_id",
            "'text/plain' as content_type",
            "cast(id % 10 as int) as priority",
            "timestamp'2024-01-02 03:04:05' as timestamp",
        )
        .repartition(3)
    )
    writer(df, url, routingKey=queue).save()

    got = drain(url, queue)
    assert sorted(int(body) for _, body in got) == list(range(500))
    keys = set()
    for props, body in got:
        i = int(body)
        headers = dict(props.headers or {})
        key = headers.pop("x-deduplication-header")
        assert KEY.match(key), key
        keys.add(key)
        assert headers == {"n": str(i), "const": "c"}
        assert (props.message_id, props.content_type, props.priority) == (
            f"m{i}",
            "text/plain",
            i % 10,
        )
        assert props.delivery_mode == 2  # persistent unless told otherwise
        assert props.timestamp == 1704164645
    assert len(keys) == 500
    assert len({KEY.match(k)["partition"] for k in keys}) == 3  # type: ignore[index]


def test_routing_key_column_routes_each_row(
    spark: Any, spark_broker: BrokerInfo, names: Callable[[str], str]
) -> None:
    url = spark_broker.url
    red, blue = names("red"), names("blue")
    with channel(url) as c:
        for queue in (red, blue):
            c.queue_declare(1, queue, durable=True)
            c.queue_bind(1, queue, "amq.direct", queue)
    rows = [(f"r{i}", red if i % 3 else blue) for i in range(60)]
    df = spark.createDataFrame(rows, "body string, destination string")
    writer(
        df, url, exchange="amq.direct", routingKeyColumn="destination", persistent="false"
    ).save()
    assert sorted(b.decode() for _, b in drain(url, red)) == sorted(b for b, d in rows if d == red)
    blue_got = drain(url, blue)
    assert sorted(b.decode() for _, b in blue_got) == sorted(b for b, d in rows if d == blue)
    assert all(p.delivery_mode is None for p, _ in blue_got)


def test_a_nack_fails_the_write(
    spark: Any, spark_broker: BrokerInfo, names: Callable[[str], str]
) -> None:
    url = spark_broker.url
    queue = names("full")
    declare_queue(url, queue, {"x-max-length": 10, "x-overflow": "reject-publish"})
    df = spark.range(50).selectExpr("cast(id as string) as body").coalesce(1)
    with pytest.raises(Exception, match="nacked"):
        writer(df, url, routingKey=queue).save()
    assert message_count(url, queue) == 10


def _replay_last_batch(checkpoint: Path) -> int:
    """Forget that the last micro-batch was committed, as if the query died right after
    its tasks published; returns that batch's id."""
    commits = checkpoint / "commits"
    last = max(int(f) for f in os.listdir(commits) if f.isdigit())
    (commits / str(last)).unlink()
    crc = commits / f".{last}.crc"
    if crc.exists():
        crc.unlink()
    return last


def test_a_replayed_micro_batch_is_dropped_by_deduplication(
    spark: Any,
    spark_broker: BrokerInfo,
    names: Callable[[str], str],
    tmp_path: Path,
    warren_only: None,
) -> None:
    """Warren's x-message-deduplication drops the replay; a plain queue shows it happened."""
    url = spark_broker.url
    deduplicated, plain = names("dedup"), names("plain")
    with channel(url) as c:
        c.queue_declare(
            1,
            deduplicated,
            durable=True,
            arguments={"x-message-deduplication": True, "x-cache-size": 100_000},
        )
        c.queue_declare(1, plain, durable=True)
        for queue in (deduplicated, plain):
            c.queue_bind(1, queue, "amq.direct", f"key-{deduplicated}")
    checkpoint = tmp_path / "ck"

    def run() -> list[int]:
        source = (
            spark.readStream.format("rate-micro-batch")
            .option("rowsPerBatch", 300)
            .option("numPartitions", 2)
            .load()
            .selectExpr("cast(value as string) as body")
        )
        query = (
            source.writeStream.format("warren")
            .option("url", url)
            .option("exchange", "amq.direct")
            .option("routingKey", f"key-{deduplicated}")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(90)
        assert not query.isActive and query.exception() is None
        return [p["batchId"] for p in query.recentProgress if p["numInputRows"]]

    first = run()
    replayed = _replay_last_batch(checkpoint)
    second = run()
    assert replayed in second  # Spark ran the batch again, with the same id

    plain_bodies = Counter(b for _, b in drain(url, plain))
    dedup_bodies = Counter(b for _, b in drain(url, deduplicated))
    assert max(plain_bodies.values()) == 2  # the replay published its rows twice...
    assert sum(plain_bodies.values()) == 300 * (len(first) + len(second))
    assert set(dedup_bodies) == set(plain_bodies)  # ...and the deduplicating queue
    assert max(dedup_bodies.values()) == 1  # kept each row once
