"""One SparkSession and one broker for all the Spark tests.

The broker is an embedded Warren (tests/conftest.py's start_broker) unless
WARREN_SPARK_BROKER_URL names another one, e.g. a RabbitMQ with streams:

    WARREN_SPARK_BROKER_URL=amqp://guest:guest@127.0.0.1:5672/ pytest -m spark

Spark runs local[2] with its UI off and two shuffle partitions; its Python
workers and the source's planners run this interpreter (PYSPARK_PYTHON and
PYSPARK_DRIVER_PYTHON, through worker_python()), so they import this checkout.
After each test the session is checked and, if the test broke it, repaired or
replaced (session_guard.py): a failed test never fails the ones after it.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .deploy import JAVA_OPTS, WITHOUT_SPARK_ZIPS
from .helpers import WORKER_DID_NOT_CONNECT, BrokerInfo, channel, declare_stream, delete_queue
from .session_guard import SharedSession

pytest.importorskip("pyspark", reason="the spark extra is not installed")

BROKER_URL_ENV = "WARREN_SPARK_BROKER_URL"
# pytest-timeout's limit for a Spark test that sets none (pyproject.toml's 120 s
# is for the rest of the suite). It counts the test's set-up, and so the JVM's
# start in the first test of a worker: 100 s of set-up and 110 s of test for
# test_errors_through_spark at a load of 20 on 2 cores, 250 s for the docs
# snippet's own Spark. A hung test still fails, after minutes.
SPARK_TIMEOUT = 600
REPORTS = pytest.StashKey[dict[str, pytest.TestReport]]()


@pytest.fixture(scope="session")
def spark_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerInfo]:
    url = os.environ.get(BROKER_URL_ENV)
    embedded = None
    if not url:
        from conftest import start_broker

        embedded = start_broker(tmp_path_factory.mktemp("warren-spark") / "data")
        url = embedded.url
    try:
        with channel(url) as c:
            is_warren = "warren_version" in c.server_properties
        yield BrokerInfo(url=url, is_warren=is_warren, embedded=embedded)
    finally:
        if embedded is not None:
            embedded.stop()


@pytest.fixture
def warren_only(spark_broker: BrokerInfo) -> None:
    """For tests of what only Warren does (x-stream-timestamp, deduplication, exact "last")."""
    if not spark_broker.is_warren:
        pytest.skip("needs Warren (the broker at WARREN_SPARK_BROKER_URL is not Warren)")


# Spark puts pyspark.zip (and py4j's zip) first on every Python worker's
# PYTHONPATH, so a worker compiles each pyspark module it imports from source:
# 3 s of start-up instead of 0.4 at a load of 20 on 2 cores, past the 10 s a
# streaming source's worker has to connect back to the JVM (a constant in
# Spark's PythonWorkerFactory: "Python worker failed to connect back"). The
# workers run this script instead, which drops those zips: the same pyspark
# (this interpreter's) then comes from site-packages with its bytecode cache.
# Two kinds of Python process run it: the tasks' workers (PYSPARK_PYTHON) and
# the driver-side planners of a data source pyspark found by itself (format
# "warren" through pyspark_warren): its lookup, schema and read planning, and
# each streaming query's source runner, which start PYSPARK_DRIVER_PYTHON.
# Without the latter every streaming query's runner compiled pyspark from the
# zip: 3.6-8 s per availableNow query at a load of 15-19, 0.9-1.4 s with it.
WORKER_PYTHON = (
    WITHOUT_SPARK_ZIPS
    + """if [ "$1" = -m ] && [ "$2" = pyspark.daemon ]; then
    shift 2
    OPENBLAS_NUM_THREADS=1 JE_ARROW_MALLOC_CONF=background_thread:false
    export OPENBLAS_NUM_THREADS JE_ARROW_MALLOC_CONF
    exec %(python)s -c %(preload)s "$@"
fi
exec %(python)s "$@"
"""
)

# Each pyspark.daemon (one per kind of Python worker of a JVM: tasks, and the
# data source's lookup, planning, writes and commits) forks a worker per
# request, and the worker imports its module, pyarrow with it, after the fork:
# Spark's daemon must not fork with threads running, and pyarrow's allocator
# (jemalloc) and numpy's OpenBLAS start threads when imported. Without those
# threads (the two settings above) the import is safe before the fork: the
# script's daemons import pyarrow and the worker module once, and each worker
# forked from them starts with them (the tests' daemons and workers: 36.4 ->
# 32.5 s of CPU over tests/spark). Warren itself is imported after the fork,
# in each worker, as without the script. Should either import start a thread still,
# the daemon starts again without them, as Spark starts it.
PRELOAD_DAEMON = """
import importlib, os, sys
import pyarrow
importlib.import_module(sys.argv[1] if sys.argv[1:2] and sys.argv[1].startswith("pyspark") else "pyspark.worker")
if len(os.listdir("/proc/self/task")) > 1:
    os.execv(sys.executable, [sys.executable, "-m", "pyspark.daemon", *sys.argv[1:]])
import runpy
runpy.run_module("pyspark.daemon", run_name="__main__", alter_sys=True)
"""


def worker_python(directory: Path) -> str:
    """An executable that runs this interpreter without Spark's zips on its path."""
    script = directory / "worker-python"
    script.write_text(
        WORKER_PYTHON
        % {"python": shlex.quote(sys.executable), "preload": shlex.quote(PRELOAD_DAEMON)}
    )
    script.chmod(0o755)
    return str(script)


def build_session(python: str) -> Any:
    """The tests' SparkSession (a new JVM when none runs); workers run ``python``."""
    os.environ["PYSPARK_PYTHON"] = python
    # Read by the JVM for the planners of auto-discovered data sources, not by
    # this (already running) driver.
    os.environ["PYSPARK_DRIVER_PYTHON"] = python
    from pyspark.sql import SparkSession

    # No warren.spark.register(session): pyspark finds format("warren") by itself
    # (pyspark_warren; test_kafka_options.py).
    session = (
        SparkSession.builder.master("local[2]")
        .appName("warren-spark-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.pyspark.python", python)
        .config("spark.driver.extraJavaOptions", JAVA_OPTS)
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    return session


@pytest.fixture(scope="session")
def spark_sessions(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedSession]:
    """The session the Spark tests share, repaired or replaced after a test that
    broke it (session_guard.py)."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs Java (no java on PATH, JAVA_HOME unset)")
    python = worker_python(tmp_path_factory.mktemp("spark-worker"))
    shared = SharedSession(lambda: build_session(python))
    try:
        yield shared
    finally:
        shared.close()


#: Spark gives a streaming source's Python worker a fixed 10 s to connect back
#: (PythonWorkerFactory; no setting in Spark 4.x). On a starved machine a
#: worker can miss it: Spark's failure, not the data source's, and the session
#: guard has repaired the session by the next run. So a Spark test that failed
#: with exactly that error runs again (pytest-rerunfailures), at most twice; any
#: other failure fails it at once.
WORKER_RERUNS = 2


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if not item.path.is_relative_to(here):
            continue
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(SPARK_TIMEOUT))
        item.add_marker(
            pytest.mark.flaky(reruns=WORKER_RERUNS, only_rerun=[WORKER_DID_NOT_CONNECT])
        )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Keeps each phase's report on the item, for the spark fixture's teardown."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    item.stash.setdefault(REPORTS, {})[report.when] = report


@pytest.fixture
def spark(spark_sessions: SharedSession, request: pytest.FixtureRequest) -> Iterator[Any]:
    """The shared SparkSession; after the test, whatever the test left behind
    (an interrupted py4j call, running queries, a dead JVM) is cleaned up so
    that the next test starts on a working session."""
    yield spark_sessions.get()
    reports = request.node.stash.get(REPORTS, {})
    spark_sessions.after_test(failed=any(r.failed for r in reports.values()))


@pytest.fixture
def names(
    spark_broker: BrokerInfo, request: pytest.FixtureRequest
) -> Iterator[Callable[[str], str]]:
    """Unique queue names for this test; every queue named is deleted afterwards."""
    made: list[str] = []
    base = request.node.name.replace("[", "-").replace("]", "")[:40]

    def name(suffix: str = "") -> str:
        made.append(f"spark-{base}-{suffix}-{uuid.uuid4().hex[:6]}")
        return made[-1]

    yield name
    for queue in made:
        delete_queue(spark_broker.url, queue)


@pytest.fixture
def stream(spark_broker: BrokerInfo, names: Callable[[str], str]) -> Callable[..., str]:
    """Declare a fresh stream queue; returns its name."""

    def make(suffix: str = "s", **arguments: Any) -> str:
        queue = names(suffix)
        declare_stream(spark_broker.url, queue, **arguments)
        return queue

    return make


@pytest.fixture
def checkpoint(tmp_path: Path) -> Callable[[str], str]:
    def path(name: str = "ck") -> str:
        return str(tmp_path / name)

    return path
