"""RabbitMQ's Python client (rabbitmq-amqp-python-client) against the /management
node (src/warren/amqp1/management_node.py): its Management calls over
in-memory links, as its users make them; and the node's paths
(management_paths.py) as RabbitMQ's clients spell them.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

import pytest
from harness import Harness, harness_fixture
from harness.management_node import NODE, NodePair
from hypothesis import given, settings
from hypothesis import strategies as st

from examples import examples
from warren.amqp1.management_node import decode_request
from warren.amqp1.management_paths import (
    BadPath,
    parse_binding_segment,
    parse_target,
    quote,
    route,
    unquote,
)
from warren.amqp1.message import AmqpMessage, encode_message

broker = harness_fixture()


@pytest.fixture
def pair(broker: Harness) -> Iterator[NodePair]:
    yield NodePair(broker)


class ClientLinks:
    """rabbitmq-amqp-python-client's blocking sender and receiver of the
    management link pair, in memory: what the client sends goes to the node,
    its replies come back decoded by the client's own proton."""

    def __init__(self, pair: NodePair, message_class: Any) -> None:
        self.pair = pair
        self.message_class = message_class
        self.replies: list[AmqpMessage] = []

    def send(self, message: Any) -> None:
        request = decode_request(message.encode())
        self.pair.harness.call(lambda: self.pair.node.request(request, self.replies.append))
        self.pair.harness.settle()

    def receive(self) -> Any:
        decoded = self.message_class()
        decoded.decode(encode_message(self.replies.pop(0)))
        return decoded


def test_rabbitmq_python_client(pair: NodePair, broker: Harness) -> None:
    """The client's Management calls, as its users make them, get what they
    expect from the node."""
    client = pytest.importorskip("rabbitmq_amqp_python_client")
    management = client.Management(None)
    links = ClientLinks(pair, client.Message)
    management._sender = management._receiver = links
    vhost = pair.vhost

    management.declare_queue(
        client.QuorumQueueSpecification(name="qq", max_len=10, deliver_limit=3)
    )
    management.declare_queue(client.ClassicQueueSpecification(name="cq", is_durable=False))
    management.declare_queue(
        client.StreamSpecification(name="sq", max_age=datetime.timedelta(hours=1))
    )
    assert {n: vhost.queues[n].queue_type for n in ("qq", "cq", "sq")} == {
        "qq": "quorum",
        "cq": "classic",
        "sq": "stream",
    }
    info = management.queue_info("qq")
    assert (info.name, info.queue_type, info.is_durable, info.leader) == (
        "qq",
        client.QueueType.quorum,
        True,
        NODE,
    )
    assert info.arguments["x-max-length"] == 10
    assert list(info.members.elements) == [NODE]
    with pytest.raises(client.ValidationCodeException, match="ErrPreconditionFailed"):
        management.declare_queue(client.QuorumQueueSpecification(name="qq", max_len=11))

    management.declare_exchange(
        client.ExchangeSpecification(name="ex", exchange_type=client.ExchangeType.topic)
    )
    assert vhost.exchanges["ex"].type == "topic"
    path = management.bind(
        client.ExchangeToQueueBindingSpecification(
            source_exchange="ex", destination_queue="cq", binding_key="a.#"
        )
    )
    binding = vhost.exchanges["ex"].find_binding(vhost.queues["cq"], "a.#", {})
    assert binding is not None
    with broker.amqp_connection() as conn:
        ch = conn.channel()
        for key in ("a.b", "a.c", "b"):
            ch.basic_publish("ex", key, b"m")
        ch.barrier()
    assert management.queue_info("cq").message_count == 2
    assert management.purge_queue("cq") == 2
    management.unbind(path)
    assert vhost.exchanges["ex"].find_binding(vhost.queues["cq"], "a.#", {}) is None

    management.delete_exchange("ex")
    for name in ("qq", "cq", "sq"):
        management.delete_queue(name)
    assert "ex" not in vhost.exchanges
    assert not {"qq", "cq", "sq"} & set(vhost.queues)


# -- paths ----------------------------------------------------------------------------
@settings(max_examples=examples(200), deadline=None)
@given(st.text(st.characters(exclude_categories=("Cs",))))
def test_names_round_trip_through_their_encoding(name: str) -> None:
    encoded = quote(name)
    assert set(encoded) <= set(
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~%"
    )
    assert unquote(encoded) == name
    segments, _ = parse_target("/queues/" + encoded)
    assert route(segments) == "queue"
    assert unquote(segments[1]) == name


@settings(max_examples=examples(100), deadline=None)
@given(
    st.text(st.characters(exclude_categories=("Cs",)), min_size=1),
    st.text(st.characters(exclude_categories=("Cs",)), min_size=1),
    st.text(st.characters(exclude_categories=("Cs",))),
)
def test_a_binding_segment_reads_back(source: str, destination: str, key: str) -> None:
    segment = f"src={quote(source)};dstq={quote(destination)};key={quote(key)};args="
    assert parse_binding_segment(segment) == (source, "queue", destination, key, "")


def test_queries_are_read_as_forms() -> None:
    """RabbitMQ's Erlang client composes GET /bindings' query as a form (a
    space is '+'), percent-encoding the rest."""
    segments, query = parse_target("/bindings?src=amq.direct&dstq=my%20q&key=%F0%9F%97%9D+1")
    assert route(segments) == "bindings"
    assert query == {"src": "amq.direct", "dstq": "my q", "key": "🗝 1"}


@pytest.mark.parametrize(
    ("target", "text"),
    [
        ("/queues/%F0%9F", "'%F0%9F' is not percent-encoded UTF-8"),
        ("/queues/%2", "bad percent-encoding in '%2'"),
        ("/bindings?src", "failed to dissect query 'src'"),
    ],
)
def test_bad_targets(target: str, text: str) -> None:
    with pytest.raises(BadPath) as bad:
        segments, _ = parse_target(target)
        unquote(segments[1])
    assert bad.value.text == text


def test_the_python_clients_paths_are_read_back() -> None:
    client = pytest.importorskip("rabbitmq_amqp_python_client")
    helper = client.AddressHelper
    name = "q ;=/%?#~x"
    segments, _ = parse_target(helper.queue_address(name))
    assert (route(segments), unquote(segments[1])) == ("queue", name)
    segments, _ = parse_target(helper.purge_queue_address(name))
    assert (route(segments), unquote(segments[1])) == ("messages", name)
    spec = client.ExchangeToQueueBindingSpecification(
        source_exchange="x;y", destination_queue=name, binding_key="a.*"
    )
    segments, _ = parse_target(helper.binding_path_with_exchange_queue(spec))
    assert route(segments) == "binding"
    assert parse_binding_segment(segments[1]) == ("x;y", "queue", name, "a.*", "")
