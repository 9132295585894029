"""RabbitMQ 4.x's reached-target-cluster-size in a real cluster: a startup probe
(no credentials) that passes once the cluster has its target number of members,
[clustering] target_cluster_size_hint, and fails while a node is missing."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path

from etcd_proc import EtcdProcess
from nodes import Node

CHECK = "/api/health/checks/reached-target-cluster-size"


def _probe(node: Node) -> tuple[int, dict[str, object]]:
    """The check through the node's HTTP port, without credentials."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{node.http_port}{CHECK}", timeout=10) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


def test_the_target_cluster_size(etcd: EtcdProcess, tmp_path: Path) -> None:
    settings = {"clustering": {"target_cluster_size_hint": "3"}}
    nodes = [Node(tmp_path, f"t{i}", etcd.url, http=True, settings=settings) for i in range(3)]
    try:
        first = nodes[0].start()
        first.wait_for(r"Warren .* started")
        assert _probe(first) == (503, {
            "status": "failed",
            "reason": "target cluster size not reached: 1 of 3 nodes are online",
            "online": 1,
            "target": 3,
        })
        for node in nodes[1:]:
            node.start()
        for node in nodes[1:]:
            node.wait_for("synced with the leader")
        assert [_probe(node) for node in nodes] == [(200, {"status": "ok"})] * 3
        nodes[2].stop()
        deadline = time.monotonic() + 30
        while (answer := _probe(first))[0] != 503 and time.monotonic() < deadline:
            time.sleep(0.1)  # the leader notices the follower gone (its connection ends)
        assert answer == (503, {
            "status": "failed",
            "reason": "target cluster size not reached: 2 of 3 nodes are online",
            "online": 2,
            "target": 3,
        })
    finally:
        for node in nodes:
            node.stop()
