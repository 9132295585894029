"""A standalone cluster with 2 workers whose Python has no Warren: spark-submit
ships Warren's pure-Python wheel with --py-files (docs/spark.md, "Deployment"),
and a batch read in partitions on both executors and a checkpointed streaming
read into the sink give exact output (issue 32)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from free_ports import free_port

from . import deploy
from .helpers import BrokerInfo, declare_queue, drain, publish

pytestmark = [pytest.mark.spark, pytest.mark.timeout(400)]

JOB = Path(__file__).with_name("cluster_job.py")
MESSAGES = 150


@pytest.fixture(autouse=True)
def _java() -> None:
    reason = deploy.java_missing()
    if reason:
        pytest.skip(reason)


def test_a_two_worker_cluster_reads_and_writes_with_the_wheel_in_py_files(
    spark_broker: BrokerInfo,
    stream: Callable[..., str],
    names: Callable[[str], str],
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    source, target = stream("src"), names("target")
    declare_queue(spark_broker.url, target)
    bodies = [f"m{i}".encode() for i in range(MESSAGES)]
    publish(spark_broker.url, source, bodies)

    # Spark puts only .zip, .egg and .jar files of --py-files on the executors' path:
    # a wheel is a zip, shipped under that name.
    wheel = tmp_path / "warren.zip"
    shutil.copy(deploy.shared_pure_wheel(tmp_path_factory), wheel)
    # The nodes' Python, less Spark's pyspark.zip (compiled again by each of the
    # twenty-odd Python processes of the job: 0.4 s of CPU each); the pyspark it
    # imports instead is the venv's own, and Warren still comes only from the wheel.
    python = deploy.without_spark_zips(
        deploy.python_without_warren(tmp_path / "node-venv"), tmp_path / "node-python"
    )
    out, checkpoint = tmp_path / "out.json", tmp_path / "checkpoint"
    with deploy.standalone_cluster(tmp_path / "cluster", free_port()) as cluster:
        # The command docs/spark.md shows, with the test's paths and small JVMs.
        job = deploy.Process(
            "driver",
            deploy.spark_submit(
                {
                    "spark.pyspark.python": str(python),
                    "spark.pyspark.driver.python": str(python),
                    "spark.executor.cores": "1",
                    "spark.cores.max": "2",
                    "spark.executor.memory": "512m",
                    "spark.local.dir": str(tmp_path),
                    # The first job waits for both executors (Spark's own wait).
                    "spark.scheduler.minRegisteredResourcesRatio": "1.0",
                    "spark.scheduler.maxRegisteredResourcesWaitingTime": "120s",
                    **deploy.LOCAL_CONF,
                },
                *("--master", cluster.url, "--driver-memory", "512m", "--py-files", str(wheel)),
                *(str(JOB), spark_broker.url, source, target, str(checkpoint), str(out)),
            ),
            tmp_path,
            # Spark 4.3 starts a streaming source's planner (a Python process of the
            # driver's JVM) without --py-files: it finds Warren on the driver's PYTHONPATH.
            deploy.base_env(PYTHONPATH=str(wheel)),
        )
        status = job.finish(timeout=300)
        assert status == 0, f"the job failed ({status})\n{job.tail(80)}\n{cluster.logs()}"

    result = json.loads(out.read_text())
    # The driver's Warren and every Python worker's came from the wheel.
    assert result["driver_warren"].startswith(str(wheel)), result["driver_warren"]
    read = result["read"]
    # Each executor's from the copy --py-files put in its working directory.
    assert all(r[3] == f"{r[2]}/warren.zip/warren/__init__.py" for r in read), read[:3]
    # The batch read: every offset once, with its body, read on both workers.
    assert sorted((r[0], r[1]) for r in read) == [(i, f"m{i}") for i in range(MESSAGES)]
    ran_on = {w for r in read for w in cluster.work_dirs if r[2].startswith(f"{w}/")}
    assert ran_on == set(cluster.work_dirs), {r[2] for r in read}

    # The streaming read: 60 + 60 + 30 rows, then nothing on the same checkpoint.
    first, second = result["batches"]
    assert first == [60, 60, 30] and sum(second) == 0, result["batches"]
    published = drain(spark_broker.url, target)
    assert sorted(body for _, body in published) == sorted(bodies)
    keys = {props.headers["x-deduplication-header"] for props, _ in published}
    assert len(keys) == MESSAGES
