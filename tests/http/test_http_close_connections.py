"""Closing connections through the management API, as RabbitMQ does: answered at
once, the client told why (AMQP 320 CONNECTION_FORCED with ``X-Reason``; MQTT 5
DISCONNECT 0x98), one connection or all of a user's."""

from __future__ import annotations

import threading
import time
import urllib.parse

import paho.mqtt.client as mqtt
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


def quoted(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def closed_by_broker(conn: BlockingConnection) -> ConnectionClosedByBroker:
    with pytest.raises(ConnectionClosedByBroker) as info:
        while True:
            conn.process_data_events(0.05)
    return info.value


def names(api: Api, protocol: str | None = None) -> list[str]:
    return [c["name"] for c in api.get("/api/connections") if protocol in (None, c["protocol"])]


def test_a_client_that_reads_nothing_is_closed_without_delay(
    api: Api, broker: BrokerThread
) -> None:
    """A consumer that stopped reading, with megabytes waiting for it: the DELETE is
    answered at once and the client, when it reads again, finds the 320 with the reason."""
    conn = connect(broker)
    try:
        ch = conn.channel()
        ch.queue_declare("flood")
        body = b"x" * 65536
        for _ in range(200):
            ch.basic_publish("", "flood", body)
        ch.basic_consume("flood", lambda *a: None)
        conn.process_data_events(0.2)  # the broker starts delivering; we stop reading
        [name] = names(api)
        started = time.monotonic()
        reply = api.delete(f"/api/connections/{quoted(name)}", headers={"X-Reason": "maintenance"})
        elapsed = time.monotonic() - started
        assert reply.status == 204 and reply.body == b""
        assert elapsed < 2, f"DELETE took {elapsed:.1f} s"
        error = closed_by_broker(conn)
        assert (error.reply_code, error.reply_text) == (320, "CONNECTION_FORCED - maintenance")
    finally:
        if conn.is_open:
            conn.close()
    wait_for(lambda: names(api) == [], what="the connection to go")
    assert api.get("/api/queues/%2F/flood")["messages"] == 200  # its unacked went back


def test_without_x_reason_the_reason_is_rabbitmqs(api: Api, broker: BrokerThread) -> None:
    conn = connect(broker)
    [name] = names(api)
    assert api.delete(f"/api/connections/{quoted(name)}").status == 204
    error = closed_by_broker(conn)
    assert error.reply_text == "CONNECTION_FORCED - Closed via management plugin"


def _mqtt(broker: BrokerThread, version: int, client_id: str) -> tuple[mqtt.Client, list[int]]:
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=version)
    reasons: list[int] = []
    gone = threading.Event()

    def on_disconnect(_c: object, _u: object, _flags: object, rc: object, _p: object) -> None:
        reasons.append(rc.value)  # type: ignore[attr-defined]
        gone.set()

    client.on_disconnect = on_disconnect
    client.username_pw_set("guest", "guest")
    client.connect("127.0.0.1", broker.mqtt_port)
    client.loop_start()
    client.gone = gone  # type: ignore[attr-defined]
    return client, reasons


@pytest.mark.parametrize(
    ("version", "expected"), [(mqtt.MQTTv5, [0x98]), (mqtt.MQTTv311, None)]
)
def test_an_mqtt_connection_is_closed(
    api: Api, broker: BrokerThread, version: int, expected: list[int] | None
) -> None:
    client, reasons = _mqtt(broker, version, f"dev-{version}")
    try:
        [name] = wait_for(lambda: names(api), what="the MQTT connection")
        started = time.monotonic()
        reply = api.delete(f"/api/connections/{quoted(name)}", headers={"X-Reason": "bye"})
        assert reply.status == 204 and time.monotonic() - started < 2
        assert client.gone.wait(10)  # type: ignore[attr-defined]
        if expected is not None:  # MQTT 5 says why: Administrative action
            assert reasons == expected
        wait_for(lambda: names(api) == [], what="the connection to go")
    finally:
        client.loop_stop()


def test_close_every_connection_of_a_user(api: Api, broker: BrokerThread) -> None:
    api.put("/api/users/alice", {"password": "pw", "tags": "management"})
    api.put("/api/permissions/%2F/alice", {"configure": ".*", "write": ".*", "read": ".*"})
    guests = [connect(broker), connect(broker)]
    alice = pika.BlockingConnection(
        pika.URLParameters(f"amqp://alice:pw@127.0.0.1:{broker.port}/%2F")
    )
    try:
        listed = api.get("/api/connections/username/guest")
        assert sorted(listed, key=lambda c: c["name"]) == sorted(
            (
                {"name": c["name"], "vhost": "/", "user": "guest", "node": c["node"]}
                for c in api.get("/api/connections")
                if c["user"] == "guest"
            ),
            key=lambda c: c["name"],
        )
        assert len(listed) == 2
        alice_api = api.as_user("alice", "pw")
        assert alice_api.request("GET", "/api/connections/username/guest").status == 401
        assert alice_api.request("DELETE", "/api/connections/username/guest").status == 401
        assert api.get("/api/connections/username/nobody") == []
        assert api.delete("/api/connections/username/nobody").status == 204
        reply = api.delete("/api/connections/username/guest", headers={"X-Reason": "all go"})
        assert reply.status == 204
        for conn in guests:
            assert closed_by_broker(conn).reply_text == "CONNECTION_FORCED - all go"
        assert alice.is_open
        assert [c["user"] for c in api.get("/api/connections")] == ["alice"]
        assert alice_api.delete("/api/connections/username/alice").status == 204  # her own
        assert closed_by_broker(alice).reply_code == 320
    finally:
        for conn in [*guests, alice]:
            if conn.is_open:
                conn.close()

