"""docs/spark.md's first example, run as written by a fresh Python with a clean
environment: no PYSPARK_PYTHON, and PATH's ``python3`` (if any) without Warren.

Spark starts its Python workers with ``PYSPARK_PYTHON``, else ``python3`` from
PATH; ``register(spark)`` on a local session makes the source's workers run
the interpreter that called it, so the snippet runs from a venv without
PYSPARK_PYTHON (it failed with ``ModuleNotFoundError: No module named
'warren'`` before).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from .deploy import JAVA_OPTS
from .helpers import BrokerInfo, channel, declare_stream, delete_queue, message_count, publish

pytestmark = pytest.mark.spark

DOC = Path(__file__).resolve().parents[2] / "docs" / "spark.md"
SRC = Path(__file__).resolve().parents[2] / "src"


def documented_snippet() -> str:
    """The Python block after "runs as written" in docs/spark.md."""
    text = DOC.read_text()
    found = re.search(r"runs as written.*?```python\n(.*?)```", text, re.S)
    assert found, "docs/spark.md lost its runnable example"
    return found.group(1)


def clean_env() -> dict[str, str]:
    """What a new shell has: no PYSPARK_*, PATH with java and the system's bin dirs."""
    java = shutil.which("java")
    java_home = os.environ.get("JAVA_HOME")
    if java is None and not java_home:
        pytest.skip("Spark needs Java (no java on PATH, JAVA_HOME unset)")
    path = [str(Path(java).parent)] if java else [str(Path(java_home or "") / "bin")]
    env = {
        "PATH": os.pathsep.join([*path, "/usr/bin", "/bin"]),
        "HOME": os.environ.get("HOME", "/tmp"),
        # This checkout's warren for the script and, through Spark, its workers.
        "PYTHONPATH": str(SRC),
        # The JVM the snippet's session starts: small, as the other tests' (not
        # the snippet's business; 18 s instead of 26).
        "JDK_JAVA_OPTIONS": JAVA_OPTS,
    }
    for name in ("JAVA_HOME", "WARREN_PURE_PYTHON", "LANG"):
        if name in os.environ:
            env[name] = os.environ[name]
    return env


@pytest.fixture
def documented_queues(spark_broker: BrokerInfo) -> Any:
    names = ("events", "audit", "copies")
    for queue in names:
        delete_queue(spark_broker.url, queue)
    declare_stream(spark_broker.url, "events")
    declare_stream(spark_broker.url, "audit")
    with channel(spark_broker.url) as c:
        c.queue_declare(1, "copies", durable=True)
        c.queue_bind(1, "copies", "amq.direct", "copies")
    yield
    for queue in names:
        delete_queue(spark_broker.url, queue)


def test_the_documented_example_runs_without_pyspark_python(
    spark_broker: BrokerInfo, documented_queues: None, tmp_path: Path
) -> None:
    url = spark_broker.url
    publish(url, "events", [f"event {i}".encode() for i in range(30)])
    publish(url, "audit", [f"audit {i}".encode() for i in range(12)])
    at = urlsplit(url)
    script = documented_snippet().replace(
        '"amqp://guest:guest@localhost:5672/"', repr(f"amqp://guest:guest@{at.hostname}:{at.port}/")
    )
    assert script != documented_snippet(), "the example's url line changed: update this test"
    (tmp_path / "example.py").write_text(script)

    done = subprocess.run(
        [sys.executable, "example.py"],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=480,  # within conftest.py's SPARK_TIMEOUT, which counts the set-up too
    )
    assert done.returncode == 0, done.stderr[-4000:]

    import pyarrow.parquet as pq

    bodies = sorted(pq.read_table(tmp_path / "events-parquet").column("body").to_pylist())
    expected = [f"event {i}".encode() for i in range(30)] + [
        f"audit {i}".encode() for i in range(12)
    ]
    assert bodies == sorted(expected)
    assert message_count(url, "copies") == 30
