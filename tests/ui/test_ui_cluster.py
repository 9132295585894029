"""The cluster page against a real cluster: a real etcd and two Warren nodes as
processes (tests/cluster's), the browser on the follower's HTTP port (which
passes through to the leader's API and UI)."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from .conftest import Console, UIServer
from .helpers import log_in

pytestmark = pytest.mark.ui

CLUSTER_TESTS = Path(__file__).resolve().parents[1] / "cluster"


@pytest.fixture
def two_nodes(etcd: Any, tmp_path: Path) -> Iterator[list[Any]]:
    """A leader and a follower in its in-sync replica set."""
    sys.path.insert(0, str(CLUSTER_TESTS))  # tests/cluster's modules import each other by name
    try:
        from nodes import Node
    finally:
        sys.path.remove(str(CLUSTER_TESTS))
    nodes = [Node(tmp_path, f"n{i}", etcd.url, http=True) for i in range(2)]
    try:
        leader, follower = nodes
        leader.start().wait_for("elected leader")
        leader.wait_for("listening on AMQP")
        follower.start().wait_for("synced with the leader")
        leader.wait_for(r"in-sync replicas: \S")  # the follower joined the ISR
        yield nodes
    finally:
        for node in nodes:
            node.stop()


def test_cluster_page_shows_the_leader_and_its_follower(
    page: Page, two_nodes: list[Any], console: Console
) -> None:
    leader, follower = two_nodes
    leader_id = (leader.data_dir / ".node_id").read_text().strip()
    follower_id = (follower.data_dir / ".node_id").read_text().strip()
    ui = UIServer(f"http://127.0.0.1:{follower.http_port}", "a cluster's follower", 0)
    log_in(page, ui)
    expect(page.locator("main h1")).to_have_text("Overview")
    summary = page.locator("#cluster-summary")
    expect(summary).to_have_text(f"node {leader_id} (leader), 2 in sync, 1 follower connected")

    summary.click()
    expect(page.locator("main h1")).to_have_text("Cluster")
    expect(page.locator("#cluster-disabled")).to_have_count(0)
    expect(page.locator("[data-field=role]")).to_have_text("leader")
    expect(page.locator("[data-field=leader]")).to_have_text(leader_id)
    expect(page.locator("[data-field=isr]")).to_have_text(
        ", ".join(sorted([leader_id, follower_id]))
    )
    row = page.locator(f"tr[data-follower='{follower_id}']")
    expect(row.locator("[data-field=state]")).to_have_text("streaming")
    expect(row.locator("[data-field=in_sync]")).to_have_text("yes")
    expect(row.locator("[data-field=lag]")).to_have_text(re.compile(r"^\d[\d,]*$"))
    expect(row.locator("[data-field=stream_reads]")).to_have_text(
        f"127.0.0.1:{follower.stream_read_port}"
    )
    expect(row.locator("[data-field=stream_protocol_reads]")).to_have_text("none")
    expect(page.locator("main")).to_contain_text(f"127.0.0.1:{leader.amqp_port}")
    assert console.errors == []
