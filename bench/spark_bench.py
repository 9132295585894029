"""Throughput of the ``warren`` Spark data source: batch read and sink, with ceilings.

    .venv/bin/python bench/spark_bench.py                  # starts a Warren from this checkout
    .venv/bin/python bench/spark_bench.py --url amqp://guest:guest@127.0.0.1:5672/ --json > rabbitmq.json
    .venv/bin/python bench/spark_bench.py --markdown warren.json rabbitmq.json  # docs/benchmarks.md

Spark runs local[2], as in the tests. Measured, each the best of --repeat runs:

* read: ``spark.read.format("warren")`` of N messages (--size bytes each, no
  properties, published beforehand by a raw publisher) into Spark's ``noop``
  sink, end to end: planning, the reads in the executors, Spark's own work;
  and the same for each minPartitions of --partitions (the scaling curve);
* write: ``df.write.format("warren")`` of --write-messages cached rows (a
  string ``body`` of --size bytes) into a fresh stream, until the broker
  confirmed every message;
* the ceilings on the same machine: Spark's ``rate-micro-batch`` source into
  ``noop`` (Spark alone), a Python data source that yields the warren
  schema's Arrow batches from memory (Spark plus the Python data source
  path, no broker), a Python sink that only counts its rows, and
  ``spark.range(N)`` with the same body written as Parquet (Spark's own
  reader and writer, no Python);
* the reader without Spark: the executors' read loop in two processes.

``--write-only`` measures the write and the Parquet and counting-sink
ceilings alone.

Broker, Spark and the Python workers share the machine's CPUs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from multiprocessing import Process, Queue
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from warren.amqp import spec  # noqa: E402
from warren.amqp.frames import content_frames, method_frame  # noqa: E402
from warren.client import AMQPError, Client  # noqa: E402


def log(message: str) -> None:
    print(f"[spark-bench] {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def warren_broker() -> Iterator[str]:
    """A Warren in a subprocess on a free port with a temporary data directory."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="warren-spark-bench-") as tmp:
        cmd = [
            sys.executable,
            "-m",
            "warren",
            "--amqp-port",
            str(port),
            "--http-port",
            "-1",
            "--mqtt-port",
            "-1",
            "--stream-port",
            "-1",
            "--prometheus-port",
            "-1",
            "-D",
            f"{tmp}/data",
            "--log-level",
            "warning",
        ]
        env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
        with open(f"{tmp}/warren.log", "wb") as logf:
            proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env)
        try:
            deadline = time.monotonic() + 30
            while True:
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                    break
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"Warren did not start: {Path(tmp, 'warren.log').read_text()}"
                    )
                time.sleep(0.1)
            log(f"Warren started on port {port} (pid {proc.pid})")
            yield f"amqp://guest:guest@127.0.0.1:{port}/"
        finally:
            proc.terminate()
            proc.wait(30)


def fresh_stream(url: str, name: str) -> None:
    """Delete the stream ``name`` if it exists and declare it again, empty."""
    with Client(url) as client:
        client.channel_open(1)
        try:
            client.rpc(1, spec.QueueDelete(queue=name), spec.QueueDeleteOk)
        except AMQPError:  # the channel is closed; a new one for the declare
            client.channel_open(2)
            client.queue_declare(2, name, durable=True, arguments={"x-queue-type": "stream"})
            return
        client.queue_declare(1, name, durable=True, arguments={"x-queue-type": "stream"})


def publish_plain(url: str, queue: str, count: int, size: int) -> float:
    """Publish ``count`` bodies of ``size`` zero bytes, no properties, with confirms
    (at most 10,000 unconfirmed); returns messages per second."""
    from warren.spark.options import SinkOptions
    from warren.spark.publish import Publisher

    publisher = Publisher(SinkOptions.parse({"url": url, "routingKey": queue})).open()
    one = method_frame(1, spec.BasicPublish(exchange="", routing_key=queue)) + b"".join(
        content_frames(1, b"\x00\x00", bytes(size), publisher.frame_max)
    )
    started = time.perf_counter()
    for lo in range(0, count, 500):
        n = min(500, count - lo)
        publisher.send(one * n, n)
    publisher.flush()
    publisher.close()
    return count / (time.perf_counter() - started)


def spark_session() -> Any:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from warren.spark import register

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("warren-spark-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.driver.memory", "2g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def best(repeat: int, run: Callable[[], Any]) -> tuple[float, list[float]]:
    """(fastest, all) wall times of ``repeat`` runs, after one warm-up."""
    run()
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return min(times), times


# -- ceilings: Spark without the broker --------------------------------------------------


def synthetic_source(count: int, size: int) -> Any:
    """A Python data source yielding the warren schema's batches from memory."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    from warren.spark.columns import schema_ddl, to_batch
    from warren.spark.scan import Rows

    class Reader(DataSourceReader):
        def partitions(self) -> list[InputPartition]:
            return [InputPartition(0), InputPartition(1)]

        def read(self, partition: InputPartition) -> Iterator[Any]:
            left = count // 2
            while left:
                n = min(16384, left)
                rows = Rows()
                rows.offsets = list(range(n))
                rows.stamps = [1_700_000_000_000] * n
                rows.exchanges = [b""] * n
                rows.keys = [b"bench"] * n
                rows.bodies = [bytes(size)] * n
                rows.header_counts = [0] * n
                yield to_batch(rows, "bench")
                left -= n

    class Synthetic(DataSource):
        @classmethod
        def name(cls) -> str:
            return "warren_bench_synthetic"

        def schema(self) -> str:
            return schema_ddl()

        def reader(self, schema: Any) -> Reader:
            return Reader()

    return Synthetic


def counting_sink() -> Any:
    """A Python sink that takes Arrow batches and only counts them."""
    from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

    class Writer(DataSourceArrowWriter):
        def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
            for batch in iterator:
                batch.column(0).to_pylist()  # what the warren sink does first
            return WriterCommitMessage()

    class Counting(DataSource):
        @classmethod
        def name(cls) -> str:
            return "warren_bench_counting"

        def writer(self, schema: Any, overwrite: bool) -> Writer:
            return Writer()

    return Counting


# -- the reader on its own ------------------------------------------------------------------


def _read_part(url: str, queue: str, lo: int, hi: int, out: Queue) -> None:  # type: ignore[type-arg]
    from warren.spark.columns import to_batch
    from warren.spark.stream import read_range

    n = 0
    for rows in read_range(
        url, queue, lo, hi, prefetch=2000, poll_timeout_ms=60_000, fail_on_data_loss=True
    ):
        n += to_batch(rows, queue).num_rows
    out.put((n, time.process_time()))


def reader_alone(url: str, queue: str, first: int, end: int, parts: int = 2) -> dict[str, float]:
    out: Queue = Queue()  # type: ignore[type-arg]
    size = end - first
    started = time.perf_counter()
    procs = [
        Process(
            target=_read_part,
            args=(url, queue, first + size * i // parts, first + size * (i + 1) // parts, out),
        )
        for i in range(parts)
    ]
    for p in procs:
        p.start()
    results = [out.get() for _ in procs]
    for p in procs:
        p.join()
    wall = time.perf_counter() - started
    rows = sum(n for n, _ in results)
    return {"rows_per_s": rows / wall, "cpu_us_per_row": sum(c for _, c in results) / rows * 1e6}


# -- the run ----------------------------------------------------------------------------------


def run(
    url: str,
    count: int,
    size: int,
    repeat: int,
    write_count: int,
    partitions: list[int],
    write_only: bool = False,
) -> dict[str, Any]:
    from warren.spark.stream import Planner

    results: dict[str, Any] = {
        "messages": count,
        "body_bytes": size,
        "write_messages": write_count,
        "load_average_start": os.getloadavg(),
    }
    with Client(url) as probe:
        props = probe.server_properties
    results["broker"] = (
        f"Warren {props['warren_version']}"
        if "warren_version" in props
        else f"{props.get('product')} {props.get('version')}"
    )
    if write_only:
        return _write_part(url, size, repeat, write_count, count, results)
    log(f"publishing {count:,} messages of {size} bytes")
    fresh_stream(url, "spark-bench-read")
    results["publish_raw"] = publish_plain(url, "spark-bench-read", count, size)
    with Planner(url, 60_000) as planner:
        bounds = planner.bounds("spark-bench-read")
    assert bounds.first is not None and bounds.end is not None
    # Before Spark starts: the reader's processes are forked from this one.
    log("the reader without Spark, two processes")
    results["reader_alone"] = reader_alone(url, "spark-bench-read", bounds.first, bounds.end)

    spark = spark_session()
    log("ceiling: Spark's rate-micro-batch source into noop")

    def rate() -> None:
        query = (
            spark.readStream.format("rate-micro-batch")
            .option("rowsPerBatch", count)
            .option("numPartitions", 2)
            .load()
            .writeStream.format("noop")
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()

    t, _ = best(repeat, rate)
    results["rate_source"] = count / t

    log("ceiling: a Python data source of the warren schema, from memory")
    spark.dataSource.register(synthetic_source(count, size))
    t, _ = best(
        repeat,
        lambda: (
            spark.read.format("warren_bench_synthetic")
            .load()
            .write.format("noop")
            .mode("overwrite")
            .save()
        ),
    )
    results["python_source_ceiling"] = count / t

    log("read: spark.read.format('warren') into noop")
    df = spark.read.format("warren").option("url", url).option("queue", "spark-bench-read")
    got = df.load().count()
    assert got == count, f"read {got} rows, published {count}"
    t, times = best(repeat, lambda: df.load().write.format("noop").mode("overwrite").save())
    results["read"] = count / t
    results["read_times_s"] = [round(x, 2) for x in times]
    curve = {}
    for p in partitions:
        log(f"read with minPartitions {p}")
        part = df.option("minPartitions", p)
        t, _ = best(
            repeat, lambda part=part: part.load().write.format("noop").mode("overwrite").save()
        )
        curve[str(p)] = count / t
    results["read_by_partitions"] = curve
    return _write_part(url, size, repeat, write_count, count, results, spark)


def _write_part(
    url: str,
    size: int,
    repeat: int,
    write_count: int,
    count: int,
    results: dict[str, Any],
    spark: Any = None,
) -> dict[str, Any]:
    """The Parquet and counting-sink ceilings and the sink's write (all that
    ``--write-only`` measures)."""
    from warren.spark.stream import Planner

    if spark is None:
        spark = spark_session()
    log("ceiling: spark.range(...).write.parquet")
    with tempfile.TemporaryDirectory(prefix="warren-spark-bench-parquet-") as tmp:
        t, _ = best(
            repeat,
            lambda: (
                spark.range(count)
                .selectExpr("id as offset", f"unhex(repeat('00', {size})) as body")
                .write.mode("overwrite")
                .parquet(f"{tmp}/out")
            ),
        )
    results["parquet_ceiling"] = count / t

    log("ceiling: a Python sink that only counts")
    spark.dataSource.register(counting_sink())
    rows = spark.range(write_count).selectExpr(f"repeat('x', {size}) as body").cache()
    rows.count()
    t, _ = best(repeat, lambda: rows.write.format("warren_bench_counting").mode("append").save())
    results["python_sink_ceiling"] = write_count / t

    log("write: df.write.format('warren') into a fresh stream")
    writes = 0

    def write() -> None:
        nonlocal writes
        writes += 1
        fresh_stream(url, "spark-bench-write")
        rows.write.format("warren").option("url", url).option(
            "routingKey", "spark-bench-write"
        ).mode("append").save()

    t, times = best(repeat, write)
    results["write"] = write_count / t
    results["write_times_s"] = [round(x, 2) for x in times]
    with Planner(url, 60_000) as planner:
        written = planner.bounds("spark-bench-write")
    if written.first is not None and written.end is not None:
        results["written_offsets"] = written.end - written.first
    spark.stop()
    results["load_average_end"] = os.getloadavg()
    return results


def environment() -> dict[str, str]:
    import pyspark

    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr
    cpu = "unknown"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    return {
        "CPUs (nproc)": str(os.cpu_count()),
        "CPU model": cpu,
        "Python": platform.python_version(),
        "PySpark": pyspark.__version__,
        "Java": java.splitlines()[0] if java else "unknown",
    }


ROWS: tuple[tuple[str, Callable[[dict[str, Any]], float]], ...] = (
    ('read: `spark.read.format("warren")` into `noop`, end to end', lambda r: r["read"]),
    ('write: `df.write.format("warren")` into a stream, all confirmed', lambda r: r["write"]),
    ("ceiling: Spark's `rate-micro-batch` source into `noop`", lambda r: r["rate_source"]),
    (
        "ceiling: a Python data source yielding the warren schema from memory, into `noop`",
        lambda r: r["python_source_ceiling"],
    ),
    ("ceiling: a Python sink that only counts its rows", lambda r: r["python_sink_ceiling"]),
    (
        "ceiling: `spark.range(...)` with the body, `write.parquet`",
        lambda r: r.get("parquet_ceiling", float("nan")),
    ),
    ("the read loop without Spark, 2 processes", lambda r: r["reader_alone"]["rows_per_s"]),
    ("(setup) a raw publisher filling the stream, confirms", lambda r: r["publish_raw"]),
)


def markdown(runs: list[dict[str, Any]]) -> str:
    """A docs/benchmarks.md section from saved --json runs, one column per run."""
    first = runs[0]
    head = " | ".join(r["label"] for r in runs)
    lines = [
        "## The Spark data source (`bench/spark_bench.py`)",
        "",
        f"Spark local[2] on the machine below, {first['messages']:,} messages of "
        f"{first['body_bytes']} bytes. Each number is the best of the timed runs, after a "
        "warm-up run; the broker, Spark's JVM and its Python workers share the CPUs. Runs:",
        "",
        *(f"- {r['label']}: `{r['command']}`, {r['date']}" for r in runs),
        "",
        "| | |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in first["environment"].items()),
        "",
        f"| rows/s | {head} |",
        "|---|" + "---:|" * len(runs),
        *(f"| {name} | " + " | ".join(f"{get(r):,.0f}" for r in runs) + " |" for name, get in ROWS),
        *(
            f"| read with minPartitions {p} | "
            + " | ".join(
                f"{r.get('read_by_partitions', {}).get(p, float('nan')):,.0f}" for r in runs
            )
            + " |"
            for p in first.get("read_by_partitions", {})
        ),
        "| CPU per row of the read loop without Spark | "
        + " | ".join(f"{r['reader_alone']['cpu_us_per_row']:.2f} µs" for r in runs)
        + " |",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="the broker (default: start a Warren from this checkout)")
    parser.add_argument("--label", help="the broker's name in the report (default: its own)")
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--write-messages", type=int, help="rows the write measures (default: --messages)"
    )
    parser.add_argument(
        "--partitions",
        default="1,2,4,8",
        help="minPartitions values of the read's scaling curve (comma-separated; '' for none)",
    )
    parser.add_argument(
        "--write-only",
        action="store_true",
        help="only the sink's write and the Parquet and counting-sink ceilings (--messages rows)",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument(
        "--markdown",
        nargs="+",
        metavar="JSON",
        help="print a docs/benchmarks.md section from files saved with --json",
    )
    args = parser.parse_args()
    if args.markdown:
        print(markdown([json.loads(Path(f).read_text()) for f in args.markdown]))
        return
    with contextlib.ExitStack() as stack:
        url = args.url or stack.enter_context(warren_broker())
        partitions = [int(p) for p in args.partitions.split(",") if p]
        results = run(
            url,
            args.messages,
            args.size,
            args.repeat,
            args.write_messages or args.messages,
            partitions,
            args.write_only,
        )
    results["label"] = args.label or results["broker"]
    results["command"] = " ".join(["bench/spark_bench.py", *sys.argv[1:]])
    results["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    results["environment"] = environment()
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for name, get in ROWS:
            with contextlib.suppress(KeyError, TypeError):
                print(f"{get(results):>12,.0f}  {name}")


if __name__ == "__main__":
    main()
