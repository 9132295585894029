"""Sensor readings -> a Warren stream -> Spark -> Parquet averages and AMQP alerts.

    make run                                        # terminal 1: the broker
    .venv/bin/python examples/spark_pipeline/run.py # terminal 2: everything else

Runs sensors (a pika publisher), the Structured Streaming job (job.py) and an
alert consumer together for ``--seconds``, then stops the queries and shows
the averages Spark wrote to Parquet. Run it again and the queries go on from
their checkpoints. ``--once`` instead publishes a fixed, simulated hour of
readings and runs the queries with ``trigger(availableNow=True)``, on a stream,
an alert queue and an output directory of its own, made afresh every time.
"""

from __future__ import annotations

import argparse
import datetime as dt
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import alerts  # noqa: E402
import job  # noqa: E402
import pika  # noqa: E402
import sensors  # noqa: E402

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/"


def spark_session() -> Any:
    from pyspark.sql import SparkSession

    from warren.spark import register

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("warren-sensor-pipeline")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    register(spark)
    return spark


def declare(url: str, topology: sensors.Topology = sensors.LIVE, *, fresh: bool = False) -> None:
    """Declare the topology's queues and exchanges; ``fresh``: delete them first."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        if fresh:
            sensors.delete(channel, topology)
        sensors.declare(channel, topology)
    finally:
        connection.close()


def publish_rounds(
    url: str,
    rounds: Any,
    stop: threading.Event,
    interval_s: float,
    topology: sensors.Topology = sensors.LIVE,
) -> int:
    """Publish rounds of readings (confirmed) until ``rounds`` ends or ``stop`` is set."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    published = 0
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        for batch in rounds:
            if stop.is_set():
                break
            sensors.publish(channel, batch, topology)
            published += len(batch)
            if interval_s:
                stop.wait(interval_s)
    finally:
        connection.close()
    return published


def show_averages(spark: Any, out: Path, limit: int = 20) -> list[Any]:
    path = out / "averages"
    if not path.exists():
        print("no averages written yet (a window is written once the watermark passes it)")
        return []
    rows = spark.read.parquet(str(path)).orderBy("window_start", "sensor").collect()
    print(f"{len(rows)} window averages in {path}; the last {min(limit, len(rows))}:")
    for row in rows[-limit:]:
        print(
            f"  {row.window_start:%H:%M:%S}-{row.window_end:%H:%M:%S} {row.sensor:>4}"
            f"  avg {row.avg_value:7.3f}  max {row.max_value:6.2f}  n {row.readings}"
        )
    return rows


def run_once(
    spark: Any, url: str, out: Path, *, sensor_count: int = 6, rounds: int = 3600
) -> tuple[list[Any], list[dict[str, object]]]:
    """Publish ``rounds`` simulated seconds of readings, process them with availableNow,
    and return the averages in Parquet and the alerts consumed.

    Every run starts over, apart from the live run and from earlier runs: on its own
    stream and alert queue (sensors.ONCE, deleted and declared again) and in its own
    directory ``out/once`` (emptied), so no other readings, offsets or watermark
    (the live run's are of today, past the simulated hour) can change what it writes."""
    topology = sensors.ONCE
    out = out / "once"
    shutil.rmtree(out, ignore_errors=True)
    declare(url, topology, fresh=True)
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    source = sensors.readings(sensor_count, start, dt.timedelta(seconds=1))
    limited = (next(source) for _ in range(rounds))
    publish_rounds(url, limited, threading.Event(), 0, topology)
    queries = job.start(
        spark, url, out, topology=topology, available_now=True, max_per_trigger=5000
    )
    for query in queries:
        query.awaitTermination()
    got: list[dict[str, object]] = []
    expected = sum(1 for _ in _over_threshold(sensor_count, start, rounds))
    stop = threading.Event()

    def collect(alert: dict[str, object]) -> None:
        alerts.show(alert)
        got.append(alert)
        if len(got) >= expected:
            stop.set()

    consumer = threading.Thread(target=alerts.consume, args=(url, stop, collect, topology))
    consumer.start()
    consumer.join(timeout=60)
    stop.set()
    return show_averages(spark, out), got


def _over_threshold(sensor_count: int, start: dt.datetime, rounds: int) -> Any:
    source = sensors.readings(sensor_count, start, dt.timedelta(seconds=1))
    for _ in range(rounds):
        for reading in next(source):
            if reading.value > sensors.THRESHOLD:
                yield reading


def run_live(
    spark: Any,
    url: str,
    out: Path,
    seconds: float,
    sensor_count: int,
    *,
    rounds: int | None = None,
    interval_s: float = 0.5,
) -> None:
    """Publish readings of the current time every ``interval_s`` for ``seconds``
    (or ``rounds`` of them, if that comes first) while the queries run."""
    declare(url)
    stop = threading.Event()
    consumer = threading.Thread(target=alerts.consume, args=(url, stop, alerts.show))
    consumer.start()
    queries = job.start(spark, url, out)
    now = dt.datetime.now(dt.UTC)
    seed = int(time.time())
    source = sensors.readings(sensor_count, now, dt.timedelta(seconds=0.5), seed=seed)
    limited = source if rounds is None else (next(source) for _ in range(rounds))
    publisher = threading.Thread(target=publish_rounds, args=(url, limited, stop, interval_s))
    publisher.start()
    bound = f"{seconds:.0f} s" if rounds is None else f"{seconds:.0f} s or {rounds} rounds"
    print(f"publishing {sensor_count} sensors every {interval_s} s for {bound} (Ctrl-C stops)")
    try:
        publisher.join(timeout=seconds)
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        publisher.join()
        for query in queries:
            query.processAllAvailable()
            query.stop()
        consumer.join()
    show_averages(spark, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=DEFAULT_URL, help=f"the broker (default {DEFAULT_URL})")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("spark-pipeline-output"),
        help="Parquet and checkpoints (default ./spark-pipeline-output)",
    )
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--sensors", type=int, default=8)
    parser.add_argument(
        "--rounds", type=int, default=None, help="live: stop after this many rounds of readings"
    )
    parser.add_argument(
        "--once",
        action="store_true",
        help="a simulated hour of readings, processed with availableNow",
    )
    args = parser.parse_args()
    spark = spark_session()
    try:
        if args.once:
            run_once(spark, args.url, args.out, sensor_count=args.sensors)
        else:
            run_live(spark, args.url, args.out, args.seconds, args.sensors, rounds=args.rounds)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
