"""Pipelines that survive the broker: a streaming query and a running read task
across a kill -9 and restart of a real broker process, and reads and writes over
TLS with a client certificate (issue 32: resilience and security)."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from procs import start_warren
from tlshelp import tls_broker, write_pki

from .helpers import declare_queue, declare_stream, drain, publish
from .test_source import reader, stream_reader

pytestmark = pytest.mark.spark

#: Quick retries: a restart here takes a second or two.
RETRIES = {"maxRetries": "40", "retryBackoffMs": "100", "retryMaxBackoffMs": "500"}


class Restartable:
    """A broker process that can be killed -9 and started again on its data dir and port."""

    def __init__(self, data: Path) -> None:
        self.data = data
        self.proc, self.port = start_warren(data)
        self.url = f"amqp://guest:guest@127.0.0.1:{self.port}/"

    def kill_and_restart(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        self.proc, port = start_warren(self.data, "--amqp-port", str(self.port))
        assert port == self.port

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def to_parquet(df: Any, where: Path) -> Any:
    """Start a streaming query writing each message's offset and body under ``where``."""
    return (
        df.select("offset", "body")
        .writeStream.format("parquet")
        .option("path", str(where / "out"))
        .option("checkpointLocation", str(where / "ck"))
        .start()
    )


def written(spark: Any, where: Path) -> dict[int, bytes]:
    """What to_parquet wrote, by offset; no offset twice."""
    rows = spark.read.parquet(str(where / "out")).collect()
    out = {r.offset: r.body for r in rows}
    assert len(out) == len(rows), "an offset written twice"
    return out


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Restartable]:
    b = Restartable(tmp_path / "data")
    try:
        yield b
    finally:
        b.stop()


def test_a_streaming_query_rides_out_a_broker_kill(
    spark: Any, broker: Restartable, tmp_path: Path
) -> None:
    url = broker.url
    declare_stream(url, "events")
    publish(url, "events", [b"a-%d" % i for i in range(500)])
    df = stream_reader(spark, url, "events", startingOffsets="earliest", **RETRIES)
    query = to_parquet(df, tmp_path)
    try:
        query.processAllAvailable()
        # The query plans without pause (no trigger interval), so it meets the
        # outage; before, its first refused connection ended it.
        broker.kill_and_restart()
        publish(url, "events", [b"b-%d" % i for i in range(500)])
        query.processAllAvailable()
        assert query.isActive and query.exception() is None
    finally:
        query.stop()
    bodies = written(spark, tmp_path)
    assert sorted(bodies) == list(range(1000))
    assert bodies[499] == b"a-499" and bodies[500] == b"b-0"


def test_a_read_task_resumes_after_the_last_offset_it_read(spark: Any, broker: Restartable) -> None:
    # The task's own loop (source._read_resuming), driven here directly so the
    # broker is killed at a known point: after the first batch of rows.
    from warren.spark.options import SourceOptions
    from warren.spark.source import _read_resuming

    url = broker.url
    declare_stream(url, "big")
    total = 40_000  # more than one batch (16,384 rows)
    for start in range(0, total, 10_000):
        publish(url, "big", [b"m-%d" % i for i in range(start, start + 10_000)])
    options = SourceOptions.parse(dict(RETRIES, url=url, queue="big"), streaming=False)
    batches = _read_resuming(options, "big", 0, total)
    first = next(batches)
    broker.kill_and_restart()
    offsets = first.column("offset").to_pylist()
    for batch in batches:
        offsets.extend(batch.column("offset").to_pylist())
    assert offsets == list(range(total))


# -- TLS ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    d = tmp_path_factory.mktemp("spark-tls")
    files: dict[str, Any] = dict(write_pki(d, users=("etl",)))
    b = tls_broker(d / "data", files, users=("etl",))
    files["port"] = b.amqp_listener.tls_port
    files["plain_url"] = b.url
    try:
        yield files
    finally:
        b.stop()


def _tls_options(tls: dict[str, Any]) -> dict[str, str]:
    return {
        "tls.caFile": tls["ca"],
        "tls.certFile": tls["etl"],
        "tls.keyFile": tls["etl.key"],
        "authMechanism": "EXTERNAL",
    }


def test_read_and_write_over_tls_with_a_client_certificate(spark: Any, tls: dict[str, Any]) -> None:
    url = f"amqps://127.0.0.1:{tls['port']}/"
    declare_stream(tls["plain_url"], "tls-in")
    declare_queue(tls["plain_url"], "tls-out")
    publish(tls["plain_url"], "tls-in", [b"t-%d" % i for i in range(300)])
    df = reader(spark, url, "tls-in", minPartitions=2, **_tls_options(tls))
    assert sorted(r.offset for r in df.select("offset").collect()) == list(range(300))
    writer = df.select("body").write.format("warren").option("url", url)
    for key, value in dict(_tls_options(tls), routingKey="tls-out").items():
        writer = writer.option(key, value)
    writer.mode("append").save()
    bodies = [body for _props, body in drain(tls["plain_url"], "tls-out")]
    assert sorted(bodies) == sorted(b"t-%d" % i for i in range(300))


def test_a_broker_certificate_the_ca_did_not_sign_fails_at_once(
    spark: Any, tls: dict[str, Any]
) -> None:
    options = dict(_tls_options(tls), **{"tls.caFile": tls["other-ca"]})
    df = reader(spark, f"amqps://127.0.0.1:{tls['port']}/", "tls-in", **options)
    with pytest.raises(Exception, match="certificate verify failed") as info:
        df.count()
    assert "option 'url'" in str(info.value)


def test_an_idle_query_plans_on_one_connection(spark: Any, tmp_path: Path, spark_broker: Any) -> None:
    """An idle query asks for the latest offsets all the time; it used to open a
    connection each time (about 80 a second, two log lines each)."""
    if spark_broker.embedded is None:
        pytest.skip("counts the embedded Warren's connections")
    b = spark_broker.embedded
    url = spark_broker.url
    declare_stream(url, "idle")
    opened = lambda: b.call(lambda: b.broker.connections_opened)  # noqa: E731
    spark.conf.set("spark.sql.streaming.noDataProgressEventInterval", "50ms")
    query = (
        stream_reader(spark, url, "idle", startingOffsets="earliest")
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    try:
        before = None
        while len(query.recentProgress) < 30:  # each an idle trigger that planned
            assert query.isActive, query.exception()
            if before is None and query.recentProgress:
                before = opened()  # the planner is connected by now
            query.awaitTermination(0.05)
        assert before is not None
        assert opened() - before <= 1, "a connection per trigger"
    finally:
        query.stop()
        spark.conf.unset("spark.sql.streaming.noDataProgressEventInterval")
