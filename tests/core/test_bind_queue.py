"""A queue binding's rule, once in the core (VHost.bind_queue) for every door:
the exchange, then the queue must exist, then the binding must be valid, and
only then is the queue's exclusivity checked (RabbitMQ's order). AMQP 0-9-1's
queue.bind, AMQP 1.0's /management node and the HTTP API call it after their
own permission checks; the HTTP API has no connection and binds any queue.

In memory: a tests/harness broker, pika's calls over MemoryAMQP, the
/management node (tests/harness/management_node.py), the management API
through ``harness.http()``.
"""

from __future__ import annotations

import pytest
from harness import Harness, channel_error, harness_fixture
from harness.management_node import NodePair

from warren.core.errors import NotFound, PreconditionFailed, ResourceLocked

pytestmark = pytest.mark.timeout(60)

memory = harness_fixture()

NOT_AN_INTEGER = "The binding key must be an integer"


def exclusive_queue(b: Harness) -> object:
    """Queue ``mine``, exclusive to a connection the test keeps open, and the
    x-consistent-hash exchange ``hash`` (its binding keys must be integers)."""
    conn = b.amqp_connection()
    ch = conn.channel()
    ch.queue_declare("mine", exclusive=True)
    ch.exchange_declare("hash", "x-consistent-hash")
    return conn


def test_the_core_order(memory: Harness) -> None:
    keep = exclusive_queue(memory)
    vhost = memory.broker.vhosts["/"]
    other = object()

    def bind(exchange: str, queue: str, key: str, owner: object | None) -> object:
        return memory.call(lambda: vhost.bind_queue(exchange, queue, key, None, owner))

    with pytest.raises(NotFound, match="no exchange 'nope'"):
        bind("nope", "missing", "x", other)
    with pytest.raises(NotFound, match="no queue 'missing'"):
        bind("hash", "missing", "x", other)
    with pytest.raises(PreconditionFailed, match=NOT_AN_INTEGER):
        bind("hash", "mine", "x", other)
    with pytest.raises(ResourceLocked, match="locked queue 'mine'"):
        bind("hash", "mine", "1", other)
    assert "mine" not in {b.destination.name for b in vhost.exchanges["hash"].bindings.values()}
    bind("hash", "mine", "1", None)  # no connection (the HTTP API): any queue
    assert len(vhost.exchanges["hash"].bindings) == 1
    assert keep is not None


def test_every_door_says_the_same(memory: Harness) -> None:
    keep = exclusive_queue(memory)
    ch = memory.amqp_connection().channel
    assert "no exchange 'nope'" in channel_error(404, ch().queue_bind, "missing", "nope", "x")
    assert "no queue 'missing'" in channel_error(404, ch().queue_bind, "missing", "hash", "x")
    assert NOT_AN_INTEGER in channel_error(406, ch().queue_bind, "mine", "hash", "x")
    assert "locked queue 'mine'" in channel_error(405, ch().queue_bind, "mine", "hash", "1")

    pair = NodePair(memory)
    for source, destination, key, text in (
        ("nope", "missing", "x", "no exchange 'nope'"),
        ("hash", "missing", "x", "no queue 'missing'"),
        ("hash", "mine", "x", NOT_AN_INTEGER),
        ("hash", "mine", "1", "locked queue 'mine'"),
    ):
        body = {"source": source, "destination_queue": destination, "binding_key": key}
        status, answer = pair.status("POST", "/bindings", body)
        assert status == "400" and text in answer, (status, answer)

    api = memory.http()
    reply = api.post("/api/bindings/%2F/e/hash/q/mine", {"routing_key": "x"})
    assert reply.status == 400 and NOT_AN_INTEGER in reply.json()["reason"], reply
    reply = api.post("/api/bindings/%2F/e/hash/q/mine", {"routing_key": "1"})
    assert reply.status == 201, reply
    assert keep is not None
