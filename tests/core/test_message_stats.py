"""Message counters and rates (what management's message_stats and metrics report).

A client's calls make the traffic, in memory (issue 29: a tests/harness
broker, pika's calls over MemoryAMQP, frames by pamqp; pika over a socket
before); the broker's automatic sampling is off (collect_statistics_interval
= 0) and the test samples with times it chooses, so the rates are exact and
nothing waits for the wall clock.
"""

from __future__ import annotations

from typing import Any

import pytest
from harness import Harness, harness_fixture, wait_until
from harness.channel import Unroutable, uniq

from warren.core.stats import COUNTERS, MessageStats

broker = harness_fixture(collect_statistics_interval=0)


def counters(stats: MessageStats) -> dict[str, int]:
    return {k: v for k, v in zip(COUNTERS, stats.values(), strict=True) if v}


def queue_stats(b: Harness, name: str) -> MessageStats:
    return b.call(lambda: b.broker.vhosts["/"].queues[name].stats)


def channel_counters(b: Harness) -> list[dict[str, int]]:
    def read() -> list[dict[str, int]]:
        return [
            counters(stats)
            for conn in b.broker.connections
            for _vhost, stats in conn.channel_stats()
            if stats.values() != MessageStats().values()
        ]

    return b.call(read)


def test_every_counter_moves_where_rabbitmq_counts_it(broker: Harness) -> None:
    conn = broker.amqp_connection()
    ch = conn.channel()
    ch.confirm_delivery()
    q = uniq()
    ch.queue_declare(q)
    ch.exchange_declare("stats-x", "direct")
    ch.queue_bind(q, "stats-x", "k")
    for i in range(5):
        ch.basic_publish("stats-x", "k", str(i).encode())
    ch.basic_publish("", q, b"direct")
    with pytest.raises(Unroutable):
        ch.basic_publish("stats-x", "nowhere", b"returned", mandatory=True)
    ch.basic_publish("stats-x", "nowhere", b"dropped")  # confirmed: nothing routed it

    method, _, _ = ch.basic_get(q, auto_ack=False)
    ch.basic_nack(method.delivery_tag, requeue=True)  # back to the head, redelivered
    ch.basic_get(q, auto_ack=True)  # the redelivered one
    ch.basic_get(q, auto_ack=True)
    got: list[int] = []

    def on_message(c: Any, m: Any, p: Any, body: bytes) -> None:
        got.append(m.delivery_tag)
        c.basic_ack(m.delivery_tag)

    ch.basic_qos(prefetch_count=10)
    ch.basic_consume(q, on_message)
    wait_until(conn, lambda: len(got) == 4)
    ch.barrier()
    other = conn.channel()
    other.queue_declare(q, passive=True)
    assert other.basic_get(q)[0] is None  # get_empty

    assert counters(queue_stats(broker, q)) == {
        "publish": 6,
        "get": 1,
        "get_no_ack": 2,
        "get_empty": 1,
        "deliver": 4,
        "ack": 4,
        "redeliver": 1,
    }
    exchange = broker.call(lambda: broker.broker.vhosts["/"].exchanges["stats-x"].stats)
    assert counters(exchange) == {"publish_in": 7, "publish_out": 5}
    assert sorted(channel_counters(broker), key=len) == [
        {"get_empty": 1},
        {
            "publish": 8,
            "confirm": 8,
            "return_unroutable": 1,
            "drop_unroutable": 1,
            "get": 1,
            "get_no_ack": 2,
            "deliver": 4,
            "ack": 4,
            "redeliver": 1,
        },
    ]
    conn.close()


def test_rates_and_the_vhost_totals_survive_closed_channels(broker: Harness) -> None:
    q = uniq()
    conn = broker.amqp_connection()
    ch = conn.channel()
    ch.queue_declare(q)
    assert broker.call(lambda: broker.broker.sample_stats(100.0)) > 0  # the baseline
    for _ in range(20):
        ch.basic_publish("", q, b"m")
    ch.barrier()
    broker.call(lambda: broker.broker.sample_stats(105.0))
    qs = queue_stats(broker, q)
    assert qs.rate("publish") == 4.0  # 20 messages in 5 s
    assert qs.as_dict()["publish_details"] == {"rate": 4.0}
    vhost = broker.call(lambda: broker.broker.vhosts["/"].stats)
    assert vhost.publish == 20 and vhost.rate("publish") == 4.0
    assert broker.call(lambda: broker.broker.stats.publish) == 20

    conn.close()
    broker.settle()  # the connection's close handled to its end
    assert broker.call(lambda: not broker.broker.connections)
    broker.call(lambda: broker.broker.sample_stats(110.0))
    assert vhost.publish == 20  # the closed channel's counts stay in the vhost's
    assert vhost.rate("publish") == 0.0
    assert qs.rate("publish") == 0.0
    as_dict = vhost.as_dict()
    assert as_dict["publish"] == 20 and as_dict["publish_details"] == {"rate": 0.0}
