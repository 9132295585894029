"""Connections, channels and consumers of real AMQP clients (pika), listed and closed
through the management API, in RabbitMQ 3.10.8's shapes."""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator

import pika
import pytest
from conftest import BrokerThread
from httphelp import Api, wait_for
from pika.adapters.blocking_connection import BlockingConnection
from pika.exceptions import ConnectionClosedByBroker
from pikahelp import connect

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def api(broker: BrokerThread) -> Api:
    return Api(broker.http_port)


@pytest.fixture
def client(broker: BrokerThread) -> Iterator[BlockingConnection]:
    conn = connect(broker, client_properties={"connection_name": "my-app"})
    try:
        yield conn
    finally:
        if conn.is_open:
            conn.close()


def quoted(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def test_a_connection_is_listed_with_rabbitmqs_fields(
    api: Api, broker: BrokerThread, client: BlockingConnection
) -> None:
    conns = api.get("/api/connections")
    assert len(conns) == 1
    c = conns[0]
    local_port = client._impl._transport._sock.getsockname()[1]
    assert c["name"] == f"127.0.0.1:{local_port} -> 127.0.0.1:{broker.port}"
    assert (c["peer_host"], c["peer_port"], c["port"]) == ("127.0.0.1", local_port, broker.port)
    assert (c["user"], c["vhost"], c["protocol"], c["state"]) == ("guest", "/", "AMQP 0-9-1", "running")
    assert c["auth_mechanism"] == "PLAIN" and c["type"] == "network"
    assert c["client_properties"]["connection_name"] == "my-app"
    assert c["client_properties"]["product"] == "Pika Python Client Library"
    assert c["channels"] == 0
    assert api.get(f"/api/connections/{quoted(c['name'])}")["name"] == c["name"]
    assert api.get("/api/vhosts/%2F/connections") == conns
    assert api.get("/api/overview")["object_totals"]["connections"] == 1
    assert api.request("GET", "/api/connections/nosuch").status == 404


def test_channels_and_consumers(api: Api, client: BlockingConnection) -> None:
    ch = client.channel()
    ch.basic_qos(prefetch_count=7)
    ch.queue_declare("work")
    ch.basic_consume("work", lambda *a: None, consumer_tag="ctag1", arguments={"x-priority": 3})
    ch2 = client.channel()
    ch2.confirm_delivery()
    conn_name = api.get("/api/connections")[0]["name"]
    channels = api.get("/api/channels")
    assert [c["number"] for c in channels] == [1, 2]
    first = channels[0]
    assert first["name"] == f"{conn_name} (1)"
    assert first["connection_details"]["name"] == conn_name
    assert (first["consumer_count"], first["prefetch_count"], first["confirm"]) == (1, 7, False)
    assert channels[1]["confirm"] is True
    assert "consumer_details" not in first
    assert api.get(f"/api/connections/{quoted(conn_name)}/channels") == channels
    assert api.get("/api/vhosts/%2F/channels") == channels
    detail = api.get(f"/api/channels/{quoted(first['name'])}")
    consumers = api.get("/api/consumers")
    assert detail["consumer_details"] == consumers
    assert consumers == [
        {
            "arguments": {"x-priority": 3},
            "ack_required": True,
            "active": True,
            "activity_status": "up",
            "channel_details": {
                "connection_name": conn_name,
                "name": first["name"],
                "node": first["node"],
                "number": 1,
                "peer_host": "127.0.0.1",
                "peer_port": first["connection_details"]["peer_port"],
                "user": "guest",
            },
            "consumer_tag": "ctag1",
            "exclusive": False,
            "prefetch_count": 7,
            "queue": {"name": "work", "vhost": "/"},
        }
    ]
    assert api.get("/api/consumers/%2F") == consumers
    queue = api.get("/api/queues/%2F/work")
    assert queue["consumers"] == 1 and queue["consumer_details"] == consumers


def test_unacked_messages_are_counted(api: Api, client: BlockingConnection) -> None:
    ch = client.channel()
    ch.queue_declare("work")
    for _ in range(3):
        ch.basic_publish("", "work", b"m")
    ch.basic_qos(prefetch_count=2)
    ch.basic_consume("work", lambda *a: None)

    def counts() -> tuple[int, int] | None:
        client.process_data_events(0)
        q = api.get("/api/queues/%2F/work")
        pair = (q["messages_ready"], q["messages_unacknowledged"])
        return pair if pair == (1, 2) else None

    assert wait_for(counts, what="two unacked messages") == (1, 2)
    assert api.get("/api/channels")[0]["messages_unacknowledged"] == 2
    assert api.get("/api/overview")["queue_totals"]["messages"] == 3


def test_delete_closes_the_connection_with_the_given_reason(
    api: Api, client: BlockingConnection
) -> None:
    ch = client.channel()
    ch.queue_declare("", exclusive=True)
    name = api.get("/api/connections")[0]["name"]
    reply = api.delete(f"/api/connections/{quoted(name)}", headers={"X-Reason": "go away"})
    assert reply.status == 204
    with pytest.raises(ConnectionClosedByBroker) as info:
        while True:
            client.process_data_events(0.05)
    assert info.value.reply_code == 320
    assert info.value.reply_text == "CONNECTION_FORCED - go away"
    wait_for(lambda: api.get("/api/connections") == [], what="the connection to go")
    assert api.get("/api/queues") == []  # its exclusive queue went with it


def test_users_see_and_close_only_their_own_connections(
    api: Api, broker: BrokerThread, client: BlockingConnection
) -> None:
    api.put("/api/users/mgr", {"password": "pw", "tags": "management"})
    api.put("/api/permissions/%2F/mgr", {"configure": ".*", "write": ".*", "read": ".*"})
    mine = connect(broker, credentials=pika.PlainCredentials("mgr", "pw"))
    try:
        mgr = api.as_user("mgr", "pw")
        listed = mgr.get("/api/connections")
        assert [c["user"] for c in listed] == ["mgr"]
        guests = [c for c in api.get("/api/connections") if c["user"] == "guest"]
        reply = mgr.delete(f"/api/connections/{quoted(guests[0]['name'])}")
        assert reply.status == 404  # not visible to mgr
        assert mgr.delete(f"/api/connections/{quoted(listed[0]['name'])}").status == 204
        with pytest.raises(ConnectionClosedByBroker):
            while True:
                mine.process_data_events(0.05)
        assert client.is_open
    finally:
        if mine.is_open:
            mine.close()


def test_deleting_a_vhost_closes_its_connections(api: Api, broker: BrokerThread) -> None:
    api.put("/api/vhosts/v")
    conn = connect(broker, virtual_host="v")
    try:
        conn.channel().queue_declare("q", durable=True)
        assert api.delete("/api/vhosts/v").status == 204
        with pytest.raises(ConnectionClosedByBroker) as info:
            while True:
                conn.process_data_events(0.05)
        assert info.value.reply_code == 320
        assert "v" not in broker.broker.vhosts
    finally:
        if conn.is_open:
            conn.close()
