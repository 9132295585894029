"""Definitions move between RabbitMQ and Warren both ways: a RabbitMQ 3.10 export
imported into Warren, and Warren's export imported into RabbitMQ, each giving
back the same definitions. Needs Debian's rabbitmq-server (skipped without it;
test_mgmt_compat.py compares exports with a recorded one in any case)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import BrokerThread
from httphelp import Api

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rabbitmq_proc import AVAILABLE, RabbitMQ  # noqa: E402
from test_mgmt_compat import VHOST_313, ordered, tool  # noqa: E402

pytestmark = [
    pytest.mark.skipif(not AVAILABLE, reason="rabbitmq-server is not installed"),
    pytest.mark.timeout(120),
]


@pytest.fixture
def rabbit(tmp_path: Path) -> Iterator[RabbitMQ]:
    server = RabbitMQ(tmp_path / "rabbitmq", plugins=["rabbitmq_management"])
    try:
        yield server
    finally:
        server.stop()


def compat_parts(api: Api) -> Any:
    """The export's entries about the compat vhost and user, key order kept but in
    parameters' values: RabbitMQ itself gives an imported value's keys back sorted."""
    parts = tool._mine(api.get("/api/definitions"))
    for param in parts["parameters"]:
        param["value"] = dict(sorted(param["value"].items()))
    return ordered(json.dumps(parts))


def _stream(api: Api) -> None:
    reply = api.put("/api/queues/compat/ds", {"durable": True, "arguments": {"x-queue-type": "stream"}})
    assert reply.status == 201, reply


def test_definitions_round_trip_between_rabbitmq_and_warren(
    rabbit: RabbitMQ, broker: BrokerThread
) -> None:
    rmq, warren = Api(rabbit.http_port), Api(broker.http_port)
    tool.populate(tool.Client(f"http://127.0.0.1:{rabbit.http_port}"))
    _stream(rmq)
    exported = rmq.get("/api/definitions")
    before = compat_parts(rmq)

    # RabbitMQ -> Warren: everything arrives, and is exported as RabbitMQ did.
    reply = warren.post("/api/definitions", exported)
    assert reply.status in (201, 204), reply
    expected = json.loads(json.dumps(tool._mine(exported)))
    expected["vhosts"] = [VHOST_313]
    for param in expected["parameters"]:
        param["value"] = dict(sorted(param["value"].items()))
    assert compat_parts(warren) == ordered(json.dumps(expected))
    queue = warren.get("/api/queues/compat/dq")
    assert (queue["arguments"], queue["policy"], queue["operator_policy"]) == (
        {"x-max-length": 10}, "pol", "opol")
    assert warren.get("/api/queues/compat/ds")["type"] == "stream"

    # Warren -> RabbitMQ (emptied of them first): the same definitions come back.
    rmq.delete("/api/vhosts/compat")
    rmq.delete("/api/users/compat-du")
    reply = rmq.post("/api/definitions", warren.get("/api/definitions"))
    assert reply.status in (201, 204), reply
    assert compat_parts(rmq) == before
    # RabbitMQ takes 3.13's vhost fields: the description Warren exported arrives.
    warren.put("/api/vhosts/compat", {"description": "orders", "tags": "prod"})
    rmq.post("/api/definitions", warren.get("/api/definitions"))
    assert rmq.get("/api/vhosts/compat")["description"] == "orders"
