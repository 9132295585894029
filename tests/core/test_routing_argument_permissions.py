"""A new queue's dead-letter exchange and a new exchange's alternate exchange
need write permission on the exchange they name (and read on the new queue or
exchange), as RabbitMQ checks them in queue.declare and exchange.declare: else
a user could route messages into an exchange he may not write to by naming
it. One rule (core/users.py's check_routing_argument) for AMQP 0-9-1, the
management API and AMQP 1.0's management node.

In memory: tests/harness brokers, pika's calls over MemoryAMQP, the management
API through ``harness.http()``.
"""

from __future__ import annotations

import pytest
from harness import Harness, channel_error, harness_fixture

pytestmark = pytest.mark.timeout(60)

memory = harness_fixture()

DLX = {"x-dead-letter-exchange": "locked"}
AE = {"alternate-exchange": "locked"}


def limited_user(b: Harness) -> None:
    """User ``u``: configure and read anything, write anything but ``locked``."""

    def add() -> None:
        b.broker.users.add_user("u", "pw", ["management"])
        b.broker.users.set_permissions("u", "/", configure=".*", write="^(?!locked$).*", read=".*")
        b.broker.save_users()
        b.broker.vhosts["/"].declare_exchange("locked", "fanout")

    b.call(add)


def test_queue_declare_with_a_dead_letter_exchange_needs_write_on_it(memory: Harness) -> None:
    limited_user(memory)
    ch = memory.amqp_connection("u", "pw").channel()
    text = channel_error(403, ch.queue_declare, "q", arguments=DLX)
    assert text == "ACCESS_REFUSED - access to exchange 'locked' in vhost '/' refused for user 'u'"
    assert "q" not in memory.broker.vhosts["/"].queues
    ch = memory.amqp_connection("u", "pw").channel()
    ch.queue_declare("q", arguments={"x-dead-letter-exchange": "open"})  # may write there
    ch.queue_declare("", arguments={"x-dead-letter-exchange": "open"})  # server-named


def test_exchange_declare_with_an_alternate_exchange_needs_write_on_it(memory: Harness) -> None:
    limited_user(memory)
    ch = memory.amqp_connection("u", "pw").channel()
    text = channel_error(403, ch.exchange_declare, "x", "direct", arguments=AE)
    assert text == "ACCESS_REFUSED - access to exchange 'locked' in vhost '/' refused for user 'u'"
    assert "x" not in memory.broker.vhosts["/"].exchanges


def test_an_existing_queue_is_not_checked_again(memory: Harness) -> None:
    """As RabbitMQ: the rule is for creating; a redeclare of a queue someone
    else made with that argument is only compared."""
    limited_user(memory)
    memory.call(lambda: memory.broker.vhosts["/"].declare_queue("q", durable=False, arguments=DLX))
    ch = memory.amqp_connection("u", "pw").channel()
    ch.queue_declare("q", arguments=DLX)


def test_the_management_api_applies_the_same_rule(memory: Harness) -> None:
    limited_user(memory)
    api = memory.http("u", "pw")
    reply = api.put("/api/queues/%2F/q", {"arguments": DLX})
    assert reply.status == 401, reply
    reply = api.put("/api/exchanges/%2F/x", {"type": "direct", "arguments": AE})
    assert reply.status == 401, reply
    vhost = memory.broker.vhosts["/"]
    assert "q" not in vhost.queues and "x" not in vhost.exchanges
    assert api.put("/api/queues/%2F/q2", {"arguments": {"x-dead-letter-exchange": "ok"}}).status == 201
