"""A cluster's permanent id (rabbitmq_identity_info's rabbitmq_cluster_permanent_id):
one id on every node, kept by a follower elected after the leader dies and by a
restart of the whole cluster (store/cluster_id.py; its format is checked against
RabbitMQ's in tests/cluster/test_cluster_id.py)."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

from etcd_proc import EtcdProcess
from nodes import Node, marks, publish_jobs, start_cluster, wait_any

_ID = re.compile(r'rabbitmq_cluster_permanent_id="(rabbitmq-cluster-id-[A-Za-z0-9_-]{22})"')


def _scraped_id(node: Node) -> str:
    """The id in the /metrics of the node's HTTP port (a follower's reaches the leader)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{node.http_port}/metrics", timeout=10) as r:
        found = _ID.search(r.read().decode())
    assert found is not None
    return found.group(1)


def _stored_id(node: Node) -> str:
    """The id in the node's own copy of the data directory."""
    data = json.loads((node.data_dir / "cluster_id.json").read_text())
    return str(data["internal_cluster_id"])


def test_every_node_reports_one_id_through_failovers_and_restarts(
    etcd: EtcdProcess, tmp_path: Path
) -> None:
    nodes = [Node(tmp_path, f"i{i}", etcd.url, http=True) for i in range(3)]
    try:
        leader = start_cluster(nodes)
        publish_jobs(leader.address, 0, 1)  # a replicated change: the followers hold the id
        first = _scraped_id(leader)
        assert {_scraped_id(node) for node in nodes} == {first}
        assert {_stored_id(node) for node in nodes} == {first}

        since = marks(nodes)
        leader.kill()  # kill -9: a follower is elected on its own copy
        survivors = [node for node in nodes if node is not leader]
        elected = wait_any(survivors, "elected leader", since=since)
        elected.wait_for(r"Warren .* started")
        assert _scraped_id(elected) == first

        for node in survivors:
            node.stop()
        for node in nodes:  # the whole cluster restarted, the old leader too
            node.start()
        elected = wait_any(nodes, "elected leader")
        elected.wait_for(r"Warren .* started")
        assert {_scraped_id(node) for node in nodes if node is elected} == {first}
        for node in nodes:
            if node is not elected:
                node.wait_for("synced with the leader")
        assert {_scraped_id(node) for node in nodes} == {first}
    finally:
        for node in nodes:
            node.stop()
