"""MQTT behaviour that only a broker with listeners shows; everything else about
the protocol runs in memory (test_mqtt_broker.py, test_mqtt_hostile.py).

- The management API's listing of MQTT connections: an HTTP request to the
  broker's HTTP listener, which the in-memory harness does not start.
"""

from __future__ import annotations

import json
import urllib.request
from base64 import b64encode

from conftest import BrokerThread
from mqttclient import V5, Client


def mqtt_port(b: BrokerThread) -> int:
    listener = b.broker.listener("mqtt")
    assert listener is not None
    return listener.port


def test_connections_listed_by_the_management_api(broker: BrokerThread) -> None:
    c = Client(mqtt_port(broker), client_id="listed", protocol=V5)
    try:
        c.connect()
        c.subscribe("x/#", qos=1)
        http = broker.broker.listener("http")
        assert http is not None
        req = urllib.request.Request(f"http://127.0.0.1:{http.port}/api/connections")
        req.add_header("Authorization", "Basic " + b64encode(b"guest:guest").decode())
        with urllib.request.urlopen(req, timeout=5) as resp:
            listed = json.load(resp)
        (conn,) = [x for x in listed if x["protocol"].startswith("MQTT")]
        assert conn["protocol"] == "MQTT 5-0"
        assert conn["client_properties"]["client_id"] == "listed"
        assert conn["user"] == "guest" and conn["vhost"] == "/"
    finally:
        c.close()
