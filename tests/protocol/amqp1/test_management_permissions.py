"""The /management node's permission checks (src/warren/amqp1/management_node.py):
through the connection's client session, in RabbitMQ 4's order, a refusal
ending the session with RabbitMQ 4's text (amqp_auth_SUITE's cases).
"""

from __future__ import annotations

from harness import Harness, harness_fixture
from harness.management_node import NodePair, restricted, restricted_again

broker = harness_fixture()


def test_declaring_and_deleting_need_configure(broker: Harness) -> None:
    pair = restricted(broker, "^ok", ".*", ".*")
    assert pair.refused("PUT", "/queues/no", {}) == (
        "configure access to queue 'no' in vhost '/' refused for user 'u'"
    )
    assert pair.refused("PUT", "/exchanges/no", {}) == (
        "configure access to exchange 'no' in vhost '/' refused for user 'u'"
    )
    assert pair.refused("DELETE", "/queues/no") == (
        "configure access to queue 'no' in vhost '/' refused for user 'u'"
    )
    assert pair.refused("DELETE", "/exchanges/no") == (
        "configure access to exchange 'no' in vhost '/' refused for user 'u'"
    )
    assert "no" not in pair.vhost.queues and "no" not in pair.vhost.exchanges
    assert pair.status("PUT", "/queues/ok", {})[0] == "201"


def test_get_needs_any_access(broker: Harness) -> None:
    NodePair(broker).status("PUT", "/queues/seen", {})
    assert restricted(broker, "^$", "^seen$", "^$").status("GET", "/queues/seen")[0] == "200"
    assert restricted_again(broker, "^$", "^$", "^$").refused("GET", "/queues/seen") == (
        "configure access to queue 'seen' in vhost '/' refused for user 'u'"
    )


def test_purge_needs_read(broker: Harness) -> None:
    pair = restricted(broker, ".*", ".*", "^$")
    pair.status("PUT", "/queues/q", {})
    assert pair.refused("DELETE", "/queues/q/messages") == (
        "read access to queue 'q' in vhost '/' refused for user 'u'"
    )


def test_binding_needs_write_on_the_destination_and_read_on_the_source(broker: Harness) -> None:
    NodePair(broker).status("PUT", "/queues/bq", {})
    body = {"source": "amq.direct", "destination_queue": "bq", "binding_key": "k"}
    pair = restricted(broker, ".*", "^$", ".*")
    assert pair.refused("POST", "/bindings", body) == (
        "write access to queue 'bq' in vhost '/' refused for user 'u'"
    )
    pair = restricted_again(broker, ".*", ".*", "^$")
    assert pair.refused("POST", "/bindings", body) == (
        "read access to exchange 'amq.direct' in vhost '/' refused for user 'u'"
    )
    assert pair.refused("DELETE", "/bindings/src=amq.direct;dstq=bq;key=k;args=") == (
        "read access to exchange 'amq.direct' in vhost '/' refused for user 'u'"
    )
    assert not pair.vhost.exchanges["amq.direct"].bindings


def test_binding_to_a_topic_exchange_checks_the_topic(broker: Harness) -> None:
    def topic() -> None:
        broker.broker.users.add_user("u", "p")
        broker.broker.users.set_permissions("u", "/")
        broker.broker.users.set_topic_permission("u", "/", "amq.topic", ".*", "^ok")

    broker.call(topic)
    pair = NodePair(broker, "u", "p")
    body = {"source": "amq.topic", "destination_exchange": "amq.direct", "binding_key": "a.b"}
    assert pair.refused("POST", "/bindings", body) == (
        "read access to topic 'a.b' in exchange 'amq.topic' in vhost '/' refused for user 'u'"
    )
    body["binding_key"] = "ok.b"
    assert pair.status("POST", "/bindings", body) == ("204", None)


def test_a_dead_letter_exchange_needs_read_on_the_queue_and_write_on_it(broker: Harness) -> None:
    body = {"arguments": {"x-dead-letter-exchange": "dlx"}}
    pair = restricted(broker, ".*", "^q$", ".*")
    assert pair.refused("PUT", "/queues/q", body) == (
        "write access to exchange 'dlx' in vhost '/' refused for user 'u'"
    )
    pair = restricted_again(broker, ".*", ".*", "^$")
    assert pair.refused("PUT", "/queues/q", body) == (
        "read access to queue 'q' in vhost '/' refused for user 'u'"
    )
    assert "q" not in pair.vhost.queues
    pair = restricted_again(broker, ".*", "^dlx$", "^q$")
    assert pair.status("PUT", "/queues/q", body)[0] == "201"


def test_an_alternate_exchange_needs_write_on_it(broker: Harness) -> None:
    body = {"arguments": {"alternate-exchange": "ae"}}
    pair = restricted(broker, ".*", "^x$", ".*")
    assert pair.refused("PUT", "/exchanges/x", body) == (
        "write access to exchange 'ae' in vhost '/' refused for user 'u'"
    )
    assert "x" not in pair.vhost.exchanges
