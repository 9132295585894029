"""AMQP 1.0 addresses as RabbitMQ 4 reads them (warren/amqp1/addresses.py).

The cases follow RabbitMQ 4's documented v2 formats and its own address test
suite's good and bad addresses (deps/rabbit/test/amqp_address_SUITE.erl), and
RabbitMQ 3.x's rabbitmq_amqp1_0 plugin's v1 forms; the v2 encoder is checked
against rabbitmq-amqp-python-client's, RabbitMQ's own Python client, when it
is installed.
"""

from __future__ import annotations

import pytest

from warren.amqp1.addresses import (
    INVALID_FIELD,
    PRECONDITION_FAILED,
    Address,
    AddressError,
    exchange_address,
    parse_source,
    parse_target,
    parse_to,
    queue_address,
)


# -- v2 ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("/exchanges/amq.topic/a.b", Address("exchange", "amq.topic", "a.b")),
        ("/exchanges/x", Address("exchange", "x", "")),
        ("/exchanges/x/", Address("exchange", "x", "")),
        ("/exchanges/my%2Fexchange/my%2Fkey", Address("exchange", "my/exchange", "my/key")),
        ("/exchanges/%F0%9F%91%89/%F0%9F%97%9D", Address("exchange", "👉", "🗝")),
        ("/exchanges/a%20b/c%25d", Address("exchange", "a b", "c%d")),
        ("/exchanges/x/k+(1)", Address("exchange", "x", "k+(1)")),  # + is not a space
        ("/queues/q", Address("queue", "q")),
        ("/queues/a/b", Address("queue", "a/b")),  # the rest is the name
        ("/queues/my%2Fqueue", Address("queue", "my/queue")),
        ("/queues/%f0%9f%8e%88", Address("queue", "🎈")),  # either case of hex digit
        ("/queues/amq.default", Address("queue", "amq.default")),
    ],
)
def test_v2_targets(address: str, expected: Address) -> None:
    assert parse_target(address) == expected
    assert parse_to(address) == expected
    assert not expected.v1 and not expected.declare


#: RabbitMQ's suite's bad v2 target addresses that start as v2 does, and more.
BAD_V2 = [
    "/queues/",  # empty queue name
    "/exchanges/",  # the default exchange is refused in v2: /queues/:queue
    "/exchanges//",
    "/exchanges//mykey",
    "/exchanges/amq.default",
    "/exchanges/amq.default/",
    "/exchanges/amq.default/mykey",
    "/exchanges/amq%2Edefault/mykey",  # encoded, still the default exchange
    "/exchanges/x/a/b",  # a raw / in a routing key
    "/exchanges/x/%2",  # a cut escape
    "/exchanges/x/%zz",
    "/exchanges/a b",  # unencoded characters outside RFC 3986's
    "/queues/🎈",
    "/queues/a%FFb",  # not UTF-8
    '/queues/"q"',
]


@pytest.mark.parametrize("address", BAD_V2)
def test_bad_v2_targets(address: str) -> None:
    with pytest.raises(AddressError) as info:
        parse_target(address)
    assert info.value.condition == INVALID_FIELD
    with pytest.raises(AddressError) as info:
        parse_to(address)
    assert info.value.condition == PRECONDITION_FAILED
    assert info.value.description == f"bad 'to' address string: {address}"


def test_the_null_target_is_the_anonymous_terminus() -> None:
    assert parse_target(None) is None
    with pytest.raises(AddressError) as info:
        parse_to(None)
    assert info.value.condition == PRECONDITION_FAILED


@pytest.mark.parametrize(
    "to",
    # Valid v1 targets, but a message's 'to' is read as v2 only.
    ["/topic/t", "/amq/queue/q", "myqueue", "/queue", "/exchange/x/k", "/queue/q", "", "/"],
)
def test_to_takes_v2_only(to: str) -> None:
    with pytest.raises(AddressError) as info:
        parse_to(to)
    assert info.value.condition == PRECONDITION_FAILED


def test_v2_sources() -> None:
    assert parse_source("/queues/q") == Address("queue", "q")
    assert parse_source("/queues/a%2Fb") == Address("queue", "a/b")
    # As RabbitMQ 4: an empty name is no error here, the queue is not found later.
    assert parse_source("/queues/") == Address("queue", "")
    for bad in ("/queues/a%2", "/queues/🎈"):
        with pytest.raises(AddressError) as info:
            parse_source(bad)
        assert info.value.condition == INVALID_FIELD


@pytest.mark.parametrize("address", [None, "/exchanges/x", "/exchanges/x/k", "/qqq/🎈"])
def test_bad_sources(address: str | None) -> None:
    with pytest.raises(AddressError) as info:
        parse_source(address)
    assert info.value.condition == INVALID_FIELD


# -- v1 ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("address", "target", "source"),
    [
        (
            "/exchange/x/k",
            Address("exchange", "x", "k", v1=True),
            Address("exchange", "x", "k", v1=True),
        ),
        # No key: a target routes by each message's subject; a source binds with "".
        (
            "/exchange/x",
            Address("exchange", "x", None, v1=True),
            Address("exchange", "x", "", v1=True),
        ),
        (
            "/exchange/x/",
            Address("exchange", "x", None, v1=True),
            Address("exchange", "x", "", v1=True),
        ),
        (
            "/exchange/a%2Fb/c%2Fd",
            Address("exchange", "a/b", "c/d", v1=True),
            Address("exchange", "a/b", "c/d", v1=True),
        ),
        (
            "/topic/a.*",
            Address("exchange", "amq.topic", "a.*", v1=True),
            Address("exchange", "amq.topic", "a.*", v1=True),
        ),
        (
            "/amq/queue/q",
            Address("queue", "q", v1=True),
            Address("queue", "q", v1=True),
        ),
        (
            "/queue/q",
            Address("queue", "q", v1=True, declare=True),
            Address("queue", "q", v1=True, declare=True),
        ),
        (
            "q",
            Address("queue", "q", v1=True, declare=True),
            Address("queue", "q", v1=True, declare=True),
        ),
        (
            "a%2Fb%20c",  # only %2F is decoded in v1
            Address("queue", "a/b%20c", v1=True, declare=True),
            Address("queue", "a/b%20c", v1=True, declare=True),
        ),
    ],
)
def test_v1_forms(address: str, target: Address, source: Address) -> None:
    assert parse_target(address) == target
    assert parse_source(address) == source


def test_v1_queue_target_is_the_default_exchange_by_subject() -> None:
    assert parse_target("/queue") == Address("exchange", "", None, v1=True)
    with pytest.raises(AddressError):
        parse_source("/queue")


@pytest.mark.parametrize(
    "address",
    [
        "",
        "/",
        "//",
        "/queues",
        "/exchanges",
        "/exchange",
        "/exchange/",
        "/exchange//k",
        "/exchange/x/k/more",
        "/queue/",
        "/queue/a/b",
        "/topic/",
        "/topic/a/b",
        "/amq/queue/",
        "/amq/queue",
        "/ex/✋",
        "/qqq/🎈",
        "x/y",
    ],
)
def test_bad_v1_addresses(address: str) -> None:
    for parse in (parse_target, parse_source):
        with pytest.raises(AddressError) as info:
            parse(address)
        assert info.value.condition == INVALID_FIELD


# -- encoding ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["q", "my/queue", "a b", "🎈", "100%", "k+(1)", "amq.default"])
def test_encoded_addresses_read_back(name: str) -> None:
    assert parse_target(queue_address(name)) == Address("queue", name)
    assert parse_source(queue_address(name)) == Address("queue", name)
    if name != "amq.default":
        assert parse_target(exchange_address(name)) == Address("exchange", name, "")
        assert parse_target(exchange_address(name, name)) == Address("exchange", name, name)


def test_encoding_agrees_with_rabbitmqs_python_client() -> None:
    """Its encoder's output for ASCII names (it writes a non-ASCII character as
    ``%`` and its code point's hex, not its UTF-8 bytes: not compared)."""
    module = pytest.importorskip("rabbitmq_amqp_python_client.address_helper")
    helper = module.AddressHelper
    for name in ["q", "my/queue", "a b", "100%", "k+(1)", "~._-", "a:b@c"]:
        assert queue_address(name) == helper.queue_address(name)
        assert exchange_address(name) == helper.exchange_address(name)
        assert exchange_address(name, "rk/1") == helper.exchange_address(name, "rk/1")
        assert parse_target(helper.exchange_address(name, "k")) == Address("exchange", name, "k")
