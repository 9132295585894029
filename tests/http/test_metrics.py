"""Prometheus metrics: RabbitMQ's families on its three endpoints, parsed with
prometheus-client's parser, compared with a recorded RabbitMQ 3.10
(tests/record_rabbitmq_prometheus.py); the [prometheus] listener."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pika
import pytest
from conftest import BrokerThread
from metricshelp import fetch, scrape, value
from paths import DATA
from pikahelp import barrier, connect, uniq, wait_until
from prometheus_client.parser import text_string_to_metric_families

from warren.metrics import SLICE

RECORDED = json.loads(
    (DATA / "rabbitmq_prometheus_families.json").read_text()
)


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
    amqp = {"protocol": "amqp091"}
    classic = {"protocol": "amqp091", "queue_type": "rabbit_classic_queue"}
    assert value(m, "rabbitmq_global_messages_received_total", **amqp) == 6
    assert value(m, "rabbitmq_global_messages_received_confirm_total", **amqp) == 6
    assert value(m, "rabbitmq_global_messages_routed_total", **amqp) == 6
    assert value(m, "rabbitmq_global_messages_confirmed_total", **amqp) == 6
    assert value(m, "rabbitmq_global_publishers", **amqp) == 1
    assert value(m, "rabbitmq_global_consumers", **amqp) == 1
    assert value(m, "rabbitmq_global_messages_delivered_total", **classic) == 4
    assert value(m, "rabbitmq_global_messages_delivered_consume_auto_ack_total", **classic) == 3
    assert value(m, "rabbitmq_global_messages_delivered_get_manual_ack_total", **classic) == 1
    assert value(m, "rabbitmq_auth_attempts_succeeded_total", **amqp) == 1
    [(identity, one)] = m["rabbitmq_identity_info"]
    assert one == 1 and identity["rabbitmq_node"] and identity["rabbitmq_cluster_permanent_id"]
    assert identity["rabbitmq_cluster"] == broker.broker.cluster_name
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
    # Counters never go backwards when a channel or connection closes (RabbitMQ's would).
    assert value(m, "rabbitmq_channel_messages_published_total") == 6
    assert value(m, "rabbitmq_global_messages_received_confirm_total", **amqp) == 6
    assert value(m, "rabbitmq_global_messages_delivered_total", **classic) == 4
    assert value(m, "rabbitmq_connection_incoming_bytes_total") > 0
    assert value(m, "rabbitmq_global_publishers", **amqp) == 0


def test_counters_outlive_deleted_queues_and_vhosts(broker: BrokerThread) -> None:
    """A stream queue's deliveries are counted for rabbit_stream_queue; deleting the
    queue, then its vhost, takes nothing back."""
    broker.call(lambda: broker.broker.add_vhost("gone"))
    broker.call(lambda: broker.broker.users.set_permissions("guest", "gone"))
    conn = connect(broker, virtual_host="gone")
    ch = conn.channel()
    ch.queue_declare("s", durable=True, arguments={"x-queue-type": "stream"})
    for _ in range(4):
        ch.basic_publish("", "s", b"m")
    ch.basic_qos(prefetch_count=10)
    got: list[bytes] = []
    ch.basic_consume(
        "s", lambda c, m, p, body: got.append(body), arguments={"x-stream-offset": "first"}
    )
    wait_until(conn, lambda: len(got) == 4)
    stream = {"protocol": "amqp091", "queue_type": "rabbit_stream_queue"}
    per_object = scrape(broker, "/metrics/per-object")
    assert value(per_object, "rabbitmq_stream_segments_total", vhost="gone", queue="s") == 1
    before = scrape(broker)
    assert (
        value(before, "rabbitmq_global_messages_delivered_consume_manual_ack_total", **stream) == 4
    )
    conn.close()
    broker.call(lambda: broker.broker.vhosts["gone"].delete_queue("s"))
    broker.call(lambda: broker.broker.delete_vhost("gone"))
    after = scrape(broker)
    assert (
        value(after, "rabbitmq_global_messages_delivered_consume_manual_ack_total", **stream) == 4
    )
    assert value(after, "rabbitmq_global_messages_received_total", protocol="amqp091") == 4
    assert value(after, "rabbitmq_queues_deleted_total") == 1
    assert value(after, "rabbitmq_channels_closed_total") == 1


def test_dead_lettered_messages_are_counted_by_reason(broker: BrokerThread) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("dead")
    dlx = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"}
    ch.queue_declare("work", arguments=dlx)
    ch.queue_declare("short", arguments={**dlx, "x-max-length": 1})
    ch.basic_publish("", "work", b"bad")
    method, _, _ = ch.basic_get("work", auto_ack=False)
    ch.basic_reject(method.delivery_tag, requeue=False)
    for body in (b"1", b"2", b"3"):  # drop-head: two over the limit
        ch.basic_publish("", "short", body)
    barrier(ch)
    wait_until(
        conn,
        lambda: broker.call(lambda: broker.broker.vhosts["/"].queues["dead"].message_count == 3),
    )
    m = scrape(broker)
    classic = {"queue_type": "rabbit_classic_queue", "dead_letter_strategy": "at_most_once"}
    assert value(m, "rabbitmq_global_messages_dead_lettered_rejected_total", **classic) == 1
    assert value(m, "rabbitmq_global_messages_dead_lettered_maxlen_total", **classic) == 2
    assert value(m, "rabbitmq_global_messages_dead_lettered_expired_total", **classic) == 0
    conn.close()


def test_failed_logins_are_counted(broker: BrokerThread) -> None:
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        connect(broker, credentials=pika.PlainCredentials("guest", "wrong"))
    req = urllib.request.Request(
        f"http://127.0.0.1:{broker.http_port}/api/overview",
        headers={"Authorization": "Basic Z3Vlc3Q6bm9wZQ=="},  # guest:nope
    )
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(req, timeout=10)
    m = scrape(broker)
    assert value(m, "rabbitmq_auth_attempts_total", protocol="amqp091") == 1
    assert value(m, "rabbitmq_auth_attempts_failed_total", protocol="amqp091") == 1
    assert value(m, "rabbitmq_auth_attempts_succeeded_total", protocol="amqp091") == 0
    assert value(m, "rabbitmq_auth_attempts_failed_total", protocol="http") == 1


def test_identity_names_the_endpoint_and_the_node_uptime_is_there(broker: BrokerThread) -> None:
    """RabbitMQ 4.1's identity_info says which endpoint served it (its
    dashboards select on rabbitmq_endpoint); the node's uptime, the one
    erlang_* family Warren has, is in node_metrics."""
    for path, endpoint in (
        ("/metrics", "aggregated"),
        ("/metrics/per-object", "per-object"),
        ("/metrics/detailed?family=node_metrics", "detailed"),
    ):
        m = scrape(broker, path)
        [(identity, _)] = m["rabbitmq_identity_info"]
        assert identity["rabbitmq_endpoint"] == endpoint, path
        prefix = "rabbitmq_detailed_" if endpoint == "detailed" else "rabbitmq_"
        [(labels, uptime)] = m[prefix + "erlang_uptime_seconds"]
        assert labels == {} and uptime > 0


def test_per_object_metrics_label_every_queue_and_channel(broker: BrokerThread) -> None:
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
    m = scrape(broker, "/metrics/per-object")
    ready = {labels["queue"]: v for labels, v in m["rabbitmq_queue_messages_ready"]}
    assert {labels["vhost"] for labels, _ in m["rabbitmq_queue_messages_ready"]} == {"/"}
    assert len(ready) == len(names)
    assert [ready[q] for q in names[:5]] == [0, 1, 2, 3, 4]
    published = {labels["queue"]: v for labels, v in m["rabbitmq_queue_messages_published_total"]}
    assert published[names[4]] == 4
    [(labels, count)] = m["rabbitmq_channel_messages_published_total"]
    assert count == 10 and labels["exchange"] == "" and labels["channel"].endswith("(1)")
    [(labels, _)] = m["rabbitmq_connection_incoming_bytes_total"]
    assert set(labels) == {"channel"}  # RabbitMQ's label for a connection, too
    conn.close()


def test_detailed_endpoint_gives_the_families_asked_for(broker: BrokerThread) -> None:
    broker.call(lambda: broker.broker.add_vhost("other"))
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("here")
    ch.exchange_declare("fan", "fanout")
    ch.queue_bind("here", "fan")
    ch.basic_publish("fan", "", b"m")
    barrier(ch)
    broker.call(lambda: broker.broker.vhosts["other"].declare_queue("there"))
    query = "family=queue_coarse_metrics&family=exchange_bindings&family=vhost_status&family=nope"
    m = scrape(broker, f"/metrics/detailed?{query}&vhost=/")
    names = {name.removesuffix("_total") for name in m}
    assert names == {
        "rabbitmq_detailed_queue_messages_ready",
        "rabbitmq_detailed_queue_messages_unacked",
        "rabbitmq_detailed_queue_messages",
        "rabbitmq_cluster_exchange_bindings",
        "rabbitmq_cluster_vhost_status",
        "rabbitmq_identity_info",
        "rabbitmq_build_info",
    }
    assert value(m, "rabbitmq_detailed_queue_messages_ready", vhost="/", queue="here") == 1
    assert {labels["queue"] for labels, _ in m["rabbitmq_detailed_queue_messages"]} == {"here"}
    assert (
        value(m, "rabbitmq_cluster_exchange_bindings", vhost="/", exchange="fan", type="fanout")
        == 1
    )
    assert {labels["vhost"] for labels, _ in m["rabbitmq_cluster_vhost_status"]} == {"/", "other"}
    everything = scrape(broker, "/metrics/detailed?family=queue_coarse_metrics")
    assert {labels["queue"] for labels, _ in everything["rabbitmq_detailed_queue_messages"]} == {
        "here",
        "there",
    }
    bare = scrape(broker, "/metrics/detailed")
    assert set(bare) == {"rabbitmq_identity_info", "rabbitmq_build_info"}
    conn.close()


#: Families of RabbitMQ's output Warren does not have, and why (docs/metrics.md).
LEFT_OUT = (
    "rabbitmq_erlang_",  # the Erlang VM (and erlang_*, telemetry_*: not rabbitmq_*)
    "rabbitmq_detailed_erlang_",
    "rabbitmq_raft_",  # Raft internals
    "rabbitmq_detailed_raft_",
)
#: Labels newer RabbitMQs add: build_info's in 3.13 (set when the product is
#: named), identity_info's rabbitmq_endpoint in 4.1 (its dashboards select on it).
LABELS_NEWER = {"product_name", "product_version", "rabbitmq_endpoint"}


@pytest.mark.parametrize("endpoint", sorted(RECORDED["endpoints"]))
def test_families_are_rabbitmqs(broker: BrokerThread, endpoint: str) -> None:
    """Every family the recorded RabbitMQ 3.10 served on the endpoint (Erlang and Raft
    families aside) is there, with RabbitMQ's type, help and labels."""
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("q")
    ch.exchange_declare("x", "fanout")
    ch.queue_bind("q", "x")
    for _ in range(3):
        ch.basic_publish("x", "", b"m")
    ch.basic_get("q", auto_ack=False)
    ours = {}
    for fam in text_string_to_metric_families(fetch(broker, endpoint)):
        name = fam.name + ("_total" if fam.type == "counter" else "")
        ours[name] = (fam.type, fam.documentation, {k for s in fam.samples for k in s.labels})
    conn.close()
    for name, theirs in RECORDED["endpoints"][endpoint].items():
        kept = name.endswith("_erlang_uptime_seconds")  # the node's uptime
        if not name.startswith("rabbitmq_") or (name.startswith(LEFT_OUT) and not kept):
            continue
        if "process_reductions" in name or "process_memory" in name:  # Erlang processes
            continue
        assert name in ours, name
        mtype, help_text, labels = ours[name]
        assert mtype == theirs["type"], name
        # 3.13 says "authentication" where 3.10 says "authorization": 3.13's text.
        expected = theirs["help"].replace("authorization attempts", "authentication attempts")
        assert help_text == expected, name
        if theirs["labels"] and labels:
            assert labels - LABELS_NEWER == set(theirs["labels"]), (name, labels, theirs["labels"])


def test_prometheus_listener_config(broker_factory: object, tmp_path: Path) -> None:
    """-1 disables the listener; the management port serves the same endpoints;
    return_per_object_metrics makes /metrics per object, as RabbitMQ's setting."""
    b = broker_factory(prometheus_port=-1)  # type: ignore[operator]
    assert b.broker.listener("http/prometheus") is None
    url = f"http://127.0.0.1:{b.http_port}/metrics/detailed?family=vhost_status"
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert b'rabbitmq_cluster_vhost_status{vhost="/"} 1' in resp.read()
    b = broker_factory(  # type: ignore[operator]
        data_dir=tmp_path / "second", prometheus_return_per_object_metrics=True
    )
    b.call(lambda: b.broker.vhosts["/"].declare_queue("one"))
    m = scrape(b)
    assert m["rabbitmq_queue_messages_ready"] == [({"vhost": "/", "queue": "one"}, 0)]
