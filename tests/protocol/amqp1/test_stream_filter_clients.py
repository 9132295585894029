"""AMQP 1.0 stream filters over real sockets (amqp1/filters.py): a stream of
messages published over AMQP 1.0 (Qpid Proton) and 0-9-1 (pika), consumed
with proton's Filter and Selector receiver options and with RabbitMQ's own
client library's StreamFilterOptions, as RabbitMQ 4.1 filters them. Each
expected list ends with the stream's last message, so no test waits for
a message not to come."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from conftest import BrokerThread, start_broker

proton = pytest.importorskip("proton")
from proton import Described, Message, symbol  # noqa: E402
from proton.reactor import Filter, Selector  # noqa: E402
from proton.utils import BlockingConnection  # noqa: E402

pytestmark = [pytest.mark.timeout(60)]

FIRST = {symbol("offset"): Described(symbol("rabbitmq:stream-offset-spec"), "first")}
APP = symbol("amqp:application-properties-filter")
PROPS = symbol("amqp:properties-filter")


def connect(port: int) -> BlockingConnection:
    return BlockingConnection(
        f"amqp://127.0.0.1:{port}",
        user="guest",
        password="guest",
        allowed_mechs="PLAIN",
        allow_insecure_mechs=True,
        virtual_host="vhost:/",
        timeout=10,
    )


def fill(broker: Any, stream: str) -> None:
    """a1..a3 over AMQP 1.0, then p1..p3 over 0-9-1 (p3 red, the last)."""
    channel_conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        channel = channel_conn.channel()
        channel.queue_declare(stream, durable=True, arguments={"x-queue-type": "stream"})
        conn = connect(broker.port)
        try:
            sender = conn.create_sender(f"/queues/{stream}")
            for message in (
                data(
                    b"a1",
                    id="order-1",
                    group_id="g1",
                    properties={"color": "red", "n": 1},
                    annotations={symbol("x-stream-filter-value"): "red"},
                ),
                data(b"a2", id=b"\x01\x02", properties={"color": "blue"}),
                data(b"a3", properties={"color": "red-ish"}),
            ):
                sender.send(message)
        finally:
            conn.close()
        channel.confirm_delivery()
        for body, props in (
            (b"p1", pika.BasicProperties(message_id="order-2", headers={"color": "green"})),
            (b"p2", pika.BasicProperties(app_id="g1")),
            (
                b"p3",
                pika.BasicProperties(
                    message_id="order-3",
                    headers={"color": "red", "n": 1, "x-stream-filter-value": "red"},
                ),
            ),
        ):
            channel.basic_publish("", stream, body, props)
    finally:
        channel_conn.close()


def data(body: bytes, **fields: Any) -> Message:
    """A message with ``body`` as one data section, which 0-9-1 reads as is."""
    message = Message(body=body, **fields)
    message.inferred = True
    return message


def text(message: Message) -> str:
    body = message.body
    return body if isinstance(body, str) else bytes(body).decode()


def consume(broker: Any, stream: str, until: str, **options: Any) -> tuple[list[str], dict]:
    """Bodies received (and accepted) up to ``until``, and the filter-set echoed."""
    conn = connect(broker.port)
    try:
        receiver = conn.create_receiver(f"/queues/{stream}", name=str(uuid.uuid4()), **options)
        echoed = receiver.link.remote_source.filter
        echoed.rewind()
        applied = echoed.get_object() if echoed.next() is not None else {}
        got: list[str] = []
        while not got or got[-1] != until:
            got.append(text(receiver.receive(timeout=10)))
            receiver.accept()
        return got, applied
    finally:
        conn.close()


def test_proton_filter_option(broker) -> None:
    fill(broker, "s")
    wanted = {
        **FIRST,
        symbol("app"): Described(APP, {"color": "&p:red"}),
        symbol("props"): Described(PROPS, {symbol("message-id"): "&p:order-"}),
    }
    got, applied = consume(broker, "s", "p3", options=Filter(wanted))
    assert got == ["a1", "p3"]
    assert set(applied) == {"offset", "app", "props"}
    assert applied[symbol("app")].descriptor == APP


def test_proton_filter_option_on_values_and_groups(broker) -> None:
    fill(broker, "s")
    values = {**FIRST, symbol("v"): Described(symbol("rabbitmq:stream-filter"), ["red"])}
    assert consume(broker, "s", "p3", options=Filter(values))[0] == ["a1", "p3"]
    groups = {**FIRST, symbol("p"): Described(PROPS, {symbol("group-id"): "g1"})}
    # p2's 0-9-1 app_id is its 1.0 group-id (RabbitMQ 4's mapping); p3 closes the stream.
    got, _ = consume(broker, "s", "p2", options=Filter(groups))
    assert got == ["a1", "p2"]
    binary = {**FIRST, symbol("p"): Described(PROPS, {symbol("message-id"): b"\x01\x02"})}
    assert consume(broker, "s", "a2", options=Filter(binary))[0] == ["a2"]


def test_proton_selector_is_not_applied_and_not_echoed(broker) -> None:
    """RabbitMQ 4.1 has no JMS selectors: it leaves the filter out of the answer
    and delivers everything, and so does Warren."""
    fill(broker, "s")
    # One filter-set: each proton Filter option writes a map of its own.
    selector = Selector("color = 'red'").filter_set
    got, applied = consume(broker, "s", "p3", options=Filter({**FIRST, **selector}))
    assert got == ["a1", "a2", "a3", "p1", "p2", "p3"]
    assert set(applied) == {"offset"}


def test_pika_reads_the_same_stream_with_its_stream_filter(broker) -> None:
    fill(broker, "s")
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        channel = conn.channel()
        channel.basic_qos(prefetch_count=10)
        got: list[bytes] = []

        def on_message(ch: Any, method: Any, props: Any, body: bytes) -> None:
            got.append(body)
            ch.basic_ack(method.delivery_tag)

        channel.basic_consume(
            "s",
            on_message,
            arguments={"x-stream-offset": "first", "x-stream-filter": "red"},
        )
        while len(got) < 2:
            conn.process_data_events(time_limit=1)
        assert got == [b"a1", b"p3"]  # a1's annotation is a 0-9-1 header
    finally:
        conn.close()


# -- RabbitMQ's own client -----------------------------------------------------------------
@pytest.fixture
def broker_41(tmp_path: Path) -> Iterator[BrokerThread]:
    """A broker that tells clients it is RabbitMQ 4.1.0: RabbitMQ's AMQP client
    library refuses stream filters from an older server."""
    b = start_broker(tmp_path / "data", rabbitmq_version="4.1.0", amqp1_announce_rabbitmq=True)
    try:
        yield b
    finally:
        b.stop()


def test_rabbitmq_amqp_client_stream_filter_options(broker_41) -> None:
    client = pytest.importorskip("rabbitmq_amqp_python_client")
    fill(broker_41, "s")
    got: list[str] = []

    class Done(Exception):
        pass

    class Handler(client.AMQPMessagingHandler):  # type: ignore[misc]
        def on_amqp_message(self, event: Any) -> None:
            got.append(client.Converter.bytes_to_string(event.message.body))
            self.delivery_context.accept(event)
            if got[-1] == "p3":
                raise Done

    env = client.Environment(f"amqp://guest:guest@127.0.0.1:{broker_41.port}/")
    try:
        conn = env.connection()
        conn.dial()
        options = client.StreamConsumerOptions(
            offset_specification=client.OffsetSpecification.first,
            filter_options=client.StreamFilterOptions(
                values=["red"],
                application_properties={"n": 1},
                message_properties=client.MessageProperties(message_id="&p:order-"),
            ),
        )
        consumer = conn.consumer(
            client.AddressHelper.queue_address("s"),
            message_handler=Handler(),
            consumer_options=options,
        )
        with pytest.raises(Done):
            consumer.run()
        consumer.close()
    finally:
        env.close()
    assert got == ["a1", "p3"]
