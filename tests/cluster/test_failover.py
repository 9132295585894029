"""Three real nodes and a real etcd: one is elected and serves, the others
replicate; kill -9 the leader and a follower takes over with every confirmed
message; clients reach the leader through any node."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest
from etcd_proc import EtcdProcess
from failover_load import FailoverLoad
from nodes import (
    PERSISTENT,
    SRC,
    Node,
    job_bodies,
    marks,
    open_channel,
    publish_jobs,
    start_cluster,
    wait_any,
)

from warren.cluster.etcd import EtcdClient


@pytest.fixture
def nodes(etcd: EtcdProcess, tmp_path: Path) -> Iterator[list[Node]]:
    started = [Node(tmp_path, f"n{i}", etcd.url) for i in range(3)]
    try:
        yield started
    finally:
        for node in started:
            node.stop()


def test_kill_9_of_the_leader_loses_no_confirmed_message(nodes: list[Node]) -> None:
    first = nodes[0].start()
    first.wait_for("elected leader")
    first.wait_for(r"listening on AMQP")
    for node in nodes[1:]:
        node.start()
    for node in nodes[1:]:
        node.wait_for("synced with the leader")
    first.wait_for(r"in-sync replicas: .*,")  # at least one follower in the ISR

    conn, ch = open_channel(first.address)
    ch.queue_declare("orders", durable=True)
    ch.confirm_delivery()
    for i in range(300):
        ch.basic_publish("", "orders", b"order-%d" % i, PERSISTENT)
    for _ in range(100):
        method, _props, _body = ch.basic_get("orders")
        assert method is not None
        ch.basic_ack(method.delivery_tag)
    conn.close()

    # A client on a follower's port reaches the leader.
    conn, ch = open_channel(nodes[1].address)
    assert ch.queue_declare("orders", passive=True).method.message_count == 200
    conn.close()

    followers = nodes[1:]
    before = marks(followers)
    first.kill()
    new_leader = wait_any(followers, "elected leader", timeout=30, since=before)
    new_leader.wait_for(rf"ready: leader {new_leader.node_id}: AMQP ")  # said again
    # While the dead leader's lease ran out, each follower said once that its
    # replication ended and retried quietly (not three lines a second).
    for node in followers:
        dead_interval = node.log[before[id(node)] :]
        assert sum(f"replication from {first.node_id} ended" in x for x in dead_interval) == 1
        assert not any(f"following leader {first.node_id}" in x for x in dead_interval)
    conn, ch = open_channel(new_leader.address)
    count = ch.queue_declare("orders", passive=True).method.message_count
    # Every confirmed message is there; acks are at-least-once (a late one may be back).
    assert 200 <= count <= 300
    bodies = set()
    while True:
        method, _props, body = ch.basic_get("orders", auto_ack=True)
        if method is None:
            break
        bodies.add(body)
        assert method.redelivered  # after a crash any of them may have been delivered
    assert {b"order-%d" % i for i in range(100, 300)} <= bodies
    conn.close()

    # The old leader comes back on its stale directory and follows.
    first.start()
    first.wait_for("following leader")
    first.wait_for(rf"ready: follower {first.node_id} of {new_leader.node_id}: AMQP ")


def test_after_a_clean_stop_of_the_leader_exactly_the_delivered_come_back_redelivered(
    nodes: list[Node],
) -> None:
    """The leader's clean stop records what was delivered and its last writes reach
    the followers: its successor flags exactly the messages delivered before."""
    leader = start_cluster(nodes)
    publish_jobs(leader.address, 0, 5)
    conn, ch = open_channel(leader.address)
    for _ in range(2):
        method, _props, _body = ch.basic_get("jobs")
        assert method is not None and not method.redelivered
    followers = [n for n in nodes if n is not leader]
    before = marks(followers)
    leader.stop()  # SIGTERM: a clean stop, the two still unacked
    new_leader = wait_any(followers, "elected leader", timeout=30, since=before)
    new_leader.wait_for(r"listening on AMQP")
    conn, ch = open_channel(new_leader.address)
    got = []
    while True:
        method, _props, body = ch.basic_get("jobs", auto_ack=True)
        if method is None:
            break
        got.append((body, method.redelivered))
    conn.close()
    assert got == [(b"job-%d" % i, i < 2) for i in range(5)]


def test_kill_9_of_the_leader_under_load_loses_no_confirmed_message(nodes: list[Node]) -> None:
    """Two publishers with confirms and two consumers with acks run through every
    node's port while the leader is killed: they reconnect to the new leader and
    go on, and every message a publisher saw confirmed is delivered afterwards."""
    leader = start_cluster(nodes)
    load = FailoverLoad([n.address for n in nodes]).start()
    try:
        load.wait_until(
            lambda: load.summary()["confirmed"] >= 300 and load.summary()["delivered"] >= 100,
            60,
            "traffic before the kill",
        )
        followers = [n for n in nodes if n is not leader]
        before = marks(followers)
        killed_at = time.monotonic()
        leader.kill()
        wait_any(followers, "elected leader", timeout=30, since=before)
        load.wait_until(
            lambda: load.stats.confirmed_between(killed_at, float("inf")) >= 300,
            60,
            "confirms from the new leader",
        )
        # Every client lost its connection and comes back (one may still be in its
        # backoff when the others have made the 300 confirms).
        load.wait_until(lambda: load.summary()["reconnects"] >= 4, 60, "every client back")
        load.stop_publishing()
        load.wait_until(lambda: not load.stats.missing(), 60, "every confirmed message delivered")
    finally:
        load.stop()
    summary = load.summary()
    assert summary["reconnects"] >= 4
    with load.stats.lock:
        assert set(load.stats.delivered) <= load.stats.sent  # nothing out of nowhere
    assert not load.stats.missing()


def test_a_stopped_follower_leaves_the_isr_and_catches_up_after(nodes: list[Node]) -> None:
    leader = start_cluster(nodes)
    stopped = nodes[2]
    assert stopped.proc is not None
    stopped.proc.send_signal(signal.SIGSTOP)  # as cut off by a partition
    try:
        # Confirms do not hang on it: it is dropped from the ISR after the ack timeout.
        publish_jobs(leader.address, 0, 50)
        leader.wait_for("disconnecting it, out of the ISR")
        leader.wait_for(r"in-sync replicas: \w+$")
    finally:
        stopped.proc.send_signal(signal.SIGCONT)
    stopped.wait_for("synced with the leader")
    leader.wait_for(r"in-sync replicas: \w+, \w+")
    publish_jobs(leader.address, 50, 50)
    # The one that was stopped can lead now: every confirmed message is there.
    before = marks(nodes[1:])
    leader.kill()
    new_leader = wait_any(nodes[1:], "elected leader", timeout=30, since=before)
    new_leader.wait_for(r"listening on AMQP")
    assert job_bodies(new_leader.address) == {b"job-%d" % i for i in range(100)}


def test_a_rolling_restart_keeps_serving_and_loses_nothing(nodes: list[Node]) -> None:
    leader = start_cluster(nodes)
    publish_jobs(leader.address, 0, 20)
    published = 20
    # Followers first, then the leader, one at a time, each back in sync before the next.
    for node in [nodes[1], nodes[2], nodes[0]]:
        others = [n for n in nodes if n is not node]
        before = marks(others)
        node.stop()
        if node is leader:
            leader = wait_any(others, "elected leader", timeout=30, since=before)
            leader.wait_for(r"listening on AMQP")
        node.start()
        node.wait_for("synced with the leader")
        # Any node's port reaches the leader.
        publish_jobs(node.address, published, 20)
        published += 20
    assert job_bodies(leader.address) == {b"job-%d" % i for i in range(published)}


def test_every_node_reports_the_cluster(etcd: EtcdProcess, tmp_path: Path) -> None:
    # Named nodes ([clustering] node_name): every report and log line uses the names.
    nodes = [
        Node(tmp_path, f"h{i}", etcd.url, http=True, settings={"clustering": {"node_name": f"node{i}"}})
        for i in range(3)
    ]
    try:
        leader = start_cluster(nodes)
        assert leader is nodes[0]
        assert any("elected leader (node node0)" in line for line in leader.log)
        for node in nodes[1:]:
            assert any("following leader node0 at" in line for line in node.log)
        publish_jobs(leader.address, 0, 10)
        auth = "Basic " + base64.b64encode(b"guest:guest").decode()
        for node in nodes:  # a follower's HTTP port reaches the leader's API
            request = urllib.request.Request(
                f"http://127.0.0.1:{node.http_port}/api/cluster", headers={"Authorization": auth}
            )
            with urllib.request.urlopen(request, timeout=10) as resp:
                status = json.load(resp)
            assert status["enabled"] and status["role"] == "leader"
            assert status["node"] == status["leader"]["id"] == "node0"
            assert status["in_sync_replicas"] == ["node0", "node1", "node2"]
            assert {f["node"] for f in status["followers"]} == set(status["in_sync_replicas"]) - {
                status["node"]
            }
            assert all(f["state"] == "streaming" and f["in_sync"] for f in status["followers"])
            assert {f["stream_reads"] for f in status["followers"]} == {
                f"127.0.0.1:{n.stream_read_port}" for n in nodes if n is not leader
            }
        request = urllib.request.Request(
            f"http://127.0.0.1:{nodes[2].http_port}/metrics", headers={"Authorization": auth}
        )
        with urllib.request.urlopen(request, timeout=10) as resp:
            metrics = resp.read().decode()
        assert "warren_cluster_leader 1\n" in metrics
        assert "warren_cluster_in_sync_replicas 3\n" in metrics
        assert 'warren_cluster_follower_lag_actions{follower="node1"}' in metrics
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "warren",
                "ctl",
                "--url",
                f"http://127.0.0.1:{nodes[1].http_port}",
                "cluster",
                "status",
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
            env=dict(os.environ, PYTHONPATH=str(SRC)),
        ).stdout
        assert "role" in out and "leader" in out and "in-sync replicas" in out
        assert out.count("streaming") == 2
        assert "node0, node1, node2" in out
        assert re.search(r"^node1 ", out, re.M) and re.search(r"^node2 ", out, re.M), out
    finally:
        for node in nodes:
            node.stop()


def test_followers_serve_the_streams_the_leader_names(nodes: list[Node]) -> None:
    leader = start_cluster(nodes)
    conn, ch = open_channel(leader.address)
    ch.queue_declare("events", durable=True, arguments={"x-queue-type": "stream"})
    ch.confirm_delivery()
    for i in range(300):
        ch.basic_publish("", "events", b"e%d" % i)
    announced = conn._impl.server_properties["warren_stream_replicas"]
    conn.close()
    followers = [n for n in nodes if n is not leader]
    assert sorted(announced) == sorted(f"127.0.0.1:{n.stream_read_port}" for n in followers)
    for follower in followers:
        conn, ch = open_channel((follower.host, follower.stream_read_port))
        ch.basic_qos(prefetch_count=100)
        got = []
        for method, props, body in ch.consume("events", arguments={"x-stream-offset": 250}):
            got.append((props.headers["x-stream-offset"], body))
            ch.basic_ack(method.delivery_tag)
            if len(got) == 50:
                break
        assert got == [(i, b"e%d" % i) for i in range(250, 300)]
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            ch.queue_delete("events")
        assert refused.value.reply_code == 403
        assert f"amqp://127.0.0.1:{leader.amqp_port}" in refused.value.reply_text
        conn.close()


def _etcd_isr_history(etcd: EtcdProcess, since: int | None) -> list[tuple[int, set[str]]]:
    """Every value the ISR key held from revision ``since`` on (None: only the
    current one), newest first, as (mod_revision, node ids): etcd keeps past
    revisions until it compacts."""

    async def read() -> list[tuple[int, set[str]]]:
        client = EtcdClient([etcd.url])
        history: list[tuple[int, set[str]]] = []
        try:
            body: dict[str, str] = {"key": base64.b64encode(b"test/isr").decode()}
            while True:
                kvs = (await client.call("kv/range", body)).get("kvs") or []
                if not kvs:
                    break
                revision = int(kvs[0]["mod_revision"])
                value = base64.b64decode(kvs[0].get("value", "")).decode()
                history.append((revision, set(value.split(",")) if value else set()))
                if since is None or revision <= since:
                    break
                body["revision"] = str(revision - 1)
        finally:
            await client.close()
        return history

    return asyncio.run(read())


def test_a_paused_leader_cannot_shrink_the_isr_or_confirm_after_its_lease(
    nodes: list[Node], etcd: EtcdProcess
) -> None:
    """A leader paused past its lease (a VM freeze, a long GC) wakes up to find
    its followers gone: it must neither store an ISR of itself alone over the new
    leader's nor confirm a message the new leader lacks."""
    leader = start_cluster(nodes)
    publish_jobs(leader.address, 0, 10)
    conn, ch = open_channel(leader.address)  # a client of the old leader's own port
    ch.confirm_delivery()
    followers = [n for n in nodes if n is not leader]
    assert leader.proc is not None
    before = marks(followers)
    leader.proc.send_signal(signal.SIGSTOP)
    try:
        new_leader = wait_any(followers, "elected leader", timeout=30, since=before)
        other = next(n for n in followers if n is not new_leader)
        new_leader.wait_for(f"in-sync replicas: .*{other.node_id}")  # it joined
        elected_isr = _etcd_isr_history(etcd, since=None)[0][0]
        confirmed: list[int] = []

        def publish() -> None:
            try:
                for i in range(10, 30):
                    ch.basic_publish("", "jobs", b"job-%d" % i, PERSISTENT)
                    confirmed.append(i)
            except pika.exceptions.AMQPError:
                pass

        publisher = threading.Thread(target=publish)
        publisher.start()
    finally:
        leader.proc.send_signal(signal.SIGCONT)
    leader.wait_for("no longer leads")
    publisher.join(30)
    assert not publisher.is_alive()
    leader.wait_for(r"following leader")
    # From the new leader's first ISR on, every value etcd held names the new
    # leader (the old one, fenced, never stored itself alone); the old leader may
    # already have caught up and rejoined.
    history = _etcd_isr_history(etcd, since=elected_isr)
    assert history[-1][0] == elected_isr
    assert all(new_leader.node_id in isr for _, isr in history), history
    assert {n.node_id for n in followers} <= history[0][1]
    # Whatever the old leader confirmed is on the new one.
    got = job_bodies(new_leader.address)
    assert {b"job-%d" % i for i in range(10)} | {b"job-%d" % i for i in confirmed} <= got


def test_the_leader_is_quorum_critical_while_no_follower_is_in_sync(
    etcd: EtcdProcess, tmp_path: Path
) -> None:
    """/api/health/checks/node-is-quorum-critical in a cluster: ok while a follower
    is in sync; 503 naming the durable queues once none is (stopping the leader
    then would leave no node with every confirmed message)."""
    nodes = [Node(tmp_path, f"q{i}", etcd.url, http=True) for i in range(2)]
    auth = "Basic " + base64.b64encode(b"guest:guest").decode()

    def check() -> tuple[int, dict[str, object]]:
        request = urllib.request.Request(
            f"http://127.0.0.1:{nodes[0].http_port}/api/health/checks/node-is-quorum-critical",
            headers={"Authorization": auth},
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as resp:
                return resp.status, json.load(resp)
        except urllib.error.HTTPError as exc:
            return exc.code, json.load(exc)

    try:
        leader = start_cluster(nodes)
        assert leader is nodes[0]
        publish_jobs(leader.address, 0, 1)  # declares the durable queue "jobs"
        assert check() == (200, {"status": "ok"})
        nodes[1].stop()
        deadline = time.monotonic() + 30
        while (answer := check())[0] != 503 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert answer == (503, {
            "status": "failed",
            "reason": "There are quorum queues that would lose their quorum if the target "
            "node is shut down",
            "queues": [{"name": "jobs", "virtual_host": "/", "type": "classic"}],
        })
    finally:
        for node in nodes:
            node.stop()
