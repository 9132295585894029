"""A spark-submit job for tests/spark/test_deploy_cluster.py: on a standalone
cluster whose nodes' Python has no Warren, with Warren's pure-Python wheel
shipped by ``--py-files``.

    cluster_job.py URL STREAM TARGET CHECKPOINT OUT.json

1. a batch read of STREAM in several partitions, each row tagged with the
   working directory (the executor's, under its worker's work dir) and the file
   Warren was imported from by the Python worker that read it;
2. a streaming read of STREAM into the sink (queue TARGET) with a checkpoint,
   trigger(availableNow=True) in micro-batches of 60, run twice on the same
   checkpoint (the second run has nothing left to write).

Writes what it saw to OUT.json for the test to check.
"""

from __future__ import annotations

import json
import sys

from pyspark.sql import SparkSession
from pyspark.sql.functions import udf
from pyspark.sql.types import StringType

import warren
from warren.spark import register


@udf(StringType())
def where() -> str:
    import os

    import warren as w  # the Python worker's own import

    return f"{os.getcwd()}|{os.path.abspath(w.__file__)}"


def main(url: str, stream: str, target: str, checkpoint: str, out: str) -> None:
    spark = SparkSession.builder.appName("warren-cluster-job").getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    register(spark)

    rows = (
        spark.read.format("warren")
        .option("url", url)
        .option("queue", stream)
        .option("minPartitions", 4)
        .load()
        .select("offset", "body", where().alias("where"))
        .collect()
    )
    read = [[r.offset, r.body.decode(), *r.where.split("|")] for r in rows]

    batches = []
    for _run in range(2):
        query = (
            spark.readStream.format("warren")
            .option("url", url)
            .option("queue", stream)
            .option("startingOffsets", "earliest")
            .option("maxRecordsPerTrigger", 60)
            .load()
            .select("body")
            .writeStream.format("warren")
            .option("url", url)
            .option("routingKey", target)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        batches.append([p["numInputRows"] for p in query.recentProgress])

    with open(out, "w") as f:
        json.dump({"driver_warren": warren.__file__, "read": read, "batches": batches}, f)
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:6])
