"""x-single-active-consumer: one consumer gets everything; when it goes, the next
takes over (highest priority first, then the longest waiting).

In memory (issue 29): a tests/harness broker, pika's calls over MemoryAMQP
(harness.channel, frames by pamqp; pika over a socket before). Where a test
says a consumer got nothing, the broker's loop has first done all it can
(Connection.pump).
"""

from __future__ import annotations

from typing import Any

from harness import Connection, Harness, harness_fixture, wait_until
from harness.channel import uniq

broker = harness_fixture()


def connect(broker: Harness) -> Connection:
    return broker.amqp_connection()


def test_only_the_first_consumer_receives_then_the_next_takes_over(
    broker: Harness,
) -> None:
    conn = connect(broker)
    ch = conn.channel()
    q = uniq()
    ch.queue_declare(q, arguments={"x-single-active-consumer": True})
    got: dict[str, list[bytes]] = {"a": [], "b": []}

    def on(name: str) -> Any:
        return lambda c, m, p, body: (got[name].append(body), c.basic_ack(m.delivery_tag))

    tag_a = ch.basic_consume(q, on("a"))
    ch.basic_consume(q, on("b"))
    for i in range(10):
        ch.basic_publish("", q, str(i).encode())
    wait_until(conn, lambda: len(got["a"]) == 10)
    conn.pump()
    assert got["b"] == []
    ch.basic_cancel(tag_a)
    for i in range(10, 15):
        ch.basic_publish("", q, str(i).encode())
    wait_until(conn, lambda: len(got["b"]) == 5)
    assert got["b"] == [str(i).encode() for i in range(10, 15)]
    conn.close()


def test_unacked_messages_of_the_active_consumer_go_to_its_successor(
    broker: Harness,
) -> None:
    conn = connect(broker)
    q = uniq()
    first = conn.channel()
    first.queue_declare(q, arguments={"x-single-active-consumer": True})
    held: list[bytes] = []
    first.basic_consume(q, lambda c, m, p, body: held.append(body))
    second = conn.channel()
    got: list[tuple[bytes, bool]] = []
    second.basic_consume(q, lambda c, m, p, body: got.append((body, m.redelivered)), auto_ack=True)
    for i in range(3):
        first.basic_publish("", q, str(i).encode())
    wait_until(conn, lambda: len(held) == 3)
    conn.pump()
    assert got == []
    first.close()  # its unacked messages are requeued for the new active consumer
    wait_until(conn, lambda: len(got) == 3)
    assert got == [(b"0", True), (b"1", True), (b"2", True)]
    conn.close()


def test_the_successor_is_the_highest_priority_consumer(broker: Harness) -> None:
    conn = connect(broker)
    ch = conn.channel()
    q = uniq()
    ch.queue_declare(q, arguments={"x-single-active-consumer": True})
    got: dict[str, list[bytes]] = {"first": [], "low": [], "high": []}

    def on(name: str) -> Any:
        return lambda c, m, p, body: got[name].append(body)

    tag = ch.basic_consume(q, on("first"), auto_ack=True)
    ch.basic_consume(q, on("low"), auto_ack=True, arguments={"x-priority": 1})
    ch.basic_consume(q, on("high"), auto_ack=True, arguments={"x-priority": 5})
    ch.basic_cancel(tag)
    ch.basic_publish("", q, b"m")
    wait_until(conn, lambda: got["high"] == [b"m"])
    conn.pump()
    assert got["low"] == [] and got["first"] == []
    conn.close()
