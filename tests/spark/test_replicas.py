"""Spark reading a stream from a cluster's followers (readFrom=replicas).

A leader broker and a follower with its stream read service run in this
process (tests/cluster/test_stream_reads.py has the same pair over pika);
Spark plans against the leader and its tasks read from the follower, or
from the leader when the follower cannot serve them.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import BrokerThread, new_event_loop

from warren import Config
from warren.amqp.replica_server import ReplicaReadServer
from warren.cluster.follower import Follower
from warren.cluster.leader import Replicator

from .helpers import declare_stream, publish
from .test_source import message, offsets_in, reader, run_available_now, stream_reader

pytestmark = pytest.mark.spark


class Cluster:
    """A leader broker replicating to one follower that serves stream reads."""

    def __init__(self, base: Path) -> None:
        self.leader_dir = base / "leader"
        self.replicator = Replicator(self.leader_dir, "s3cret")
        self.leader = BrokerThread(
            Config(data_dir=str(self.leader_dir), amqp_port=0, http_port=-1, mqtt_port=-1, stream_port=-1, prometheus_port=-1)
        )
        self.leader.broker.replication = self.replicator
        self.leader.broker.stream_replicas = self.replicator.stream_replicas
        self.leader.start()
        server = self.leader.run(asyncio.start_server(self.replicator.serve, "127.0.0.1", 0))
        repl_port = server.sockets[0].getsockname()[1]
        self.loop = new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        follower_dir = base / "follower"
        config = Config(data_dir=str(follower_dir), clustering_stream_read_port=0)
        self.reads = ReplicaReadServer(config, follower_dir, lambda: self.leader.url)
        self._run(self.reads.start())
        self.follower = Follower(
            follower_dir,
            "f1",
            "s3cret",
            stream_reads=f"127.0.0.1:{self.reads.port}",
            on_synced=self.reads.applied,
        )
        self.task = asyncio.run_coroutine_threadsafe(
            self.follower.run("127.0.0.1", repl_port), self.loop
        )
        self._run(self.follower.synced.wait())

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def stop_reads(self) -> None:
        self._run(self.reads.stop())

    def stop(self) -> None:
        try:
            self.loop.call_soon_threadsafe(self.task.cancel)
            self._run(self.reads.stop())
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
        finally:
            self.leader.stop()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.stop()


def test_a_batch_read_spreads_over_the_followers(spark: Any, cluster: Cluster) -> None:
    url = cluster.leader.url
    declare_stream(url, "events")
    publish(url, "events", [message(i) for i in range(500)])
    df = reader(spark, url, "events", readFrom="replicas", minPartitions=4)
    rows = df.orderBy("offset").collect()
    assert [r.offset for r in rows] == list(range(500))
    assert [r.body for r in rows] == [b"body-%d" % i for i in range(500)]
    assert rows[7].headers["k"] == "v7" and rows[7].correlation_id == "c7"
    # Every task read from the follower, which the leader announced.
    assert cluster.reads.connections_accepted >= 4


def test_a_streaming_query_reads_from_the_followers(
    spark: Any, cluster: Cluster, tmp_path: Path
) -> None:
    url = cluster.leader.url
    declare_stream(url, "ticks")
    publish(url, "ticks", [b"t%d" % i for i in range(120)])
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")
    df = stream_reader(
        spark,
        url,
        "ticks",
        startingOffsets="earliest",
        maxRecordsPerTrigger=50,
        readFrom="replicas",
    )
    assert run_available_now(df, out, ck) == [50, 50, 20]
    assert offsets_in(spark, out) == [("ticks", i) for i in range(120)]
    assert cluster.reads.connections_accepted >= 3


def test_tasks_fall_back_to_the_leader_when_a_follower_cannot_serve(
    spark: Any, cluster: Cluster
) -> None:
    url = cluster.leader.url
    declare_stream(url, "events")
    publish(url, "events", [message(i) for i in range(200)])
    port = cluster.reads.port
    cluster.stop_reads()
    df = reader(
        spark, url, "events", readFrom="replicas", replicas=f"127.0.0.1:{port}", minPartitions=2
    )
    assert sorted(r.offset for r in df.select("offset").collect()) == list(range(200))
