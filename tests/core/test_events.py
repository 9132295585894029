"""The broker's events (core/events.py), named as RabbitMQ's event exchange names them.

Driven through the in-memory harness: an AMQP client and the management API
make the changes, an observer on ``broker.events`` records what is announced.
"""

from __future__ import annotations

from typing import Any

from harness.broker import Harness
from harness.fixtures import harness_fixture

from warren.core.events import EVENT_NAMES, Events

broker = harness_fixture()


def _record(h: Harness) -> list[tuple[str, dict[str, Any]]]:
    seen: list[tuple[str, dict[str, Any]]] = []
    h.broker.events.observers.append(lambda name, props: seen.append((name, props)))
    return seen


def _names(seen: list[tuple[str, dict[str, Any]]]) -> list[str]:
    return [name for name, _ in seen]


def test_connection_queue_and_consumer_events(broker: Harness) -> None:
    seen = _record(broker)
    conn = broker.amqp_connection()
    ch = conn.channel()
    ch.queue_declare("q1", durable=False)
    tag = ch.basic_consume("q1", lambda *a: None)
    ch.basic_cancel(tag)
    ch.basic_consume("q1", lambda *a: None, consumer_tag="second")
    ch.queue_delete("q1")
    conn.close()
    broker.settle()
    assert _names(seen) == [
        "connection.created",
        "channel.created",
        "queue.created",
        "consumer.created",
        "consumer.deleted",
        "consumer.created",
        "queue.deleted",
        "channel.closed",
        "connection.closed",
    ]
    seen.pop(1)
    seen.pop(-2)
    created = seen[0][1]
    assert created["user"] == "guest" and created["vhost"] == "/"
    assert created["protocol"].startswith("AMQP 0-9-1")
    assert seen[-1][1]["name"] == created["name"]
    assert seen[1][1] == {
        "name": "q1",
        "durable": False,
        "auto_delete": False,
        "exclusive": False,
        "type": "classic",
        "vhost": "/",
    }
    assert seen[2][1] == {
        "vhost": "/",
        "queue": "q1",
        "consumer_tag": tag,
        "exclusive": False,
        "ack_required": True,
    }
    assert seen[5][1] == {"name": "q1", "vhost": "/"}


def test_closing_a_channel_deletes_its_consumers(broker: Harness) -> None:
    conn = broker.amqp_connection()
    ch = conn.channel()
    ch.queue_declare("q2", durable=False)
    seen = _record(broker)
    ch.basic_consume("q2", lambda *a: None, consumer_tag="c")
    ch.close()
    broker.settle()
    assert _names(seen) == ["consumer.created", "consumer.deleted", "channel.closed"]
    assert seen[1][1]["consumer_tag"] == "c"
    conn.close()


def test_channel_events(broker: Harness) -> None:
    conn = broker.amqp_connection()
    seen = _record(broker)
    ch = conn.channel()
    ch.close()
    broker.settle()
    assert _names(seen) == ["channel.created", "channel.closed"]
    opened = seen[0][1]
    assert opened["number"] == 1 and opened["user"] == "guest" and opened["vhost"] == "/"
    assert opened["name"] == f"{opened['connection']} (1)"
    assert seen[1][1] == opened
    conn.close()


def test_exchange_and_binding_events(broker: Harness) -> None:
    conn = broker.amqp_connection()
    ch = conn.channel()
    ch.queue_declare("bq", durable=False)
    seen = _record(broker)
    ch.exchange_declare("ex1", "topic", durable=False, arguments={"x-a": 1})
    ch.exchange_declare("ex1", "topic", durable=False, arguments={"x-a": 1})  # exists: no event
    ch.exchange_declare("ex2", "fanout", durable=False, auto_delete=True)
    ch.queue_bind("bq", "ex1", "a.*")
    ch.exchange_bind("ex2", "ex1", "b")
    ch.queue_unbind("bq", "ex1", "a.*")
    ch.exchange_unbind("ex2", "ex1", "b")
    ch.queue_bind("bq", "ex1", "c")
    ch.exchange_delete("ex1")
    ch.exchange_delete("ex2")
    broker.settle()
    binding = {
        "vhost": "/",
        "source_name": "ex1",
        "source_kind": "exchange",
        "destination_name": "bq",
        "destination_kind": "queue",
        "routing_key": "a.*",
        "arguments": {},
    }
    to_ex2 = {**binding, "destination_name": "ex2", "destination_kind": "exchange"}
    assert seen == [
        (
            "exchange.created",
            {
                "vhost": "/",
                "name": "ex1",
                "type": "topic",
                "durable": False,
                "auto_delete": False,
                "internal": False,
                "arguments": {"x-a": 1},
            },
        ),
        (
            "exchange.created",
            {
                "vhost": "/",
                "name": "ex2",
                "type": "fanout",
                "durable": False,
                "auto_delete": True,
                "internal": False,
                "arguments": {},
            },
        ),
        ("binding.created", binding),
        ("binding.created", {**to_ex2, "routing_key": "b"}),
        ("binding.deleted", binding),
        ("binding.deleted", {**to_ex2, "routing_key": "b"}),
        ("binding.created", {**binding, "routing_key": "c"}),
        # A deleted exchange's bindings go with it, each announced.
        ("binding.deleted", {**binding, "routing_key": "c"}),
        ("exchange.deleted", {"name": "ex1", "vhost": "/"}),
        ("exchange.deleted", {"name": "ex2", "vhost": "/"}),
    ]
    assert {name for name, _ in seen} <= set(EVENT_NAMES)
    conn.close()


def test_policy_vhost_and_alarm_events(broker: Harness) -> None:
    seen = _record(broker)

    def change() -> None:
        b = broker.broker
        b.add_vhost("v1")
        b.set_policy("v1", "p", "^q", {"max-length": 1})
        b.clear_policy("v1", "p")
        b.set_operator_policy("v1", "op", ".*", {"max-length": 5})
        b.clear_operator_policy("v1", "op")
        b.delete_vhost("v1")
        b.resource_alarms.set_alarm("memory", True)
        b.resource_alarms.set_alarm("memory", True)  # already raised: no event
        b.resource_alarms.set_alarm("memory", False)

    broker.call(change)
    assert seen == [
        ("vhost.created", {"name": "v1"}),
        (
            "policy.set",
            {"name": "p", "pattern": "^q", "definition": {"max-length": 1}, "vhost": "v1"},
        ),
        ("policy.cleared", {"name": "p", "vhost": "v1"}),
        (
            "operator.policy.set",
            {"name": "op", "pattern": ".*", "definition": {"max-length": 5}, "vhost": "v1"},
        ),
        ("operator.policy.cleared", {"name": "op", "vhost": "v1"}),
        ("vhost.deleted", {"name": "v1"}),
        ("alarm.set", {"source": "memory"}),
        ("alarm.cleared", {"source": "memory"}),
    ]


def test_user_and_permission_events_from_the_management_api(broker: Harness) -> None:
    seen = _record(broker)
    http = broker.http()
    assert http.put("/api/users/ann", {"password": "pw", "tags": ""}).status == 201
    assert http.put("/api/users/ann", {"password": "pw2", "tags": ""}).status == 204
    assert (
        http.put("/api/permissions/%2F/ann", {"configure": "", "write": ".*", "read": ".*"}).status
        == 201
    )
    assert http.delete("/api/permissions/%2F/ann").status == 204
    assert http.delete("/api/users/ann").status == 204
    assert seen == [
        ("user.created", {"name": "ann", "tags": [], "user_who_performed_action": "guest"}),
        (
            "permission.created",
            {
                "user": "ann",
                "vhost": "/",
                "configure": "",
                "write": ".*",
                "read": ".*",
                "user_who_performed_action": "guest",
            },
        ),
        ("permission.deleted", {"user": "ann", "vhost": "/", "user_who_performed_action": "guest"}),
        ("user.deleted", {"name": "ann", "user_who_performed_action": "guest"}),
    ]
    assert {name for name, _ in seen} <= set(EVENT_NAMES)


def test_a_failing_observer_is_logged_and_the_others_still_hear() -> None:
    events = Events()
    assert not events
    heard: list[str] = []

    def broken(name: str, props: dict[str, Any]) -> None:
        raise RuntimeError("boom")

    events.observers += [broken, lambda name, props: heard.append(name)]
    assert events
    events.emit("queue.created", {})
    assert heard == ["queue.created"]


def test_an_auto_delete_queue_goes_after_its_last_consumer(broker: Harness) -> None:
    conn = broker.amqp_connection()
    ch = conn.channel()
    ch.queue_declare("ad", durable=False, auto_delete=True)
    tag = ch.basic_consume("ad", lambda *a: None)
    seen = _record(broker)
    ch.basic_cancel(tag)
    broker.settle()
    assert seen == [
        (
            "consumer.deleted",
            {
                "vhost": "/",
                "queue": "ad",
                "consumer_tag": tag,
                "exclusive": False,
                "ack_required": True,
            },
        ),
        ("queue.deleted", {"name": "ad", "vhost": "/"}),
    ]
    conn.close()
