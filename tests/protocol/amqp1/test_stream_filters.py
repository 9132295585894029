"""AMQP 1.0 stream filters in memory (amqp1/filters.py, core/stream_delivery.py):
RabbitMQ 4.1's reading of a source's filter-set (what is applied, what is left
out, what the attach's answer echoes), the property filters' matching rules on
messages published over AMQP 1.0 and 0-9-1, and their effect on settlement,
with Qpid Proton's engine as the 1.0 client and the harness's 0-9-1 client."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from harness import Harness, harness_fixture
from harness.amqp1 import ProtonClient
from pamqp import commands

from warren.amqp1.filters import (
    APPLICATION_PROPERTIES_FILTER,
    PROPERTIES_FILTER,
    STREAM_FILTER,
    STREAM_MATCH_UNFILTERED,
    STREAM_OFFSET_SPEC,
    stream_filters,
)
from warren.amqp1.types import Described, Symbol, Timestamp, UInt, ULong

proton = pytest.importorskip("proton")
symbol, ulong = proton.symbol, proton.ulong

broker = harness_fixture(manual_clock=True)

APP = Symbol("amqp:application-properties-filter")
PROPS = Symbol("amqp:properties-filter")
UUID = uuid.UUID("0c6b2a51-2d4f-4b7e-9c61-1f0d7f3a6a11")


# -- reading the filter-set ---------------------------------------------------------------
def test_stream_filters_become_consumer_arguments() -> None:
    read = stream_filters(
        {
            Symbol("offset"): Described(STREAM_OFFSET_SPEC, "first"),
            Symbol("values"): Described(STREAM_FILTER, ["red", Symbol("not-utf8"), 7, "blue"]),
            Symbol("unfiltered"): Described(STREAM_MATCH_UNFILTERED, True),
        }
    )
    assert read.arguments == {
        "x-stream-offset": "first",
        "x-stream-filter": ["red", "blue"],
        "x-stream-match-unfiltered": True,
    }
    assert read.predicate is None
    assert list(read.applied) == ["offset", "values", "unfiltered"]


def test_an_undescribed_stream_filter_is_read_as_described_by_its_key() -> None:
    # RabbitMQ 4.1's amqp_filter_set_bug, permitted by default: echoed described.
    read = stream_filters({STREAM_FILTER: "red", Symbol("rabbitmq:stream-other"): "x"})
    assert read.arguments == {"x-stream-filter": "red"}
    assert read.applied == {STREAM_FILTER: Described(STREAM_FILTER, "red")}


@pytest.mark.parametrize(
    "value",
    [
        Described(STREAM_MATCH_UNFILTERED, "yes"),  # not a boolean
        Described(STREAM_FILTER, 1),  # neither a string nor a list
        Described(Symbol("apache.org:selector-filter:string"), "color = 'red'"),
        Described(Symbol("apache.org:no-local-filter:list"), []),
        "undescribed",
        Described(PROPS, {}),  # empty
        Described(PROPS, {Symbol(f"k{i}"): "v" for i in range(17)}),
        Described(PROPS, {Symbol("subject"): "&x"}),  # & starts no known modifier
        Described(PROPS, {Symbol("subject"): Symbol("a symbol")}),  # must be a string
        Described(PROPS, {Symbol("message-id"): 7}),  # a long: no message-id type
        Described(PROPS, {Symbol("group-sequence"): 7}),  # must be a uint
        Described(PROPS, {Symbol("user-id"): "text"}),  # must be binary
        Described(PROPS, {Symbol("content-type"): "text/plain"}),  # must be a symbol
        Described(PROPS, {Symbol("creation-time"): 1000}),  # must be a timestamp
        Described(PROPS, {Symbol("durable"): True}),  # no such property
        Described(PROPS, {"subject": "x"}),  # the key must be a symbol
        Described(APP, {Symbol("color"): "red"}),  # the key must be a string
        Described(APP, {"color": "&"}),
        Described(APP, ["color", "red"]),  # not a map
        Described(ULong(0x175), {"color": "red"}),
    ],
)
def test_what_rabbitmq_leaves_out(value: Any) -> None:
    read = stream_filters({Symbol("f"): value, Symbol("kept"): Described(APP, {"k": "v"})})
    assert list(read.applied) == ["kept"]
    assert read.arguments == {}


def test_property_filters_by_name_or_code() -> None:
    filters = {
        Symbol("p"): Described(ULong(0x173), {Symbol("subject"): "s"}),
        Symbol("a"): Described(ULong(0x174), {"k": 1}),
    }
    read = stream_filters(filters)
    assert read.applied == filters
    assert read.predicate is not None
    assert read.predicate.properties == (("subject", "s"),)
    assert read.predicate.application == (("k", 1),)
    named = stream_filters({Symbol("p"): Described(PROPERTIES_FILTER, {Symbol("to"): "t"})})
    assert named.predicate is not None and named.predicate.properties == (("to", "t"),)
    assert APPLICATION_PROPERTIES_FILTER == APP


def test_one_filter_per_section_the_last_wins() -> None:
    read = stream_filters(
        {
            Symbol("first"): Described(APP, {"k": "1"}),
            Symbol("props"): Described(PROPS, {Symbol("subject"): "s"}),
            Symbol("second"): Described(APP, {"k": "2"}),
        }
    )
    assert list(read.applied) == ["props", "second"]
    assert read.predicate is not None and read.predicate.application == (("k", "2"),)


def test_every_property_type_rabbitmq_takes() -> None:
    read = stream_filters(
        {
            Symbol("p"): Described(
                PROPS,
                {
                    Symbol("message-id"): ULong(7),
                    Symbol("correlation-id"): UUID,
                    Symbol("user-id"): b"guest",
                    Symbol("to"): "&&amp",
                    Symbol("reply-to"): "/queues/r",
                    Symbol("content-type"): Symbol("text/plain"),
                    Symbol("content-encoding"): Symbol("gzip"),
                    Symbol("absolute-expiry-time"): Timestamp(5),
                    Symbol("creation-time"): Timestamp(6),
                    Symbol("group-id"): "g",
                    Symbol("group-sequence"): UInt(3),
                    Symbol("reply-to-group-id"): "&p:r",
                },
            )
        }
    )
    assert read.predicate is not None
    fields = dict(read.predicate.properties)
    assert fields["to"] == "&amp"  # && escapes a leading &
    assert len(fields) == 12


# -- matching, through the broker -----------------------------------------------------------
def declare_stream(harness: Harness, name: str) -> None:
    harness.call(
        lambda: harness.broker.vhosts["/"].declare_queue(
            name, durable=True, arguments={"x-queue-type": "stream"}
        )
    )


def filtered(*pairs: tuple[str, Any]) -> Any:
    """A receiver option: the source's filter-set."""

    def configure(receiver: Any) -> None:
        receiver.source.filter.put_dict(
            {symbol(name): proton.Described(symbol(kind), value) for name, kind, value in pairs}
        )

    return configure


def fill_mixed(harness: Harness, c: ProtonClient, stream: str) -> None:
    """Seven messages: a1..a4 over AMQP 1.0, p1..p3 over 0-9-1."""
    sender = c.sender(f"/queues/{stream}", name="fill")
    for message in (
        proton.Message(
            body="a1",
            id="order-1",
            correlation_id="c-1",
            reply_to="/queues/replies",
            content_type="text/plain",
            group_id="g1",
            properties={"color": "red", "n": 1},
            annotations={symbol("x-stream-filter-value"): "red"},
        ),
        proton.Message(body="a2", id=b"\x01\x02", properties={"color": "blue", "n": 2.0}),
        proton.Message(body="a3", id=UUID, properties={"color": "red-ish", "flag": True}),
        proton.Message(body="a4", id=ulong(7)),
    ):
        assert c.send(sender, message).remote_state == proton.Delivery.ACCEPTED
    sender.close()
    c.pump()
    ch = harness.amqp_connection().channel()
    for body, props in (
        (
            b"p1",
            {
                "message_id": "order-2",
                "headers": {"color": "red", "n": 1, "x-stream-filter-value": "red"},
            },
        ),
        (b"p2", {"user_id": "guest", "headers": {"color": "green"}}),
        (b"p3", {"app_id": "g1", "reply_to": "replies"}),
    ):
        ch.basic_publish("", stream, body, commands.Basic.Properties(**props))


def bodies(c: ProtonClient, receiver: Any, settle: bool = True) -> list[str]:
    got = c.receive(receiver)
    if settle:
        for delivery, _ in got:
            c.settle(delivery)
    return [text(m) for _, m in got]


def text(message: Any) -> str:
    """A body sent as a string (1.0) or as bytes (0-9-1: a data section)."""
    body = message.body
    return body if isinstance(body, str) else bytes(body).decode()


APP_P = "amqp:application-properties-filter"
PROPS_P = "amqp:properties-filter"


@pytest.mark.parametrize(
    "pairs, expected",
    [
        ([("f", APP_P, {"color": "red"})], ["a1", "p1"]),
        ([("f", APP_P, {"color": "&p:red"})], ["a1", "a3", "p1"]),
        ([("f", APP_P, {"color": "&s:ue"})], ["a2"]),
        ([("f", APP_P, {"n": 2})], ["a2"]),  # a long matches a double of the same value
        ([("f", APP_P, {"n": 1.0})], ["a1", "p1"]),  # and a double a 0-9-1 integer
        ([("f", APP_P, {"flag": True})], ["a3"]),
        ([("f", APP_P, {"flag": 1})], []),  # a boolean is no number
        ([("f", APP_P, {"flag": None})], ["a3"]),  # null: the key is there
        ([("f", APP_P, {"color": "red", "n": 1})], ["a1", "p1"]),
        ([("f", APP_P, {"color": "red", "missing": None})], []),
        ([("f", PROPS_P, {symbol("message-id"): "&p:order-"})], ["a1", "p1"]),
        ([("f", PROPS_P, {symbol("message-id"): b"\x01\x02"})], ["a2"]),
        ([("f", PROPS_P, {symbol("message-id"): UUID})], ["a3"]),
        ([("f", PROPS_P, {symbol("correlation-id"): "c-1"})], ["a1"]),
        ([("f", PROPS_P, {symbol("reply-to"): "/queues/replies"})], ["a1", "p3"]),
        ([("f", PROPS_P, {symbol("group-id"): "g1"})], ["a1", "p3"]),
        ([("f", PROPS_P, {symbol("user-id"): b"guest"})], ["p2"]),
        ([("f", PROPS_P, {symbol("content-type"): symbol("text/plain")})], ["a1"]),
        ([("f", PROPS_P, {symbol("subject"): "&p:"})], []),  # no message has one
        (
            [
                ("p", PROPS_P, {symbol("message-id"): "&s:2"}),
                ("a", APP_P, {"color": "red"}),
            ],
            ["p1"],
        ),
        ([("v", "rabbitmq:stream-filter", "red")], ["a1", "p1"]),
        (
            [
                ("v", "rabbitmq:stream-filter", "red"),
                ("u", "rabbitmq:stream-match-unfiltered", True),
            ],
            ["a1", "a2", "a3", "a4", "p1", "p2", "p3"],
        ),
        (
            [
                ("v", "rabbitmq:stream-filter", ["red"]),
                ("u", "rabbitmq:stream-match-unfiltered", True),
                ("a", APP_P, {"n": 1}),
            ],
            ["a1", "p1"],
        ),
    ],
)
def test_filters_on_a_stream_of_mixed_messages(
    broker: Harness, pairs: list[tuple[str, str, Any]], expected: list[str]
) -> None:
    declare_stream(broker, "s")
    c = ProtonClient(broker).open()
    fill_mixed(broker, c, "s")
    start = ("o", "rabbitmq:stream-offset-spec", "first")
    receiver = c.receiver("/queues/s", credit=20, configure=filtered(start, *pairs))
    assert bodies(c, receiver) == expected
    # The answer echoes every filter applied (here, all asked for).
    echoed = receiver.remote_source.filter
    echoed.rewind()
    echoed.next()
    assert sorted(str(k) for k in echoed.get_object()) == sorted(["o", *(p[0] for p in pairs)])


def test_the_answer_leaves_out_what_was_not_applied(broker: Harness) -> None:
    declare_stream(broker, "s")
    broker.call(lambda: broker.broker.vhosts["/"].declare_queue("classic"))
    c = ProtonClient(broker).open()
    asked = filtered(
        ("o", "rabbitmq:stream-offset-spec", "first"),
        ("sel", "apache.org:selector-filter:string", "color = 'red'"),
        ("a", APP_P, {"color": "&bad"}),
    )
    receiver = c.receiver("/queues/s", credit=1, configure=asked)
    echoed = receiver.remote_source.filter
    echoed.rewind()
    echoed.next()
    assert list(echoed.get_object()) == ["o"]
    # A classic queue applies none.
    other = c.receiver("/queues/classic", credit=1, name="classic", configure=asked)
    echoed = other.remote_source.filter
    echoed.rewind()
    assert echoed.next() is None or echoed.get_object() == {}


# -- settlement ---------------------------------------------------------------------------
def test_skipped_messages_need_no_settlement_and_acks_advance_only_what_was_settled(
    broker: Harness,
) -> None:
    declare_stream(broker, "s")
    c = ProtonClient(broker).open()
    fill_mixed(broker, c, "s")
    receiver = c.receiver(
        "/queues/s",
        credit=20,
        configure=filtered(
            ("o", "rabbitmq:stream-offset-spec", "first"), ("a", APP_P, {"color": "&p:red"})
        ),
    )
    got = c.receive(receiver)
    assert [text(m) for _, m in got] == ["a1", "a3", "p1"]  # offsets 0, 2 and 4
    queue = broker.broker.vhosts["/"].queues["s"]

    def reader() -> Any:
        (only,) = queue.reading.readers.values()
        return only

    assert broker.call(lambda: queue.unacked) == 3  # the skipped ones are not waiting
    assert broker.call(lambda: list(reader().in_flight)) == [0, 2, 4]
    c.settle(got[2][0])  # the last one first
    c.settle(got[1][0])
    # Offsets 1 and 3 were never delivered; 0 is not settled: nothing moves past it.
    assert broker.call(lambda: (queue.unacked, reader().resume_offset())) == (1, 0)
    c.settle(got[0][0])
    # All settled: where it would start again is its next read (past the skipped ones).
    assert broker.call(lambda: (queue.unacked, reader().resume_offset())) == (0, 7)


def test_a_filter_matching_little_reads_on_over_many_delivery_passes(broker: Harness) -> None:
    declare_stream(broker, "big")
    c = ProtonClient(broker).open()
    sender = c.sender("/queues/big", settled=True)
    for i in range(5000):
        delivery = sender.delivery(f"d{i}")
        sender.send(proton.Message(body=i, properties={"i": i}).encode())
        sender.advance()
        delivery.settle()
        if i % 100 == 99:
            c.pump()
    assert broker.broker.vhosts["/"].queues["big"].message_count == 5000
    receiver = c.receiver(
        "/queues/big",
        credit=10,
        configure=filtered(
            ("o", "rabbitmq:stream-offset-spec", "first"), ("a", APP_P, {"i": 4999})
        ),
    )
    ((_, last),) = c.receive(receiver)
    assert last.body == 4999


def test_a_drain_waits_for_the_filters_scan(broker: Harness) -> None:
    """A filter that skips more than a delivery pass's batch goes on in the next
    pass; a drain answers once the scan found a match or the end, as RabbitMQ's."""
    declare_stream(broker, "big")
    c = ProtonClient(broker).open()
    sender = c.sender("/queues/big", settled=True)
    for i in range(5000):
        delivery = sender.delivery(f"d{i}")
        sender.send(proton.Message(body=i, properties={"i": i}).encode())
        sender.advance()
        delivery.settle()
        if i % 100 == 99:
            c.pump()
    wanted = filtered(("o", "rabbitmq:stream-offset-spec", "first"), ("a", APP_P, {"i": 4999}))
    receiver = c.receiver("/queues/big", configure=wanted)
    receiver.drain(5)
    c.pump()
    ((_, last),) = c.receive(receiver)
    assert last.body == 4999
    assert receiver.credit == 0 and not receiver.draining()
    # A drain that reads to the end without a match answers too.
    none = filtered(("o", "rabbitmq:stream-offset-spec", "first"), ("a", APP_P, {"i": -1}))
    nothing = c.receiver("/queues/big", name="none", configure=none)
    nothing.drain(5)
    c.pump()
    assert c.receive(nothing) == [] and nothing.credit == 0 and not nothing.draining()
