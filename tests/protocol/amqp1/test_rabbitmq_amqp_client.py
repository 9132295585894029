"""rabbitmq-amqp-python-client (RabbitMQ's own AMQP 1.0 client library, on
Qpid Proton) against the embedded broker over real sockets: its publisher,
its consumer and delivery context (accept, discard, requeue)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pika
import pytest

client = pytest.importorskip("rabbitmq_amqp_python_client")
from proton import Delivery  # noqa: E402
from rabbitmq_amqp_python_client import (  # noqa: E402
    AddressHelper,
    AMQPMessagingHandler,
    Converter,
    Environment,
    Message,
)

pytestmark = [pytest.mark.timeout(30)]


@pytest.fixture
def broker(broker_factory: Callable[..., Any]) -> Any:
    """A broker that announces RabbitMQ 4.x ([amqp1] announce_rabbitmq): the
    client refuses any other (test_rabbitmq_client.py)."""
    return broker_factory(amqp1_announce_rabbitmq=True)


class Consumed(Exception):
    """Raised by a handler to leave ``consumer.run()``, as the library's own tests do."""


@pytest.fixture
def connection(broker) -> Iterator[Any]:
    env = Environment(f"amqp://guest:guest@127.0.0.1:{broker.port}/")
    conn = env.connection()
    conn.dial()
    yield conn
    env.close()


def declare(broker: Any, name: str, **arguments: Any) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        conn.channel().queue_declare(name, durable=True, arguments=arguments or None)
    finally:
        conn.close()


def test_publish_and_consume(broker, connection) -> None:
    declare(broker, "lib")
    publisher = connection.publisher(AddressHelper.queue_address("lib"))
    for i in range(5):
        delivery = publisher.publish(Message(body=Converter.string_to_bytes(f"m{i}")))
        assert delivery.remote_state == Delivery.ACCEPTED
    publisher.close()
    got: list[str] = []

    class Handler(AMQPMessagingHandler):
        def on_amqp_message(self, event: Any) -> None:
            got.append(Converter.bytes_to_string(event.message.body))
            self.delivery_context.accept(event)
            if len(got) == 5:
                raise Consumed

    consumer = connection.consumer(AddressHelper.queue_address("lib"), message_handler=Handler())
    with pytest.raises(Consumed):
        consumer.run()
    consumer.close()
    assert got == [f"m{i}" for i in range(5)]


def test_discard_dead_letters_and_requeue_redelivers(broker, connection) -> None:
    declare(broker, "lib-dlq")
    declare(
        broker,
        "lib-work",
        **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "lib-dlq"},
    )
    publisher = connection.publisher()
    for body in ("discard me", "requeue me"):
        message = Message(body=Converter.string_to_bytes(body))
        message.address = AddressHelper.queue_address("lib-work")
        publisher.publish(message)
    seen: list[tuple[str, bool]] = []

    class Handler(AMQPMessagingHandler):
        def on_amqp_message(self, event: Any) -> None:
            message = event.message
            body = Converter.bytes_to_string(message.body)
            seen.append((body, bool(message.first_acquirer)))
            if body == "discard me":
                self.delivery_context.discard(event)
            elif message.first_acquirer:
                self.delivery_context.requeue(event)
            else:
                self.delivery_context.accept(event)
                raise Consumed

    consumer = connection.consumer(
        AddressHelper.queue_address("lib-work"), message_handler=Handler()
    )
    with pytest.raises(Consumed):
        consumer.run()
    consumer.close()
    assert seen == [("discard me", True), ("requeue me", True), ("requeue me", False)]
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        method, props, body = conn.channel().basic_get("lib-dlq", auto_ack=True)
        assert body == b"discard me"
        assert props.headers["x-death"][0]["reason"] == "rejected"
    finally:
        conn.close()


def test_connects_to_a_broker_with_the_default_settings(broker) -> None:
    """The library wants RabbitMQ 4.0.0 or later in the open (4.1 for stream
    filters): AMQP 1.0 clients are told at least that whatever ``[main]
    rabbitmq_version`` is."""
    env = Environment(f"amqp://guest:guest@127.0.0.1:{broker.port}/")
    try:
        env.connection().dial()
    finally:
        env.close()


def test_management_declares_binds_and_deletes(connection) -> None:
    from rabbitmq_amqp_python_client import (
        ExchangeSpecification,
        ExchangeToQueueBindingSpecification,
        QuorumQueueSpecification,
    )

    management = connection.management()
    management.declare_exchange(ExchangeSpecification(name="lib-x"))
    info = management.declare_queue(QuorumQueueSpecification(name="lib-qq"))
    assert info.name == "lib-qq"
    management.bind(
        ExchangeToQueueBindingSpecification(
            source_exchange="lib-x", destination_queue="lib-qq", binding_key="k"
        )
    )
    publisher = connection.publisher(AddressHelper.exchange_address("lib-x", "k"))
    publisher.publish(Message(body=b"routed"))
    assert management.purge_queue("lib-qq") == 1
    management.delete_queue("lib-qq")
    management.delete_exchange("lib-x")
    management.close()
