"""Prometheus metrics: RabbitMQ's family names, parsed with prometheus-client's parser."""

from __future__ import annotations

from conftest import BrokerThread
from pikahelp import barrier, connect, uniq, wait_until
from prometheus_client.parser import text_string_to_metric_families

from warren.metrics import SLICE, render, snapshot


def scrape(
    b: BrokerThread, per_object: bool = False
) -> dict[str, list[tuple[dict[str, str], float]]]:
    snap = b.run(snapshot(b.broker))
    text = render(snap, per_object).decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def value(metrics: dict[str, list[tuple[dict[str, str], float]]], name: str) -> float:
    [(labels, v)] = metrics[name]
    assert labels == {}
    return v


def test_aggregated_metrics_follow_the_traffic(broker: BrokerThread) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    queues = [uniq() for _ in range(2)]
    for q in queues:
        ch.queue_declare(q)
        for _ in range(3):
            ch.basic_publish("", q, b"x" * 10)
    ch.basic_get(queues[0], auto_ack=False)  # one unacked
    ch.basic_consume(queues[1], lambda *a: None, auto_ack=True)
    wait_until(
        conn,
        lambda: broker.call(lambda: broker.broker.vhosts["/"].queues[queues[1]].message_count == 0),
    )
    barrier(ch)

    m = scrape(broker)
    assert value(m, "rabbitmq_connections") == 1
    assert value(m, "rabbitmq_channels") == 1
    assert value(m, "rabbitmq_consumers") == 1
    assert value(m, "rabbitmq_queues") == 2
    assert value(m, "rabbitmq_queue_messages_ready") == 2
    assert value(m, "rabbitmq_queue_messages_unacked") == 1
    assert value(m, "rabbitmq_queue_messages") == 3
    assert value(m, "rabbitmq_queue_messages_ready_bytes") == 20
    assert value(m, "rabbitmq_channel_messages_published_total") == 6
    assert value(m, "rabbitmq_channel_messages_confirmed_total") == 6
    assert value(m, "rabbitmq_channel_get_ack_total") == 1
    assert value(m, "rabbitmq_channel_messages_delivered_total") == 3
    assert value(m, "rabbitmq_queue_messages_published_total") == 6
    assert value(m, "rabbitmq_connections_opened_total") == 1
    assert value(m, "rabbitmq_channels_opened_total") == 1
    assert value(m, "rabbitmq_queues_declared_total") == 2
    assert value(m, "rabbitmq_queues_created_total") == 2
    assert value(m, "rabbitmq_process_max_fds") > 0
    [(identity, one)] = m["rabbitmq_identity_info"]
    assert one == 1 and identity["rabbitmq_node"] == broker.broker.cluster_name
    ch.queue_declare(queues[0], passive=True)  # passive: not counted as a declaration
    ch.queue_delete(queues[0])
    conn.close()
    wait_until([], lambda: broker.call(lambda: not broker.broker.connections))
    m = scrape(broker)
    assert value(m, "rabbitmq_connections") == 0
    assert value(m, "rabbitmq_connections_closed_total") == 1
    assert value(m, "rabbitmq_channels_closed_total") == 1
    assert value(m, "rabbitmq_queues_declared_total") == 2
    assert value(m, "rabbitmq_queues_deleted_total") == 1
    # Counters never go backwards when a channel closes (RabbitMQ's would).
    assert value(m, "rabbitmq_channel_messages_published_total") == 6


def test_per_object_metrics_label_every_queue(broker: BrokerThread) -> None:
    conn = connect(broker)
    ch = conn.channel()
    names = [uniq() for _ in range(SLICE + 3)]  # more than one slice of the snapshot
    for i, q in enumerate(names[:5]):
        ch.queue_declare(q)
        for _ in range(i):
            ch.basic_publish("", q, b"m")
    for q in names[5:]:
        ch.queue_declare(q)
    barrier(ch)
    m = scrape(broker, per_object=True)
    ready = {labels["queue"]: v for labels, v in m["rabbitmq_queue_messages_ready"]}
    assert {labels["vhost"] for labels, _ in m["rabbitmq_queue_messages_ready"]} == {"/"}
    assert len(ready) == len(names)
    assert [ready[q] for q in names[:5]] == [0, 1, 2, 3, 4]
    published = {labels["queue"]: v for labels, v in m["rabbitmq_queue_messages_published_total"]}
    assert published[names[4]] == 4
    conn.close()
