"""A follower whose leader died logs the change of state once, then retries
quietly with a back-off until etcd names the next leader (cluster/retry.py).

One ClusterNode in the test's event loop against a real etcd; the leader it is
told to follow is a dead port (its key held by a lease, as a killed leader's is
until the lease runs out). The node's clock is driven by the test: each retry
delay is taken from the node's sleep and released at once, so a long dead
interval passes without waiting."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from pathlib import Path
from typing import Any

from conftest import new_event_loop
from free_ports import free_port

from warren import Config
from warren.cluster.etcd import EtcdClient
from warren.cluster.leader import Replicator
from warren.cluster.node import ClusterNode
from warren.cluster.retry import Backoff


class DrivenClock:
    """The node's clock: its sleeps wait until the test releases them."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: asyncio.Queue[tuple[float, asyncio.Future[None]]] = asyncio.Queue()

    def time(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.sleeps.put_nowait((seconds, done))
        await done

    async def release_next(self) -> float:
        """Let the node's next sleep end (as if its time had passed); its length."""
        seconds, done = await asyncio.wait_for(self.sleeps.get(), 30)
        self.now += seconds
        if not done.done():
            done.set_result(None)
        return seconds


class Lines(logging.Handler):
    """The node's log lines, and a way to wait for one."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []
        self.changed = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())
        self.changed.set()

    async def wait_for(self, pattern: str, since: int = 0) -> int:
        regex = re.compile(pattern)

        async def found() -> int:
            while True:
                for i, line in enumerate(self.lines[since:], since):
                    if regex.search(line):
                        return i
                self.changed.clear()
                await self.changed.wait()

        return await asyncio.wait_for(found(), 30)


def _no_broker(_config: Config) -> Any:
    raise AssertionError("this node is not in the in-sync replica set: it must not lead")


def test_backoff_doubles_to_its_cap_and_resets() -> None:
    backoff = Backoff(first=0.1, cap=1.0)
    assert [backoff.next() for _ in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert backoff.failures == 6
    backoff.reset()
    assert backoff.failures == 0 and backoff.next() == 0.1


def test_a_follower_of_a_dead_leader_logs_each_change_once(etcd: Any, tmp_path: Path) -> None:
    loop = new_event_loop()
    try:
        loop.run_until_complete(_dead_leader(etcd.url, tmp_path))
    finally:
        loop.close()


async def _dead_leader(etcd_url: str, tmp_path: Path) -> None:
    prefix = "quiet"
    client = EtcdClient([etcd_url])
    lines = Lines()
    logger = logging.getLogger("warren")
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(lines)
    clock = DrivenClock()
    stop = asyncio.Event()
    new_leader: asyncio.Server | None = None
    try:
        await client.put(f"{prefix}/secret", "s3cret")
        await client.put(f"{prefix}/isr", "dead,new")
        lease = await client.grant(60)
        dead = {
            "id": "dead",
            "replication": f"127.0.0.1:{free_port()}",  # nothing listens: refused
            "amqp": f"127.0.0.1:{free_port()}",
            "mqtt": None,
            "http": None,
        }
        await client.put(f"{prefix}/leader", json.dumps(dead), lease)
        config = Config(
            data_dir=str(tmp_path / "node"),
            amqp_port=free_port(),
            mqtt_port=-1,
            stream_port=-1,
            http_port=-1,
            prometheus_port=-1,
            clustering=True,
            clustering_etcd_endpoints=(etcd_url,),
            clustering_etcd_prefix=prefix,
            clustering_lease_ttl=10,
        )
        node = ClusterNode(config, _no_broker, clock=clock)
        running = asyncio.ensure_future(node.run(stop))

        # 12 attempts on the dead leader: 17 s of the node's time, driven.
        delays = [await clock.release_next() for _ in range(12)]
        assert delays == [0.1, 0.2, 0.4, 0.8, 1.6] + [2.0] * 7
        assert node.role == "follower"
        assert sum("replication from dead ended" in line for line in lines.lines) == 1, lines.lines
        assert sum("following leader dead" in line for line in lines.lines) == 1, lines.lines
        assert len(lines.lines) <= 4, lines.lines  # node, following, proxying, ended

        # The dead leader's lease runs out: one line says so, then one that it waits.
        before = len(lines.lines)
        await client.revoke(lease)
        await lines.wait_for("not in the in-sync replica set", before)
        assert lines.lines[before:] == [
            "leader dead is gone or replaced: looking for the next",
            "not in the in-sync replica set: waiting for a leader",
        ]

        # The next leader: the node follows and syncs with it, and says so.
        root = tmp_path / "new"
        root.mkdir()
        (root / "file").write_bytes(b"from the new leader")
        replicator = Replicator(root, "s3cret")
        new_leader = await asyncio.start_server(replicator.serve, "127.0.0.1", 0)
        port = new_leader.sockets[0].getsockname()[1]
        before = len(lines.lines)
        await client.put(
            f"{prefix}/leader",
            json.dumps({**dead, "id": "new", "replication": f"127.0.0.1:{port}"}),
        )
        await lines.wait_for("synced with the leader", before)
        assert (tmp_path / "node" / "file").read_bytes() == b"from the new leader"
        assert any("following leader new" in line for line in lines.lines[before:])
        stop.set()
        await asyncio.wait_for(running, 30)
    finally:
        stop.set()
        if new_leader is not None:
            new_leader.close()
        logger.removeHandler(lines)
        logger.setLevel(level)
        await client.close()

