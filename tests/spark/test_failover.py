"""A streaming query across a cluster leader's kill -9: three real nodes and a
real etcd (tests/cluster's harness), the query given every node's URL; a
follower takes over and the query goes on with exact output, never restarted."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from .helpers import declare_stream, publish
from .test_resilience import to_parquet, written
from .test_source import stream_reader

pytestmark = pytest.mark.spark

_CLUSTER_TESTS = str(Path(__file__).resolve().parents[1] / "cluster")
if _CLUSTER_TESTS not in sys.path:  # the same module objects as tests/cluster uses
    sys.path.append(_CLUSTER_TESTS)

from nodes import Node, marks, start_cluster, wait_any  # noqa: E402


def test_a_streaming_query_follows_the_new_leader(spark: Any, etcd: Any, tmp_path: Path) -> None:
    nodes = [Node(tmp_path, f"n{i}", etcd.url) for i in range(3)]
    try:
        leader = start_cluster(nodes)
        url_of = {id(n): f"amqp://guest:guest@{n.host}:{n.amqp_port}/" for n in nodes}
        declare_stream(url_of[id(leader)], "events")
        publish(url_of[id(leader)], "events", [b"a-%d" % i for i in range(300)])
        # The old leader first: the query starts there and must move.
        urls = ",".join(url_of[id(n)] for n in [leader, *[n for n in nodes if n is not leader]])
        df = stream_reader(
            spark,
            urls,
            "events",
            startingOffsets="earliest",
            maxRetries="60",
            retryBackoffMs="100",
            retryMaxBackoffMs="500",
        )
        query = to_parquet(df, tmp_path)
        try:
            query.processAllAvailable()
            followers = [n for n in nodes if n is not leader]
            before = marks(followers)
            leader.kill()
            new_leader = wait_any(followers, "elected leader", timeout=60, since=before)
            new_leader.wait_for(r"listening on AMQP")
            publish(url_of[id(new_leader)], "events", [b"b-%d" % i for i in range(300)])
            query.processAllAvailable()
            assert query.isActive and query.exception() is None
        finally:
            query.stop()
        bodies = written(spark, tmp_path)
        assert sorted(bodies) == list(range(600))
        assert bodies[299] == b"a-299" and bodies[300] == b"b-0"
    finally:
        for node in nodes:
            node.stop()
