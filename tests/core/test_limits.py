"""User limits (max-connections, max-channels) and the broker-wide max_connections and
max_consumers_per_channel, as clients of RabbitMQ see them.

Texts checked against RabbitMQ 3.10.8 (``rabbitmqctl set_user_limits`` and pika): a
connection beyond the user's max-connections is closed at connection.open with 530
NOT_ALLOWED "connection refused for user 'u': user connection limit (N) is reached";
a channel beyond max-channels closes the connection with 530 NOT_ALLOWED "number of
channels opened for user 'u' has reached the maximum allowed user limit of (N)".
RabbitMQ 3.10 has no consumer_max_per_channel; the text is rabbit_channel's from the
releases that do ("reached maximum (N) of consumers per channel", 530).

In memory (issue 29): tests/harness brokers, pika's calls over MemoryAMQP
(harness.channel), paho's client in memory for MQTT (harness.mqtt), the
management API through ``harness.http()``; a restart is a new Harness on the
same data dir. test_broker_max_connections stays on sockets: max_connections
refuses at the listener's accept, before any protocol byte.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import BrokerThread
from harness import Harness, MemoryMQTT, connection_error, harness_fixture

# tests/protocol/mqtt's helper (not a package).
from mqttclient import V5, V311, Client  # noqa: E402
from pika.exceptions import AMQPConnectionError
from pikahelp import connect

pytestmark = pytest.mark.timeout(60)

Factory = Callable[..., BrokerThread]

memory = harness_fixture()
capped = harness_fixture(max_consumers_per_channel=1)


def conn_refused(n: int, user: str = "guest") -> str:
    return (
        f"NOT_ALLOWED - connection refused for user '{user}': "
        f"user connection limit ({n}) is reached"
    )


def chan_refused(n: int, user: str = "guest") -> str:
    return (
        f"NOT_ALLOWED - number of channels opened for user '{user}' "
        f"has reached the maximum allowed user limit of ({n})"
    )


def refused_connection(b: Harness) -> str:
    """The text of the 530 that closes a new connection at connection.open
    (pika: ProbableAccessDeniedError with "(530)")."""
    return connection_error(530, b.amqp_connection)


def set_limit(b: Harness, name: str, value: int, user: str = "guest") -> None:
    assert b.http().put(f"/api/user-limits/{user}/{name}", {"value": value}).status == 204


def connections_of(b: Harness, user: str = "guest") -> int:
    return b.call(lambda: b.broker.users.connection_counts.get(user, 0))


def mqtt_connack(b: Harness, protocol: int = V5) -> Any:
    """paho's CONNACK reason code for guest (in memory); the client then gone."""
    client = b.mqtt("", protocol)
    client.paho.username_pw_set("guest", "guest")
    try:
        return client.connect()
    finally:
        client.lose()


def socket_connack(b: BrokerThread, protocol: int = V5) -> Any:
    """The same with paho over a socket."""
    client = Client(b.mqtt_port, protocol=protocol, username="guest", password="guest")
    try:
        _, rc, _ = client.connect()
        return rc
    finally:
        client.paho.loop_stop()
        client.paho.disconnect()


def mqtt_client(b: Harness) -> MemoryMQTT:
    """An MQTT 5 client of guest, connected (in memory)."""
    client = b.mqtt("", V5)
    client.paho.username_pw_set("guest", "guest")
    assert client.connect() == 0
    return client


def disconnect(client: MemoryMQTT) -> None:
    client.paho.disconnect()
    client.until(lambda: client.eof)


def test_user_max_connections_across_protocols(memory: Harness) -> None:
    set_limit(memory, "max-connections", 1)
    first = memory.amqp_connection()
    try:
        assert conn_refused(1) in refused_connection(memory)
        # MQTT counts against the same limit: 5: Quota exceeded, 3.1.1: 5 not authorized
        # (RabbitMQ 3.10 answered 5; 3.13 maps quota exceeded to it).
        assert mqtt_connack(memory, V5).value == 0x97
        assert mqtt_connack(memory, V311).getName() == "Not authorized"
    finally:
        first.close()
    assert connections_of(memory) == 0  # freed by the close (close-ok came after it)
    mqtt = mqtt_client(memory)
    try:
        assert conn_refused(1) in refused_connection(memory)  # the MQTT client counts
    finally:
        disconnect(mqtt)
    memory.settle()
    assert connections_of(memory) == 0  # the MQTT connection freed
    with memory.amqp_connection() as again:
        assert again.is_open


def test_zero_allows_none_negative_and_cleared_mean_no_limit(memory: Harness) -> None:
    set_limit(memory, "max-connections", 0)
    assert conn_refused(0) in refused_connection(memory)
    set_limit(memory, "max-connections", -1)
    conns = [memory.amqp_connection() for _ in range(3)]
    for c in conns:
        c.close()
    set_limit(memory, "max-connections", 0)
    assert memory.http().delete("/api/user-limits/guest/max-connections").status == 204
    with memory.amqp_connection() as c:
        assert c.is_open
    assert (
        memory.http().delete("/api/user-limits/guest/max-connections").status == 204
    )  # unset: 204, as RabbitMQ


def test_user_max_channels_over_all_connections(memory: Harness) -> None:
    memory.call(lambda: memory.broker.users.set_limit("guest", "max-channels", 2))
    a, b = memory.amqp_connection(), memory.amqp_connection()
    a.channel()
    b_ch = b.channel()
    assert connection_error(530, a.channel) == chan_refused(2)
    # The refused connection's channel is given back; closing one on b frees one.
    b_ch.close()
    assert memory.call(lambda: memory.broker.users.channel_counts) == {}
    b.channel()
    b.channel()
    assert connection_error(530, b.channel) == chan_refused(2)
    assert memory.call(lambda: memory.broker.users.channel_counts) == {}


def test_limits_hold_across_a_restart_and_go_with_the_user(tmp_path: Path) -> None:
    with Harness(tmp_path / "data") as b:
        api = b.http()
        api.put("/api/users/u", {"password": "pw", "tags": ""})
        api.put("/api/permissions/%2F/u", {"configure": ".*", "write": ".*", "read": ".*"})
        set_limit(b, "max-connections", 0, user="u")
        set_limit(b, "max-channels", 1)
    with Harness(tmp_path / "data") as b:
        api = b.http()
        assert api.get("/api/user-limits") == [
            {"user": "guest", "value": {"max-channels": 1}},
            {"user": "u", "value": {"max-connections": 0}},
        ]
        assert api.get("/api/user-limits/u") == [{"user": "u", "value": {"max-connections": 0}}]
        text = connection_error(530, b.amqp_connection, "u", "pw")
        assert conn_refused(0, "u") in text
        c = b.amqp_connection()
        c.channel()
        assert connection_error(530, c.channel) == chan_refused(1)
        # Deleting the user drops its limits: created again, it has none.
        assert api.delete("/api/users/u").status == 204
        assert api.get("/api/user-limits") == [{"user": "guest", "value": {"max-channels": 1}}]
        api.put("/api/users/u", {"password": "pw", "tags": ""})
        assert api.request("GET", "/api/user-limits/u").json() == []
        assert api.request("GET", "/api/user-limits/nobody").status == 404


def test_user_limits_move_from_mgmt_json(tmp_path: Path) -> None:
    Harness(tmp_path / "data").stop()
    mgmt = tmp_path / "data" / "mgmt.json"
    mgmt.write_text(
        json.dumps(
            {
                "vhost_metadata": {},
                "user_limits": {"guest": {"max-connections": 0}, "gone": {"max-channels": 1}},
                "global_parameters": {"g": 1},
            }
        )
    )
    with Harness(tmp_path / "data") as b:
        assert b.http().get("/api/user-limits") == [
            {"user": "guest", "value": {"max-connections": 0}}
        ]
        assert conn_refused(0) in refused_connection(b)
    saved = json.loads(mgmt.read_text())
    assert saved.pop("checksum").startswith("crc32:")  # store/layout.py write_json_atomically
    assert saved == {"vhost_metadata": {}, "global_parameters": {"g": 1}}
    users = json.loads((tmp_path / "data" / "users.json").read_text())["users"]
    assert [u["limits"] for u in users if u["name"] == "guest"] == [{"max-connections": 0}]


def test_definitions_round_trip(memory: Harness, tmp_path: Path) -> None:
    api = memory.http()
    set_limit(memory, "max-channels", 7)
    exported = api.get("/api/definitions")
    assert [u["limits"] for u in exported["users"]] == [{"max-channels": 7}]
    with Harness(tmp_path / "other") as other:
        other_api = other.http()
        assert other_api.post("/api/definitions", exported).status == 204
        assert other_api.get("/api/user-limits") == [
            {"user": "guest", "value": {"max-channels": 7}}
        ]
        # Limits given replace the user's; an entry without them leaves them.
        exported["users"][0]["limits"] = {"max-connections": 3}
        assert other_api.post("/api/definitions", exported).status == 204
        del exported["users"][0]["limits"]
        assert other_api.post("/api/definitions", exported).status == 204
        assert other_api.get("/api/user-limits") == [
            {"user": "guest", "value": {"max-connections": 3}}
        ]
        exported["users"][0]["limits"] = {"max-connections": "x"}
        reply = other_api.post("/api/definitions", exported)
        assert reply.status == 400 and b"max-connections should be a number" in reply.body
        exported["users"][0]["limits"] = {"max-queues": 1}
        assert other_api.post("/api/definitions", exported).status == 400


def test_broker_max_connections(broker_factory: Factory) -> None:
    b = broker_factory(max_connections=1)
    first = connect(b)
    try:
        # Closed before the handshake, as RabbitMQ's connection_max.
        with pytest.raises(AMQPConnectionError):
            connect(b)
        assert socket_connack(b, V5).value == 0x97
        assert socket_connack(b, V311).getName() == "Not authorized"  # as for the limits
    finally:
        first.close()
    with connect(b) as again:
        assert again.is_open


def test_max_consumers_per_channel(capped: Harness) -> None:
    with capped.amqp_connection() as c:
        ch = c.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        tag = ch.basic_consume(q, lambda *a: None)
        ch.basic_cancel(tag)
        ch.basic_consume(q, lambda *a: None)  # the cancelled one no longer counts
        other = c.channel()
        other.basic_consume(q, lambda *a: None)  # per channel
        text = connection_error(530, ch.basic_consume, q, lambda *a: None)
        assert text == "NOT_ALLOWED - reached maximum (1) of consumers per channel"


def test_vhost_max_connections_counts_mqtt_connections(memory: Harness) -> None:
    """A vhost's max-connections counts MQTT clients with AMQP ones and refuses
    them as RabbitMQ does (3.1.1: 5 not authorized, as 3.10 answered; 5: 0x97)."""
    api = memory.http()
    assert api.put("/api/vhost-limits/%2F/max-connections", {"value": 1}).status == 204
    client = mqtt_client(memory)
    try:
        assert "connection limit (1) is reached" in refused_connection(memory)
        assert mqtt_connack(memory, V5).value == 0x97
        assert mqtt_connack(memory, V311).getName() == "Not authorized"
    finally:
        disconnect(client)
    # The MQTT connection gone, its place is free again.
    memory.settle()
    assert api.get("/api/connections") == []
    with memory.amqp_connection() as conn:
        assert conn.is_open
