"""The Structured Streaming job: windowed averages to Parquet, threshold alerts to AMQP.

Two queries read the readings stream (``sensor-readings``; ``--once``:
``sensor-readings-once``) independently, each with its own checkpoint (as two
Kafka consumers of one topic would):

* averages: readings parsed from JSON, a 30 s watermark on their own event
  time, per-sensor averages over 10 s windows, appended to Parquet once a
  window can no longer change;
* alerts: every reading above the threshold, published to the topic exchange
  ``sensor-alerts`` (``sensor-alerts-once``) with the routing key ``alert.<sensor>``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from sensors import LIVE, THRESHOLD, Topology

READING_SCHEMA = "sensor STRING, value DOUBLE, time TIMESTAMP"
WINDOW = "10 seconds"
WATERMARK = "30 seconds"


def readings(
    spark: SparkSession, url: str, topology: Topology, max_per_trigger: int | None = None
) -> DataFrame:
    """The stream's readings: the JSON body's fields, plus where the message was."""
    reader = (
        spark.readStream.format("warren")
        .option("url", url)
        .option("queue", topology.readings_stream)
        .option("startingOffsets", "earliest")
    )
    if max_per_trigger:
        reader = reader.option("maxRecordsPerTrigger", max_per_trigger)
    raw = reader.load()
    return raw.select(
        "offset", F.from_json(F.col("body").cast("string"), READING_SCHEMA).alias("r")
    ).select("offset", "r.*")


def averages(readings: DataFrame) -> DataFrame:
    return (
        readings.withWatermark("time", WATERMARK)
        .groupBy(F.window("time", WINDOW).alias("window"), "sensor")
        .agg(
            F.round(F.avg("value"), 3).alias("avg_value"),
            F.max("value").alias("max_value"),
            F.count("*").alias("readings"),
        )
        .select(
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            "sensor",
            "avg_value",
            "max_value",
            "readings",
        )
    )


def alerts(readings: DataFrame) -> DataFrame:
    """One message per reading over the threshold, in the sink's columns."""
    return readings.where(F.col("value") > THRESHOLD).select(
        F.to_json(F.struct("sensor", "value", "time", "offset")).alias("body"),
        F.concat(F.lit("alert."), F.col("sensor")).alias("routing_key"),
        F.lit("application/json").alias("content_type"),
    )


def start(
    spark: SparkSession,
    url: str,
    out: Path,
    *,
    topology: Topology = LIVE,
    available_now: bool = False,
    max_per_trigger: int | None = None,
) -> list[Any]:
    """Start both queries; with ``available_now`` they stop once the stream is read."""
    source = readings(spark, url, topology, max_per_trigger)

    def trigger(writer: Any) -> Any:
        return (
            writer.trigger(availableNow=True)
            if available_now
            else writer.trigger(processingTime="2 seconds")
        )

    to_parquet = trigger(
        averages(source)
        .writeStream.queryName("sensor-averages")
        .format("parquet")
        .outputMode("append")
        .option("path", str(out / "averages"))
        .option("checkpointLocation", str(out / "checkpoints" / "averages"))
    ).start()
    to_alerts = trigger(
        alerts(source)
        .writeStream.queryName("sensor-alerts")
        .format("warren")
        .option("url", url)
        .option("exchange", topology.alerts_exchange)
        .option("routingKeyColumn", "routing_key")
        .option("checkpointLocation", str(out / "checkpoints" / "alerts"))
    ).start()
    return [to_parquet, to_alerts]
