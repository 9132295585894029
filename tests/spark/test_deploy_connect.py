"""Spark Connect (issue 32): a Connect server whose Python has Warren's wheel
pip-installed (docs/spark.md, "Deployment"), and a client in its own process
that registers the source on its Connect session and reads in batch, writes,
and reads as a stream, with exact output."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from free_ports import free_port

from . import deploy
from .helpers import BrokerInfo, declare_queue, drain, publish

pytestmark = [pytest.mark.spark, pytest.mark.timeout(400)]

CLIENT = Path(__file__).with_name("connect_job.py")
MESSAGES = 100


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """sc://127.0.0.1:PORT of a Spark Connect server (local[2]) whose Python has
    Warren's wheel installed, as on a node: nothing else gives it Warren."""
    reason = deploy.java_missing()
    if reason:
        pytest.skip(reason)
    pytest.importorskip("grpc", reason="Spark Connect's client needs pyspark[connect]")
    root = tmp_path_factory.mktemp("connect")
    python = deploy.python_without_warren(root / "node-venv")
    deploy.install_wheel(python, deploy.shared_pure_wheel(tmp_path_factory))
    port = free_port()
    # The command docs/spark.md shows (start-connect-server.sh runs the same class).
    server = deploy.Process(
        "connect-server",
        deploy.spark_submit(
            {
                "spark.connect.grpc.binding.port": str(port),
                "spark.connect.grpc.binding.address": "127.0.0.1",
                "spark.local.dir": str(root),  # not /tmp: the server is killed at the end
                **deploy.LOCAL_CONF,
            },
            *("--class", "org.apache.spark.sql.connect.service.SparkConnectServer"),
            *("--master", "local[2]", "--driver-memory", "768m", "spark-internal"),
        ),
        root,
        # Connect's Python data sources run PYSPARK_PYTHON (spark.pyspark.python is not
        # read): the node's Python, less Spark's zips (test_deploy_cluster.py).
        deploy.base_env(
            PYSPARK_PYTHON=str(deploy.without_spark_zips(python, root / "node-python"))
        ),
    )
    try:
        server.wait_for_port(port)
        yield f"sc://127.0.0.1:{port}"
    finally:
        server.kill()


def test_a_connect_client_reads_writes_and_streams(
    connect_server: str,
    spark_broker: BrokerInfo,
    stream: Callable[..., str],
    names: Callable[[str], str],
    tmp_path: Path,
) -> None:
    source, target = stream("src"), names("target")
    declare_queue(spark_broker.url, target)
    bodies = [f"m{i}".encode() for i in range(MESSAGES)]
    publish(spark_broker.url, source, bodies)

    out = tmp_path / "out.json"
    client = deploy.Process(
        "connect-client",
        [
            sys.executable,
            str(CLIENT),
            connect_server,
            spark_broker.url,
            source,
            target,
            str(tmp_path / "checkpoint"),
            str(out),
        ],
        tmp_path,
        # The client's Warren (this checkout) only serves to register the source.
        dict(os.environ),
    )
    status = client.finish(timeout=300)
    assert status == 0, f"the client failed ({status})\n{client.tail(80)}"

    result = json.loads(out.read_text())
    assert result["session"] == "pyspark.sql.connect.session"
    expected = [[i, f"m{i}"] for i in range(MESSAGES)]
    assert sorted(result["read"]) == expected
    assert sorted(result["streamed"]) == expected
    published = drain(spark_broker.url, target)
    assert sorted(body for _, body in published) == sorted(bodies)
    assert len({props.headers["x-deduplication-header"] for props, _ in published}) == MESSAGES
