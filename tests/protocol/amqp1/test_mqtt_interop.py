"""MQTT and AMQP 1.0 on the same broker, in memory: paho's publishes reach an
AMQP 1.0 consumer through amq.topic, and a 1.0 publish reaches an MQTT
subscriber, as RabbitMQ 4 carries them between its protocols."""

from __future__ import annotations

import pytest
from harness import Harness, harness_fixture
from harness.amqp1 import ProtonClient

proton = pytest.importorskip("proton")

broker = harness_fixture()


def test_mqtt_publish_to_an_amqp1_consumer(broker: Harness) -> None:
    vhost = broker.broker.vhosts["/"]

    def setup() -> None:
        q = vhost.declare_queue("from-mqtt", durable=False)
        vhost.bind(vhost.get_exchange("amq.topic"), q, "sensors.*")

    broker.call(setup)
    c = ProtonClient(broker).open()
    receiver = c.receiver("/queues/from-mqtt", credit=5)
    m = broker.mqtt("sensor-1", protocol=5)
    m.paho.username_pw_set("guest", "guest")
    assert m.connect() == 0
    acked: list[int] = []
    m.paho.on_publish = lambda _c, _u, mid, _rc, _props: acked.append(mid)
    info = m.paho.publish("sensors/t1", b"21.5", qos=1)
    m.until(lambda: info.mid in acked)
    c.pump()
    ((delivery, message),) = c.receive(receiver)
    assert message.body == b"21.5"
    assert message.annotations[proton.symbol("x-routing-key")] == "sensors.t1"
    assert message.annotations[proton.symbol("x-exchange")] == "amq.topic"
    c.settle(delivery)


def test_amqp1_publish_to_an_mqtt_subscriber(broker: Harness) -> None:
    m = broker.mqtt("listener", protocol=5)
    m.paho.username_pw_set("guest", "guest")
    assert m.connect() == 0
    got: list[bytes] = []
    subscribed: list[int] = []
    m.paho.on_subscribe = lambda _c, _u, mid, _codes, _props: subscribed.append(mid)
    m.paho.on_message = lambda _c, _u, msg: got.append(msg.payload)
    _, mid = m.paho.subscribe("alerts/#", qos=1)
    m.until(lambda: mid in subscribed)
    c = ProtonClient(broker).open()
    sender = c.sender("/exchanges/amq.topic/alerts.fire")
    message = proton.Message(body=b"evacuate")
    message.inferred = True  # a data section: the MQTT payload as it is
    assert c.send(sender, message).remote_state == proton.Delivery.ACCEPTED
    m.until(lambda: got == [b"evacuate"])
