"""Network partitions: three real nodes, each in its own network namespace
(tests/cluster/netns.py), etcd and the clients outside them. Cutting a node's
link partitions it from everyone while it keeps running."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from etcd_proc import ETCD, EtcdProcess
from failover_load import FailoverLoad
from netns import Network, available
from nodes import Node, job_bodies, marks, publish_jobs, start_cluster, wait_any


@pytest.fixture
def net_cluster(tmp_path: Path) -> Iterator[tuple[Network, list[Node]]]:
    if ETCD is None:
        pytest.skip("etcd is not installed (make etcd installs Debian's etcd-server)")
    why = available()
    if why is not None:
        pytest.skip(why)
    network = Network(3)
    etcd: EtcdProcess | None = None
    nodes: list[Node] = []
    try:
        etcd = EtcdProcess(tmp_path / "etcd", host=network.gateway)
        nodes = [
            Node(tmp_path, f"p{i}", etcd.url, host=addr, netns=network.namespaces[i])
            for i, addr in enumerate(network.addresses)
        ]
        yield network, nodes
    finally:
        for node in nodes:
            node.kill()
        if etcd is not None:
            etcd.stop()
        network.close()


def test_a_partitioned_leader_is_replaced_and_no_confirmed_message_is_lost(
    net_cluster: tuple[Network, list[Node]],
) -> None:
    network, nodes = net_cluster
    leader = start_cluster(nodes)
    # Heartbeats of 2 s: a client of the cut-off leader hears no reset, only silence.
    load = FailoverLoad([n.address for n in nodes], heartbeat=2).start()
    try:
        load.wait_until(
            lambda: load.summary()["confirmed"] >= 300 and load.summary()["delivered"] >= 100,
            60,
            "traffic before the partition",
        )
        followers = nodes[1:]
        before = marks(followers)
        cut_at = time.monotonic()
        network.cut(0)
        new_leader = wait_any(followers, "elected leader", timeout=30, since=before)
        # Cut off from etcd, the old leader gives up leading on its own.
        leader.wait_for("no longer leads", timeout=30)
        load.wait_until(
            lambda: load.stats.confirmed_between(cut_at, float("inf")) >= 300,
            90,
            "confirms from the new leader",
        )
        network.heal(0)
        # It follows the new leader, dropping whatever it took that was never confirmed.
        leader.wait_for("following leader", timeout=30)
        leader.wait_for("synced with the leader", timeout=30)
        new_leader.wait_for(r"in-sync replicas: \w+, \w+$", timeout=30)
        load.stop_publishing()
        load.wait_until(lambda: not load.stats.missing(), 60, "every confirmed message delivered")
    finally:
        load.stop()
    assert load.summary()["reconnects"] >= 4
    with load.stats.lock:
        assert set(load.stats.delivered) <= load.stats.sent
    assert not load.stats.missing()


def test_a_partitioned_follower_leaves_the_isr_and_after_healing_can_lead_alone(
    net_cluster: tuple[Network, list[Node]],
) -> None:
    network, nodes = net_cluster
    leader = start_cluster(nodes)
    cut = nodes[2]
    network.cut(2)
    # Confirms go on without it once the leader has dropped it from the ISR.
    publish_jobs(leader.address, 0, 50)
    leader.wait_for("out of the ISR", timeout=30)
    leader.wait_for(r"in-sync replicas: \w+$", timeout=30)
    publish_jobs(leader.address, 50, 50)
    network.heal(2)
    cut.wait_for("synced with the leader", timeout=60)
    leader.wait_for(r"in-sync replicas: \w+, \w+$", timeout=30)
    publish_jobs(leader.address, 100, 50)
    # The healed follower alone holds every confirmed message: kill the others.
    before = marks([cut])
    leader.kill()
    nodes[1].kill()
    wait_any([cut], "elected leader", timeout=30, since=before)
    cut.wait_for("listening on AMQP", timeout=30)
    assert job_bodies(cut.address) == {b"job-%d" % i for i in range(150)}
