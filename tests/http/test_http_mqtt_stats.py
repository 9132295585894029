"""An MQTT connection's message counters in its vhost's message_stats, also after
it closed (RabbitMQ 3.10's MQTT plugin publishes through AMQP channels, whose
counters stay in the vhost's and the overview's totals when they close).

Sampled by hand (collect_statistics_interval = 0), with the times the test
chooses. A closed AMQP channel folds its counters into the vhost through its
client session (core/session.py); an MQTT connection's delivery stream does
the same. The Prometheus metrics keep counting them under the MQTT protocol
label, not twice.
"""

from __future__ import annotations

import urllib.request

import pytest
from conftest import BrokerThread
from httphelp import Api
from mqttraw import paho_publish
from pikahelp import wait_until
from prometheus_client.parser import text_string_to_metric_families

from warren.mqtt.packets import MQTT_3_1_1

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def broker(hand_sampled_broker: BrokerThread) -> BrokerThread:
    return hand_sampled_broker


def test_a_closed_mqtt_connection_still_counts_in_its_vhost(broker: BrokerThread) -> None:
    api = Api(broker.http_port)
    listener = broker.broker.listener("mqtt")
    assert listener is not None
    broker.call(lambda: broker.broker.sample_stats(0.0))
    paho_publish(listener.port, "sensors/a", [b"1", b"2", b"3"], level=MQTT_3_1_1)
    paho_publish(listener.port, "sensors/b", [b"4", b"5"])
    wait_until([], lambda: broker.call(lambda: not broker.broker.connections))
    broker.call(lambda: broker.broker.sample_stats(5.0))
    vhost = api.get("/api/vhosts/%2F")["message_stats"]
    assert vhost["publish"] == 5 and vhost["publish_details"] == {"rate": 1.0}
    overview = api.get("/api/overview")["message_stats"]
    assert overview["publish"] == 5 and overview["publish_details"] == {"rate": 1.0}
    # Later samples: the counts stay (they never go backwards).
    broker.call(lambda: broker.broker.sample_stats(10.0))
    assert api.get("/api/vhosts/%2F")["message_stats"]["publish"] == 5
    # The metrics count them once, by protocol.
    prometheus = broker.broker.listener("http/prometheus")
    assert prometheus is not None
    with urllib.request.urlopen(f"http://127.0.0.1:{prometheus.port}/metrics", timeout=10) as r:
        text = r.read().decode()
    received = {
        s.labels["protocol"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "rabbitmq_global_messages_received_total"
    }
    assert received == {"amqp091": 0, "mqtt310": 0, "mqtt311": 3, "mqtt50": 2, "stream": 0}
