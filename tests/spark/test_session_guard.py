"""What one Spark test can leave behind never reaches the next (session_guard.py).

Each test breaks the shared session as a failing test did (a py4j call
interrupted before its reply, as pytest-timeout interrupts it; a query left
running; the JVM killed), runs what the spark fixture runs after a test, and
checks that the session then answers right.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from .helpers import BrokerInfo, declare_queue, drain, publish
from .session_guard import SharedSession, interrupted_connection

pytestmark = pytest.mark.spark


def wait_until(condition: Any, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"no {what} after {timeout:.0f} s"
        time.sleep(0.01)


def interrupt_a_call_before_its_reply(spark: Any) -> pytest.ExceptionInfo[BaseException]:
    """The main thread blocks in a JVM call (a take() on an empty queue); a signal
    makes it raise pytest's Failed there, as pytest-timeout's signal method does;
    then the JVM sends the reply that nobody reads.

    Returns the exception: while it lives (pytest keeps a failed test's until
    its teardown, and its frames in a reference cycle until the collector
    runs) it holds the connection, which the thread uses again; dropped at
    once, the connection would be freed, its socket closed, and the next call
    would open a new one."""
    handoff = spark._jvm.java.util.concurrent.LinkedTransferQueue()
    main = threading.get_ident()
    interrupted = threading.Event()

    def interrupter() -> None:  # its own py4j connection (one per thread)
        wait_until(handoff.hasWaitingConsumer, "take() waiting in the JVM")
        signal.pthread_kill(main, signal.SIGUSR1)
        if interrupted.wait(120):
            handoff.put("a late reply")  # taken by the interrupted take()
            wait_until(handoff.isEmpty, "the late reply taken")

    def on_signal(signum: int, frame: Any) -> None:
        pytest.fail("interrupted the way pytest-timeout interrupts a test")

    previous = signal.signal(signal.SIGUSR1, on_signal)
    thread = threading.Thread(target=interrupter, daemon=True)
    try:
        thread.start()
        with pytest.raises(pytest.fail.Exception) as info:
            handoff.take()
        interrupted.set()
        thread.join(120)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert not thread.is_alive()
    return info


def test_a_call_interrupted_before_its_reply_leaves_no_reply_to_the_next_call(
    spark_sessions: SharedSession,
) -> None:
    spark = spark_sessions.get()
    interrupted = interrupt_a_call_before_its_reply(spark)
    assert interrupted_connection(spark) is not None
    done = spark_sessions.after_test(failed=True)
    assert "closed the py4j connection of an interrupted call" in done
    # Without the repair these read the late reply and each one after it the
    # reply meant for the call before (issue 29: 'int' object has no attribute
    # 'format', KeyError: 'c').
    assert spark_sessions.get() is spark, "a closed connection is enough: same JVM"
    assert spark.range(3).count() == 3
    assert spark.sql("SELECT 'x' AS c").collect()[0].c == "x"
    assert spark_sessions.after_test(failed=False) == []
    del interrupted


def test_a_write_after_a_repaired_call_finds_the_warren_format(
    spark_sessions: SharedSession, spark_broker: BrokerInfo, names: Callable[[str], str]
) -> None:
    """The connection opened after the repair is served by a new JVM thread,
    which has no active session; Spark looks a write's format up there
    (session_guard.py), so the write failed with [DATA_SOURCE_NOT_FOUND]
    while a read of the same format worked."""
    queue = names("q")
    declare_queue(spark_broker.url, queue)
    spark = spark_sessions.get()
    interrupted = interrupt_a_call_before_its_reply(spark)
    assert "closed the py4j connection of an interrupted call" in spark_sessions.after_test(
        failed=True
    )
    spark = spark_sessions.get()
    rows = spark.range(7).selectExpr("cast(id as string) as body")
    rows.write.format("warren").option("url", spark_broker.url).option(
        "routingKey", queue
    ).mode("append").save()
    assert sorted(int(body) for _, body in drain(spark_broker.url, queue)) == list(range(7))
    del interrupted


def test_a_streaming_query_left_running_is_stopped(spark_sessions: SharedSession) -> None:
    spark = spark_sessions.get()
    query = spark.readStream.format("rate").load().writeStream.format("noop").start()
    assert query.isActive
    done = spark_sessions.after_test(failed=False)
    assert any(line.startswith("stopped streaming query") for line in done), done
    assert not query.isActive
    assert spark.streams.active == []


def test_a_session_whose_jvm_died_is_replaced(spark_sessions: SharedSession) -> None:
    from pyspark import SparkContext

    spark = spark_sessions.get()
    gateway = SparkContext._gateway
    assert gateway is not None
    gateway.proc.kill()  # the JVM (spark-submit execs java)
    gateway.proc.wait(60)
    done = spark_sessions.after_test(failed=True)
    assert "discarded the session and its JVM (it ran no job)" in done
    fresh = spark_sessions.get()
    assert fresh is not spark
    assert fresh.range(4).count() == 4
    assert fresh.sql("SELECT 'y' AS c").collect()[0].c == "y"


def test_python_workers_import_pyspark_with_its_bytecode(spark: Any) -> None:
    """Not from Spark's pyspark.zip, compiled again at every worker's start:
    a streaming source's worker has 10 s to connect back to the JVM, and on a
    busy machine the zip's imports alone took longer (conftest.py's
    worker_python)."""
    from pyspark.sql.functions import udf

    def pyspark_file(_):  # no hints: pyspark would look for a pandas UDF in them
        import pyspark

        return str(pyspark.__file__)

    path = spark.range(1).select(udf(pyspark_file, "string")("id")).first()[0]
    assert ".zip" not in path, path


def python_paths_under(pid: int) -> dict[int, tuple[str, str]]:
    """(command line, PYTHONPATH) of every Python process below ``pid`` (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry.name))
    found = {}
    todo = list(children.get(pid, []))
    while todo:
        child = todo.pop()
        todo.extend(children.get(child, []))
        with contextlib.suppress(OSError):
            command = (Path("/proc") / str(child) / "cmdline").read_bytes().replace(b"\0", b" ")
            environ = (Path("/proc") / str(child) / "environ").read_bytes().split(b"\0")
            if b"pyspark" in command:
                path = next((e[11:] for e in environ if e.startswith(b"PYTHONPATH=")), b"")
                found[child] = (command.decode(), path.decode())
    return found


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc")
def test_a_streaming_querys_planner_imports_pyspark_with_its_bytecode(
    spark: Any, spark_broker: BrokerInfo, stream: Any, tmp_path: Path
) -> None:
    """The streaming source's runner (one Python process per query, also held to
    the 10 s connect-back) and the source's other planners run
    PYSPARK_DRIVER_PYTHON, not PYSPARK_PYTHON: without the zips on their path too,
    each query's runner compiled pyspark again (conftest.py's WORKER_PYTHON)."""
    from pyspark import SparkContext

    queue = stream()
    publish(spark_broker.url, queue, [b"m"])
    query = (
        spark.readStream.format("warren")
        .option("url", spark_broker.url)
        .option("queue", queue)
        .option("startingOffsets", "earliest")
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    try:
        query.processAllAvailable()
        gateway = SparkContext._gateway
        assert gateway is not None
        processes = python_paths_under(gateway.proc.pid)
    finally:
        query.stop()
    runners = [p for p, (command, _) in processes.items() if "streaming_source_runner" in command]
    assert runners, processes
    with_zip = {p: v for p, v in processes.items() if "pyspark.zip" in v[1]}
    assert with_zip == {}
