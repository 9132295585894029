"""RabbitMQ's own AMQP 1.0 Python client (rabbitmq-amqp-python-client) against
the embedded broker: its publisher and consumer on a queue declared over 0-9-1
(its management calls need the /management node). The client insists on a
RabbitMQ 4.0 or later: it connects only when [amqp1] announce_rabbitmq is on
(AMQP 1.0 clients are then told 4.1.0 while [main] rabbitmq_version is a 3.x)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pika
import pytest

client = pytest.importorskip("rabbitmq_amqp_python_client")

pytestmark = [pytest.mark.timeout(60)]


@pytest.fixture
def broker(broker_factory: Callable[..., Any]) -> Any:
    """A broker that announces RabbitMQ 4.x, as the client needs."""
    return broker_factory(amqp1_announce_rabbitmq=True)


def test_refused_unless_rabbitmq_is_announced(
    broker_factory: Callable[..., Any], tmp_path: Path
) -> None:
    for announce in (False, True):
        b = broker_factory(data_dir=tmp_path / str(announce), amqp1_announce_rabbitmq=announce)
        environment = client.Environment(f"amqp://guest:guest@127.0.0.1:{b.port}/")
        try:
            if announce:
                environment.connection().dial()
            else:
                with pytest.raises(client.ValidationCodeException, match="RabbitMQ"):
                    environment.connection().dial()
        finally:
            environment.close()


def test_publisher_and_consumer(broker) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    conn.channel().queue_declare("rmq-client", durable=True)
    conn.close()
    environment = client.Environment(f"amqp://guest:guest@127.0.0.1:{broker.port}/")
    connection = environment.connection()
    connection.dial()
    try:
        address = client.AddressHelper.queue_address("rmq-client")
        publisher = connection.publisher(address)
        status = publisher.publish(client.Message(body=client.Converter.string_to_bytes("hi")))
        assert status.remote_state == client.OutcomeState.ACCEPTED
        publisher.close()
        got: list[str] = []

        class Stop(Exception):
            """Ends consumer.run(), as the client's examples do."""

        class Handler(client.AMQPMessagingHandler):  # type: ignore[misc]
            def on_amqp_message(self, event: object) -> None:
                got.append(client.Converter.bytes_to_string(event.message.body))  # type: ignore[attr-defined]
                self.delivery_context.accept(event)
                raise Stop

        consumer = connection.consumer(address, message_handler=Handler())
        with pytest.raises(Stop):
            consumer.run()
        consumer.close()
        assert got == ["hi"]
        queue = broker.broker.vhosts["/"].queues["rmq-client"]
        assert broker.call(lambda: queue.message_count) == 0
    finally:
        connection.close()
        environment.close()
