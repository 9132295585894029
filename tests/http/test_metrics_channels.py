"""The per-channel Prometheus series by exchange and queue (RabbitMQ's
channel_exchange_metrics, channel_queue_metrics, channel_queue_exchange_metrics):
the same client script as a recorded RabbitMQ 3.10 answered
(tests/record_rabbitmq_channel_series.py), the same samples; and how they
follow runs, confirms over several exchanges, deleted queues, closed channels."""

from __future__ import annotations

import json

import prometheus_channel_scenario as scenario
import pytest
from conftest import BrokerThread
from metricshelp import fetch, scrape
from pamqp import commands
from paths import DATA
from pikahelp import barrier, connect, uniq, wait_until
from rawamqp import RawAMQP, publish_frames

RECORDED = json.loads(
    (DATA / "rabbitmq_prometheus_channel_series.json").read_text()
)


def _recorded(path: str) -> scenario.Series:
    return [
        (name, tuple(tuple(p) for p in labels), value)
        for name, labels, value in RECORDED["endpoints"][path]
    ]


@pytest.mark.parametrize(
    ("path", "prefix"),
    [
        ("/metrics", "rabbitmq_"),
        ("/metrics/per-object", "rabbitmq_"),
        (scenario.DETAILED, "rabbitmq_detailed_"),
    ],
)
def test_channel_series_are_rabbitmqs(broker: BrokerThread, path: str, prefix: str) -> None:
    conn = connect(broker)
    scenario.run(conn, "scenario")
    got = scenario.reduce(fetch(broker, path), prefix)
    conn.close()
    assert got == _recorded(path)


def _by(m: dict[str, list[tuple[dict[str, str], float]]], name: str, key: str) -> dict[str, float]:
    return {labels[key]: v for labels, v in m.get(name, [])}


def test_runs_are_counted_by_exchange_and_queue(broker: BrokerThread) -> None:
    """Publishes a socket read holds many of go as runs (amqp/publish_run.py),
    deliveries to a waiting consumer as runs: counted once per run, the same
    numbers as message by message."""
    conn = connect(broker)
    pub = conn.channel()
    q1, q2, fan = uniq(), uniq(), uniq("x")
    pub.queue_declare(q1)
    pub.queue_declare(q2)
    pub.exchange_declare(fan, "fanout")
    pub.queue_bind(q1, fan)
    pub.queue_bind(q2, fan)
    sub = conn.channel()
    got: list[bytes] = []
    sub.basic_consume(q2, lambda _c, _m, _p, body: got.append(body), auto_ack=True)
    barrier(sub)
    for i in range(500):  # pika sends them without waiting: reads of many publishes
        pub.basic_publish(fan, "", b"%d" % i)
        pub.basic_publish("", q1, b"%d" % i)
    wait_until(conn, lambda: len(got) == 500)
    barrier(pub)
    m = scrape(broker, "/metrics/per-object")
    published = _by(m, "rabbitmq_channel_messages_published_total", "exchange")
    assert published == {fan: 500, "": 500}
    routed = {
        (labels["queue"], labels["exchange"]): v
        for labels, v in m["rabbitmq_queue_messages_published_total"]
    }
    assert routed == {(q1, fan): 500, (q2, fan): 500, (q1, ""): 500}
    delivered = _by(m, "rabbitmq_channel_messages_delivered_total", "queue")
    assert delivered == {q2: 500}
    conn.close()


def test_confirms_are_charged_to_their_exchange(broker: BrokerThread) -> None:
    """Publishes sent in one write, alternating between exchanges, persistent
    into a durable queue (their confirms wait for the disk sync, many at
    once) and to a queue without durability (confirmed at once): each
    exchange is charged the confirms of its own publishes."""
    c = RawAMQP(broker.port)
    c.handshake()
    c.open_channel(1)
    for q, durable in (("dur", True), ("mem", False)):
        c.send_method(1, commands.Queue.Declare(queue=q, durable=durable))
        c.expect_method(commands.Queue.DeclareOk)
    names = ["x0", "x1", "x2"]
    for i, name in enumerate(names):
        c.send_method(1, commands.Exchange.Declare(exchange=name, exchange_type="fanout"))
        c.expect_method(commands.Exchange.DeclareOk)
        c.send_method(1, commands.Queue.Bind(queue="dur" if i < 2 else "mem", exchange=name))
        c.expect_method(commands.Queue.BindOk)
    c.send_method(1, commands.Confirm.Select())
    c.expect_method(commands.Confirm.SelectOk)
    n = 300
    sent = [names[(i // 7 + i) % 3] for i in range(n)]  # runs of one exchange, and single ones
    persistent = commands.Basic.Properties(delivery_mode=2)
    c.send(b"".join(publish_frames(1, b"m", "", x, persistent) for x in sent))
    confirmed: set[int] = set()
    while len(confirmed) < n:
        _, frame = c.read_frame()
        assert isinstance(frame, commands.Basic.Ack), frame
        top = frame.delivery_tag
        confirmed |= set(range(1, top + 1)) if frame.multiple else {top}
    m = scrape(broker, "/metrics/per-object")
    expected = {x: sent.count(x) for x in names}
    assert _by(m, "rabbitmq_channel_messages_published_total", "exchange") == expected
    assert _by(m, "rabbitmq_channel_messages_confirmed_total", "exchange") == expected
    c.close()


def test_deleted_queues_and_closed_channels_end_their_series(broker: BrokerThread) -> None:
    conn = connect(broker)
    ch = conn.channel()
    keep, gone = uniq(), uniq()
    for q in (keep, gone):
        ch.queue_declare(q)
        ch.basic_publish("", q, b"m")
        ch.basic_get(q, auto_ack=True)
    ch.queue_delete(gone)
    m = scrape(broker, "/metrics/per-object")
    assert set(_by(m, "rabbitmq_channel_get_total", "queue")) == {keep}
    routed = _by(m, "rabbitmq_queue_messages_published_total", "queue")
    assert set(routed) == {keep}
    aggregated = scrape(broker, "/metrics")
    # The aggregated counters keep what was counted (they never go back).
    assert aggregated["rabbitmq_channel_get_total"] == [({}, 2)]
    ch.close()
    barrier(conn.channel())
    m = scrape(broker, "/metrics/per-object")
    assert "rabbitmq_channel_get_total" not in m or m["rabbitmq_channel_get_total"] == []
    conn.close()


def test_a_channel_keeps_no_counts_of_queues_long_deleted(broker: BrokerThread) -> None:
    """RPC-style traffic through ever new queues, never scraped: the counts of
    deleted queues are dropped as new ones come, not kept for the channel's
    life."""
    conn = connect(broker)
    ch = conn.channel()
    for _ in range(300):
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.basic_publish("", q, b"reply")
        ch.basic_get(q, auto_ack=True)
        ch.queue_delete(q)

    def sizes() -> tuple[int, int]:
        [amqp] = [c for c in broker.broker.connections if hasattr(c, "channels")]
        counts = amqp.channels[ch.channel_number].counts
        return len(counts.queues), len(counts.routed)

    held = broker.call(sizes)
    assert max(held) <= 64, held
    conn.close()
