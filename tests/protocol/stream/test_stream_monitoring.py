"""Stream protocol connections as the monitoring sees them, after rstream
publishes and consumes over a socket: the protocol="stream" Prometheus
families (a real scrape of the [prometheus] listener, RabbitMQ's
rabbit_global_counters for the stream plugin), and rabbitmq_stream_management's
API (/api/stream/...) beside /api/connections, closing one included."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from conftest import BrokerThread, start_broker
from httphelp import Api, wait_for
from metricshelp import Samples, scrape, value
from rstream import (
    AMQPMessage,
    Consumer,
    ConsumerOffsetSpecification,
    MessageContext,
    OffsetType,
    Producer,
)
from rstream.recovery import BackOffRecoveryStrategy
from streamhelp import HOST

pytestmark = [pytest.mark.timeout(120)]

STREAM = {"protocol": "stream"}
STREAM_QUEUE = {"protocol": "stream", "queue_type": "rabbit_stream_queue"}


@pytest.fixture
def warren(tmp_path: Path) -> Iterator[BrokerThread]:
    b = start_broker(tmp_path / "data", stream_port=0)
    try:
        yield b
    finally:
        b.stop()


def api(b: BrokerThread) -> Api:
    listener = b.broker.listener("http")
    assert listener is not None
    return Api(listener.port)


def named(items: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    """The connections a client opened under ``name`` (rstream may open two:
    its locator, and one for its publishers or subscriptions)."""
    return [i for i in items if i.get("user_provided_name") == name]


def streams_only(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [i for i in items if i["protocol"] == "stream"]


def check_metrics_while_open(m: Samples, connections: int) -> None:
    assert value(m, "rabbitmq_global_messages_received_total", **STREAM) == 5
    assert value(m, "rabbitmq_global_messages_received_confirm_total", **STREAM) == 5
    assert value(m, "rabbitmq_global_messages_routed_total", **STREAM) == 5
    assert value(m, "rabbitmq_global_messages_confirmed_total", **STREAM) == 5
    assert value(m, "rabbitmq_global_publishers", **STREAM) == 1
    assert value(m, "rabbitmq_global_consumers", **STREAM) == 1
    assert value(m, "rabbitmq_global_messages_delivered_total", **STREAM_QUEUE) == 5
    # Stream consumers settle nothing: RabbitMQ counts no acks for them, nor
    # any for AMQP 0-9-1 on the stream.
    assert value(m, "rabbitmq_global_messages_acknowledged_total", **STREAM_QUEUE) == 0
    amqp_stream = {"protocol": "amqp091", "queue_type": "rabbit_stream_queue"}
    assert value(m, "rabbitmq_global_messages_acknowledged_total", **amqp_stream) == 0
    assert value(m, "rabbitmq_global_messages_received_total", protocol="amqp091") == 0
    # Only the stream queue type for the stream protocol, as RabbitMQ.
    labelled = [labels for labels, _ in m["rabbitmq_global_messages_delivered_total"]]
    assert [lb for lb in labelled if lb["protocol"] == "stream"] == [STREAM_QUEUE]
    # No channels: the channel families leave the stream protocol out.
    assert value(m, "rabbitmq_channel_messages_published_total") == 0
    assert value(m, "rabbitmq_connections") == connections
    opened = value(m, "rabbitmq_connections_opened_total")
    assert opened - value(m, "rabbitmq_connections_closed_total") == connections
    assert value(m, "rabbitmq_consumers") == 1


def test_metrics_and_management_api_follow_rstream(warren: BrokerThread) -> None:
    admin = api(warren)
    got: list[int] = []
    done = asyncio.Event()

    async def on_message(msg: AMQPMessage, ctx: MessageContext) -> None:
        got.append(ctx.offset)
        if len(got) == 5:
            done.set()

    async def run() -> tuple[Samples, Samples]:
        port = warren.stream_port
        async with Producer(
            HOST, port, username="guest", password="guest", connection_name="mon-producer"
        ) as p:
            await p.create_stream("mon")
            for i in range(5):
                await p.send_wait("mon", AMQPMessage(body=f"m{i}".encode()))
            async with Consumer(
                HOST, port, username="guest", password="guest", connection_name="mon-consumer"
            ) as c:
                await c.subscribe(
                    "mon",
                    on_message,
                    offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST, None),
                    properties={"app": "monitoring"},
                )
                await asyncio.wait_for(done.wait(), 30)
                conns = await asyncio.to_thread(lambda: streams_only(admin.get("/api/connections")))
                m = await asyncio.to_thread(scrape, warren)
                check_metrics_while_open(m, len(conns))
                await asyncio.to_thread(check_api_while_open, admin)
            # The consumer's connections are gone; the counters are not.
            await asyncio.to_thread(
                wait_for,
                lambda: value(scrape(warren), "rabbitmq_global_consumers", **STREAM) == 0,
            )
            after_consumer = await asyncio.to_thread(scrape, warren)
        return m, after_consumer

    _, after_consumer = asyncio.run(run())
    assert got == [0, 1, 2, 3, 4]
    assert value(after_consumer, "rabbitmq_global_messages_delivered_total", **STREAM_QUEUE) == 5
    wait_for(lambda: value(scrape(warren), "rabbitmq_global_publishers", **STREAM) == 0)
    end = scrape(warren)
    assert value(end, "rabbitmq_global_messages_received_total", **STREAM) == 5
    assert value(end, "rabbitmq_global_messages_confirmed_total", **STREAM) == 5
    assert value(end, "rabbitmq_global_messages_delivered_total", **STREAM_QUEUE) == 5
    assert value(end, "rabbitmq_global_messages_received_total", protocol="amqp091") == 0
    opened = value(end, "rabbitmq_connections_opened_total")
    assert value(end, "rabbitmq_connections_closed_total") == opened


def check_api_while_open(admin: Api) -> None:
    everyone = streams_only(admin.get("/api/connections"))
    listed = admin.get("/api/stream/connections")
    assert sorted(c["name"] for c in listed) == sorted(c["name"] for c in everyone)
    assert admin.get("/api/stream/connections/%2F") == listed
    assert admin.request("GET", "/api/stream/connections/nowhere").status == 404
    [producer] = [c for c in named(listed, "mon-producer") if c["publishers"]]
    [consumer] = [c for c in named(listed, "mon-consumer") if c["subscriptions"]]
    for conn in (producer, consumer):
        assert conn["protocol"] == "stream" and conn["vhost"] == "/" and conn["user"] == "guest"
        assert conn["channels"] == 0 and conn["auth_mechanism"] == "PLAIN"
    path = f"/api/stream/connections/%2F/{quote(producer['name'], safe='')}"
    one = admin.get(path)
    assert one["name"] == producer["name"]
    assert one["client_properties"]["connection_name"] == "mon-producer"
    assert (
        admin.request("GET", f"/api/stream/connections/other/{quote(producer['name'])}").status
        == 404
    )

    details = {k: producer[k] for k in ("name", "node", "peer_host", "peer_port", "user")}
    [pub] = admin.get("/api/stream/publishers")
    assert pub == {
        "confirmed": 5,
        "connection_details": details,
        "errored": 0,
        "published": 5,
        "publisher_id": pub["publisher_id"],
        "queue": {"name": "mon", "vhost": "/"},
        "reference": "",
    }
    assert admin.get("/api/stream/publishers/%2F") == [pub]
    assert admin.get("/api/stream/publishers/%2F/mon") == [pub]
    assert admin.get(path + "/publishers") == [pub]
    assert admin.request("GET", "/api/stream/publishers/%2F/missing").status == 404
    assert admin.request("GET", "/api/stream/publishers/nowhere").status == 404

    [sub] = admin.get("/api/stream/consumers")
    assert {k: sub[k] for k in sub if k not in ("credits", "subscription_id")} == {
        "active": True,
        "activity_status": "up",
        "connection_details": {k: consumer[k] for k in details},
        "consumed": 5,
        "offset": 4,
        "offset_lag": 0,
        "properties": sub["properties"],
        "queue": {"name": "mon", "vhost": "/"},
    }
    assert sub["properties"]["app"] == "monitoring"
    assert isinstance(sub["credits"], int)
    assert admin.get("/api/stream/consumers/%2F") == [sub]
    consumer_path = f"/api/stream/connections/%2F/{quote(consumer['name'], safe='')}"
    assert admin.get(consumer_path + "/consumers") == [sub]
    assert admin.get(consumer_path + "/publishers") == []
    assert admin.request("GET", "/api/stream/consumers?disable_stats=true").status == 400
    assert admin.get("/api/stream/publishers?disable_stats=true") == []

    # A management user sees only their own connections' publishers and consumers.
    assert admin.put("/api/users/mon-bob", {"password": "bob", "tags": "management"}).status == 201
    assert (
        admin.put(
            "/api/permissions/%2F/mon-bob", {"configure": ".*", "write": ".*", "read": ".*"}
        ).status
        == 201
    )
    bob = admin.as_user("mon-bob", "bob")
    assert bob.get("/api/stream/connections") == []
    assert bob.get("/api/stream/publishers") == []
    assert bob.get("/api/stream/consumers") == []
    assert bob.request("DELETE", path).status == 404  # not one bob may see


def test_closing_a_stream_connection_over_the_api(warren: BrokerThread) -> None:
    """DELETE /api/connections/{name} and /api/stream/connections/{vhost}/{name}:
    the client gets a Close and the connection goes."""
    admin = api(warren)

    async def run() -> None:
        port = warren.stream_port
        clients = [
            Producer(
                HOST,
                port,
                username="guest",
                password="guest",
                connection_name=f"mon-{i}",
                recovery_strategy=BackOffRecoveryStrategy(enable=False),
            )
            for i in range(2)
        ]
        for client in clients:
            await client.start()
        try:
            conns = await asyncio.to_thread(lambda: admin.get("/api/stream/connections"))
            first, second = named(conns, "mon-0"), named(conns, "mon-1")
            assert first and second
            for conn in first:
                reply = await asyncio.to_thread(
                    admin.request,
                    "DELETE",
                    f"/api/connections/{quote(conn['name'], safe='')}",
                    headers={"X-Reason": "tidy up"},
                )
                assert reply.status == 204
            for conn in second:
                reply = await asyncio.to_thread(
                    admin.request,
                    "DELETE",
                    f"/api/stream/connections/%2F/{quote(conn['name'], safe='')}",
                )
                assert reply.status == 204

            def gone() -> bool:
                left = admin.get("/api/stream/connections")
                return not [c for c in left if c.get("user_provided_name") in ("mon-0", "mon-1")]

            await asyncio.to_thread(wait_for, gone, 20, "the connections closed")
        finally:
            for client in clients:
                with contextlib.suppress(Exception):  # the server closed it first
                    await client.close()

    asyncio.run(run())
