"""A Spark Connect client for tests/spark/test_deploy_connect.py, run in its own
process (a Connect session turns pyspark of its process to Connect mode, which
the classic SparkSession of the other Spark tests must not meet).

    connect_job.py sc://HOST:PORT URL STREAM TARGET CHECKPOINT OUT.json

Registers the source on the Connect session, reads STREAM in batch (3
partitions), writes the bodies to queue TARGET, reads STREAM once more as a
stream (trigger(availableNow=True), into the memory sink), and writes what it
saw to OUT.json.
"""

from __future__ import annotations

import json
import sys

from pyspark.sql import SparkSession

from warren.spark import register


def main(remote: str, url: str, stream: str, target: str, checkpoint: str, out: str) -> None:
    spark = SparkSession.builder.remote(remote).getOrCreate()
    register(spark)  # spark.dataSource.register(WarrenDataSource), on the Connect session

    df = (
        spark.read.format("warren")
        .option("url", url)
        .option("queue", stream)
        .option("minPartitions", 3)
        .load()
    )
    read = [[r.offset, r.body.decode()] for r in df.select("offset", "body").collect()]

    df.select("body").write.format("warren").option("url", url).option("routingKey", target).mode(
        "append"
    ).save()

    query = (
        spark.readStream.format("warren")
        .option("url", url)
        .option("queue", stream)
        .option("startingOffsets", "earliest")
        .load()
        .select("offset", "body")
        .writeStream.format("memory")
        .queryName("warren_connect")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    streamed = [
        [r.offset, r.body.decode()] for r in spark.sql("SELECT * FROM warren_connect").collect()
    ]

    with open(out, "w") as f:
        json.dump({"session": type(spark).__module__, "read": read, "streamed": streamed}, f)
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:7])
