"""MQTT in the Prometheus metrics: RabbitMQ 3.13's protocol labels (mqtt311, mqtt50)
on the global and auth attempt counters, kept after the client leaves."""

from __future__ import annotations

import urllib.request

from conftest import BrokerThread
from mqttraw import paho_publish
from pikahelp import wait_until
from prometheus_client.parser import text_string_to_metric_families

from warren.mqtt.packets import MQTT_3_1_1, MQTT_5


def samples(b: BrokerThread) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    listener = b.broker.listener("http/prometheus")
    assert listener is not None
    with urllib.request.urlopen(f"http://127.0.0.1:{listener.port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_mqtt_publishes_and_logins_by_protocol_version(broker: BrokerThread) -> None:
    listener = broker.broker.listener("mqtt")
    assert listener is not None
    paho_publish(listener.port, "sensors/a", [b"1", b"2", b"3"], level=MQTT_5)
    paho_publish(listener.port, "sensors/b", [b"4"], level=MQTT_3_1_1)
    wait_until([], lambda: broker.call(lambda: not broker.broker.connections))
    m = samples(broker)
    for protocol, count in (("mqtt50", 3), ("mqtt311", 1)):
        labels = (("protocol", protocol),)
        assert m[("rabbitmq_global_messages_received_total", labels)] == count
        assert m[("rabbitmq_auth_attempts_succeeded_total", labels)] == 1
        assert m[("rabbitmq_global_publishers", labels)] == 0  # gone
    assert m[("rabbitmq_global_messages_received_total", (("protocol", "amqp091"),))] == 0
    assert m[("rabbitmq_connections_closed_total", ())] == 2
