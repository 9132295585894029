"""message_stats in the management API and /metrics over HTTP.

The broker's automatic sampling is off (collect_statistics_interval = 0);
the test samples with the times it chooses, so rates are exact.
"""

from __future__ import annotations

import pytest
from conftest import BrokerThread
from httphelp import Api, wait_for
from pikahelp import barrier, connect, uniq
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def broker(hand_sampled_broker: BrokerThread) -> BrokerThread:
    return hand_sampled_broker


def test_message_stats_and_rates_of_queues_exchanges_channels_vhosts(
    broker: BrokerThread,
) -> None:
    api = Api(broker.http_port)
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    q = uniq()
    ch.queue_declare(q)
    broker.call(lambda: broker.broker.sample_stats(0.0))
    for _ in range(10):
        ch.basic_publish("", q, b"m")
    ch.basic_get(q, auto_ack=True)
    barrier(ch)
    broker.call(lambda: broker.broker.sample_stats(5.0))

    stats = api.get(f"/api/queues/%2F/{q}")["message_stats"]
    assert stats["publish"] == 10 and stats["publish_details"] == {"rate": 2.0}
    assert stats["get_no_ack"] == 1 and stats["deliver_get"] == 1
    exchange = api.get("/api/exchanges/%2F/amq.default")["message_stats"]
    assert exchange["publish_in"] == 10 and exchange["publish_out"] == 10
    [channel] = api.get("/api/channels")
    assert channel["message_stats"]["confirm"] == 10
    assert channel["message_stats"]["confirm_details"] == {"rate": 2.0}
    vhost = api.get("/api/vhosts/%2F")["message_stats"]
    assert vhost["publish"] == 10 and vhost["publish_details"] == {"rate": 2.0}
    [connection] = api.get("/api/connections")
    assert connection["recv_oct"] > 10 * len(q) and connection["recv_cnt"] >= 1
    assert connection["send_oct"] > 0 and connection["send_cnt"] >= 1
    assert connection["recv_oct_details"]["rate"] > 0
    overview = api.get("/api/overview")
    assert overview["rates_mode"] == "basic"
    assert overview["message_stats"]["publish_details"] == {"rate": 2.0}
    conn.close()


def test_metrics_endpoints(broker: BrokerThread) -> None:
    api = Api(broker.http_port).anonymous()  # as RabbitMQ's prometheus endpoint: no auth
    conn = connect(broker)
    ch = conn.channel()
    q = uniq()
    ch.queue_declare(q)
    ch.basic_publish("", q, b"12345")
    barrier(ch)
    for path, per_object in (("/metrics", False), ("/metrics/per-object", True)):
        reply = api.request("GET", path)
        assert reply.status == 200
        assert reply.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(reply.body.decode())
            for s in family.samples
        }
        assert samples[("rabbitmq_connections", ())] == 1
        ready = ("rabbitmq_queue_messages_ready", (("queue", q), ("vhost", "/")))
        if per_object:  # per channel, as RabbitMQ's per-object endpoint
            assert samples[ready] == 1
            published = [
                v for (name, _), v in samples.items()
                if name == "rabbitmq_channel_messages_published_total"
            ]
            assert published == [1]
        else:
            assert samples[("rabbitmq_channel_messages_published_total", ())] == 1
            assert samples[("rabbitmq_queue_messages_ready", ())] == 1
    conn.close()


def test_length_rates_and_history_as_rabbitmq_builds_them(broker: BrokerThread) -> None:
    """messages_details and message_stats' *_details with ages: samples every
    ``incr`` seconds, newest first, at multiples of it; avg and avg_rate over them.
    Unacknowledged bytes are counted while the consumer holds the messages."""
    api = Api(broker.http_port)
    conn = connect(broker)
    ch = conn.channel()
    q = uniq()
    ch.queue_declare(q)
    t0 = 1_795_000_000.0  # a multiple of 5 s: samples land on the timestamps
    broker.call(lambda: broker.broker.sample_stats(t0))
    for _ in range(10):
        ch.basic_publish("", q, b"0123456789")
    barrier(ch)
    broker.call(lambda: broker.broker.sample_stats(t0 + 5))
    ch.basic_qos(prefetch_count=4)
    ch.basic_consume(q, lambda *a: None)
    wait_for(lambda: api.get(f"/api/queues/%2F/{q}")["messages_unacknowledged"] == 4)
    broker.call(lambda: broker.broker.sample_stats(t0 + 10))

    info = api.get(f"/api/queues/%2F/{q}")
    assert info["message_bytes_unacknowledged"] == 40 and info["message_bytes_ready"] == 60
    assert info["message_bytes"] == 100
    assert info["messages_details"] == {"rate": 0.0}
    assert info["messages_ready_details"] == {"rate": -0.8}  # 10 -> 6 in 5 s
    assert info["messages_unacknowledged_details"] == {"rate": 0.8}

    aged = api.get(f"/api/queues/%2F/{q}?lengths_age=15&lengths_incr=5&msg_rates_age=10&msg_rates_incr=10")
    ready = aged["messages_ready_details"]
    stamps = [int((t0 + 10 - 5 * i) * 1000) for i in range(4)]
    assert ready["samples"] == [
        {"sample": v, "timestamp": t} for v, t in zip((6, 10, 0, 0), stamps, strict=True)
    ]
    assert ready["avg"] == 4.0 and ready["avg_rate"] == 0.4  # (6 - 0) / 15
    publish = aged["message_stats"]["publish_details"]
    assert [s["sample"] for s in publish["samples"]] == [10, 0]
    assert publish["avg_rate"] == 1.0 and publish["rate"] == 0.0
    overview = api.get("/api/overview?lengths_age=5&lengths_incr=5")
    assert overview["queue_totals"]["messages_unacknowledged_details"]["samples"] == [
        {"sample": 4, "timestamp": stamps[0]},
        {"sample": 0, "timestamp": stamps[1]},
    ]
    assert isinstance(overview["churn_rates"]["queue_declared_details"]["rate"], float)
    [node] = api.get("/api/nodes")
    assert node["disk_free"] > 0 and node["fd_used"] > 0 and node["sockets_used"] == 1
    # RabbitMQ's 400 for a range that is not positive or has over 500 samples;
    # an age without its increment asks for no history.
    for query, age, incr in (("lengths_age=0&lengths_incr=5", 0, 5), ("msg_rates_age=501&msg_rates_incr=1", 501, 1)):
        reply = api.request("GET", f"/api/queues/%2F/{q}?{query}")
        assert (reply.status, reply.json()) == (
            400,
            {"error": "bad_request", "reason": f"Invalid range parameters: age {age}, incr {incr}"},
        )
    assert "samples" not in api.get(f"/api/queues/%2F/{q}?lengths_age=60")["messages_details"]
    conn.close()


def test_history_of_an_object_new_since_the_last_sample(broker: BrokerThread) -> None:
    """A queue declared after the broker last sampled has no samples of its own:
    its history ends where the broker's does, all zeros (not at the epoch)."""
    api = Api(broker.http_port)
    t0 = 1_795_000_000.0
    broker.call(lambda: broker.broker.sample_stats(t0))
    q = uniq()
    conn = connect(broker)
    conn.channel().queue_declare(q)
    details = api.get(f"/api/queues/%2F/{q}?lengths_age=10&lengths_incr=5")["messages_details"]
    stamps = [int(t0 * 1000) - 5000 * i for i in range(3)]
    assert details["samples"] == [{"sample": 0, "timestamp": t} for t in stamps]
    assert details["avg"] == 0 and details["avg_rate"] == 0
    conn.close()
